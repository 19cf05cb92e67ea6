// `--mode decode --steps N`: an inference loop in miniature. A prompt of P tokens per batch element
// (the decode directory's cache_seqlens, or --prompt-len) is prefilled with the kernel's forward
// pass (causal, per-batch lengths as key padding) and its K/V written into a fresh cache by the
// update-cache kernel; then N decode steps each generate S_new new tokens (q, k_new, v_new drawn
// from the seed, outside the timed region), append them and attend, one after the other, the
// lengths growing by S_new per step.
//   TTFT = prefill forward + cache fill (median over the timing repetitions)
//   TBT  = one step (update-cache kernel + attention), per step: mean, p50, p99
// Only the decode directory's shapes, dtype and page size are used; the data are generated. A
// paged directory gets a fresh pool with a shuffled block table covering S_max per element.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "decode_run.h"
#include "flashattn/registry.h"
#include "run.h"
#include "timing.h"

namespace flashattn {

struct DecodeSimOptions {
  int device = 0;
  TimingOptions timing;  // warm-up and repetitions of the prefill (TTFT); steps run once each
  int steps = 0;
  int prompt_len = 0;  // 0: the directory's cache_seqlens
  uint64_t seed = 0;
  int splits = 0;
  bool check = false;  // check the last step's O and lse against the fp64 reference
  int cpu_threads = 0;
};

struct DecodeSimResult {
  RunRecord run;        // mode Decode; timing: the steps' samples (TBT)
  nlohmann::json sim;   // the "simulation" object of the run's JSON
  std::string summary;  // one console line
};

// "" when the simulation can run `dec` (and its forward pass) on this problem, else the reason.
std::string decode_sim_unsupported(const KernelMode& dec, const DecodeInputs& shape, const DecodeSimOptions& opt, int sm);

DecodeSimResult simulate_decode(const KernelMode& dec, const DecodeInputs& shape, const DecodeSimOptions& opt);

}  // namespace flashattn

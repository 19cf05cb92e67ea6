// The decode run loop: a DecodeSession holds one decode step's inputs (host, and on the device
// once uploaded), the stream, the L2 flusher and the reference cache; DecodeSession::run executes
// one registered decode kernel: a checked step (poisoned O/lse, fp64 reference, the caches
// compared bit for bit with the host's append), then the timing of the step (update-cache kernel
// + attention) and of the attention alone.
//
// Timing a step needs no reset between repetitions: the update writes the same k_new/v_new rows
// at the same positions every time (cache_seqlens is an input, never advanced by the step), so
// every repetition sees the same cache and does the same work.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "array.h"
#include "decode_data.h"
#include "device_info.h"
#include "flashattn/registry.h"
#include "run.h"
#include "timing.h"

namespace flashattn {

// One step's inputs in the compute dtype (caches as stored: contiguous or a page pool).
struct DecodeInputs {
  DecodeDims dims;
  DType dtype = DType::F32;
  double scale = 0.0;
  HostArray q, k_new, v_new, k_cache, v_cache;
  HostArray cache_seqlens;               // int32 [B]
  std::optional<HostArray> block_table;  // int32 [B, max_blocks] when paged
};

struct DecodeOptions {
  int device = 0;            // -1: no GPU (only host kernels: cpu)
  TimingOptions timing;
  TimingOptions cpu_timing;  // for host kernels (fewer repetitions)
  bool check = false;
  int cpu_threads = 0;
  uint64_t seed = 0;
  double check_budget_macs = 8e9;  // reference work before rows are sampled
  int splits = 0;                  // --splits (0: each kernel chooses)
  bool keep_caches = false;        // download the updated caches (--write-cache)
  bool time_attention = true;      // also time the attention alone
};

struct DecodeRecord {
  RunRecord run;             // mode Decode; timing of a whole step (update + attention)
  TimingStats attend;        // the attention alone (empty when not timed)
  int splits = 1;            // split-K pieces the kernel used
  double kv_bytes = 0;       // K and V bytes a step reads: sum_b L_b * H_kv * D * 2 * itemsize
  std::optional<HostArray> k_cache, v_cache;  // after the step, when kept
  bool cache_checked = false, cache_ok = true;
  int64_t cache_mismatches = 0;  // elements differing from the host's append
};

// "" when `e` can run this decode problem on a GPU of compute capability `sm` (0: none).
std::string decode_why_unsupported(const KernelMode& e, const DecodeDims& d, DType dtype, int sm);

// Keys of every step row: visible (query, key) pairs summed over B * H * S_new rows.
double decode_visible_pairs(const DecodeDims& d, const HostArray& cache_seqlens);
// K and V bytes a step reads (each cache row of [0, L_b) once per kv head).
double decode_kv_bytes(const DecodeDims& d, const HostArray& cache_seqlens, DType dtype);

class DecodeSession {
 public:
  DecodeSession(DecodeInputs inputs, DecodeOptions opt);
  ~DecodeSession();
  DecodeSession(const DecodeSession&) = delete;
  DecodeSession& operator=(const DecodeSession&) = delete;

  // Runs one decode kernel (InputError if it cannot run this problem; RuntimeError on GPU errors).
  DecodeRecord run(const KernelMode& e);

  const DeviceInfo* device() const;  // null without a GPU
  const DecodeInputs& inputs() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace flashattn

// The flashattn command: options (parsed by main.cpp) and the orchestration from data directory to
// outputs, table and JSON.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "timing.h"

namespace flashattn {

struct AppOptions {
  std::vector<std::string> compute;  // kernel names, or {"all"}
  std::string mode = "forward";      // forward | backward | both | decode
  std::string data;
  std::string out;                   // empty: DATA/out/<kernel>
  bool causal = false;
  std::string window;                // "LEFT,RIGHT" or empty
  std::optional<double> scale;
  std::string dtype;                 // empty: the input's dtype
  std::string layout;                // empty: meta.json's, else bhsd
  int warmup = 3;
  int repeat = 20;                   // --repeat / --min-samples
  double min_time_ms = 0;
  bool no_flush = false;             // --no-flush / --hot
  double max_noise_pct = 0.5;        // --max-noise: percent; 0 turns the noise rule off
  double max_time_s = 1.0;           // --max-time: wall seconds the noise rule may spend per run
  std::string sweep;                 // --sweep fa-grid | FILE.json (see sweep.h)
  bool dry_run = false;              // --dry-run: print the sweep's points and exit
  bool ceilings = false;             // --ceilings: measure GEMM and copy ceilings (ceilings.h)
  bool check = false;
  std::string json;                  // FILE or "-" (stdout)
  bool no_write = false;
  uint64_t seed = 0;
  int device = 0;
  int threads = 0;
  bool deterministic = false;
  bool allow_nonfinite = false;      // run even when an input holds NaN or Inf (else exit 2)
  // Decode mode (decode_app.h).
  int splits = 0;                    // --splits N: split-K pieces per (batch, kv head); 0: the kernel's choice
  bool write_cache = false;          // --write-cache: also write the updated K_cache, V_cache
  int steps = 0;                     // --steps N: prefill + N decode steps (TTFT/TBT simulation)
  int prompt_len = 0;                // --prompt-len N: prompt of the simulation (0: cache_seqlens)
  std::string baseline;              // kernel the speedup column is relative to
  bool quiet = false;
  std::string command_line;
};

// Runs the command; returns the exit code (0, 1 runtime failure, 3 validation failed). Usage and
// input errors are thrown as InputError (exit 2).
int run_app(const AppOptions& opt);

// The timing options of the command line (shared by runs, sweeps and --ceilings); InputError on
// out-of-range values.
TimingOptions timing_options(const AppOptions& opt);

// `--list`: the support matrix derived from the registry (as text, or JSON when `json`).
std::string list_kernels(bool json);

}  // namespace flashattn

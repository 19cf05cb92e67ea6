// `flashattn --sweep fa-grid|FILE.json`: a grid of problems whose inputs are generated on the device
// from --seed (no data files), each run for every kernel x mode, with one progress line per point.
//
// fa-grid is FlashAttention's benchmark grid: B*S = 16384 for S in {512, ..., 16384}, H = 2048/D,
// D in {64, 128}, causal off and on, forward and backward. A preset file lists points:
//
//   {"name": "fp32-ladder",
//    "defaults": {"dtype": "fp32", "causal": [false, true], "mode": "both"},
//    "points": [{"B": 8, "H": 16, "S": 2048, "D": 64}, {"B": 4, "H": 8, "S_q": 4096, "S_k": 4096, "D": 64}]}
//
// Point fields: B, H, D (required), H_kv (default H), S or S_q and S_k, dtype, causal, mode ("forward",
// "backward", "both" or a list), kernels (list or comma-separated). dtype and causal may be lists:
// the point is repeated for each value. A point's own fields win, then the command line (--dtype,
// --mode, --causal, --compute), then the file's "defaults", then bf16 / both modes / not causal.
#pragma once

#include <nlohmann/json.hpp>

#include <string>
#include <vector>

#include "app.h"
#include "problem.h"
#include "run.h"

namespace flashattn {

struct SweepPoint {
  Dims dims;
  DType dtype = DType::BF16;
  bool causal = false;
  std::vector<Mode> modes;
  std::vector<std::string> kernels;  // empty: the command line's --compute
};

struct SweepGrid {
  std::string name;
  std::vector<SweepPoint> points;
};

// What the command line says for fields a grid may leave open ("" / false / empty: not given).
struct SweepDefaults {
  std::string dtype;
  std::string mode;
  bool causal = false;
  std::vector<std::string> kernels;
};

// Expands "fa-grid" or a preset file. InputError naming the file and the point on bad input.
SweepGrid load_sweep(const std::string& spec, const SweepDefaults& cli);
// The grid as a preset file with every field explicit (what --dry-run prints).
nlohmann::json sweep_grid_json(const SweepGrid& g);

// One run in a point's progress line: "hopper fwd 15.2 ms 2320.0 TFLOP/s over 4 GPUs (noisy)".
std::string sweep_run_summary(const RunRecord& r);

// Runs the sweep; returns the exit code (0; 1 if a run failed; 3 if a --check failed).
int run_sweep(const AppOptions& opt);

}  // namespace flashattn

// --check: compares a kernel's outputs with the fp64 cpu reference.
//
// Metrics per output: max abs, mean abs, MSE, max rel (denominator max(|ref|, 1e-3 * max|ref|)),
// relative L2 ||out - ref|| / ||ref||, and the first mismatches. Any NaN/Inf where the reference is
// finite, or a finite lse where the reference is -inf, fails the check.
//
// Rules:
//   fp32:        rel L2 <= 1e-5 for every output;   fp64 (cpu kernel): rel L2 <= 1e-12
//                an output that is zero by symmetry (reference RMS < 1e-6, e.g. dK with one key)
//                is held to RMS error <= 1e-6 (fp64: 1e-12) instead, as no relative error exists
//   fp16 / bf16: max abs <= 2 x (max abs of the naive kernel in the same dtype, same inputs)
//                + floor, 3x for dQ/dK/dV; floor = 1e-6 * max(1, max|ref|)   (the FlashAttention rule)
//                the naive kernel itself: rel L2 <= 4 x eps(dtype) (a sanity bound for the baseline)
// Large problems check a deterministic random sample of rows (see RowSelection) so --check stays
// within seconds; the result says how many rows were checked.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "array.h"
#include "reference.h"

namespace flashattn {

struct Mismatch {
  int64_t index = 0;  // index within the checked values (row-major over the checked rows)
  int64_t row = 0;    // position of the row in the selection
  int col = 0;
  double got = 0, want = 0;
};

struct ErrorStats {
  int64_t count = 0;          // values compared
  double max_abs = 0, mean_abs = 0, mse = 0, max_rel = 0, rel_l2 = 0;
  double ref_max_abs = 0;
  double ref_rms = 0;         // root mean square of the (finite) reference values
  int64_t nonfinite = 0;      // non-finite outputs where the reference is finite, or -inf mismatches
  std::vector<Mismatch> first_mismatches;  // up to 5, in index order
};

// Compares `got` with `want` (same length, `cols` values per row). Reference entries equal to -inf
// (lse of empty rows) must be -inf in `got` and are excluded from the numeric metrics.
// `mismatch_tol` decides which elements are listed as mismatches (|got - want| > mismatch_tol).
ErrorStats compare_values(const std::vector<double>& got, const std::vector<double>& want, int cols,
                          double mismatch_tol);

struct OutputCheck {
  std::string name;      // "O", "lse", "dQ", "dK", "dV"
  ErrorStats err;
  std::string rule;      // human-readable, e.g. "max_abs <= 2 x naive (3.1e-3) + 1e-6"
  std::string metric;    // "rel_l2" or "max_abs"
  double measured = 0;   // the value of `metric`
  double tolerance = 0;  // the bound it is held to
  double baseline = -1;  // naive's value of `metric` when the rule uses it
  bool passed = false;
};

struct CheckResult {
  bool performed = false;
  bool passed = true;
  std::string reference = "cpu-fp64";
  std::string note;  // e.g. "cpu is the reference"
  std::vector<OutputCheck> outputs;
  int64_t rows_checked = 0, rows_total = 0;          // query rows
  int64_t key_rows_checked = 0, key_rows_total = 0;  // key rows (backward)
};

// Which rows the reference computes.
struct RowSelection {
  std::vector<RowId> q_rows;  // query rows (h < H)
  std::vector<RowId> k_rows;  // key rows (h is the kv head)
  int64_t q_total = 0, k_total = 0;
};
// All rows when the reference work fits in `budget_macs` multiply-adds, else a deterministic
// random sample (the first and last query row of the first and last head always included).
RowSelection select_rows(const Dims& d, bool backward, double budget_macs, uint64_t seed);

// Reference values at the selected rows, row-major (rows x D, or rows for lse).
struct ReferenceRows {
  std::vector<double> o, lse, dq, dk, dv;
};
ReferenceRows compute_reference(const RefInputs& in, const RowSelection& sel, bool backward);

// A kernel's outputs on the host (compute dtype, the problem's layout; lse fp32 [B, H, S_q]).
struct KernelOutputs {
  std::optional<HostArray> o, lse, dq, dk, dv;
};

// The outputs' values at the selected rows, in the same order as ReferenceRows.
ReferenceRows gather_rows(const KernelOutputs& out, const RowSelection& sel, const Dims& d, Layout layout);

// Error statistics of each output present in `got`.
std::vector<std::pair<std::string, ErrorStats>> measure_errors(const ReferenceRows& got, const ReferenceRows& want,
                                                               int D);

// Applies the rules above. `baseline` holds the naive kernel's errors in the same dtype (required
// for fp16/bf16 unless `is_baseline`, i.e. the kernel being judged is naive itself).
CheckResult judge(const std::vector<std::pair<std::string, ErrorStats>>& errors, DType dtype, bool is_baseline,
                  const std::vector<std::pair<std::string, ErrorStats>>* baseline);

}  // namespace flashattn

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
//   fp16 / bf16: max abs <= 2 x (max abs of the same-dtype baseline) + floor, 3x for dQ/dK/dV;
//                floor = 1e-6 * max(1, max|ref|)   (the FlashAttention rule)
//                The baseline is attention computed naively in the dtype (reference.h,
//                baseline_*_rows) on the same rows, and is itself judged against the fp64
//                reference first: its max abs error must be within kBaselineBound x eps(dtype) x
//                max|ref| (lse: kLseBaselineBound x eps(fp32) x max(1, max|lse|)). A baseline out of
//                that bound fails the check (no tolerance is derived from it); a kernel's tolerance
//                is therefore never above factor x bound + floor.
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

// Bounds on the same-dtype baseline's own max abs error (see the rules above). Measured on random
// N(0,1) inputs over the GPU test matrix's shapes (S 1..4096, D 32..256, masks, GQA, scales 0.1..4):
// at most 0.83 x eps x max|ref| for O, dQ, dK, dV and 3.7 x eps(fp32) x max(1, |lse|) for lse.
constexpr double kBaselineBound = 2.0;
constexpr double kLseBaselineBound = 64.0;

struct OutputCheck {
  std::string name;      // "O", "lse", "dQ", "dK", "dV"
  ErrorStats err;
  std::string rule;      // human-readable, e.g. "max_abs <= 2 x baseline (3.1e-3) + 1e-6"
  std::string metric;    // "rel_l2" or "max_abs"
  double measured = 0;   // the value of `metric`
  double tolerance = 0;  // the bound it is held to
  double baseline = -1;        // the baseline's max abs error when the rule uses it
  double baseline_bound = -1;  // what the baseline's own error is held to
  bool baseline_passed = true;
  bool passed = false;
};

struct CheckResult {
  bool performed = false;
  bool passed = true;
  std::string reference = "cpu-fp64";
  std::string baseline;  // "cpu-naive-bf16" when the rule uses a same-dtype baseline
  std::string note;  // e.g. "cpu is the reference"
  std::vector<OutputCheck> outputs;
  int64_t rows_checked = 0, rows_total = 0;          // query rows
  int64_t key_rows_checked = 0, key_rows_total = 0;  // key rows (backward)
  // Host wall time of this check: the reference (and baseline) rows when this check computed them
  // (a later check of the same inputs reuses them), the comparisons and, for a ring, the comparison
  // with the one-GPU run's outputs. -1: not measured.
  double seconds = -1;
};

// The gap from 1 to the next value of the dtype (2^-7 bf16, 2^-10 fp16, 2^-23 fp32; fp64 else).
double dtype_eps(DType t);

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
// The same-dtype baseline (fp16/bf16) at the selected rows, in the same order.
ReferenceRows compute_baseline(const RefInputs& in, const RowSelection& sel, bool backward, DType dtype);

// A kernel's outputs on the host (compute dtype, the problem's layout; lse fp32 [B, H, S_q]).
struct KernelOutputs {
  std::optional<HostArray> o, lse, dq, dk, dv;
};

// The outputs' values at the selected rows, in the same order as ReferenceRows.
ReferenceRows gather_rows(const KernelOutputs& out, const RowSelection& sel, const Dims& d, Layout layout);

// Test-only fault injection, so that tests can prove a wrong kernel is caught end to end: when the
// environment variable FLASHATTN_INJECT_FAULT names `kernel`, its first output (O in forward and
// decode, dQ in backward) gets 1.0 added to element 0 (query row 0 of head 0, which the check
// always samples) right after the checked run, before validation and before any file is written.
// Returns a note for the run's record, or "" when nothing was injected.
std::string inject_fault_if_asked(const std::string& kernel, KernelOutputs& out);

// Error statistics of each output present in `got`.
std::vector<std::pair<std::string, ErrorStats>> measure_errors(const ReferenceRows& got, const ReferenceRows& want,
                                                               int D);

// Applies the rules above. `baseline` holds the same-dtype baseline's errors against the reference
// on the same rows (compute_baseline, then measure_errors); required for fp16/bf16 (without it an
// output is held to rel L2 <= 4 eps(dtype) and the rule says so).
using OutputErrors = std::vector<std::pair<std::string, ErrorStats>>;
CheckResult judge(const OutputErrors& errors, DType dtype, const OutputErrors* baseline);

}  // namespace flashattn

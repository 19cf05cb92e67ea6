// The oracle: attention forward and backward in fp64, written from the definitions in
// reference.h and deliberately sharing nothing with the kernels; and, through the same code with
// fp32 sums and dtype roundings, the same-dtype baseline of the fp16/bf16 rule.
//
// Shape of the computation:
//   forward, per query row:   pass 1 stores the row of scores (one row, O(S_k) memory) and finds
//                             the max; pass 2 sums exp(s - max) for lse; pass 3 accumulates
//                             P·V with P = exp(s - lse). Rows of one head go in tiles of
//                             kTileRows that share each K and V row's read, the order of every
//                             row's own sums unchanged (and the key rows of the backward alike);
//                             the scores of a block of kKeyBlock keys are computed side by side
//                             (block_dots), each still summed in its own pair's order.
//   backward, per query row:  the forward row again (lse_i, O_i, D_i = <dO_i, O_i>), then
//                             dQ_i = scale * sum_j dS_ij k_j over the stored row of scores.
//   backward, per key row:    needs lse_i and D_i of every query row of every query head in its
//                             group, computed once per distinct (b, kv head); then
//                             dK_j = scale * sum_{h,i} dS_ij q_i and dV_j = sum_{h,i} P_ij dO_i.
// Every output element is written by exactly one task with a fixed summation order, so results are
// bitwise identical for any thread count, and the whole-tensor functions (which run the row
// functions over every row) agree bitwise with the row functions.
//
// Two copies: this file is compiled for the target's baseline and, on x86-64 with GCC or Clang,
// once more with -mavx2 (no FMA) and FLASHATTN_REFERENCE_AVX2_COPY, each copy's code in its own
// namespace (reference_copy::baseline, reference_copy::avx2). The baseline copy holds the public
// functions and runs the AVX2 copy where the CPU has AVX2 (FLASHATTN_REFERENCE_ISA=baseline
// forces the baseline). Both run every sum in the same order, one rounding per operation, so their
// results are bitwise identical (tests/cpu/test_reference.cpp); the wider vectors change the time.
#include "reference.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <map>
#include <string>
#include <type_traits>
#include <utility>

#include "array.h"
#include "flashattn/error.h"
#include "parallel.h"

#ifdef FLASHATTN_REFERENCE_AVX2_COPY
#define FLASHATTN_REFERENCE_COPY avx2
#else
#define FLASHATTN_REFERENCE_COPY baseline
#endif
#include "reference_model.h"

namespace flashattn {

#ifndef FLASHATTN_REFERENCE_AVX2_COPY

// Four independent partial sums, a fixed order (so results never depend on threading) and several
// times faster than one dependent chain of additions.
double dot_f64(const double* a, const double* b, int n) {
  double s0 = 0.0, s1 = 0.0, s2 = 0.0, s3 = 0.0;
  int d = 0;
  for (; d + 4 <= n; d += 4) {
    s0 += a[d] * b[d];
    s1 += a[d + 1] * b[d + 1];
    s2 += a[d + 2] * b[d + 2];
    s3 += a[d + 3] * b[d + 3];
  }
  for (; d < n; ++d) s0 += a[d] * b[d];
  return (s0 + s1) + (s2 + s3);
}
#endif

namespace reference_copy::FLASHATTN_REFERENCE_COPY {
namespace {

using namespace model;

// Per-worker scratch: a tile's rows of scores and head-dim vectors (s_row and o: the first).
struct Scratch {
  std::vector<double> s_rows, o_rows;
  double* s_row;
  double* o;
  explicit Scratch(const Dims& d)
      : s_rows(size_t(kTileRows) * std::max(d.S_k, 1)), o_rows(size_t(kTileRows) * std::max(d.D, 1)),
        s_row(s_rows.data()), o(o_rows.data()) {}
  Scratch(Scratch&& x) noexcept = default;
};

// Rows [begin, end) cut into tiles of up to `tile` (<= kTileRows) consecutive rows sharing (b, head):
// fn(b, head, indices, count, first) for each, `first` the tile's first row number.
template <class IdOf, class Fn>
void for_each_tile(int64_t begin, int64_t end, int tile, IdOf id_of, Fn fn) {
  std::array<int, kTileRows> idx;
  int64_t r = begin;
  while (r < end) {
    const RowId first = id_of(r);
    int count = 0;
    for (; r < end && count < tile; ++r) {
      const RowId id = id_of(r);
      if (id.b != first.b || id.h != first.h) break;
      idx[count++] = id.i;
    }
    fn(first.b, first.h, idx.data(), count, r - count);
  }
}

// Runs body(t, scratch) for every t in [0, tasks), each thread with its own Scratch (parallel.h).
template <class Body>
void parallel_tasks(int64_t tasks, int workers, const Dims& dims, Body body) {
  flashattn::parallel_tasks(tasks, workers, [&] { return Scratch(dims); }, body);
}

// Splits n rows of `row_cost` work each into chunks: enough chunks to balance the workers (rows
// differ in cost under causal or padding), few enough to keep the counter cold.
struct Chunking {
  int64_t chunk = 1, tasks = 0;
  int workers = 1;
};
Chunking chunk_rows(int64_t n, double row_cost, int threads) {
  Chunking c;
  c.workers = parallel_workers(threads, n, static_cast<double>(n) * row_cost);
  c.chunk = std::max<int64_t>(1, n / (static_cast<int64_t>(c.workers) * 16));
  c.tasks = (n + c.chunk - 1) / c.chunk;
  return c;
}

void check_inputs(const RefInputs& in, bool backward) {
  const Dims& d = in.dims;
  if (d.B < 0 || d.H < 1 || d.H_kv < 1 || d.S_q < 0 || d.S_k < 0 || d.D < 1 || d.H % d.H_kv != 0) {
    throw RuntimeError("reference: invalid dims B=" + std::to_string(d.B) + " H=" + std::to_string(d.H) +
                       " H_kv=" + std::to_string(d.H_kv) + " S_q=" + std::to_string(d.S_q) +
                       " S_k=" + std::to_string(d.S_k) + " D=" + std::to_string(d.D));
  }
  if (!in.q || !in.k || !in.v || (backward && !in.dout)) {
    throw RuntimeError("reference: missing input tensor");
  }
  if (in.seqlens_k) {
    for (int b = 0; b < d.B; ++b) {
      if (in.seqlens_k[b] < 0 || in.seqlens_k[b] > d.S_k) {
        throw InputError("seqlens_k[" + std::to_string(b) + "] = " + std::to_string(in.seqlens_k[b]) +
                         " is outside [0, S_k=" + std::to_string(d.S_k) + "]");
      }
    }
  }
}

void check_row(const RowId& r, int heads, int S, const Dims& d, const char* what) {
  if (r.b < 0 || r.b >= d.B || r.h < 0 || r.h >= heads || r.i < 0 || r.i >= S) {
    throw RuntimeError(std::string("reference: ") + what + " row (b=" + std::to_string(r.b) + ", h=" +
                       std::to_string(r.h) + ", i=" + std::to_string(r.i) + ") out of range");
  }
}

template <class Arith>
void forward_rows(const RefInputs& in, Arith arith, const std::vector<RowId>& rows, double* o, double* lse) {
  check_inputs(in, /*backward=*/false);
  const Dims& d = in.dims;
  for (const RowId& r : rows) check_row(r, d.H, d.S_q, d, "query");
  const Attention<Arith> attn(in, arith);
  const int64_t n = static_cast<int64_t>(rows.size());
  const Chunking c = chunk_rows(n, 2.0 * d.S_k * d.D, in.threads);
  parallel_tasks(c.tasks, c.workers, d, [&](int64_t t, Scratch& sc) {
    for_each_tile(t * c.chunk, std::min(n, (t + 1) * c.chunk), kTileRows, [&](int64_t r) { return rows[r]; },
                  [&](int b, int h, const int* is, int count, int64_t first) {
                    std::array<double*, kTileRows> out;
                    for (int k = 0; k < count; ++k) out[k] = o + (first + k) * d.D;
                    attn.forward_tile(b, h, is, count, sc.s_row, out.data(), lse + first);
                  });
  });
}

template <class Arith>
void backward_rows(const RefInputs& in, Arith arith, const std::vector<RowId>& q_rows, double* dq,
                   const std::vector<RowId>& k_rows, double* dk, double* dv) {
  check_inputs(in, /*backward=*/true);
  const Dims& d = in.dims;
  for (const RowId& r : q_rows) check_row(r, d.H, d.S_q, d, "query");
  for (const RowId& r : k_rows) check_row(r, d.H_kv, d.S_k, d, "key");
  const Attention<Arith> attn(in, arith);
  const int G = attn.group_size();

  // lse_i and D_i of every query row of each (b, kv head) that a key row needs, computed once.
  std::map<std::pair<int, int>, size_t> group_index;
  std::vector<std::pair<int, int>> groups;
  for (const RowId& r : k_rows) {
    if (group_index.emplace(std::make_pair(r.b, r.h), groups.size()).second) groups.emplace_back(r.b, r.h);
  }
  const int64_t group_rows = static_cast<int64_t>(G) * d.S_q;
  std::vector<double> lse(groups.size() * group_rows), Dt(groups.size() * group_rows);
  {
    const int64_t n = static_cast<int64_t>(groups.size()) * group_rows;
    const Chunking c = chunk_rows(n, 2.0 * d.S_k * d.D, in.threads);
    auto id_of = [&](int64_t r) {
      const auto& [b, g] = groups[r / group_rows];
      return RowId{b, g * G + static_cast<int>((r % group_rows) / d.S_q), static_cast<int>(r % d.S_q)};
    };
    parallel_tasks(c.tasks, c.workers, d, [&](int64_t t, Scratch& sc) {
      for_each_tile(t * c.chunk, std::min(n, (t + 1) * c.chunk), kTileRows, id_of,
                    [&](int b, int h, const int* is, int count, int64_t first) {
                      std::array<double*, kTileRows> out;
                      for (int k = 0; k < count; ++k) out[k] = sc.o + int64_t(k) * d.D;
                      attn.forward_tile(b, h, is, count, sc.s_row, out.data(), lse.data() + first);
                      for (int k = 0; k < count; ++k)
                        Dt[first + k] = lse[first + k] == kNegInf ? 0.0 : attn.delta(b, h, is[k], out[k]);
                    });
    });
  }

  {
    const int64_t n = static_cast<int64_t>(q_rows.size());
    const Chunking c = chunk_rows(n, 4.0 * d.S_k * d.D, in.threads);
    parallel_tasks(c.tasks, c.workers, d, [&](int64_t t, Scratch& sc) {
      for (int64_t r = t * c.chunk; r < std::min(n, (t + 1) * c.chunk); ++r) {
        const RowId& id = q_rows[r];
        attn.dq_row(id.b, id.h, id.i, sc.s_row, sc.o, dq + r * d.D);
      }
    });
  }

  {
    const int64_t n = static_cast<int64_t>(k_rows.size());
    const Chunking c = chunk_rows(n, 4.0 * group_rows * d.D, in.threads);
    parallel_tasks(c.tasks, c.workers, d, [&](int64_t t, Scratch&) {
      for_each_tile(t * c.chunk, std::min(n, (t + 1) * c.chunk), kKeyTileRows, [&](int64_t r) { return k_rows[r]; },
                    [&](int b, int g, const int* js, int count, int64_t first) {
                      const size_t gi = group_index.at({b, g});
                      std::array<double*, kTileRows> dks, dvs;
                      for (int k = 0; k < count; ++k) dks[k] = dk + (first + k) * d.D, dvs[k] = dv + (first + k) * d.D;
                      attn.dkdv_tile(b, g, js, count, lse.data() + gi * group_rows, Dt.data() + gi * group_rows,
                                     dks.data(), dvs.data());
                    });
    });
  }
}

// fn(arith): the oracle's arithmetic (baseline_dtype null) or the dtype's baseline.
template <class Fn>
void with_arith(const DType* baseline_dtype, Fn fn) {
  if (!baseline_dtype) return fn(Exact{});
  if (*baseline_dtype != DType::F16 && *baseline_dtype != DType::BF16)
    throw RuntimeError(std::string("baseline: defined for fp16 and bf16, not ") + dtype_name(*baseline_dtype));
  fn(InDtype{*baseline_dtype});
}

}  // namespace

// This copy's entry points (with_arith's baseline_dtype).
void run_forward_rows(const RefInputs& in, const DType* baseline_dtype, const std::vector<RowId>& rows, double* o,
                      double* lse) {
  with_arith(baseline_dtype, [&](auto arith) { forward_rows(in, arith, rows, o, lse); });
}
void run_backward_rows(const RefInputs& in, const DType* baseline_dtype, const std::vector<RowId>& q_rows, double* dq,
                       const std::vector<RowId>& k_rows, double* dk, double* dv) {
  with_arith(baseline_dtype, [&](auto arith) { backward_rows(in, arith, q_rows, dq, k_rows, dk, dv); });
}

}  // namespace reference_copy::FLASHATTN_REFERENCE_COPY

#ifndef FLASHATTN_REFERENCE_AVX2_COPY
#ifdef FLASHATTN_HAVE_REFERENCE_AVX2
namespace reference_copy::avx2 {
void run_forward_rows(const RefInputs& in, const DType* baseline_dtype, const std::vector<RowId>& rows, double* o,
                      double* lse);
void run_backward_rows(const RefInputs& in, const DType* baseline_dtype, const std::vector<RowId>& q_rows, double* dq,
                       const std::vector<RowId>& k_rows, double* dk, double* dv);
}  // namespace reference_copy::avx2
#endif

namespace {

// A copy's entry points.
struct Copy {
  decltype(&reference_copy::baseline::run_forward_rows) forward;
  decltype(&reference_copy::baseline::run_backward_rows) backward;
};

bool use_avx2_copy() {
#ifdef FLASHATTN_HAVE_REFERENCE_AVX2
  static const bool cpu_has_avx2 = __builtin_cpu_supports("avx2");
  const char* forced = std::getenv("FLASHATTN_REFERENCE_ISA");
  return cpu_has_avx2 && !(forced && std::string(forced) == "baseline");
#else
  return false;
#endif
}

Copy copy() {
#ifdef FLASHATTN_HAVE_REFERENCE_AVX2
  if (use_avx2_copy()) return {reference_copy::avx2::run_forward_rows, reference_copy::avx2::run_backward_rows};
#endif
  return {reference_copy::baseline::run_forward_rows, reference_copy::baseline::run_backward_rows};
}

std::vector<RowId> all_rows(int B, int heads, int S) {
  std::vector<RowId> rows;
  rows.reserve(static_cast<size_t>(B) * heads * S);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < S; ++i) rows.push_back({b, h, i});
  return rows;
}

}  // namespace

const char* reference_instruction_set() { return use_avx2_copy() ? "avx2" : "baseline"; }

void reference_forward_rows(const RefInputs& in, const std::vector<RowId>& rows, double* o, double* lse) {
  copy().forward(in, nullptr, rows, o, lse);
}

void reference_backward_rows(const RefInputs& in, const std::vector<RowId>& q_rows, double* dq,
                             const std::vector<RowId>& k_rows, double* dk, double* dv) {
  copy().backward(in, nullptr, q_rows, dq, k_rows, dk, dv);
}

void baseline_forward_rows(const RefInputs& in, DType dtype, const std::vector<RowId>& rows, double* o, double* lse) {
  copy().forward(in, &dtype, rows, o, lse);
}

void baseline_backward_rows(const RefInputs& in, DType dtype, const std::vector<RowId>& q_rows, double* dq,
                            const std::vector<RowId>& k_rows, double* dk, double* dv) {
  copy().backward(in, &dtype, q_rows, dq, k_rows, dk, dv);
}

void reference_forward(const RefInputs& in, double* o, double* lse) {
  const Dims& d = in.dims;
  reference_forward_rows(in, all_rows(d.B, d.H, d.S_q), o, lse);
}

void reference_backward(const RefInputs& in, double* dq, double* dk, double* dv) {
  const Dims& d = in.dims;
  reference_backward_rows(in, all_rows(d.B, d.H, d.S_q), dq, all_rows(d.B, d.H_kv, d.S_k), dk, dv);
}
#endif  // FLASHATTN_REFERENCE_AVX2_COPY

}  // namespace flashattn

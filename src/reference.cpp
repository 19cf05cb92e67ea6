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
#include "reference_blocks.h"

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

using namespace blocks;

constexpr double kNegInf = -std::numeric_limits<double>::infinity();

// Rows computed together: enough to cut the trips through K and V (forward_tile) or Q and dO
// (dkdv_tile: fewer, as each key row carries four head-dim vectors) many-fold, few enough that
// their head-dim vectors stay in the first-level cache.
constexpr int kTileRows = 16;
constexpr int kKeyTileRows = 8;

// The arithmetic of a model. Exact: the oracle, fp64 throughout, nothing rounded. InDtype: the
// same-dtype baseline of the fp16/bf16 rule, attention the way a framework's unfused kernels
// compute it in that dtype (kernels/naive_fwd.cu and naive_bwd.cu do it on the GPU): scores and
// every sum in fp32, P, dS and the outputs rounded to the dtype. Values always travel as doubles;
// an InDtype value is exactly a float (or a dtype value) at every step.
struct Exact {
  using Acc = double;
  double stored(double x) const { return x; }  // a value written to memory in the dtype
};
struct InDtype {
  using Acc = float;
  DType dtype = DType::BF16;
  double stored(double x) const {
    const float f = static_cast<float>(x);
    return dtype == DType::F16 ? half_bits_to_float(float_to_half_bits(f)) : bf16_bits_to_float(float_to_bf16_bits(f));
  }
};

double dot(const double* a, const double* b, int n, double) { return dot_f64(a, b, n); }

// fp32: one running sum in element order, as a thread of the naive kernel accumulates.
float dot(const double* a, const double* b, int n, float) {
  float s = 0.f;
  for (int d = 0; d < n; ++d) s += static_cast<float>(a[d]) * static_cast<float>(b[d]);
  return s;
}

static_assert(kKeyTileRows <= kKeyBlock, "a key tile is one block");

// y += alpha * x in the accumulation type.
template <class Acc>
void axpy(double alpha, const double* x, double* y, int n) {
  const Acc a = static_cast<Acc>(alpha);
  for (int d = 0; d < n; ++d) y[d] = static_cast<Acc>(y[d]) + a * static_cast<Acc>(x[d]);
}

// The problem as the definitions state it: tensor rows, visibility and scores, in the arithmetic
// of `Arith`.
template <class Arith>
class Attention {
 public:
  using Acc = typename Arith::Acc;

  Attention(const RefInputs& in, Arith arith) : in_(in), dm_(in.dims), arith_(arith) {
    group_ = dm_.H / dm_.H_kv;
    offset_ = static_cast<int64_t>(dm_.S_k) - dm_.S_q;
  }

  const Dims& dims() const { return dm_; }
  int group_size() const { return group_; }

  const double* q(int b, int h, int i) const { return in_.q + row_index(b, h, dm_.H, dm_.S_q, i); }
  const double* dout(int b, int h, int i) const { return in_.dout + row_index(b, h, dm_.H, dm_.S_q, i); }
  const double* k(int b, int g, int j) const { return in_.k + row_index(b, g, dm_.H_kv, dm_.S_k, j); }
  const double* v(int b, int g, int j) const { return in_.v + row_index(b, g, dm_.H_kv, dm_.S_k, j); }

  int seqlen_k(int b) const { return in_.seqlens_k ? in_.seqlens_k[b] : dm_.S_k; }

  // Key j visible to query i of batch b. Any negative window bound means unbounded; causal is
  // tested on its own, so a caller that folded it into window_right gets the same answer.
  bool visible(int b, int i, int j) const {
    if (j >= seqlen_k(b)) return false;
    const int64_t diag = i + offset_;  // the key aligned with query i (bottom-right alignment)
    if (in_.causal && j > diag) return false;
    if (in_.window_left >= 0 && j < diag - in_.window_left) return false;
    if (in_.window_right >= 0 && j > diag + in_.window_right) return false;
    return true;
  }

  // s_ij of a visible key j from qk = <q_i, k_j> (block_dots); an invisible key's score is -inf
  // (an invisible key and a -inf mask entry are the same thing to everything downstream: they
  // contribute exp(-inf) = 0).
  double score_of(Acc qk, int b, int h, int i, int j) const {
    Acc s = static_cast<Acc>(in_.scale) * qk;
    if (in_.mask.ptr) {
      const MaskView& m = in_.mask;
      s += static_cast<Acc>(m.ptr[b * m.batch + h * m.head + i * m.row + j * m.col]);
    }
    return s;
  }

  // sum_j exp(s_j - m). In fp64 one running sum; in fp32 the naive kernel's order: a warp's 32
  // lanes each sum every 32nd key, then a butterfly over the lanes.
  Acc exp_sum(const double* s_row, Acc m) const {
    if constexpr (std::is_same_v<Acc, double>) {
      double sum = 0;
      for (int j = 0; j < dm_.S_k; ++j)
        if (s_row[j] != kNegInf) sum += std::exp(s_row[j] - m);
      return sum;
    } else {
      std::array<float, 32> lane{};
      for (int j = 0; j < dm_.S_k; ++j)
        if (s_row[j] != kNegInf) lane[j % 32] += std::exp(static_cast<float>(s_row[j]) - m);
      for (int off = 16; off > 0; off /= 2) {
        std::array<float, 32> next;
        for (int l = 0; l < 32; ++l) next[l] = lane[l] + lane[l ^ off];
        lane = next;
      }
      return lane[0];
    }
  }

  // P_ij = exp(s_ij - lse_i), as stored.
  double prob(double s, double lse) const {
    return arith_.stored(std::exp(static_cast<Acc>(s) - static_cast<Acc>(lse)));
  }

  // Forward for one query row: fills s_row[0, S_k) with the scores and o[0, D) with O_i; returns
  // lse_i (natural log). A row without a finite score gives O_i = 0 and lse_i = -inf.
  double forward_row(int b, int h, int i, double* s_row, double* o) const {
    double lse = 0;
    forward_tile(b, h, &i, 1, s_row, &o, &lse);
    return lse;
  }

  // The forward for `count` query rows of head (b, h) at once (query indices is[0, count)), so that
  // the rows share each key row's and value row's trip from memory (at long S_k a head's K and V
  // outgrow the caches, and one row at a time would stream them once per row); each row's sums
  // run in its own order whatever the tile. s_rows holds count rows of S_k scores; o[t] receives
  // O of row t, lse[t] its lse: three passes per row (scores and their max, the exp sum for lse,
  // P·V with P = exp(s - lse)). A row with a NaN score is NaN throughout (NaN or Inf in the
  // inputs, run with --allow-nonfinite: std::max would drop it, and a row of NaN scores would pass
  // for a fully masked one); one without a finite score gets O = 0, lse = -inf. Subtracting the
  // max keeps every exp <= 1 and the sum >= 1: nothing overflows, the log is well conditioned.
  void forward_tile(int b, int h, const int* is, int count, double* s_rows, double* const* o, double* lse) const {
    const int D = dm_.D, Sk = dm_.S_k, g = h / group_;
    std::array<std::vector<Acc>, kTileRows> q_buf;
    std::array<const Acc*, kTileRows> qa;
    for (int t = 0; t < count; ++t) qa[t] = row_in(q(b, h, is[t]), D, q_buf[t]);
    std::vector<Acc> kt(size_t(kKeyBlock) * D);
    for (int j0 = 0; j0 < Sk; j0 += kKeyBlock) {  // a block of key rows, read once for the tile
      const int jn = std::min(kKeyBlock, Sk - j0);
      std::array<std::array<bool, kKeyBlock>, kTileRows> vis{};
      std::array<int, kTileRows> need;  // the rows that see a key of the block
      std::array<const Acc*, kTileRows> a;
      int nn = 0;
      for (int t = 0; t < count; ++t) {
        bool any = false;
        for (int u = 0; u < jn; ++u) any |= vis[t][u] = visible(b, is[t], j0 + u);
        if (any) {
          a[nn] = qa[t];
          need[nn++] = t;
        } else {
          std::fill(s_rows + int64_t(t) * Sk + j0, s_rows + int64_t(t) * Sk + j0 + jn, kNegInf);
        }
      }
      if (nn == 0) continue;
      std::array<const double*, kKeyBlock> rows;
      for (int u = 0; u < jn; ++u) rows[u] = k(b, g, j0 + u);
      transpose_block(rows.data(), jn, D, kt.data());
      Acc qk[kTileRows][kKeyBlock];
      block_dots(a.data(), nn, kt.data(), D, qk);
      for (int m = 0; m < nn; ++m) {
        const int t = need[m];
        double* s_row = s_rows + int64_t(t) * Sk;
        for (int u = 0; u < jn; ++u) s_row[j0 + u] = vis[t][u] ? score_of(qk[m][u], b, h, is[t], j0 + u) : kNegInf;
      }
    }
    std::array<bool, kTileRows> live{};
    for (int t = 0; t < count; ++t) {
      const double* s_row = s_rows + int64_t(t) * Sk;
      double m = kNegInf;
      bool nan = false;
      for (int j = 0; j < Sk; ++j) {
        nan = nan || std::isnan(s_row[j]);
        m = std::max(m, s_row[j]);
      }
      if (nan) {
        std::fill(o[t], o[t] + D, std::numeric_limits<double>::quiet_NaN());
        lse[t] = std::numeric_limits<double>::quiet_NaN();
        continue;
      }
      std::fill(o[t], o[t] + D, 0.0);
      lse[t] = kNegInf;
      if (m == kNegInf) continue;
      const Acc l = static_cast<Acc>(m) + std::log(exp_sum(s_row, static_cast<Acc>(m)));
      lse[t] = l;
      live[t] = true;
    }
    // P·V: each row's sum over j in key order, in the accumulation type, a block of value rows
    // at a time (read, and in fp32 converted, once for the tile).
    std::vector<Acc> acc(size_t(count) * D, Acc(0));
    std::array<std::vector<Acc>, kKeyBlock> v_buf;
    for (int j0 = 0; j0 < Sk; j0 += kKeyBlock) {
      const int jn = std::min(kKeyBlock, Sk - j0);
      std::array<const Acc*, kKeyBlock> vrows{};
      for (int t = 0; t < count; ++t) {
        if (!live[t]) continue;
        const double* s_row = s_rows + int64_t(t) * Sk;
        std::array<Acc, kKeyBlock> alpha;
        std::array<const Acc*, kKeyBlock> x;
        int terms = 0;
        for (int u = 0; u < jn; ++u) {
          if (s_row[j0 + u] == kNegInf) continue;
          if (!vrows[u]) vrows[u] = row_in(v(b, g, j0 + u), D, v_buf[u]);
          alpha[terms] = static_cast<Acc>(prob(s_row[j0 + u], lse[t]));
          x[terms++] = vrows[u];
        }
        if (terms) axpy_terms(alpha.data(), x.data(), terms, acc.data() + int64_t(t) * D, D);
      }
    }
    for (int t = 0; t < count; ++t)
      if (live[t])
        for (int d = 0; d < D; ++d) o[t][d] = arith_.stored(acc[int64_t(t) * D + d]);
  }

  // D_i = <dO_i, O_i> over the model's own O_i.
  double delta(int b, int h, int i, const double* o) const { return dot(dout(b, h, i), o, dm_.D, Acc{}); }

  // dS_ij = P_ij (dP_ij - D_i), as stored, from dP_ij = <dO_i, v_j>.
  double dscore_of(double p, Acc dp, double Di) const {
    return arith_.stored(static_cast<Acc>(p) * (dp - static_cast<Acc>(Di)));
  }
  double dscore(double p, const double* dO, const double* vj, double Di) const {
    return dscore_of(p, dot(dO, vj, dm_.D, Acc{}), Di);
  }

  // dQ_i for one query row (o is scratch of D doubles).
  void dq_row(int b, int h, int i, double* s_row, double* o, double* dq) const {
    const int D = dm_.D;
    const double lse = forward_row(b, h, i, s_row, o);
    std::fill(dq, dq + D, 0.0);
    if (lse == kNegInf) return;  // no visible key: no gradient flows
    const double* dO = dout(b, h, i);
    const double Di = delta(b, h, i, o);
    const int g = h / group_;
    for (int j = 0; j < dm_.S_k; ++j) {
      if (s_row[j] == kNegInf) continue;
      axpy<Acc>(dscore(prob(s_row[j], lse), dO, v(b, g, j), Di), k(b, g, j), dq, D);
    }
    for (int d = 0; d < D; ++d) dq[d] = arith_.stored(static_cast<Acc>(in_.scale) * static_cast<Acc>(dq[d]));
  }

  // dK_j and dV_j for `count` keys js[0, count) of kv head g at once, given lse_i and D_i of the
  // group's query rows, indexed [(h - g * group) * S_q + i]: the keys share each query row's and
  // dO row's trip from memory; per key the sum runs over (h, i) in order, as for one key alone.
  void dkdv_tile(int b, int g, const int* js, int count, const double* lse, const double* Dt, double* const* dk,
                 double* const* dv) const {
    const int D = dm_.D;
    // The tile's key and value rows, transposed once for every query row's dot products.
    std::vector<Acc> kt(size_t(kKeyBlock) * D), vt(size_t(kKeyBlock) * D);
    {
      std::array<const double*, kKeyBlock> krows, vrows;
      for (int t = 0; t < count; ++t) krows[t] = k(b, g, js[t]), vrows[t] = v(b, g, js[t]);
      transpose_block(krows.data(), count, D, kt.data());
      transpose_block(vrows.data(), count, D, vt.data());
    }
    std::vector<Acc> dk_acc(size_t(count) * D, Acc(0)), dv_acc(size_t(count) * D, Acc(0));
    // Query rows in groups of kQueryGroup: their dot products with the tile together, then their
    // terms added in query order, as one row at a time.
    constexpr int kQueryGroup = 4;
    std::array<std::vector<Acc>, kQueryGroup> q_buf, do_buf;
    for (int hh = 0; hh < group_; ++hh) {
      const int h = g * group_ + hh;
      for (int i0 = 0; i0 < dm_.S_q; i0 += kQueryGroup) {
        std::array<int, kQueryGroup> rows;
        std::array<std::array<bool, kKeyBlock>, kQueryGroup> vis{};
        std::array<const Acc*, kQueryGroup> qa, da;
        int nr = 0;
        for (int i = i0; i < std::min(i0 + kQueryGroup, dm_.S_q); ++i) {
          if (lse[static_cast<int64_t>(hh) * dm_.S_q + i] == kNegInf) continue;
          bool any = false;
          for (int t = 0; t < count; ++t) any |= vis[nr][t] = visible(b, i, js[t]);
          if (!any) continue;
          qa[nr] = row_in(q(b, h, i), D, q_buf[nr]);
          da[nr] = row_in(dout(b, h, i), D, do_buf[nr]);
          rows[nr++] = i;
        }
        if (nr == 0) continue;
        Acc qk[kQueryGroup][kKeyBlock], dp[kQueryGroup][kKeyBlock];
        block_dots(qa.data(), nr, kt.data(), D, qk);
        block_dots(da.data(), nr, vt.data(), D, dp);
        for (int t = 0; t < count; ++t) {
          std::array<Acc, kQueryGroup> ds, p;
          std::array<const Acc*, kQueryGroup> qx, dx;
          int terms = 0;
          for (int m = 0; m < nr; ++m) {  // in query order
            if (!vis[m][t]) continue;
            const int i = rows[m];
            const double s = score_of(qk[m][t], b, h, i, js[t]);
            if (s == kNegInf) continue;
            const double pi = prob(s, lse[static_cast<int64_t>(hh) * dm_.S_q + i]);
            ds[terms] = static_cast<Acc>(dscore_of(pi, dp[m][t], Dt[static_cast<int64_t>(hh) * dm_.S_q + i]));
            p[terms] = static_cast<Acc>(pi);
            qx[terms] = qa[m];
            dx[terms++] = da[m];
          }
          if (terms == 0) continue;
          axpy_terms(ds.data(), qx.data(), terms, dk_acc.data() + int64_t(t) * D, D);
          axpy_terms(p.data(), dx.data(), terms, dv_acc.data() + int64_t(t) * D, D);
        }
      }
    }
    for (int t = 0; t < count; ++t)
      for (int d = 0; d < D; ++d) {
        dk[t][d] = arith_.stored(static_cast<Acc>(in_.scale) * dk_acc[int64_t(t) * D + d]);
        dv[t][d] = arith_.stored(dv_acc[int64_t(t) * D + d]);
      }
  }

 private:
  int64_t row_index(int b, int h, int heads, int S, int i) const {
    return ((static_cast<int64_t>(b) * heads + h) * S + i) * dm_.D;
  }

  const RefInputs& in_;
  Dims dm_;
  Arith arith_;
  int group_ = 1;
  int64_t offset_ = 0;
};

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

void check_baseline_dtype(DType dtype) {
  if (dtype != DType::F16 && dtype != DType::BF16)
    throw RuntimeError(std::string("baseline: defined for fp16 and bf16, not ") + dtype_name(dtype));
}

}  // namespace

// This copy's entry points: the oracle's arithmetic (baseline_dtype null) or the dtype's baseline.
void run_forward_rows(const RefInputs& in, const DType* baseline_dtype, const std::vector<RowId>& rows, double* o,
                      double* lse) {
  if (!baseline_dtype) return forward_rows(in, Exact{}, rows, o, lse);
  check_baseline_dtype(*baseline_dtype);
  forward_rows(in, InDtype{*baseline_dtype}, rows, o, lse);
}
void run_backward_rows(const RefInputs& in, const DType* baseline_dtype, const std::vector<RowId>& q_rows, double* dq,
                       const std::vector<RowId>& k_rows, double* dk, double* dv) {
  if (!baseline_dtype) return backward_rows(in, Exact{}, q_rows, dq, k_rows, dk, dv);
  check_baseline_dtype(*baseline_dtype);
  backward_rows(in, InDtype{*baseline_dtype}, q_rows, dq, k_rows, dk, dv);
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

bool use_avx2_copy() {
#ifdef FLASHATTN_HAVE_REFERENCE_AVX2
  static const bool cpu_has_avx2 = __builtin_cpu_supports("avx2");
  const char* forced = std::getenv("FLASHATTN_REFERENCE_ISA");
  return cpu_has_avx2 && !(forced && std::string(forced) == "baseline");
#else
  return false;
#endif
}

void forward_copy(const RefInputs& in, const DType* baseline_dtype, const std::vector<RowId>& rows, double* o,
                  double* lse) {
#ifdef FLASHATTN_HAVE_REFERENCE_AVX2
  if (use_avx2_copy()) return reference_copy::avx2::run_forward_rows(in, baseline_dtype, rows, o, lse);
#endif
  reference_copy::baseline::run_forward_rows(in, baseline_dtype, rows, o, lse);
}

std::vector<RowId> all_rows(int B, int heads, int S) {
  std::vector<RowId> rows;
  rows.reserve(static_cast<size_t>(B) * heads * S);
  for (int b = 0; b < B; ++b)
    for (int h = 0; h < heads; ++h)
      for (int i = 0; i < S; ++i) rows.push_back({b, h, i});
  return rows;
}

void backward_copy(const RefInputs& in, const DType* baseline_dtype, const std::vector<RowId>& q_rows, double* dq,
                   const std::vector<RowId>& k_rows, double* dk, double* dv) {
#ifdef FLASHATTN_HAVE_REFERENCE_AVX2
  if (use_avx2_copy()) return reference_copy::avx2::run_backward_rows(in, baseline_dtype, q_rows, dq, k_rows, dk, dv);
#endif
  reference_copy::baseline::run_backward_rows(in, baseline_dtype, q_rows, dq, k_rows, dk, dv);
}

}  // namespace

const char* reference_instruction_set() { return use_avx2_copy() ? "avx2" : "baseline"; }

void reference_forward_rows(const RefInputs& in, const std::vector<RowId>& rows, double* o, double* lse) {
  forward_copy(in, nullptr, rows, o, lse);
}

void reference_backward_rows(const RefInputs& in, const std::vector<RowId>& q_rows, double* dq,
                             const std::vector<RowId>& k_rows, double* dk, double* dv) {
  backward_copy(in, nullptr, q_rows, dq, k_rows, dk, dv);
}

void baseline_forward_rows(const RefInputs& in, DType dtype, const std::vector<RowId>& rows, double* o, double* lse) {
  forward_copy(in, &dtype, rows, o, lse);
}

void baseline_backward_rows(const RefInputs& in, DType dtype, const std::vector<RowId>& q_rows, double* dq,
                            const std::vector<RowId>& k_rows, double* dk, double* dv) {
  backward_copy(in, &dtype, q_rows, dq, k_rows, dk, dv);
}

void reference_forward(const RefInputs& in, double* o, double* lse) {
  const Dims& d = in.dims;
  reference_forward_rows(in, all_rows(d.B, d.H, d.S_q), o, lse);
}

void reference_backward(const RefInputs& in, double* dq, double* dk, double* dv) {
  const Dims& d = in.dims;
  reference_backward_rows(in, all_rows(d.B, d.H, d.S_q), dq,
                          all_rows(d.B, d.H_kv, d.S_k), dk, dv);
}
#endif  // FLASHATTN_REFERENCE_AVX2_COPY

}  // namespace flashattn

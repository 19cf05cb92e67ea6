// The reference's model of attention (reference.cpp): the arithmetic of the oracle (fp64) and of
// the same-dtype baseline, and the problem as reference.h's definitions state it, row tiles at a
// time. Included by reference.cpp alone, inside each of its two copies' namespaces
// (FLASHATTN_REFERENCE_COPY; reference_blocks.h says why).
#pragma once

#ifndef FLASHATTN_REFERENCE_COPY
#error "reference_model.h belongs to reference.cpp, which names the copy"
#endif

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>
#include <vector>

#include "array.h"
#include "reference.h"
#include "reference_blocks.h"

namespace flashattn::reference_copy::FLASHATTN_REFERENCE_COPY::model {

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

inline double dot(const double* a, const double* b, int n, double) { return dot_f64(a, b, n); }

// fp32: one running sum in element order, as a thread of the naive kernel accumulates.
inline float dot(const double* a, const double* b, int n, float) {
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

}  // namespace flashattn::reference_copy::FLASHATTN_REFERENCE_COPY::model

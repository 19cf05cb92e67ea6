// naive, backward — rung 1 of the ladder: the gradient formulas evaluated one output element per
// thread, every intermediate materialised in global memory, with the rounding points of the
// same-dtype baseline of backward (reference.h).
//   P_ij  = exp(scale * q_i.k_j + mask_ij - lse_i)   recomputed from the forward's lse, stored in dtype
//   D_i   = rowsum(dO_i * O_i)                       fp32
//   dS_ij = P_ij (dO_i.v_j - D_i)                    fp32 accumulate, stored in dtype
//   dQ_i  = scale * sum_j dS_ij k_j
//   dK_j  = scale * sum_{h in group} sum_i dS_ij q_i
//   dV_j  = sum_{h in group} sum_i P_ij dO_i         fp32 accumulate, outputs in dtype
// Each dK/dV element is summed by one thread over the query heads of its kv group and the visible
// queries, so there are no atomics and results are bitwise reproducible.
// Limits: fp32/fp16/bf16, any head dim, every feature; workspace P and dS ([B, H, S_q, S_k] in
// the dtype) plus D ([B, H, S_q] fp32).
// Measured: see README.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "common/dtype.cuh"
#include "common/mask.cuh"
#include "common/switch.h"
#include "flashattn/check.h"
#include "flashattn/error.h"
#include "flashattn/registry.h"

namespace flashattn {
namespace naive_bwd {

constexpr int kThreads = 256;

inline size_t align256(size_t n) { return (n + 255) / 256 * 256; }

inline unsigned blocks_for(int64_t n, int per_block) {
  const int64_t blocks = (n + per_block - 1) / per_block;
  return static_cast<unsigned>(blocks < (int64_t{1} << 24) ? blocks : (int64_t{1} << 24));
}

template <class T>
struct Args {
  const T* q = nullptr;
  const T* k = nullptr;
  const T* v = nullptr;
  const T* o = nullptr;
  const T* dout = nullptr;
  const float* lse = nullptr;  // [B, H, S_q]
  T* dq = nullptr;
  T* dk = nullptr;
  T* dv = nullptr;
  Strides q_st, k_st, v_st, o_st, do_st, dq_st, dk_st, dv_st;
  int B = 0, H = 0, H_kv = 0, S_q = 0, S_k = 0, D = 0;
  float scale = 0.f;
  Visibility vis;
  T* p = nullptr;          // workspace: [B, H, S_q, S_k]
  T* ds = nullptr;         // workspace: [B, H, S_q, S_k]
  float* delta = nullptr;  // workspace: [B, H, S_q], D_i
};

// Flat index over [B, H, S_q, X] -> (b, h, i, x) with row = (b*H + h)*S_q + i.
struct RowCoords {
  int64_t b, h, i, x, row;
};
FLASHATTN_HD inline RowCoords row_coords(int64_t e, int64_t X, int S_q, int H) {
  RowCoords c;
  c.x = e % X;
  c.row = e / X;
  c.i = c.row % S_q;
  const int64_t bh = c.row / S_q;
  c.h = bh % H;
  c.b = bh / H;
  return c;
}

// P[b, h, i, j] from the same score expression as the forward, so it is the forward's P.
template <class T>
FLASHATTN_HD inline void probs_at(const Args<T>& a, int64_t e) {
  const RowCoords c = row_coords(e, a.S_k, a.S_q, a.H);
  const int64_t g = c.h / (a.H / a.H_kv);
  const float lse = a.lse[c.row];
  float p = 0.f;
  if (lse != -INFINITY && a.vis.visible(c.i, c.x, a.vis.seqlen_k(c.b))) {
    const T* q_row = a.q + c.b * a.q_st.batch + c.h * a.q_st.head + c.i * a.q_st.row;
    const T* k_row = a.k + c.b * a.k_st.batch + g * a.k_st.head + c.x * a.k_st.row;
    const float s = a.scale * dot_f32(q_row, k_row, a.D) + a.vis.bias(c.b, c.h, c.i, c.x);
    p = expf(s - lse);
  }
  a.p[e] = from_float<T>(p);
}

// D_i = sum_d dO[i, d] * O[i, d], one thread per query row.
template <class T>
FLASHATTN_HD inline void delta_at(const Args<T>& a, int64_t row) {
  const int64_t i = row % a.S_q, bh = row / a.S_q;
  const int64_t h = bh % a.H, b = bh / a.H;
  const T* do_row = a.dout + b * a.do_st.batch + h * a.do_st.head + i * a.do_st.row;
  const T* o_row = a.o + b * a.o_st.batch + h * a.o_st.head + i * a.o_st.row;
  a.delta[row] = dot_f32(do_row, o_row, a.D);
}

// dS[b, h, i, j] = P (dP - D_i) with dP = dO_i . v_j; a zero P (invisible, masked, empty row)
// needs no dP.
template <class T>
FLASHATTN_HD inline void dscores_at(const Args<T>& a, int64_t e) {
  const float p = to_float(a.p[e]);
  float ds = 0.f;
  if (p != 0.f) {
    const RowCoords c = row_coords(e, a.S_k, a.S_q, a.H);
    const int64_t g = c.h / (a.H / a.H_kv);
    const T* do_row = a.dout + c.b * a.do_st.batch + c.h * a.do_st.head + c.i * a.do_st.row;
    const T* v_row = a.v + c.b * a.v_st.batch + g * a.v_st.head + c.x * a.v_st.row;
    ds = p * (dot_f32(do_row, v_row, a.D) - a.delta[c.row]);
  }
  a.ds[e] = from_float<T>(ds);
}

// dQ[b, h, i, d] = scale * sum over visible j of dS_ij K[j, d].
template <class T>
FLASHATTN_HD inline void dq_at(const Args<T>& a, int64_t e) {
  const RowCoords c = row_coords(e, a.D, a.S_q, a.H);
  const int64_t g = c.h / (a.H / a.H_kv);
  const IndexRange keys = a.vis.keys(c.i, a.vis.seqlen_k(c.b));
  const T* ds_row = a.ds + c.row * a.S_k;
  const T* k_col = a.k + c.b * a.k_st.batch + g * a.k_st.head + c.x;
  float acc = 0.f;
  for (int64_t j = keys.begin; j < keys.end; ++j)
    acc += to_float(ds_row[j]) * to_float(k_col[j * a.k_st.row]);
  a.dq[c.b * a.dq_st.batch + c.h * a.dq_st.head + c.i * a.dq_st.row + c.x] = from_float<T>(a.scale * acc);
}

// dK[b, g, j, d] and dV[b, g, j, d]: sums over the group's query heads (in head order) and the
// queries that see key j (in query order).
template <class T>
FLASHATTN_HD inline void dkdv_at(const Args<T>& a, int64_t e) {
  const RowCoords c = row_coords(e, a.D, a.S_k, a.H_kv);  // here h is the kv head g, i the key j
  const int64_t g = c.h, j = c.i, d = c.x;
  const int G = a.H / a.H_kv;
  const IndexRange queries = a.vis.queries(j, a.vis.seqlen_k(c.b));
  float acc_k = 0.f, acc_v = 0.f;
  for (int r = 0; r < G; ++r) {
    const int64_t h = g * G + r;
    const int64_t row0 = (c.b * a.H + h) * a.S_q;  // row of query 0 of head h
    const T* q_col = a.q + c.b * a.q_st.batch + h * a.q_st.head + d;
    const T* do_col = a.dout + c.b * a.do_st.batch + h * a.do_st.head + d;
    for (int64_t i = queries.begin; i < queries.end; ++i) {
      const int64_t pj = (row0 + i) * a.S_k + j;
      acc_k += to_float(a.ds[pj]) * to_float(q_col[i * a.q_st.row]);
      acc_v += to_float(a.p[pj]) * to_float(do_col[i * a.do_st.row]);
    }
  }
  a.dk[c.b * a.dk_st.batch + g * a.dk_st.head + j * a.dk_st.row + d] = from_float<T>(a.scale * acc_k);
  a.dv[c.b * a.dv_st.batch + g * a.dv_st.head + j * a.dv_st.row + d] = from_float<T>(acc_v);
}

// One grid-stride kernel per stage; the stage is the function applied to each flat index.
enum class Stage { kProbs, kDelta, kDScores, kDQ, kDKDV };

template <class T, Stage kStage>
__global__ void stage_kernel(Args<T> a, int64_t n) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if constexpr (kStage == Stage::kProbs) probs_at(a, e);
    if constexpr (kStage == Stage::kDelta) delta_at(a, e);
    if constexpr (kStage == Stage::kDScores) dscores_at(a, e);
    if constexpr (kStage == Stage::kDQ) dq_at(a, e);
    if constexpr (kStage == Stage::kDKDV) dkdv_at(a, e);
  }
}

size_t workspace_bytes(const BwdParams& p) {
  const size_t rows = static_cast<size_t>(p.B) * p.H * p.S_q;
  const size_t n = rows * p.S_k;
  return 2 * align256(n * dtype_size(p.dtype)) + align256(rows * sizeof(float));
}

template <class T>
Args<T> make_args(const BwdParams& p) {
  Args<T> a;
  a.q = static_cast<const T*>(p.q);
  a.k = static_cast<const T*>(p.k);
  a.v = static_cast<const T*>(p.v);
  a.o = static_cast<const T*>(p.o);
  a.dout = static_cast<const T*>(p.dout);
  a.lse = static_cast<const float*>(p.lse);
  a.dq = static_cast<T*>(p.dq);
  a.dk = static_cast<T*>(p.dk);
  a.dv = static_cast<T*>(p.dv);
  a.q_st = p.q_st;
  a.k_st = p.k_st;
  a.v_st = p.v_st;
  a.o_st = p.o_st;
  a.do_st = p.do_st;
  a.dq_st = p.dq_st;
  a.dk_st = p.dk_st;
  a.dv_st = p.dv_st;
  a.B = p.B;
  a.H = p.H;
  a.H_kv = p.H_kv;
  a.S_q = p.S_q;
  a.S_k = p.S_k;
  a.D = p.D;
  a.scale = p.scale;
  a.vis = make_visibility(p);
  const size_t rows = static_cast<size_t>(p.B) * p.H * p.S_q;
  const size_t n = rows * p.S_k;
  char* ws = static_cast<char*>(p.workspace);
  a.p = reinterpret_cast<T*>(ws);
  a.ds = reinterpret_cast<T*>(ws + align256(n * sizeof(T)));
  a.delta = reinterpret_cast<float*>(ws + 2 * align256(n * sizeof(T)));
  return a;
}

template <class T>
void launch(const BwdParams& p, const LaunchContext& ctx) {
  const Args<T> a = make_args<T>(p);
  const int64_t rows = static_cast<int64_t>(p.B) * p.H * p.S_q;
  const int64_t n_scores = rows * p.S_k;
  const int64_t n_dq = rows * p.D;
  const int64_t n_dkdv = static_cast<int64_t>(p.B) * p.H_kv * p.S_k * p.D;
  cudaStream_t st = ctx.stream;
  stage_kernel<T, Stage::kProbs><<<blocks_for(n_scores, kThreads), kThreads, 0, st>>>(a, n_scores);
  CHECK_LAUNCH("naive probs stage");
  stage_kernel<T, Stage::kDelta><<<blocks_for(rows, kThreads), kThreads, 0, st>>>(a, rows);
  CHECK_LAUNCH("naive delta stage");
  stage_kernel<T, Stage::kDScores><<<blocks_for(n_scores, kThreads), kThreads, 0, st>>>(a, n_scores);
  CHECK_LAUNCH("naive dscores stage");
  stage_kernel<T, Stage::kDQ><<<blocks_for(n_dq, kThreads), kThreads, 0, st>>>(a, n_dq);
  CHECK_LAUNCH("naive dq stage");
  stage_kernel<T, Stage::kDKDV><<<blocks_for(n_dkdv, kThreads), kThreads, 0, st>>>(a, n_dkdv);
  CHECK_LAUNCH("naive dkdv stage");
}

void run(const BwdParams& p, const LaunchContext& ctx) {
  if (static_cast<int64_t>(p.B) * p.H * p.S_q * p.S_k * p.D == 0) return;
  if (p.H_kv <= 0 || p.H % p.H_kv != 0) throw RuntimeError("naive backward: H must be a multiple of H_kv");
  if (p.workspace == nullptr || p.workspace_bytes < workspace_bytes(p))
    throw RuntimeError("naive backward: workspace smaller than its workspace function asked for");
  DTYPE_SWITCH(p.dtype, T, [&] { launch<T>(p, ctx); });
}

KernelMode make_entry() {
  KernelMode m;
  m.kernel = "naive";
  m.mode = Mode::Backward;
  m.summary = "materialised attention: P, dS in memory, one thread per gradient element, no atomics";
  m.rung = 1;
  m.gpu = true;
  m.min_sm = 70;  // as the forward: plain CUDA, bf16 conversions emulated below sm_80
  m.dtypes = dtype_bit(DType::F32) | dtype_bit(DType::F16) | dtype_bit(DType::BF16);
  m.max_head_dim = 0;
  m.features = kAllFeatures;
  m.uses_atomics = false;
  m.bwd = &run;
  m.bwd_workspace = &workspace_bytes;
  return m;
}

}  // namespace naive_bwd
}  // namespace flashattn

FLASHATTN_REGISTER_KERNEL_MODE(naive_backward, flashattn::naive_bwd::make_entry)

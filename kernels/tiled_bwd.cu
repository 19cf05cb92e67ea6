// tiled, backward — rung 3 of the ladder: standard attention backward on the tiled fp32 GEMM of
// common/tiled_gemm.cuh, the probabilities materialised in global memory. Six launches, in order:
//   P = exp(scale * Q K^T + mask - lse)     score GEMM, P from the forward's lse (0 if invisible)
//   D_i = rowsum(dO_i * O_i)                 one warp per row
//   dV = sum over the group's heads of P^T dO            output GEMM, heads summed as rounds
//   dP = dO V^T;  dS = P * (dP - D_i)        score GEMM whose epilogue writes dS over P
//   dQ = scale * dS K                        output GEMM
//   dK = scale * sum over the group's heads of dS^T Q    output GEMM, heads summed as rounds
// GQA: a kv head's dK/dV entry reduces over (query head of its group, query) inside one GEMM, so
// there are no atomics and results are bitwise reproducible. dV must run before the dS GEMM
// overwrites P; that ordering lets one S_q x S_k buffer serve both. Score tiles with no visible
// key skip their main loop and the output GEMMs reduce over visible keys/queries only.
//
// What limits it: each score makes six trips through DRAM, 24 bytes in fp32 (P written; read by
// dV; read and dS written by the dS GEMM; dS read by dQ and by dK), against 10*D FLOPs in five
// GEMMs. Unlike the forward there is no standalone memory pass (the softmax-backward is the dS
// GEMM's epilogue), so the GEMMs set the pace; expected about 15-20 TFLOP/s at S = 4096, D = 64 on
// an H100/H200. dV and dK read P/dS transposed, still coalesced: a warp reads 32 consecutive keys
// of one query row.
//
// Limits: fp32 only; any head dim; every feature; sm_70+. Workspace: the [B, H, S_q, ld] fp32
// matrix (ld = S_k rounded up to 4) plus D_i, [B, H, S_q] fp32.
// Instantiations: 5 kernels per arch (P GEMM, dS GEMM, output GEMM with A and with A^T, D_i).
// Measured: see README.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "common/mask.cuh"
#include "common/tiled_gemm.cuh"
#include "flashattn/check.h"
#include "flashattn/error.h"
#include "flashattn/registry.h"

namespace flashattn {
namespace tiled_bwd {

constexpr int kDeltaThreads = 256;

// P_ij = exp(s_ij - lse_i) with s_ij recomputed exactly as the forward did (same GEMM, same
// ScoreRule); 0 for invisible keys (s = -inf) and empty rows (lse = -inf).
struct ProbStage {
  tiled::ScoreRule rule;
  tiled::ScoreMatrix p;
  const float* lse = nullptr;
  __device__ IndexRange k_range(int64_t b, int, int m0, int m_end, int n0, int n_end) const {
    return rule.k_range(b, m0, m_end, n0, n_end);
  }
  __device__ void store(int64_t b, int h, int i, int j, float4 qk) const {
    const float4 s = rule.scores(b, h, i, j, qk);
    const float row_lse = lse[p.row_index(b, h, i)];
    float4 out = make_float4(0.f, 0.f, 0.f, 0.f);
    if (row_lse != -INFINITY)
      out = make_float4(expf(s.x - row_lse), expf(s.y - row_lse), expf(s.z - row_lse), expf(s.w - row_lse));
    *reinterpret_cast<float4*>(p.row(b, h, i) + j) = out;
  }
};

// dS_ij = P_ij (dP_ij - D_i), read-modify-write of the chunk this thread alone owns. Where P is 0
// (invisible, padding columns, empty rows) dS is 0 whatever dP is.
struct DsStage {
  tiled::ScoreRule rule;  // only for the tile-skipping range
  tiled::ScoreMatrix buf;  // P in, dS out
  const float* delta = nullptr;
  __device__ IndexRange k_range(int64_t b, int, int m0, int m_end, int n0, int n_end) const {
    return rule.k_range(b, m0, m_end, n0, n_end);
  }
  __device__ void store(int64_t b, int h, int i, int j, float4 dp) const {
    float4* ptr = reinterpret_cast<float4*>(buf.row(b, h, i) + j);
    const float4 p = *ptr;
    const float d = delta[buf.row_index(b, h, i)];
    const float4 ds = make_float4(p.x == 0.f ? 0.f : p.x * (dp.x - d), p.y == 0.f ? 0.f : p.y * (dp.y - d),
                                  p.z == 0.f ? 0.f : p.z * (dp.z - d), p.w == 0.f ? 0.f : p.w * (dp.w - d));
    *ptr = ds;
  }
};

// D_i = sum_d dO[i, d] * O[i, d], one warp per row.
__global__ void __launch_bounds__(kDeltaThreads)
    delta_kernel(const float* o, Strides o_st, const float* dout, Strides do_st, float* delta, int H, int S_q,
                 int D, int64_t rows) {
  const int lane = threadIdx.x % 32;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (kDeltaThreads / 32);
  for (int64_t row = (blockIdx.x * static_cast<int64_t>(kDeltaThreads) + threadIdx.x) / 32; row < rows;
       row += warps) {  // warp-uniform
    const int64_t i = row % S_q, bh = row / S_q;
    const int64_t h = bh % H, b = bh / H;
    const float* o_row = o + b * o_st.batch + h * o_st.head + i * o_st.row;
    const float* do_row = dout + b * do_st.batch + h * do_st.head + i * do_st.row;
    float part = 0.f;
    for (int d = lane; d < D; d += 32) part += do_row[d] * o_row[d];
    for (int off = 16; off > 0; off /= 2) part += __shfl_xor_sync(0xffffffffu, part, off);
    if (lane == 0) delta[row] = part;
  }
}

size_t workspace_bytes(const BwdParams& p) {
  const size_t delta = static_cast<size_t>(p.B) * p.H * p.S_q * sizeof(float);
  return tiled::ScoreMatrix::bytes(p.B, p.H, p.S_q, p.S_k) + delta;
}

// A per-query-head tensor as the operand of a per-kv-head product: entry c = kv head, round r =
// the r-th query head of its group (c*G + r).
tiled::Operand group_operand(const void* ptr, const Strides& st, int G) {
  Strides grouped = st;
  grouped.head = st.head * G;
  return tiled::tensor_operand(ptr, grouped, /*head_div=*/1, /*round=*/st.head);
}

void run(const BwdParams& p, const LaunchContext& ctx) {
  if (static_cast<int64_t>(p.B) * p.H * p.S_q * p.S_k * p.D == 0) return;
  if (p.dtype != DType::F32) throw RuntimeError("tiled backward: fp32 only");
  if (p.H_kv <= 0 || p.H % p.H_kv != 0) throw RuntimeError("tiled backward: H must be a multiple of H_kv");
  if (p.workspace == nullptr || p.workspace_bytes < workspace_bytes(p))
    throw RuntimeError("tiled backward: workspace smaller than its workspace function asked for");
  if (reinterpret_cast<uintptr_t>(p.workspace) % 16 != 0)
    throw RuntimeError("tiled backward: workspace not 16-byte aligned");
  const int G = p.H / p.H_kv;
  const Visibility vis = make_visibility(p);
  const tiled::ScoreMatrix buf = tiled::score_matrix(p.workspace, p);
  // ScoreMatrix::bytes is a multiple of 16, so D_i starts aligned right after it.
  float* delta = reinterpret_cast<float*>(static_cast<char*>(p.workspace) +
                                          tiled::ScoreMatrix::bytes(p.B, p.H, p.S_q, p.S_k));
  tiled::ScoreRule rule;
  rule.vis = vis;
  rule.scale = p.scale;
  rule.D = p.D;

  // P: M = S_q, N = S_k, K = D, as the forward's score GEMM.
  tiled::GemmProblem qk;
  qk.M = p.S_q;
  qk.N = p.S_k;
  qk.K = p.D;
  qk.batch = p.B;
  qk.heads = p.H;
  qk.a = tiled::tensor_operand(p.q, p.q_st);
  qk.b = tiled::tensor_operand(p.k, p.k_st, /*head_div=*/G);
  ProbStage prob;
  prob.rule = rule;
  prob.p = buf;
  prob.lse = static_cast<const float*>(p.lse);
  tiled::launch_gemm<tiled::ScoreTile, /*kTransA=*/false, /*kTransB=*/true>(qk, prob, ctx.stream,
                                                                            "launch of tiled P GEMM");

  const int64_t rows = static_cast<int64_t>(p.B) * p.H * p.S_q;
  const int64_t delta_blocks = (rows + kDeltaThreads / 32 - 1) / (kDeltaThreads / 32);
  const unsigned delta_grid =
      static_cast<unsigned>(delta_blocks < (int64_t{1} << 24) ? delta_blocks : (int64_t{1} << 24));
  delta_kernel<<<delta_grid, kDeltaThreads, 0, ctx.stream>>>(static_cast<const float*>(p.o), p.o_st,
                                                             static_cast<const float*>(p.dout), p.do_st,
                                                             delta, p.H, p.S_q, p.D, rows);
  CHECK_LAUNCH("tiled delta_kernel");

  // Outputs of the head-dim-wide GEMMs; rows are keys for dK/dV (per kv head), queries for dQ.
  auto output = [&](void* ptr, const Strides& st, float alpha, bool rows_are_keys) {
    tiled::OutputStage out;
    out.out = static_cast<float*>(ptr);
    out.st = st;
    out.N = p.D;
    out.alpha = alpha;
    out.vis = vis;
    out.rows_are_keys = rows_are_keys;
    return out;
  };
  // dV, dK: M = S_k, N = D, K = S_q in G rounds; A = P^T or dS^T (the buffer, read transposed).
  tiled::GemmProblem kv;
  kv.M = p.S_k;
  kv.N = p.D;
  kv.K = p.S_q;
  kv.batch = p.B;
  kv.heads = p.H_kv;
  kv.rounds = G;
  kv.a = buf.operand(/*group=*/G);

  // dV = sum_r P_r^T dO_r
  kv.b = group_operand(p.dout, p.do_st, G);
  tiled::launch_gemm<tiled::OutputTile, /*kTransA=*/true, /*kTransB=*/false>(
      kv, output(p.dv, p.dv_st, /*alpha=*/1.f, /*rows_are_keys=*/true), ctx.stream,
      "launch of tiled dV GEMM");

  // dP = dO V^T (M = S_q, N = S_k, K = D; V stored as B^T), dS over P in the epilogue.
  tiled::GemmProblem dov;
  dov.M = p.S_q;
  dov.N = p.S_k;
  dov.K = p.D;
  dov.batch = p.B;
  dov.heads = p.H;
  dov.a = tiled::tensor_operand(p.dout, p.do_st);
  dov.b = tiled::tensor_operand(p.v, p.v_st, /*head_div=*/G);
  DsStage ds;
  ds.rule = rule;
  ds.buf = buf;
  ds.delta = delta;
  tiled::launch_gemm<tiled::ScoreTile, /*kTransA=*/false, /*kTransB=*/true>(dov, ds, ctx.stream,
                                                                            "launch of tiled dS GEMM");

  // dQ = scale * dS K: M = S_q, N = D, K = S_k.
  tiled::GemmProblem dsk;
  dsk.M = p.S_q;
  dsk.N = p.D;
  dsk.K = p.S_k;
  dsk.batch = p.B;
  dsk.heads = p.H;
  dsk.a = buf.operand(/*group=*/1);
  dsk.b = tiled::tensor_operand(p.k, p.k_st, /*head_div=*/G);
  tiled::launch_gemm<tiled::OutputTile, /*kTransA=*/false, /*kTransB=*/false>(
      dsk, output(p.dq, p.dq_st, /*alpha=*/p.scale, /*rows_are_keys=*/false), ctx.stream,
      "launch of tiled dQ GEMM");

  // dK = scale * sum_r dS_r^T Q_r
  kv.b = group_operand(p.q, p.q_st, G);
  tiled::launch_gemm<tiled::OutputTile, /*kTransA=*/true, /*kTransB=*/false>(
      kv, output(p.dk, p.dk_st, /*alpha=*/p.scale, /*rows_are_keys=*/true), ctx.stream,
      "launch of tiled dK GEMM");
}

KernelMode make_entry() {
  KernelMode m;
  m.kernel = "tiled";
  m.mode = Mode::Backward;
  m.summary = "shared-memory tiled GEMMs + row softmax, attention matrix materialised (fp32 CUDA cores)";
  m.rung = 3;
  m.gpu = true;
  m.min_sm = 70;  // as the forward
  m.dtypes = dtype_bit(DType::F32);
  m.head_dims = {};
  m.max_head_dim = 0;  // any D
  m.features = kAllFeatures;
  m.uses_atomics = false;
  m.bwd = &run;
  m.bwd_workspace = &workspace_bytes;
  return m;
}

}  // namespace tiled_bwd
}  // namespace flashattn

FLASHATTN_REGISTER_KERNEL_MODE(tiled_backward, flashattn::tiled_bwd::make_entry)

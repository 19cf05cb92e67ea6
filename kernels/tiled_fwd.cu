// tiled, forward — rung 3 of the ladder: standard (materialised) attention on our own GEMMs.
// Over naive (one thread per output, every operand read from global memory) it stages operand
// tiles in shared memory and register micro-tiles (common/tiled_gemm.cuh): each element loaded
// into shared memory serves a 128-wide row or column of outputs, each value read from shared
// memory serves 8 FFMAs. Over cublas it shows what such a GEMM is made of, on plain fp32 CUDA
// cores. The attention matrix still goes through global memory, which rungs 4 and 5 remove.
// Three launches:
//   S = scale * Q K^T (+ mask; invisible keys -> -inf)   tiled GEMM, S in the workspace (fp32)
//   m_i = rowmax(S_i); l_i = rowsum(exp(S_i - m_i)); lse_i = m_i + log(l_i); P_i = exp(S_i - lse_i)
//                                                        one block per row, P written over S
//   O = P V                                              tiled GEMM, reduction cut to visible keys
// Score tiles with no visible key skip their main loop, so causal does about half the FLOPs.
//
// What limits it: each score makes four trips through DRAM, 16 bytes in fp32 (the GEMM writes S,
// the softmax reads S and writes P, the second GEMM reads P; the softmax's second read of a row
// and, for D > 64, the O GEMM's further column tiles mostly hit L2), 20 with a mask. At B4 H8
// S4096 that is 537M scores, 8.6 GB. Per score the GEMMs do 4*D FLOPs, 16 FLOP/byte at D = 64, so
// the GEMMs themselves stay compute-bound (a simple 128x128 SGEMM reaches about half of the ~67
// TFLOP/s fp32 peak of an H100/H200 SXM), but the softmax is a pure memory pass of 8 bytes per
// score, about a quarter of the time. Expected: about 15-20 TFLOP/s at S = 4096, D = 64. D = 32
// leaves half of the O GEMM's 64-wide column tile idle.
//
// Limits: fp32 only; any head dim (the GEMMs predicate every edge); every feature; sm_70+ (plain
// CUDA, 17 KB of static shared memory). Workspace: B*H*S_q*ld floats, ld = S_k rounded up to 4.
// Instantiations: 3 kernels per arch (score GEMM, softmax, output GEMM); no head-dim dispatch.
// Always deterministic (no atomics; every reduction has a fixed order).
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
namespace tiled_fwd {

constexpr int kSoftmaxThreads = 128;
constexpr int kUnroll = 4;  // float4 loads in flight per thread: the pass is bound by memory latency

// S = scale * Q K^T + mask, -inf where invisible, stored as whole float4 chunks (padding columns
// are invisible, so they get -inf too).
struct ScoreStage {
  tiled::ScoreRule rule;
  tiled::ScoreMatrix s;
  __device__ IndexRange k_range(int64_t b, int, int m0, int m_end, int n0, int n_end) const {
    return rule.k_range(b, m0, m_end, n0, n_end);
  }
  __device__ void store(int64_t b, int h, int i, int j, float4 qk) const {
    *reinterpret_cast<float4*>(s.row(b, h, i) + j) = rule.scores(b, h, i, j, qk);
  }
};

// Softmax statistics: m the running max, l the sum of exp(s - m); m = -inf: no finite score yet.
struct RowStats {
  float m = -INFINITY;
  float l = 0.f;
};

// Symmetric in a and b, so the two lanes of a shuffle pair compute the same bits.
__device__ inline RowStats merge(RowStats a, RowStats b) {
  const float m = fmaxf(a.m, b.m);
  if (m == -INFINITY) return a;
  return RowStats{m, a.l * expf(a.m - m) + b.l * expf(b.m - m)};  // l_a e^(m_a - m) + l_b e^(m_b - m)
}

// The row's (m, l), identical in every thread of the block.
__device__ inline RowStats block_reduce(RowStats st, float* sm_m, float* sm_l) {
  constexpr int kWarps = kSoftmaxThreads / 32;
  for (int off = 16; off > 0; off /= 2) {
    const RowStats other{__shfl_xor_sync(0xffffffffu, st.m, off), __shfl_xor_sync(0xffffffffu, st.l, off)};
    st = merge(st, other);
  }
  __syncthreads();  // the previous row's readers are done with sm_m / sm_l
  if (threadIdx.x % 32 == 0) {
    sm_m[threadIdx.x / 32] = st.m;
    sm_l[threadIdx.x / 32] = st.l;
  }
  __syncthreads();
  st = RowStats{sm_m[0], sm_l[0]};
  for (int w = 1; w < kWarps; ++w) st = merge(st, RowStats{sm_m[w], sm_l[w]});
  return st;
}

// One block per row (not a warp): the rows in flight then total a few MB, so pass 2's re-read of
// a long row comes from L2. The mask and visibility are already in S (-inf), padding included, so
// both passes run over whole float4 chunks of the padded row. Each thread rewrites exactly the
// chunks it read, so P can go over S.
__global__ void __launch_bounds__(kSoftmaxThreads)
    softmax_kernel(tiled::ScoreMatrix s, float* lse, int64_t rows) {
  __shared__ float sm_m[kSoftmaxThreads / 32], sm_l[kSoftmaxThreads / 32];
  const int64_t chunks = s.ld / 4;
  for (int64_t row = blockIdx.x; row < rows; row += gridDim.x) {
    float4* s_row = reinterpret_cast<float4*>(s.ptr + row * s.ld);

    // Pass 1: m_i = rowmax(S_i), l_i = rowsum(exp(S_i - m_i)), online over batches of chunks.
    RowStats st;
    for (int64_t c0 = 0; c0 < chunks; c0 += kSoftmaxThreads * kUnroll) {
      float4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t c = c0 + u * kSoftmaxThreads + threadIdx.x;
        v[u] = c < chunks ? s_row[c] : make_float4(-INFINITY, -INFINITY, -INFINITY, -INFINITY);
      }
      float m_new = st.m;  // m_new = max(m, rowmax(batch))
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        m_new = fmaxf(m_new, fmaxf(fmaxf(v[u].x, v[u].y), fmaxf(v[u].z, v[u].w)));
      if (m_new == -INFINITY) continue;
      float l_new = st.l * expf(st.m - m_new);  // l_new = l e^(m - m_new) + rowsum(exp(batch - m_new))
#pragma unroll
      for (int u = 0; u < kUnroll; ++u)
        l_new += expf(v[u].x - m_new) + expf(v[u].y - m_new) + expf(v[u].z - m_new) + expf(v[u].w - m_new);
      st = RowStats{m_new, l_new};
    }
    st = block_reduce(st, sm_m, sm_l);
    // A row with no visible key, or only -inf scores, is empty: lse = -inf and P = 0.
    const float row_lse = st.m == -INFINITY ? -INFINITY : st.m + logf(st.l);
    if (threadIdx.x == 0) lse[row] = row_lse;

    // Pass 2: P = exp(S - lse), over S.
    for (int64_t c0 = 0; c0 < chunks; c0 += kSoftmaxThreads * kUnroll) {
      float4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t c = c0 + u * kSoftmaxThreads + threadIdx.x;
        if (c < chunks) v[u] = s_row[c];
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int64_t c = c0 + u * kSoftmaxThreads + threadIdx.x;
        if (c >= chunks) continue;
        float4 p = make_float4(0.f, 0.f, 0.f, 0.f);
        if (row_lse != -INFINITY)
          p = make_float4(expf(v[u].x - row_lse), expf(v[u].y - row_lse), expf(v[u].z - row_lse),
                          expf(v[u].w - row_lse));
        s_row[c] = p;
      }
    }
  }
}

size_t workspace_bytes(const FwdParams& p) { return tiled::ScoreMatrix::bytes(p.B, p.H, p.S_q, p.S_k); }

void run(const FwdParams& p, const LaunchContext& ctx) {
  if (static_cast<int64_t>(p.B) * p.H * p.S_q * p.S_k * p.D == 0) return;
  if (p.dtype != DType::F32) throw RuntimeError("tiled forward: fp32 only");
  if (p.H_kv <= 0 || p.H % p.H_kv != 0) throw RuntimeError("tiled forward: H must be a multiple of H_kv");
  if (p.workspace == nullptr || p.workspace_bytes < workspace_bytes(p))
    throw RuntimeError("tiled forward: workspace smaller than its workspace function asked for");
  if (reinterpret_cast<uintptr_t>(p.workspace) % 16 != 0)
    throw RuntimeError("tiled forward: workspace not 16-byte aligned");
  const int G = p.H / p.H_kv;
  const Visibility vis = make_visibility(p);
  const tiled::ScoreMatrix s = tiled::score_matrix(p.workspace, p);

  // S = scale * Q K^T: M = S_q, N = S_k, K = D; K is stored (S_k, D), i.e. as B^T.
  tiled::GemmProblem qk;
  qk.M = p.S_q;
  qk.N = p.S_k;
  qk.K = p.D;
  qk.batch = p.B;
  qk.heads = p.H;
  qk.a = tiled::tensor_operand(p.q, p.q_st);
  qk.b = tiled::tensor_operand(p.k, p.k_st, /*head_div=*/G);
  ScoreStage score;
  score.rule.vis = vis;
  score.rule.scale = p.scale;
  score.rule.D = p.D;
  score.s = s;
  tiled::launch_gemm<tiled::ScoreTile, /*kTransA=*/false, /*kTransB=*/true>(qk, score, ctx.stream,
                                                                            "launch of tiled score GEMM");

  const int64_t rows = static_cast<int64_t>(p.B) * p.H * p.S_q;
  const unsigned grid = static_cast<unsigned>(rows < (int64_t{1} << 24) ? rows : (int64_t{1} << 24));
  softmax_kernel<<<grid, kSoftmaxThreads, 0, ctx.stream>>>(s, static_cast<float*>(p.lse), rows);
  CHECK_LAUNCH("tiled softmax_kernel");

  // O = P V: M = S_q, N = D, K = S_k.
  tiled::GemmProblem pv;
  pv.M = p.S_q;
  pv.N = p.D;
  pv.K = p.S_k;
  pv.batch = p.B;
  pv.heads = p.H;
  pv.a = s.operand(/*group=*/1);
  pv.b = tiled::tensor_operand(p.v, p.v_st, /*head_div=*/G);
  tiled::OutputStage out;
  out.out = static_cast<float*>(p.o);
  out.st = p.o_st;
  out.N = p.D;
  out.alpha = 1.f;
  out.vis = vis;
  out.rows_are_keys = false;
  tiled::launch_gemm<tiled::OutputTile, /*kTransA=*/false, /*kTransB=*/false>(pv, out, ctx.stream,
                                                                              "launch of tiled output GEMM");
}

KernelMode make_entry() {
  KernelMode m;
  m.kernel = "tiled";
  m.mode = Mode::Forward;
  m.summary = "shared-memory tiled GEMMs + row softmax, attention matrix materialised (fp32 CUDA cores)";
  m.rung = 3;
  m.gpu = true;
  // Plain fp32 CUDA: no cp.async, no 16-bit types, static shared memory under 48 KB.
  m.min_sm = 70;
  m.dtypes = dtype_bit(DType::F32);
  m.head_dims = {};
  m.max_head_dim = 0;  // any D: the head dim is only a GEMM extent, predicated like the others
  m.features = kAllFeatures;
  m.uses_atomics = false;
  m.fwd = &run;
  m.fwd_workspace = &workspace_bytes;
  return m;
}

}  // namespace tiled_fwd
}  // namespace flashattn

FLASHATTN_REGISTER_KERNEL_MODE(tiled_forward, flashattn::tiled_fwd::make_entry)

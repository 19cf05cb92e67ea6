// fa1, forward — rung 4 of the ladder: FlashAttention-1 (Dao et al. 2022, Algorithm 1), fp32 on
// CUDA cores. Over `tiled` it never materialises S or P anywhere, not even per row: attention is
// computed block by block with the online-softmax rescaling, and the only O(N) state is the
// running (O, m, l), which FA1 keeps in global memory.
//
// Loop order, as the paper has it: the OUTER loop runs over K/V blocks j (K_j, V_j loaded into
// shared memory once per j), the INNER loop over Q blocks i; every (i, j) reloads Q_i, O_i, l_i,
// m_i from global memory, folds block j in and writes O_i, l_i, m_i back. A Q block's rows are
// revisited once per K/V block, so one thread block must own every Q block of its (batch, head):
// grid = B*H, one block per head, no races and no atomics. Inside the block the kNWarps warps
// share the K/V block and each owns kRowsPerWarp rows of the Q block (B_r = kBlockM rows), so a
// warp's rows are read and written by that warp only and warps meet only at the barriers around
// each K/V block load. GQA needs nothing special here: head h reads K/V head h / (H / H_kv).
//
// Per warp and (i, j) (one thread = 4 rows x B_c/16 columns of S, the same 4 rows x D/16 of O):
//   Q_i rows -> the warp's shared slice; S_ij = Q_i K_j^T from shared-memory float4 micro-tiles;
//   P~_ij overwrites the Q_i slice (Q is dead once S exists); P~_ij V_j from shared memory; the
//   old O_i, m_i, l_i come from global memory and the new ones go back to it.
// The scores are kept in log2 units (s * scale * log2(e)), so every exponential is one exp2f and
// m lives in the workspace in those units; lse = ln(2) * (m + log2(l)) converts back at the end.
// Masking (causal, window, padding, S_k tail, additive mask) sets invisible scores to -inf; whole
// (warp rows x K/V block) pairs with no visible key are skipped, and blocks that every row sees
// in full skip the per-element predicate. A row with no finite score keeps P~ = 0 and l = 0, so
// an empty row ends with O = 0 (its initial value) and lse = -inf.
//
// Tiles: B_c = kBlockN = 64 keys (32 at D = 256), B_r = 16 warps x 8 rows = 128 (8 warps at
// D = 256 so K/V and the Q rows fit the 163 KB of shared memory sm_80 allows). Shared rows are
// padded to D + 4 floats (4 mod 32 words) so a warp's float4 reads of 16 K rows (two wavefronts,
// the minimum for 256 bytes) or 2 Q rows (one) are conflict-free. No pipelining beyond what 16 resident warps give: loads are issued together
// and the other warps run while one waits.
//
// What limits fa1 (the costs FA2 removes):
//  * Parallelism: B*H blocks of one SM each. At B*H = 32 on a 132-SM H100 only 32 SMs work (24%
//    of the GPU); a 512-thread block with <= 128 registers per thread is one block per SM. FP32
//    peak of 32 SMs is ~16 TFLOP/s (128 FMA lanes x 2 x 1.98 GHz each); with the softmax,
//    shuffles, barriers and the exposed latency of the per-(i, j) loads we expect about 60% of
//    it: ~10 TFLOP/s forward at B*H = 32, S = 1024-4096, D = 64 (fa2's target is 40 at the same
//    shape), and ~35 TFLOP/s once B*H >= 132 fills the GPU.
//  * Round trips: per K/V block and head, Q_i is read and O_i read + written (3 * S_q * D * 4
//    bytes) and m, l read + written (16 * S_q bytes): 0.8 MB per K/V block at S_q = 1024, D = 64,
//    411 MB in all at B*H = 32, S = 1024, against 34 MB of compulsory traffic (about 21
//    FLOP/byte). The per-head working set (Q, O, m, l: 0.5 MB at that shape) stays in L2 while
//    B*H * S_q * D * 8 bytes fits in it (50 MB), so the round trips cost latency rather than HBM
//    bandwidth until B*H * S_q grows past ~100k rows.
//
// Algorithm 1 line by line: 2 (O = 0, l = 0, m = -inf in HBM) at kernel entry, every call;
// 5 (for j) and 6 (load K_j, V_j) in forward_kernel; 7-13 in update_rows; 16 (return O) plus the
// lse this project's contract asks for in the epilogue.
// Limits: fp32 only, head dims 32, 64, 96, 128, 256, sm_80+, every feature including the additive
// mask. Workspace: m and l, [B, H, S_q] fp32 each (8 * B * H * S_q bytes). Deterministic.
// Instantiations: 5 (one per head dim); masking is a per-block, warp-uniform runtime branch.
// Measured: see README.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "common/head_dims.h"
#include "common/mask.cuh"
#include "common/math_constants.h"
#include "flashattn/check.h"
#include "flashattn/error.h"
#include "flashattn/registry.h"

namespace flashattn {
namespace fa1_fwd {


template <int kHeadDim_>
struct Traits {
  static constexpr int kHeadDim = kHeadDim_;
  // As many warps as 128 registers per thread allow: the grid is only B*H blocks, so each block
  // must bring its own latency hiding. D = 256 halves them to fit shared memory (header).
  static constexpr int kNWarps = kHeadDim <= 128 ? 16 : 8;
  static constexpr int kThreads = kNWarps * 32;
  static constexpr int kRowsPerWarp = 8;
  static constexpr int kBlockM = kNWarps * kRowsPerWarp;     // B_r
  static constexpr int kBlockN = kHeadDim <= 128 ? 64 : 32;  // B_c
  // A warp is 2 row groups x 16 column groups; a lane owns kTM rows of the warp's 8.
  static constexpr int kColLanes = 16;
  static constexpr int kTM = kRowsPerWarp / 2;
  static constexpr int kTN = kBlockN / kColLanes;  // S columns of a lane: cl + 16 t
  // O columns of a lane: (t * 16 + cl) * kVec + e, so 16 lanes touch one contiguous row segment
  // (coalesced in global memory, conflict-free in shared memory). float2 where D is not a
  // multiple of 64.
  static constexpr int kVec = kHeadDim % (4 * kColLanes) == 0 ? 4 : 2;
  static constexpr int kTD = kHeadDim / (kVec * kColLanes);
  // P~V and the O update run over column chunks of kTDChunk accesses: at D = 128 a lane's whole
  // O slice (32 floats) plus its old value (32) do not fit beside the rest in 128 registers, so
  // it takes two 64-column halves (re-reading P~ from shared memory, a broadcast, costs little).
  static constexpr int kTDChunk = kHeadDim == 128 ? 1 : kTD;
  // Unrolling the S and P~V loops twice lets loads run ahead of the FMAs; at D = 128 that costs
  // the last registers and spills, so it stays rolled there.
  static constexpr int kUnrollS = kHeadDim == 128 ? 1 : 2;
  static constexpr int kUnrollPV = kHeadDim == 128 ? 1 : 2;
  static constexpr int kD4 = kHeadDim / 4;  // float4s per row
  static constexpr int kPitch = kHeadDim + 4;  // 4 mod 32 words: float4 reads of 8 rows hit 32 banks
  static constexpr int kPPitch = kBlockN + 4;
  // A warp's slice holds its Q_i rows, then its P~_ij rows.
  static constexpr int kWarpFloats = kRowsPerWarp * (kPitch > kPPitch ? kPitch : kPPitch);
  static constexpr int kSmemFloats = 2 * kBlockN * kPitch + kNWarps * kWarpFloats;
  static constexpr size_t kSmemBytes = kSmemFloats * sizeof(float);

  static_assert(kHeadDim % (kVec * kColLanes) == 0, "O columns must split evenly over 16 lanes");
  static_assert(kBlockN % kColLanes == 0 && kBlockN % 4 == 0, "S columns must split over 16 lanes");
  static_assert(kD4 % 8 == 0 && kBlockN % (kThreads / 8) == 0, "K/V loads: 8 threads per row");
  static_assert(kRowsPerWarp % 4 == 0, "Q loads: 8 lanes per row, 4 rows per pass");
  static_assert(kSmemBytes <= 163 * 1024, "must fit the shared memory of sm_80");
};

// N consecutive floats moved as one 8- or 16-byte access (through float2/float4, which the
// compiler always turns into a single vector instruction).
template <int N>
struct alignas(4 * N) Vec {
  float x[N];
};
template <int N>
using NativeVec = typename std::conditional<N == 4, float4, float2>::type;

template <int N>
__device__ __forceinline__ Vec<N> load_vec(const float* p) {
  static_assert(N == 2 || N == 4, "8- or 16-byte vectors");
  const NativeVec<N> n = *reinterpret_cast<const NativeVec<N>*>(p);
  Vec<N> v;
  v.x[0] = n.x;
  v.x[1] = n.y;
  if constexpr (N == 4) {
    v.x[2] = n.z;
    v.x[3] = n.w;
  }
  return v;
}
template <int N>
__device__ __forceinline__ void store_vec(float* p, const Vec<N>& v) {
  static_assert(N == 2 || N == 4, "8- or 16-byte vectors");
  NativeVec<N> n;
  n.x = v.x[0];
  n.y = v.x[1];
  if constexpr (N == 4) {
    n.z = v.x[2];
    n.w = v.x[3];
  }
  *reinterpret_cast<NativeVec<N>*>(p) = n;
}

__device__ __forceinline__ float warp_max16(float x) {
  for (int off = 8; off > 0; off /= 2) x = fmaxf(x, __shfl_xor_sync(0xffffffffu, x, off));
  return x;
}
__device__ __forceinline__ float warp_sum16(float x) {
  for (int off = 8; off > 0; off /= 2) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}

struct Args {
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  float* o = nullptr;    // also the running O of Algorithm 1
  float* lse = nullptr;  // [B, H, S_q]
  float* m = nullptr;    // workspace [B, H, S_q]: running max, log2 units
  float* l = nullptr;    // workspace [B, H, S_q]: running sum
  Strides q_st, k_st, v_st, o_st;
  int H = 0, H_kv = 0, S_q = 0, S_k = 0;
  float scale_log2 = 0.f;
  Visibility vis;
};

// Lines 8-13 of Algorithm 1 for the warp's rows [r0, r0 + kRowsPerWarp) of Q block i against
// the K/V block at j0. `full`: every (row, key) pair of the tile is visible and unmasked.
template <class Tr>
__device__ __forceinline__ void update_rows(const Args& a, const float* gQ, float* gO, float* gM,
                                            float* gL, const float* sK, const float* sV, float* sW,
                                            int b, int h, int r0, int j0, int seqlen, bool full) {
  constexpr int kTM = Tr::kTM, kTN = Tr::kTN, kTD = Tr::kTD, kVec = Tr::kVec;
  const int lane = threadIdx.x % 32;
  const int cl = lane % Tr::kColLanes;  // column group
  const int rl = lane / Tr::kColLanes;  // row group: rows rl * kTM + a of the warp's slice

  // Line 8: load Q_i, O_i, l_i, m_i from HBM to on-chip memory.
  __syncwarp();  // the slice still holds P~ of the previous (i, j) until every lane is past P~V
  // 8 lanes per row: each quarter-warp moves one contiguous 128-byte segment.
#pragma unroll
  for (int pass = 0; pass < Tr::kRowsPerWarp / 4; ++pass) {
    const int r = pass * 4 + lane / 8;
    const float* src = gQ + (r0 + r) * a.q_st.row;
#pragma unroll
    for (int u = 0; u < Tr::kD4 / 8; ++u) {
      const int c = (u * 8 + lane % 8) * 4;
      Vec<4> x{};
      if (r0 + r < a.S_q) x = load_vec<4>(src + c);
      store_vec<4>(sW + r * Tr::kPitch + c, x);  // (kRowsPerWarp, kHeadDim)
    }
  }
  float m_i[kTM], l_i[kTM];
#pragma unroll
  for (int i = 0; i < kTM; ++i) {
    const int row = r0 + rl * kTM + i;
    m_i[i] = row < a.S_q ? gM[row] : -INFINITY;
    l_i[i] = row < a.S_q ? gL[row] : 0.f;
  }
  __syncwarp();

  // Line 9: S_ij = Q_i K_j^T (times scale * log2(e), see header).
  float rS[kTM][kTN] = {};  // (kTM, kTN) per lane: rows rl * kTM + i, columns cl + 16 t
#pragma unroll Tr::kUnrollS
  for (int d = 0; d < Tr::kHeadDim; d += 4) {
    Vec<4> q[kTM], k[kTN];
#pragma unroll
    for (int i = 0; i < kTM; ++i) q[i] = load_vec<4>(sW + (rl * kTM + i) * Tr::kPitch + d);
#pragma unroll
    for (int t = 0; t < kTN; ++t) k[t] = load_vec<4>(sK + (cl + 16 * t) * Tr::kPitch + d);
#pragma unroll
    for (int i = 0; i < kTM; ++i)
#pragma unroll
      for (int t = 0; t < kTN; ++t)
#pragma unroll
        for (int x = 0; x < 4; ++x) rS[i][t] = fmaf(q[i].x[x], k[t].x[x], rS[i][t]);
  }
#pragma unroll
  for (int i = 0; i < kTM; ++i)
#pragma unroll
    for (int t = 0; t < kTN; ++t) {
      float s = rS[i][t] * a.scale_log2;
      if (!full) {  // MASK(S): warp-uniform branch, taken only on boundary blocks
        const int row = r0 + rl * kTM + i, col = j0 + cl + 16 * t;
        // Rows past S_q are never stored; -inf keeps their mask reads in bounds.
        if (row >= a.S_q || !a.vis.visible(row, col, seqlen)) s = -INFINITY;
        else if (a.vis.mask.ptr) s += a.vis.bias(b, h, row, col) * kLog2e;
      }
      rS[i][t] = s;
    }

  // Line 10: m~_ij = rowmax(S_ij), P~_ij = exp(S_ij - m~_ij), l~_ij = rowsum(P~_ij).
  // Line 11: m_new = max(m_i, m~_ij), l_new = e^(m_i - m_new) l_i + e^(m~_ij - m_new) l~_ij.
  // A row with no finite score so far (m_new = -inf) stays at l = 0, O = 0.
  float m_new[kTM], c_old[kTM], c_new[kTM];
#pragma unroll
  for (int i = 0; i < kTM; ++i) {
    float mx = -INFINITY;
#pragma unroll
    for (int t = 0; t < kTN; ++t) mx = fmaxf(mx, rS[i][t]);
    const float m_tile = warp_max16(mx);                          // m~_ij
    const float m_base = m_tile == -INFINITY ? 0.f : m_tile;      // keeps exp(-inf - -inf) out
    float sum = 0.f;
#pragma unroll
    for (int t = 0; t < kTN; ++t) {
      rS[i][t] = exp2f(rS[i][t] - m_base);  // P~_ij
      sum += rS[i][t];
    }
    const float l_tile = warp_sum16(sum);  // l~_ij
    m_new[i] = fmaxf(m_i[i], m_tile);
    const bool empty = m_new[i] == -INFINITY;
    const float e_old = empty ? 0.f : exp2f(m_i[i] - m_new[i]);  // e^(m_i - m_new)
    const float e_new = empty ? 0.f : exp2f(m_tile - m_new[i]);  // e^(m~_ij - m_new)
    const float l_new = e_old * l_i[i] + e_new * l_tile;
    // Line 12's coefficients: O_i <- (l_i e^(m_i - m_new) / l_new) O_i + (e^(m~ - m_new) / l_new) P~V.
    const float inv = l_new > 0.f ? 1.f / l_new : 0.f;
    c_old[i] = l_i[i] * e_old * inv;
    c_new[i] = e_new * inv;
    l_i[i] = l_new;
  }

  // P~_ij replaces Q_i in the warp's slice once every lane is done reading Q_i.
  __syncwarp();
#pragma unroll
  for (int i = 0; i < kTM; ++i)
#pragma unroll
    for (int t = 0; t < kTN; ++t) sW[(rl * kTM + i) * Tr::kPPitch + cl + 16 * t] = rS[i][t];  // (8, kBlockN)
  __syncwarp();

  // Line 12: P~_ij V_j, then O_i <- diag(l_new)^-1 (diag(l_i) e^(m_i - m_new) O_i + e^(m~ - m_new) P~_ij V_j),
  // in column chunks of kTDChunk * 16 * kVec (see Traits). The old O_i of a chunk is requested
  // before its P~V so the load latency hides behind the FMAs.
#pragma unroll
  for (int t0 = 0; t0 < kTD; t0 += Tr::kTDChunk) {
    Vec<kVec> rO[kTM][Tr::kTDChunk];  // (kTM, kTDChunk * kVec) per lane
#pragma unroll
    for (int i = 0; i < kTM; ++i) {
      const int row = r0 + rl * kTM + i;
#pragma unroll
      for (int t = 0; t < Tr::kTDChunk; ++t)
        rO[i][t] = row < a.S_q ? load_vec<kVec>(gO + row * a.o_st.row + ((t0 + t) * 16 + cl) * kVec) : Vec<kVec>{};
    }
    float acc[kTM][Tr::kTDChunk][kVec] = {};  // (kTM, kTDChunk * kVec) per lane
#pragma unroll Tr::kUnrollPV
    for (int n = 0; n < Tr::kBlockN; n += 4) {
      Vec<4> p[kTM];
#pragma unroll
      for (int i = 0; i < kTM; ++i) p[i] = load_vec<4>(sW + (rl * kTM + i) * Tr::kPPitch + n);
#pragma unroll
      for (int x = 0; x < 4; ++x) {
        Vec<kVec> vv[Tr::kTDChunk];
#pragma unroll
        for (int t = 0; t < Tr::kTDChunk; ++t)
          vv[t] = load_vec<kVec>(sV + (n + x) * Tr::kPitch + ((t0 + t) * 16 + cl) * kVec);
#pragma unroll
        for (int i = 0; i < kTM; ++i)
#pragma unroll
          for (int t = 0; t < Tr::kTDChunk; ++t)
#pragma unroll
            for (int e = 0; e < kVec; ++e) acc[i][t][e] = fmaf(p[i].x[x], vv[t].x[e], acc[i][t][e]);
      }
    }
#pragma unroll
    for (int i = 0; i < kTM; ++i) {
      const int row = r0 + rl * kTM + i;
      if (row >= a.S_q) continue;
#pragma unroll
      for (int t = 0; t < Tr::kTDChunk; ++t) {
        Vec<kVec> out;
#pragma unroll
        for (int e = 0; e < kVec; ++e) out.x[e] = fmaf(c_old[i], rO[i][t].x[e], c_new[i] * acc[i][t][e]);
        store_vec<kVec>(gO + row * a.o_st.row + ((t0 + t) * 16 + cl) * kVec, out);
      }
    }
  }
  // Line 13: l_i <- l_new, m_i <- m_new. Every lane of the row group read the old values before the
  // __syncwarp above, so one lane may overwrite them.
#pragma unroll
  for (int i = 0; i < kTM; ++i) {
    const int row = r0 + rl * kTM + i;
    if (cl == 0 && row < a.S_q) {
      gM[row] = m_new[i];
      gL[row] = l_i[i];
    }
  }
}

template <class Tr>
__global__ void __launch_bounds__(Tr::kThreads, 1) forward_kernel(const Args a) {
  extern __shared__ float4 fa1_fwd_smem[];
  const int warp = threadIdx.x / 32;
  float* sK = reinterpret_cast<float*>(fa1_fwd_smem);                 // (kBlockN, kPitch)
  float* sV = sK + Tr::kBlockN * Tr::kPitch;                           // (kBlockN, kPitch)
  float* sW = sV + Tr::kBlockN * Tr::kPitch + warp * Tr::kWarpFloats;  // this warp's slice

  const int bh = blockIdx.x;  // one block per (b, h): it owns every Q block of the head
  const int b = bh / a.H, h = bh % a.H;
  const int g = h / (a.H / a.H_kv);
  const float* gQ = a.q + b * a.q_st.batch + h * a.q_st.head;
  const float* gK = a.k + b * a.k_st.batch + g * a.k_st.head;
  const float* gV = a.v + b * a.v_st.batch + g * a.v_st.head;
  float* gO = a.o + b * a.o_st.batch + h * a.o_st.head;
  const int64_t stat0 = static_cast<int64_t>(bh) * a.S_q;  // row 0 of this head in m, l, lse
  float* gM = a.m + stat0;
  float* gL = a.l + stat0;
  const int seqlen = a.vis.seqlen_k(b);

  // Line 2: O = (0), l = (0), m = (-inf) in HBM — redone every call, as part of the kernel's time.
  for (int64_t e = threadIdx.x; e < static_cast<int64_t>(a.S_q) * Tr::kD4; e += Tr::kThreads)
    store_vec<4>(gO + (e / Tr::kD4) * a.o_st.row + (e % Tr::kD4) * 4, Vec<4>{});
  for (int r = threadIdx.x; r < a.S_q; r += Tr::kThreads) {
    gM[r] = -INFINITY;
    gL[r] = 0.f;
  }
  __syncthreads();  // other warps' rows were zeroed by this thread

  // Keys that any query of the head sees (begin and end never decrease with the query index):
  // K/V blocks outside are never loaded.
  const IndexRange first = a.vis.keys(0, seqlen), last = a.vis.keys(a.S_q - 1, seqlen);
  const int n_begin = static_cast<int>(first.begin / Tr::kBlockN);
  const int n_end = last.end > first.begin ? static_cast<int>((last.end + Tr::kBlockN - 1) / Tr::kBlockN) : n_begin;
  const int m_blocks = (a.S_q + Tr::kBlockM - 1) / Tr::kBlockM;

  // Line 5: for 1 <= j <= T_c.
  for (int nb = n_begin; nb < n_end; ++nb) {
    const int j0 = nb * Tr::kBlockN;
    // Line 6: load K_j, V_j from HBM to on-chip SRAM (rows past S_k as zeros).
    __syncthreads();  // every warp is done with K_{j-1}, V_{j-1}
    // 8 threads per row (one 128-byte segment each step), kThreads / 8 rows per pass.
#pragma unroll
    for (int pass = 0; pass < Tr::kBlockN / (Tr::kThreads / 8); ++pass) {
      const int n = pass * (Tr::kThreads / 8) + threadIdx.x / 8;
      const float* k_src = gK + (j0 + n) * a.k_st.row;
      const float* v_src = gV + (j0 + n) * a.v_st.row;
#pragma unroll
      for (int u = 0; u < Tr::kD4 / 8; ++u) {
        const int c = (u * 8 + threadIdx.x % 8) * 4;
        Vec<4> kx{}, vx{};
        if (j0 + n < a.S_k) {
          kx = load_vec<4>(k_src + c);
          vx = load_vec<4>(v_src + c);
        }
        store_vec<4>(sK + n * Tr::kPitch + c, kx);
        store_vec<4>(sV + n * Tr::kPitch + c, vx);
      }
    }
    __syncthreads();

    // Line 7: for 1 <= i <= T_r; each warp takes its rows of Q block i.
    for (int mb = 0; mb < m_blocks; ++mb) {
      const int r0 = mb * Tr::kBlockM + warp * Tr::kRowsPerWarp;
      if (r0 >= a.S_q) break;
      const int r_last = min(r0 + Tr::kRowsPerWarp, a.S_q) - 1;
      const IndexRange kf = a.vis.keys(r0, seqlen), kl = a.vis.keys(r_last, seqlen);
      if (j0 >= kl.end || j0 + Tr::kBlockN <= kf.begin) continue;  // no row sees this block
      const bool full = a.vis.mask.ptr == nullptr && kl.begin <= j0 && j0 + Tr::kBlockN <= kf.end;
      update_rows<Tr>(a, gQ, gO, gM, gL, sK, sV, sW, b, h, r0, j0, seqlen, full);
    }
  }
  __syncthreads();  // the last m, l of every row are visible to the whole block

  // lse = m + log(l), back from log2 units; -inf for rows that never saw a finite score.
  for (int r = threadIdx.x; r < a.S_q; r += Tr::kThreads) {
    const float m = gM[r], l = gL[r];
    a.lse[stat0 + r] = m == -INFINITY ? -INFINITY : (m + log2f(l)) * kLn2;
  }
}

// ---- host side --------------------------------------------------------------------------------

size_t workspace_bytes(const FwdParams& p) {
  return 2 * sizeof(float) * static_cast<size_t>(p.B) * p.H * p.S_q;  // m and l
}

// The tiles move 16-byte vectors: rows must start on 16-byte boundaries.
bool rows_aligned(const void* ptr, const Strides& st) {
  return reinterpret_cast<uintptr_t>(ptr) % 16 == 0 && st.batch % 4 == 0 && st.head % 4 == 0 && st.row % 4 == 0;
}

template <int kHeadDim>
void launch(const FwdParams& p, const LaunchContext& ctx) {
  using Tr = Traits<kHeadDim>;
  Args a;
  a.q = static_cast<const float*>(p.q);
  a.k = static_cast<const float*>(p.k);
  a.v = static_cast<const float*>(p.v);
  a.o = static_cast<float*>(p.o);
  a.lse = static_cast<float*>(p.lse);
  const size_t rows = static_cast<size_t>(p.B) * p.H * p.S_q;
  a.m = static_cast<float*>(p.workspace);
  a.l = a.m + rows;
  a.q_st = p.q_st;
  a.k_st = p.k_st;
  a.v_st = p.v_st;
  a.o_st = p.o_st;
  a.H = p.H;
  a.H_kv = p.H_kv;
  a.S_q = p.S_q;
  a.S_k = p.S_k;
  a.scale_log2 = p.scale_log2;
  a.vis = make_visibility(p);
  const auto kernel = &forward_kernel<Tr>;
  // sm_86/sm_89 offer 99 KB per block rather than sm_80's 163 KB: say so instead of failing the launch.
  int smem_optin = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, ctx.device));
  if (Tr::kSmemBytes > static_cast<size_t>(smem_optin))
    throw RuntimeError("fa1 forward: head dim " + std::to_string(kHeadDim) + " needs " +
                       std::to_string(Tr::kSmemBytes / 1024) + " KB of shared memory per block, this GPU offers " +
                       std::to_string(smem_optin / 1024) + " KB");
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(Tr::kSmemBytes)));
  kernel<<<static_cast<unsigned>(p.B * p.H), Tr::kThreads, Tr::kSmemBytes, ctx.stream>>>(a);
  CHECK_LAUNCH("fa1 forward_kernel");
}

// Head dims with a variant; the build compiles those FLASHATTN_HDIMS enables (common/head_dims.h).
using KernelHeadDims = HeadDims<32, 64, 96, 128, 256>;

void run(const FwdParams& p, const LaunchContext& ctx) {
  if (static_cast<int64_t>(p.B) * p.H * p.S_q == 0) return;
  if (p.dtype != DType::F32) throw RuntimeError("fa1 forward: fp32 only");
  if (p.H_kv <= 0 || p.H % p.H_kv != 0) throw RuntimeError("fa1 forward: H must be a multiple of H_kv");
  if (p.workspace == nullptr || p.workspace_bytes < workspace_bytes(p))
    throw RuntimeError("fa1 forward: workspace smaller than its workspace function asked for");
  if (!rows_aligned(p.q, p.q_st) || !rows_aligned(p.k, p.k_st) || !rows_aligned(p.v, p.v_st) ||
      !rows_aligned(p.o, p.o_st))
    throw RuntimeError("fa1 forward: q, k, v and o rows must start on 16-byte boundaries");
  KernelHeadDims::dispatch(p.D, "fa1 forward", [&](auto kD) { launch<decltype(kD)::value>(p, ctx); });
}

KernelMode make_entry() {
  KernelMode m;
  m.kernel = "fa1";
  m.mode = Mode::Forward;
  m.summary =
      "FlashAttention-1 (Dao et al. 2022, Alg. 1/4): K/V-block outer loop, running O/m/l in global memory "
      "(fp32 CUDA cores)";
  m.rung = 4;
  m.gpu = true;
  m.min_sm = 80;  // up to 132 KB of shared memory per block (checked at launch: sm_86/89 offer 99 KB)
  m.dtypes = dtype_bit(DType::F32);
  m.head_dims = KernelHeadDims::list();
  m.features = kAllFeatures;
  m.uses_atomics = false;
  m.fwd = &run;
  m.fwd_workspace = &workspace_bytes;
  return m;
}

}  // namespace fa1_fwd
}  // namespace flashattn

FLASHATTN_REGISTER_KERNEL_MODE(fa1_forward, flashattn::fa1_fwd::make_entry)

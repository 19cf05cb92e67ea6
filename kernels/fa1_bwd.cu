// fa1, backward — rung 4 of the ladder: FlashAttention-1's backward pass (Dao et al. 2022,
// Algorithm 4), fp32 on CUDA cores. Over `tiled` it recomputes S and P block by block instead of
// storing them, and keeps dK_j, dV_j on chip for the whole sweep over the queries.
//
// Loop order, as the paper has it: the OUTER loop runs over K/V blocks j (K_j, V_j in shared
// memory, dK~_j, dV~_j accumulating in registers), the INNER loop over Q blocks i; every (i, j)
// reloads Q_i, O_i, dO_i and lse_i from global memory and read-modify-writes dQ_i there. Since
// the inner loop revisits every dQ_i once per K/V block, one thread block owns everything that
// touches a (batch, kv head): grid = B*H_kv, and the block sweeps the query heads of its GQA group
// one after another inside the inner loop (so dK_j, dV_j also sum over the group). No two blocks
// write the same dQ, dK or dV element and no atomics are used: results are bitwise reproducible.
//
// Lse instead of (l, m): Algorithm 4 line 13 computes P_ij = diag(l_i)^-1 exp(S_ij - m_i); this
// kernel reads the forward's lse_i = m_i + log(l_i) (the only row statistic this project's forward
// returns) and computes P_ij = exp(S_ij - lse_i), the same value. Scores are kept in log2 units
// (s * scale * log2(e), lse * log2(e)) so each P is one exp2f; a row with lse = -inf (no visible
// key) gets lse = +inf here, hence P = 0, dS = 0 and no contribution anywhere.
// No dropout: lines 1, 14, 15 and 18 are identities and are left out.
//
// One tile step (256 threads; B_r = kBlockM queries, B_c = kBlockN keys):
//   load   Q_i, dO_i -> shared; O_i only feeds D_i = rowsum(dO_i o O_i) (line 19), summed as the
//          rows arrive; lse_i -> shared
//   S, dP  16 x 16 threads, each a (B_r/16) x (B_c/16) micro-tile of both from float4 reads of
//          Q_i, K_j, dO_i, V_j; P and dS = P o (dP - D_i) -> shared
//   dK, dV each thread owns 4 keys x D/(threads per key) columns of both accumulators:
//          dV~ += P^T dO_i, dK~ += dS^T Q_i, one query row at a time
//   dQ     each thread owns 4 queries x D/(threads per query) columns: dQ_i += scale dS K_j,
//          added to the dQ_i it reads from global memory and written back (line 21)
// Three barriers per tile step. Tiles: B_c = 64 (32 at D = 256), B_r = 64 (32 at D >= 128) so the
// five shared tiles fit the 163 KB of sm_80; rows padded to D + 4 floats (4 mod 32 words) so the
// float4 reads of 16 K rows or 2 Q rows by one warp are conflict-free.
//
// What limits it: B*H_kv blocks of 8 warps, one block per SM; at B*H_kv = 32 a 132-SM H100 uses 32
// SMs (~16 TFLOP/s of fp32 peak), and the lone block on each stalls at each of the three barriers
// while its loads are in flight. Per K/V block and query head it moves Q_i, O_i, dO_i and dQ_i in
// plus dQ_i out (5 * S_q * D * 4 bytes: 1.3 MB at S_q = 1024, D = 64), served from L2 while the
// per-group working set fits. A tile step is 5 * 2 * 64^3 FLOP = 10k FMA cycles of one SM; with
// ~75% FMA issue density and the barrier stalls we expect ~6-8 TFLOP/s at B*H = 32,
// S = 1024-4096, D = 64 (backward FLOPs = 2.5x forward).
//
// Algorithm 4 line by line: 5 (dQ = 0 in HBM; dK, dV are written whole) at kernel entry, every
// call; 6-8 and 24 in backward_kernel; 9-23 in its inner loop, each step commented.
// Limits: fp32 only, head dims 32, 64, 96, 128, 256, sm_80+, every feature including the additive
// mask. No workspace. Deterministic. Instantiations: 5 (one per head dim).
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
namespace fa1_bwd {


template <int kHeadDim_>
struct Traits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kNWarps = 8;
  static constexpr int kThreads = kNWarps * 32;
  static constexpr int kBlockM = kHeadDim <= 96 ? 64 : 32;   // B_r
  static constexpr int kBlockN = kHeadDim <= 128 ? 64 : 32;  // B_c
  static constexpr int kD4 = kHeadDim / 4;
  static constexpr int kPitch = kHeadDim + 4;  // 4 mod 32 words: conflict-free float4 row reads
  static constexpr int kSPitch = kBlockN + 4;
  // S and dP: 16 x 16 threads; rows ty * kSTM + a, columns tx + 16 t.
  static constexpr int kSTM = kBlockM / 16;
  static constexpr int kSTN = kBlockN / 16;
  // dK, dV (kBlockN, D): keys kc * 4 + a, columns (t * kKDimThreads + kd) * kKVec + e; a warp's
  // lanes run along the columns so each row segment is contiguous.
  static constexpr int kKeyThreads = kBlockN / 4;
  static constexpr int kKDimThreads = kThreads / kKeyThreads;
  static constexpr int kKVec = kHeadDim % (4 * kKDimThreads) == 0 ? 4 : 2;
  static constexpr int kKTD = kHeadDim / (kKVec * kKDimThreads);
  // dQ (kBlockM, D): queries qr * 4 + a, columns (t * kQDimThreads + qd) * kQVec + e.
  static constexpr int kQRowThreads = kBlockM / 4;
  static constexpr int kQDimThreads = kThreads / kQRowThreads;
  static constexpr int kQVec = kHeadDim % (4 * kQDimThreads) == 0 ? 4 : 2;
  static constexpr int kQTD = kHeadDim / (kQVec * kQDimThreads);

  // sK, sV; sQ, sdO; sP, sdS; lse_i, D_i.
  static constexpr int kSmemFloats =
      2 * kBlockN * kPitch + 2 * kBlockM * kPitch + 2 * kBlockM * kSPitch + 2 * kBlockM;
  static constexpr size_t kSmemBytes = kSmemFloats * sizeof(float);

  static_assert(kBlockM % 32 == 0 && kBlockN % 32 == 0, "row loads: 32 rows per pass");
  static_assert(kD4 % 8 == 0, "row loads: 8 threads per row");
  static_assert(kHeadDim % (kKVec * kKDimThreads) == 0, "dK/dV columns must split evenly");
  static_assert(kHeadDim % (kQVec * kQDimThreads) == 0, "dQ columns must split evenly");
  static_assert(kKDimThreads <= 32 && 32 % kKDimThreads == 0 && kQDimThreads <= 32, "lane layout");
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

struct Args {
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  const float* o = nullptr;
  const float* dout = nullptr;
  const float* lse = nullptr;  // [B, H, S_q], natural log, from fa1's forward
  float* dq = nullptr;
  float* dk = nullptr;
  float* dv = nullptr;
  Strides q_st, k_st, v_st, o_st, do_st, dq_st, dk_st, dv_st;
  int H = 0, H_kv = 0, S_q = 0, S_k = 0;
  float scale = 0.f;
  float scale_log2 = 0.f;
  Visibility vis;
};

// Line 10 (+ line 19): Q_i, dO_i -> shared, lse_i (log2 units; +inf for rows that contribute
// nothing) and D_i = rowsum(dO_i o O_i) -> shared. 8 threads per row, 32 rows per pass; rows past
// S_q are zeros.
template <class Tr>
__device__ __forceinline__ void load_query_tile(const Args& a, const float* gQ, const float* gO,
                                                const float* gdO, const float* gLse, int i0, float* sQ,
                                                float* sdO, float* sLse, float* sDi) {
  const int sub = threadIdx.x % 8;
#pragma unroll
  for (int pass = 0; pass < Tr::kBlockM / 32; ++pass) {
    const int r = pass * 32 + threadIdx.x / 8;
    const int row = i0 + r;
    const bool valid = row < a.S_q;
    float d_sum = 0.f;
#pragma unroll
    for (int u = 0; u < Tr::kD4 / 8; ++u) {
      const int c = (u * 8 + sub) * 4;
      Vec<4> qv{}, dov{}, ov{};
      if (valid) {
        qv = load_vec<4>(gQ + row * a.q_st.row + c);
        dov = load_vec<4>(gdO + row * a.do_st.row + c);
        ov = load_vec<4>(gO + row * a.o_st.row + c);
      }
      store_vec<4>(sQ + r * Tr::kPitch + c, qv);    // (kBlockM, kHeadDim)
      store_vec<4>(sdO + r * Tr::kPitch + c, dov);  // (kBlockM, kHeadDim)
#pragma unroll
      for (int x = 0; x < 4; ++x) d_sum = fmaf(dov.x[x], ov.x[x], d_sum);
    }
    // The 8 threads of a row are 8 consecutive lanes.
    for (int off = 4; off > 0; off /= 2) d_sum += __shfl_xor_sync(0xffffffffu, d_sum, off);
    if (sub == 0) {
      const float lse = valid ? gLse[row] : -INFINITY;
      sLse[r] = lse == -INFINITY ? INFINITY : lse * kLog2e;
      sDi[r] = d_sum;
    }
  }
}

// Line 7: K_j, V_j (rows [j0, j0 + kBlockN) of one kv head) -> shared, rows past S_k as zeros.
// 8 threads per row, 32 rows per pass.
template <class Tr>
__device__ __forceinline__ void load_kv_tile(const Args& a, const float* gK, const float* gV, int j0, float* sK,
                                             float* sV, int tid) {
  constexpr int kBlockN = Tr::kBlockN, kPitch = Tr::kPitch;
#pragma unroll
  for (int pass = 0; pass < kBlockN / 32; ++pass) {
    const int n = pass * 32 + tid / 8;
#pragma unroll
    for (int u = 0; u < Tr::kD4 / 8; ++u) {
      const int c = (u * 8 + tid % 8) * 4;
      Vec<4> kx{}, vx{};
      if (j0 + n < a.S_k) {
        kx = load_vec<4>(gK + (j0 + n) * a.k_st.row + c);
        vx = load_vec<4>(gV + (j0 + n) * a.v_st.row + c);
      }
      store_vec<4>(sK + n * kPitch + c, kx);
      store_vec<4>(sV + n * kPitch + c, vx);
    }
  }
}

// Line 11: S_ij = Q_i K_j^T (the scale comes at line 12); line 17: dP_ij = dO_i V_j^T. Each
// thread owns rows ty * kSTM + i, columns tx + 16 t of both.
template <class Tr>
__device__ __forceinline__ void scores_and_dprobs(const float* sQ, const float* sK, const float* sdO, const float* sV,
                                                  int tx, int ty, float (&rS)[Tr::kSTM][Tr::kSTN],
                                                  float (&rdP)[Tr::kSTM][Tr::kSTN]) {
  constexpr int kPitch = Tr::kPitch;
#pragma unroll 1
  for (int d = 0; d < Tr::kHeadDim; d += 4) {
    Vec<4> x[Tr::kSTM], y[Tr::kSTN];
#pragma unroll
    for (int i = 0; i < Tr::kSTM; ++i) x[i] = load_vec<4>(sQ + (ty * Tr::kSTM + i) * kPitch + d);
#pragma unroll
    for (int t = 0; t < Tr::kSTN; ++t) y[t] = load_vec<4>(sK + (tx + 16 * t) * kPitch + d);
#pragma unroll
    for (int i = 0; i < Tr::kSTM; ++i)
#pragma unroll
      for (int t = 0; t < Tr::kSTN; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) rS[i][t] = fmaf(x[i].x[e], y[t].x[e], rS[i][t]);
#pragma unroll
    for (int i = 0; i < Tr::kSTM; ++i) x[i] = load_vec<4>(sdO + (ty * Tr::kSTM + i) * kPitch + d);
#pragma unroll
    for (int t = 0; t < Tr::kSTN; ++t) y[t] = load_vec<4>(sV + (tx + 16 * t) * kPitch + d);
#pragma unroll
    for (int i = 0; i < Tr::kSTM; ++i)
#pragma unroll
      for (int t = 0; t < Tr::kSTN; ++t)
#pragma unroll
        for (int e = 0; e < 4; ++e) rdP[i][t] = fmaf(x[i].x[e], y[t].x[e], rdP[i][t]);
  }
}

// Where a (query block, key block) step sits, for the element-wise lines.
struct TileStep {
  int b, h;
  int i0, j0;   // first query row, first key
  int seqlen;   // keys of batch b
  bool full;    // every (row, key) of the pair visible and no additive mask: no element test
};

// Line 12: MASK(S_ij); line 13: P_ij = exp(S_ij - lse_i); line 20: dS_ij = P_ij o (dP_ij - D_i).
// P and dS go to shared memory, where lines 16, 21 and 22 read them along other dimensions.
template <class Tr>
__device__ __forceinline__ void probs_and_dscores(const Args& a, const TileStep& st,
                                                  const float (&rS)[Tr::kSTM][Tr::kSTN],
                                                  const float (&rdP)[Tr::kSTM][Tr::kSTN], const float* sLse,
                                                  const float* sDi, float* sP, float* sdS, int tx, int ty) {
  constexpr int kSPitch = Tr::kSPitch;
  const int b = st.b, h = st.h, i0 = st.i0, j0 = st.j0, seqlen = st.seqlen;
  const bool full = st.full;
#pragma unroll
  for (int i = 0; i < Tr::kSTM; ++i) {
    const int r = ty * Tr::kSTM + i;
    const int row = i0 + r;
    const float lse2 = sLse[r], d_i = sDi[r];
#pragma unroll
    for (int t = 0; t < Tr::kSTN; ++t) {
      const int c = tx + 16 * t;
      float s = rS[i][t] * a.scale_log2;  // the forward's expression, bit for bit
      if (!full) {
        const int col = j0 + c;
        // Rows past S_q have lse = +inf already; -inf keeps their mask reads in bounds.
        if (row >= a.S_q || !a.vis.visible(row, col, seqlen)) s = -INFINITY;
        else if (a.vis.mask.ptr) s += a.vis.bias(b, h, row, col) * kLog2e;
      }
      const float p = exp2f(s - lse2);
      sP[r * kSPitch + c] = p;                      // (kBlockM, kBlockN)
      sdS[r * kSPitch + c] = p * (rdP[i][t] - d_i);  // (kBlockM, kBlockN)
    }
  }
}

// Line 16: dV~_j += P_ij^T dO_i; line 22: dK~_j += dS_ij^T Q_i (scale applied at line 24).
template <class Tr>
__device__ __forceinline__ void accumulate_dkdv(const float* sP, const float* sdS, const float* sdO, const float* sQ,
                                                int kc, int kd, float (&rdK)[4][Tr::kKTD][Tr::kKVec],
                                                float (&rdV)[4][Tr::kKTD][Tr::kKVec]) {
  constexpr int kBlockM = Tr::kBlockM, kPitch = Tr::kPitch, kSPitch = Tr::kSPitch;
#pragma unroll 2
  for (int r = 0; r < kBlockM; ++r) {
    const Vec<4> p4 = load_vec<4>(sP + r * kSPitch + kc * 4);
    const Vec<4> ds4 = load_vec<4>(sdS + r * kSPitch + kc * 4);
#pragma unroll
    for (int t = 0; t < Tr::kKTD; ++t) {
      const int col = (t * Tr::kKDimThreads + kd) * Tr::kKVec;
      const Vec<Tr::kKVec> dov = load_vec<Tr::kKVec>(sdO + r * kPitch + col);
      const Vec<Tr::kKVec> qv = load_vec<Tr::kKVec>(sQ + r * kPitch + col);
#pragma unroll
      for (int i = 0; i < 4; ++i)
#pragma unroll
        for (int e = 0; e < Tr::kKVec; ++e) {
          rdV[i][t][e] = fmaf(p4.x[i], dov.x[e], rdV[i][t][e]);
          rdK[i][t][e] = fmaf(ds4.x[i], qv.x[e], rdK[i][t][e]);
        }
    }
  }
}

// Line 21: dQ_i <- dQ_i + scale dS_ij K_j, read-modify-write in HBM. The same thread updates the
// same dQ elements at every (i, j), so no other thread's write can interleave.
template <class Tr>
__device__ __forceinline__ void update_dq(const Args& a, const float* sdS, const float* sK, float* gdQ, int i0, int qr,
                                          int qd) {
  constexpr int kBlockN = Tr::kBlockN, kPitch = Tr::kPitch, kSPitch = Tr::kSPitch;
  float acc[4][Tr::kQTD][Tr::kQVec] = {};  // (4, kQTD * kQVec) per thread
#pragma unroll 2
  for (int n = 0; n < kBlockN; n += 4) {
    Vec<4> ds4[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) ds4[i] = load_vec<4>(sdS + (qr * 4 + i) * kSPitch + n);
#pragma unroll
    for (int x = 0; x < 4; ++x)
#pragma unroll
      for (int t = 0; t < Tr::kQTD; ++t) {
        const Vec<Tr::kQVec> kv =
            load_vec<Tr::kQVec>(sK + (n + x) * kPitch + (t * Tr::kQDimThreads + qd) * Tr::kQVec);
#pragma unroll
        for (int i = 0; i < 4; ++i)
#pragma unroll
          for (int e = 0; e < Tr::kQVec; ++e) acc[i][t][e] = fmaf(ds4[i].x[x], kv.x[e], acc[i][t][e]);
      }
  }
  Vec<Tr::kQVec> old[4][Tr::kQTD];  // all loads first: stores could alias them otherwise
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int row = i0 + qr * 4 + i;
#pragma unroll
    for (int t = 0; t < Tr::kQTD; ++t) {
      const int col = (t * Tr::kQDimThreads + qd) * Tr::kQVec;
      old[i][t] = row < a.S_q ? load_vec<Tr::kQVec>(gdQ + row * a.dq_st.row + col) : Vec<Tr::kQVec>{};
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int row = i0 + qr * 4 + i;
    if (row >= a.S_q) continue;
#pragma unroll
    for (int t = 0; t < Tr::kQTD; ++t) {
      Vec<Tr::kQVec> out;
#pragma unroll
      for (int e = 0; e < Tr::kQVec; ++e) out.x[e] = fmaf(a.scale, acc[i][t][e], old[i][t].x[e]);
      store_vec<Tr::kQVec>(gdQ + row * a.dq_st.row + (t * Tr::kQDimThreads + qd) * Tr::kQVec, out);
    }
  }
}

// Line 24: write dK_j <- scale dK~_j, dV_j <- dV~_j to HBM (keys past S_k are not written).
template <class Tr>
__device__ __forceinline__ void store_dkdv(const Args& a, float* gdK, float* gdV, int j0, int kc, int kd,
                                           const float (&rdK)[4][Tr::kKTD][Tr::kKVec],
                                           const float (&rdV)[4][Tr::kKTD][Tr::kKVec]) {
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int key = j0 + kc * 4 + i;
    if (key >= a.S_k) continue;
#pragma unroll
    for (int t = 0; t < Tr::kKTD; ++t) {
      const int col = (t * Tr::kKDimThreads + kd) * Tr::kKVec;
      Vec<Tr::kKVec> dk, dv;
#pragma unroll
      for (int e = 0; e < Tr::kKVec; ++e) {
        dk.x[e] = a.scale * rdK[i][t][e];
        dv.x[e] = rdV[i][t][e];
      }
      store_vec<Tr::kKVec>(gdK + key * a.dk_st.row + col, dk);
      store_vec<Tr::kKVec>(gdV + key * a.dv_st.row + col, dv);
    }
  }
}

template <class Tr>
__global__ void __launch_bounds__(Tr::kThreads, 1) backward_kernel(const Args a) {
  constexpr int kBlockM = Tr::kBlockM, kBlockN = Tr::kBlockN, kPitch = Tr::kPitch, kSPitch = Tr::kSPitch;
  extern __shared__ float4 fa1_bwd_smem[];
  float* sK = reinterpret_cast<float*>(fa1_bwd_smem);  // (kBlockN, kPitch)
  float* sV = sK + kBlockN * kPitch;                    // (kBlockN, kPitch)
  float* sQ = sV + kBlockN * kPitch;                    // (kBlockM, kPitch)
  float* sdO = sQ + kBlockM * kPitch;                   // (kBlockM, kPitch)
  float* sP = sdO + kBlockM * kPitch;                   // (kBlockM, kSPitch)
  float* sdS = sP + kBlockM * kSPitch;                  // (kBlockM, kSPitch)
  float* sLse = sdS + kBlockM * kSPitch;                // (kBlockM)
  float* sDi = sLse + kBlockM;                          // (kBlockM)

  const int tid = threadIdx.x;
  const int b = blockIdx.x / a.H_kv, g = blockIdx.x % a.H_kv;  // one block per (b, kv head)
  const int G = a.H / a.H_kv;
  const float* gK = a.k + b * a.k_st.batch + g * a.k_st.head;
  const float* gV = a.v + b * a.v_st.batch + g * a.v_st.head;
  float* gdK = a.dk + b * a.dk_st.batch + g * a.dk_st.head;
  float* gdV = a.dv + b * a.dv_st.batch + g * a.dv_st.head;
  const int seqlen = a.vis.seqlen_k(b);

  // Line 5: dQ = (0) in HBM for the group's query heads — every call, as part of the kernel's
  // time (dK, dV need no clearing: line 24 writes every row of them).
  for (int hh = 0; hh < G; ++hh) {
    float* gdQ = a.dq + b * a.dq_st.batch + (g * G + hh) * a.dq_st.head;
    for (int64_t e = tid; e < static_cast<int64_t>(a.S_q) * Tr::kD4; e += Tr::kThreads)
      store_vec<4>(gdQ + (e / Tr::kD4) * a.dq_st.row + (e % Tr::kD4) * 4, Vec<4>{});
  }
  __syncthreads();

  const int tx = tid % 16, ty = tid / 16;                                  // S, dP
  const int kd = tid % Tr::kKDimThreads, kc = tid / Tr::kKDimThreads;      // dK, dV
  const int qd = tid % Tr::kQDimThreads, qr = tid / Tr::kQDimThreads;      // dQ
  const int n_blocks = (a.S_k + kBlockN - 1) / kBlockN;
  const int m_blocks = (a.S_q + kBlockM - 1) / kBlockM;

  // Line 6: for 1 <= j <= T_c (every block: rows no query sees still get dK = dV = 0).
  for (int nb = 0; nb < n_blocks; ++nb) {
    const int j0 = nb * kBlockN;
    // Line 7: load K_j, V_j from HBM to on-chip SRAM (rows past S_k as zeros).
    __syncthreads();  // the previous tile step's reads of sK, sV are done
    load_kv_tile<Tr>(a, gK, gV, j0, sK, sV, tid);
    // Line 8: dK~_j = (0), dV~_j = (0) on chip; (4, kKTD * kKVec) per thread.
    float rdK[4][Tr::kKTD][Tr::kKVec] = {};
    float rdV[4][Tr::kKTD][Tr::kKVec] = {};

    for (int hh = 0; hh < G; ++hh) {  // the query heads of this kv head, one after another
      const int h = g * G + hh;
      const float* gQ = a.q + b * a.q_st.batch + h * a.q_st.head;
      const float* gO = a.o + b * a.o_st.batch + h * a.o_st.head;
      const float* gdO = a.dout + b * a.do_st.batch + h * a.do_st.head;
      float* gdQ = a.dq + b * a.dq_st.batch + h * a.dq_st.head;
      const float* gLse = a.lse + (static_cast<int64_t>(b) * a.H + h) * a.S_q;

      // Line 9: for 1 <= i <= T_r.
      for (int mb = 0; mb < m_blocks; ++mb) {
        const int i0 = mb * kBlockM;
        const int i_last = min(i0 + kBlockM, a.S_q) - 1;
        // Key ranges never shrink from the front or the back as the query index grows, so the
        // first and last rows bound what the tile sees (block-uniform decisions).
        const IndexRange kf = a.vis.keys(i0, seqlen), kl = a.vis.keys(i_last, seqlen);
        if (j0 >= kl.end || j0 + kBlockN <= kf.begin) continue;
        const bool full = a.vis.mask.ptr == nullptr && kl.begin <= j0 && j0 + kBlockN <= kf.end;

        // Line 10: load Q_i, O_i, dO_i, lse_i (dQ_i is read at line 21); line 19: D_i.
        __syncthreads();  // the previous tile step's reads of sQ, sdO, sP, sdS are done
        load_query_tile<Tr>(a, gQ, gO, gdO, gLse, i0, sQ, sdO, sLse, sDi);
        __syncthreads();

        // Line 11: S_ij = scale Q_i K_j^T; line 17: dP_ij = dO_i V_j^T.
        float rS[Tr::kSTM][Tr::kSTN] = {};   // (kSTM, kSTN) per thread
        float rdP[Tr::kSTM][Tr::kSTN] = {};  // (kSTM, kSTN) per thread
        scores_and_dprobs<Tr>(sQ, sK, sdO, sV, tx, ty, rS, rdP);
        // Line 12: MASK(S_ij); line 13: P_ij = exp(S_ij - lse_i); line 20: dS_ij = P_ij o (dP_ij - D_i).
        probs_and_dscores<Tr>(a, TileStep{b, h, i0, j0, seqlen, full}, rS, rdP, sLse, sDi, sP, sdS, tx, ty);
        __syncthreads();

        // Line 16: dV~_j += P_ij^T dO_i; line 22: dK~_j += dS_ij^T Q_i.
        accumulate_dkdv<Tr>(sP, sdS, sdO, sQ, kc, kd, rdK, rdV);
        // Line 21: dQ_i <- dQ_i + scale dS_ij K_j in HBM.
        update_dq<Tr>(a, sdS, sK, gdQ, i0, qr, qd);
      }  // line 23
    }

    // Line 24: write dK_j <- scale dK~_j, dV_j <- dV~_j to HBM.
    store_dkdv<Tr>(a, gdK, gdV, j0, kc, kd, rdK, rdV);
  }  // line 25
}

// ---- host side --------------------------------------------------------------------------------

// The tiles move 16-byte vectors: rows must start on 16-byte boundaries.
bool rows_aligned(const void* ptr, const Strides& st) {
  return reinterpret_cast<uintptr_t>(ptr) % 16 == 0 && st.batch % 4 == 0 && st.head % 4 == 0 && st.row % 4 == 0;
}

template <int kHeadDim>
void launch(const BwdParams& p, const LaunchContext& ctx) {
  using Tr = Traits<kHeadDim>;
  Args a;
  a.q = static_cast<const float*>(p.q);
  a.k = static_cast<const float*>(p.k);
  a.v = static_cast<const float*>(p.v);
  a.o = static_cast<const float*>(p.o);
  a.dout = static_cast<const float*>(p.dout);
  a.lse = static_cast<const float*>(p.lse);
  a.dq = static_cast<float*>(p.dq);
  a.dk = static_cast<float*>(p.dk);
  a.dv = static_cast<float*>(p.dv);
  a.q_st = p.q_st;
  a.k_st = p.k_st;
  a.v_st = p.v_st;
  a.o_st = p.o_st;
  a.do_st = p.do_st;
  a.dq_st = p.dq_st;
  a.dk_st = p.dk_st;
  a.dv_st = p.dv_st;
  a.H = p.H;
  a.H_kv = p.H_kv;
  a.S_q = p.S_q;
  a.S_k = p.S_k;
  a.scale = p.scale;
  a.scale_log2 = p.scale_log2;
  a.vis = make_visibility(p);
  const auto kernel = &backward_kernel<Tr>;
  // sm_86/sm_89 offer 99 KB per block rather than sm_80's 163 KB: say so instead of failing the launch.
  int smem_optin = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, ctx.device));
  if (Tr::kSmemBytes > static_cast<size_t>(smem_optin))
    throw RuntimeError("fa1 backward: head dim " + std::to_string(kHeadDim) + " needs " +
                       std::to_string(Tr::kSmemBytes / 1024) + " KB of shared memory per block, this GPU offers " +
                       std::to_string(smem_optin / 1024) + " KB");
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                  static_cast<int>(Tr::kSmemBytes)));
  kernel<<<static_cast<unsigned>(p.B * p.H_kv), Tr::kThreads, Tr::kSmemBytes, ctx.stream>>>(a);
  CHECK_LAUNCH("fa1 backward_kernel");
}

// Head dims with a variant; the build compiles those FLASHATTN_HDIMS enables (common/head_dims.h).
using KernelHeadDims = HeadDims<32, 64, 96, 128, 256>;

void run(const BwdParams& p, const LaunchContext& ctx) {
  if (static_cast<int64_t>(p.B) * p.H * p.S_q * p.S_k == 0) return;
  if (p.dtype != DType::F32) throw RuntimeError("fa1 backward: fp32 only");
  if (p.H_kv <= 0 || p.H % p.H_kv != 0) throw RuntimeError("fa1 backward: H must be a multiple of H_kv");
  if (!rows_aligned(p.q, p.q_st) || !rows_aligned(p.k, p.k_st) || !rows_aligned(p.v, p.v_st) ||
      !rows_aligned(p.o, p.o_st) || !rows_aligned(p.dout, p.do_st) || !rows_aligned(p.dq, p.dq_st) ||
      !rows_aligned(p.dk, p.dk_st) || !rows_aligned(p.dv, p.dv_st))
    throw RuntimeError("fa1 backward: q, k, v, o, dout, dq, dk and dv rows must start on 16-byte boundaries");
  KernelHeadDims::dispatch(p.D, "fa1 backward", [&](auto kD) { launch<decltype(kD)::value>(p, ctx); });
}

KernelMode make_entry() {
  KernelMode m;
  m.kernel = "fa1";
  m.mode = Mode::Backward;
  m.summary =
      "FlashAttention-1 (Dao et al. 2022, Alg. 4): K/V-block outer loop, dQ read-modify-written in global memory "
      "(fp32 CUDA cores)";
  m.rung = 4;
  m.gpu = true;
  m.min_sm = 80;  // up to 139 KB of shared memory per block (checked at launch: sm_86/89 offer 99 KB)
  m.dtypes = dtype_bit(DType::F32);
  m.head_dims = KernelHeadDims::list();
  m.features = kAllFeatures;
  m.uses_atomics = false;
  m.bwd = &run;
  m.bwd_workspace = nullptr;
  return m;
}

}  // namespace fa1_bwd
}  // namespace flashattn

FLASHATTN_REGISTER_KERNEL_MODE(fa1_backward, flashattn::fa1_bwd::make_entry)

// The pieces of the fa2 forward kernel (kernels/fa2_fwd.cu): tile shapes and per-head-dim traits,
// the kernel arguments, and the device steps it is built from (cp.async, the K/V, bias and Qᵀ
// tile loads, S = Q Kᵀ and O += P V on register tiles, the block's coordinates; the block setup,
// bias add, element mask, online softmax, Pᵀ store and epilogue). Included by fa2_fwd.cu alone.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "common/mask.cuh"
#include "common/math_constants.h"
#include "flashattn/params.h"

namespace flashattn {
namespace fa2_fwd {

// ---------------------------------------------------------------------------------------------
// Tile shapes. A block has kThreads threads in (kBlockM / kTM) row groups of kTN adjacent lanes;
// a thread owns kTM rows, kSN = kBlockN / kTN columns of S (keys c, c + kTN, ...: consecutive
// lanes read consecutive K rows, which the padded stride spreads over all banks) and
// kON = kHeadDim / kTN columns of O (float4 chunks 4(c + kTN k): a row group reads one contiguous
// V row segment). Shared memory per block: Qᵀ (kHeadDim x kBlockM), K (kBlockN x kLdK),
// V (kBlockN x kHeadDim), Pᵀ (kBlockN x kLdP).
// ---------------------------------------------------------------------------------------------
template <int kHeadDim_, int kTN_, int kNWarps_, int kBlockN_, int kMinBlocksPerSm_>
struct TileTraits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kTN = kTN_;  // threads sharing a row (the row-max shuffle width)
  static constexpr int kNWarps = kNWarps_;
  static constexpr int kThreads = 32 * kNWarps;
  static constexpr int kTM = 8;  // rows per thread: two 128-bit loads of Qᵀ / Pᵀ per k-step
  static constexpr int kBlockM = kTM * kThreads / kTN;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kSN = kBlockN / kTN;
  static constexpr int kON = kHeadDim / kTN;
  static constexpr int kOChunks = kON / 4;
  static constexpr int kMinBlocksPerSm = kMinBlocksPerSm_;
  // Threads along a row when copying K/V tiles: the largest power of two (<= 32) dividing the
  // row's 16-byte chunks, so a warp's copies cover whole 128-byte lines.
  static constexpr int kLoadCols = (kHeadDim / 4) % 32 == 0 ? 32 : ((kHeadDim / 4) % 16 == 0 ? 16 : 8);

  // Qᵀ needs no pad: a warp's loads hit 32 / kTN distinct addresses 8 floats apart. K and Pᵀ
  // rows are read (K) or written (Pᵀ) by consecutive lanes at the same column: a stride of
  // 4 mod 32 floats puts 8 consecutive rows in 8 distinct 16-byte bank groups.
  static constexpr int kLdQ = kBlockM;
  static constexpr int kLdK = kHeadDim + 4;
  static constexpr int kLdV = kHeadDim;
  static constexpr int kLdP = kBlockM + 4;
  static constexpr int kSizeQ = kHeadDim * kLdQ;
  static constexpr int kSizeK = kBlockN * kLdK;
  static constexpr int kSizeV = kBlockN * kLdV;
  static constexpr int kSizeP = kBlockN * kLdP;
  static constexpr size_t kSmemBytes = sizeof(float) * (kSizeQ + kSizeK + kSizeV + kSizeP);

  static_assert(32 % kTN == 0, "a row group must not straddle a warp (shuffle reductions)");
  static_assert(kBlockM % 32 == 0, "Pᵀ stride must be 4 mod 32 floats; Qᵀ stores need 32 rows");
  static_assert(kBlockN % kTN == 0 && kHeadDim % (4 * kTN) == 0, "whole micro-tiles, float4 O chunks");
  static_assert(kHeadDim % 16 == 0, "the QKᵀ loop is unrolled by 4 steps of 4");
  static_assert((kHeadDim / 4) % kLoadCols == 0 && kThreads % kLoadCols == 0 &&
                    kBlockN % (kThreads / kLoadCols) == 0,
                "K/V tiles split evenly into 16-byte copies");
  static_assert((kBlockM * kHeadDim / 4) % kThreads == 0, "Q tile splits evenly into float4 loads");
  static_assert(kLdK % 32 == 4 && kLdP % 32 == 4, "conflict-free padded strides");
};

// Per head dim: (kTN, warps, kBlockN, blocks/SM). kBlockM = 8 * threads / kTN. Registers are
// the budget: O (kTM x kON) and S (kTM x kSN) accumulators live together with m_i, l_i (2 kTM),
// the operand fragments and addresses. Registers in brackets: ptxas for sm_90a, no spills.
template <int kHeadDim> struct Traits;
// D=32 [128]: 8x4 S and O tiles, kBlockM 128 x kBlockN 32; 41 KB smem, so four 128-thread
// blocks per SM (16 warps) once registers fit 128. Half the FFMAs per score of D=64, so the
// softmax is twice the share: not a tuned shape.
template <> struct Traits<32> : TileTraits<32, 8, 4, 32, 4> {};
// D=64 [245], the main target: 8x8 S and 8x8 O tiles, 8 lanes per row, kBlockM 128 x kBlockN 64,
// four warps, two blocks per SM (98 KB smem each). 2 LDS.128 per 32 FFMA instead of 3 for 8x4
// tiles: measured on H200 (2026-11-21) 44.3 TFLOP/s against 39.3 for the 8x4 / 16-warp shape
// (TileTraits<64, 16, 8, 64, 2>): with 8 warps per SM the FFMA issue rate is the limit, so fewer
// shared loads per FFMA beat the extra latency hiding of 16 warps. Also tried: 8x8 with 256
// threads and kBlockM 256 (one block/SM) 43.5; kBlockN 32 35.7; 8x4 with three 128-thread
// blocks/SM 40.9.
template <> struct Traits<64> : TileTraits<64, 8, 4, 64, 2> {};
// D=96 [223]: 8 lanes per row so O is 8x12 (3 float4 chunks); S 8x4 with kBlockN = 32 keeps
// smem at 89 KB: two 128-thread blocks per SM (8 warps).
template <> struct Traits<96> : TileTraits<96, 8, 4, 32, 2> {};
// D=128 [193]: 8x8 O (64) + 8x4 S (32) accumulators, kBlockM 128 x kBlockN 64; Qᵀ alone is
// 64 KB, 162 KB in all, so one 256-thread block per SM (8 warps; still fits sm_80's 163 KB).
// O's 8x8 tile needs 4 LDS.128 per 64 FFMA, QKᵀ 3 per 32.
template <> struct Traits<128> : TileTraits<128, 16, 8, 64, 1> {};
// D=256 [234]: 8x16 O accumulators (128 registers) leave room for an 8x2 S tile only; kBlockM 64
// and kBlockN 32 keep smem at 137 KB so sm_80 runs it too (one 128-thread block per SM). Not a
// tuned shape.
template <> struct Traits<256> : TileTraits<256, 16, 4, 32, 1> {};

// Grid order (see make_args).
enum Order : int { kRowBlocksFastest = 0, kHeavyFirstAscending = 1, kHeavyFirstDescending = 2 };

struct Args {
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  float* o = nullptr;
  float* lse = nullptr;  // [B, H, S_q]
  Strides q_st, k_st, v_st, o_st;
  int B = 0, H = 0, S_q = 0, S_k = 0;
  int kv_group = 1;  // H / H_kv
  int num_m_blocks = 0;
  int order = kRowBlocksFastest;
  float scale_log2 = 0.f;
  Visibility vis;
};


__device__ __forceinline__ float ex2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// 16-byte global -> shared copy; src_bytes = 0 zero-fills (rows past the key range: V must be 0
// there, not stale shared memory that could hold NaN, since 0 * NaN poisons O).
__device__ __forceinline__ void cp_async_16(float* dst, const float* src, bool valid) {
  const unsigned dst_s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst_s), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_4(float* dst, const float* src, bool valid) {
  const unsigned dst_s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(dst_s), "l"(src), "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::: "memory"); }

// One (kBlockN, kHeadDim) tile of K or V, rows [n0, n0 + kBlockN) of one (b, kv head); rows at
// or past kv_limit become zeros. kLoadCols adjacent threads copy adjacent 16-byte chunks of a row
// (coalesced); a thread's chunks sit at fixed offsets from its first one, so its addresses are
// one base plus immediates rather than a register pair per chunk.
template <class Kt>
__device__ __forceinline__ void load_kv_tile(float* sX, int ld, const float* gX, int64_t row_stride, int n0,
                                             int kv_limit) {
  constexpr int kRowStep = Kt::kThreads / Kt::kLoadCols;  // rows covered by one pass of the block
  const int r0 = threadIdx.x / Kt::kLoadCols, c0 = 4 * (threadIdx.x % Kt::kLoadCols);
  const float* src_thr = gX + (n0 + r0) * row_stride + c0;
  float* dst_thr = sX + r0 * ld + c0;
#pragma unroll
  for (int ri = 0; ri < Kt::kBlockN / kRowStep; ++ri) {
    const bool valid = n0 + r0 + ri * kRowStep < kv_limit;
#pragma unroll
    for (int ci = 0; ci < Kt::kHeadDim / (4 * Kt::kLoadCols); ++ci) {
      const float* src = src_thr + ri * kRowStep * row_stride + 4 * Kt::kLoadCols * ci;
      cp_async_16(dst_thr + ri * kRowStep * ld + 4 * Kt::kLoadCols * ci, valid ? src : gX, valid);
    }
  }
}

// threadIdx.x read where it is used: index math for the rarely taken mask paths then cannot be
// hoisted out of the K/V loop and held in registers (or spilled) for the whole loop.
__device__ __forceinline__ int thread_index_here() {
  int tid;
  asm volatile("mov.u32 %0, %%tid.x;" : "=r"(tid));
  return tid;
}

// The additive mask for rows [m0, m0 + kBlockM) and keys [n0, n0 + kBlockN), transposed into
// sBt[j][i] (the Pᵀ buffer, unused until P is written), zeros outside [S_q) x [S_k). Staged through
// shared memory with 4-byte cp.async so the loads neither hold registers nor stall QKᵀ.
template <class Kt>
__device__ __forceinline__ void load_bias_tile(float* sBt, const Args& a, int b, int h, int m0, int n0) {
  static_assert(Kt::kThreads % Kt::kBlockN == 0, "a thread keeps one key column of the tile");
  constexpr int kRowStep = Kt::kThreads / Kt::kBlockN;
  const MaskView& mk = a.vis.mask;
  const int tid = thread_index_here();
  const int j = tid % Kt::kBlockN, i0 = tid / Kt::kBlockN;  // lanes along keys: coalesced rows
  const bool col_ok = n0 + j < a.S_k;
  const float* src = mk.ptr + b * mk.batch + h * mk.head + (m0 + i0) * mk.row + (n0 + j) * mk.col;
#pragma unroll 4
  for (int i = i0; i < Kt::kBlockM; i += kRowStep) {
    const bool valid = col_ok && m0 + i < a.S_q;
    cp_async_4(sBt + j * Kt::kLdP + i, valid ? src : mk.ptr, valid);
    src += kRowStep * mk.row;
  }
}

// Qᵀ tile, scaled into log2 units: sQt[d][i] = Q[m0 + i][d] * scale·log2 e, zero past S_q.
// Lanes take consecutive rows so the transposing scalar stores hit 32 distinct banks.
template <class Kt>
__device__ __forceinline__ void load_q_transposed(float* sQt, const float* gQ, int64_t row_stride, int rows,
                                                  float scale_log2) {
  constexpr int kChunks = Kt::kBlockM * Kt::kHeadDim / 4;
#pragma unroll 8
  for (int it = 0; it < kChunks / Kt::kThreads; ++it) {
    const int e = it * Kt::kThreads + threadIdx.x;
    const int i = e % Kt::kBlockM, c = e / Kt::kBlockM;
    float4 x = make_float4(0.f, 0.f, 0.f, 0.f);
    if (i < rows) x = __ldg(reinterpret_cast<const float4*>(gQ + i * row_stride + 4 * c));
    float* dst = sQt + 4 * c * Kt::kLdQ + i;
    dst[0 * Kt::kLdQ] = x.x * scale_log2;
    dst[1 * Kt::kLdQ] = x.y * scale_log2;
    dst[2 * Kt::kLdQ] = x.z * scale_log2;
    dst[3 * Kt::kLdQ] = x.w * scale_log2;
  }
}

// min(x, n) for a key index x >= 0 and a length n >= 0, as int.
__device__ __forceinline__ int clamp_to(int64_t x, int n) { return x < n ? static_cast<int>(x) : n; }

__device__ __forceinline__ float lane4(const float4& v, int e) {
  return e == 0 ? v.x : (e == 1 ? v.y : (e == 2 ? v.z : v.w));
}

// rS = Q_i K_jᵀ from the Qᵀ and K tiles. Per 4-wide step of d: one LDS.128 of K per owned key
// (4 consecutive d) and two LDS.128 of Qᵀ per d (8 owned rows), (kSN + 8) loads per 32 kSN FFMA.
template <class Kt>
__device__ __forceinline__ void gemm_qk(float (&rS)[Kt::kTM][Kt::kSN], const float* sQ_thr,
                                        const float* sK_thr) {
#pragma unroll
  for (int r = 0; r < Kt::kTM; ++r)
#pragma unroll
    for (int t = 0; t < Kt::kSN; ++t) rS[r][t] = 0.f;
#pragma unroll 4
  for (int d0 = 0; d0 < Kt::kHeadDim; d0 += 4) {
    float4 rK[Kt::kSN];  // (kSN keys, 4 d)
#pragma unroll
    for (int t = 0; t < Kt::kSN; ++t)
      rK[t] = *reinterpret_cast<const float4*>(sK_thr + t * Kt::kTN * Kt::kLdK + d0);
#pragma unroll
    for (int dd = 0; dd < 4; ++dd) {
      const float4 qa = *reinterpret_cast<const float4*>(sQ_thr + (d0 + dd) * Kt::kLdQ);
      const float4 qb = *reinterpret_cast<const float4*>(sQ_thr + (d0 + dd) * Kt::kLdQ + 4);
      const float rQ[Kt::kTM] = {qa.x, qa.y, qa.z, qa.w, qb.x, qb.y, qb.z, qb.w};  // (kTM) rows at d
#pragma unroll
      for (int t = 0; t < Kt::kSN; ++t) {
        const float kk = lane4(rK[t], dd);
#pragma unroll
        for (int r = 0; r < Kt::kTM; ++r) rS[r][t] = fmaf(rQ[r], kk, rS[r][t]);
      }
    }
  }
}

// rO += P_ij V_j: per key, two LDS.128 of Pᵀ (8 owned rows) and kOChunks LDS.128 of V.
template <class Kt>
__device__ __forceinline__ void gemm_pv(float (&rO)[Kt::kTM][Kt::kON], const float* sP_thr,
                                        const float* sV_thr) {
  constexpr int kUnroll = 512 / (Kt::kTM * Kt::kON) > 0 ? 512 / (Kt::kTM * Kt::kON) : 1;  // ~512 FFMA a trip
#pragma unroll kUnroll
  for (int j = 0; j < Kt::kBlockN; ++j) {
    const float4 pa = *reinterpret_cast<const float4*>(sP_thr + j * Kt::kLdP);
    const float4 pb = *reinterpret_cast<const float4*>(sP_thr + j * Kt::kLdP + 4);
    const float rP[Kt::kTM] = {pa.x, pa.y, pa.z, pa.w, pb.x, pb.y, pb.z, pb.w};  // (kTM) rows at key j
#pragma unroll
    for (int ch = 0; ch < Kt::kOChunks; ++ch) {
      const float4 rV = *reinterpret_cast<const float4*>(sV_thr + j * Kt::kLdV + 4 * Kt::kTN * ch);
#pragma unroll
      for (int e = 0; e < 4; ++e)
#pragma unroll
        for (int r = 0; r < Kt::kTM; ++r) rO[r][4 * ch + e] = fmaf(rP[r], lane4(rV, e), rO[r][4 * ch + e]);
    }
  }
}

// K and V of (batch b, query head h): kv head h / (H / H_kv).
__device__ __forceinline__ const float* k_head(const Args& a, int b, int h) {
  return a.k + b * a.k_st.batch + (h / a.kv_group) * a.k_st.head;
}
__device__ __forceinline__ const float* v_head(const Args& a, int b, int h) {
  return a.v + b * a.v_st.batch + (h / a.kv_group) * a.v_st.head;
}

// Which (Q block, b, h) a thread block computes, from its linear index (32-bit: the grid and
// B*H fit in int, and 64-bit division is a long subroutine).
struct TileCoords {
  int m_block, b, h;
};
__device__ __forceinline__ TileCoords tile_coords(const Args& a) {
  const unsigned idx = blockIdx.x, bh_count = static_cast<unsigned>(a.B) * a.H;
  unsigned bh, m_block;
  if (a.order == kRowBlocksFastest) {
    m_block = idx % a.num_m_blocks;
    bh = idx / a.num_m_blocks;
  } else {
    const unsigned level = idx / bh_count;
    bh = idx % bh_count;
    m_block = a.order == kHeavyFirstDescending ? a.num_m_blocks - 1 - level : level;
  }
  return TileCoords{static_cast<int>(m_block), static_cast<int>(bh / a.H), static_cast<int>(bh % a.H)};
}

// Block-uniform values the K/V loop needs only now and then. They sit in shared memory and are
// re-read where used (each __syncthreads orders the reads), so they occupy no registers across
// the loop: at D = 64 the accumulators and operands already use most of the 128 that two
// resident blocks allow.
struct BlockInfo {
  int b, h, m0;
  int seqlen;                      // keys of batch b
  int kv_hi;                       // keys at or past it are loaded as zeros
  int n_full_begin, n_full_end;    // K/V blocks every row sees whole: no element mask
};

// Block setup: the K/V blocks [n_begin, n_end) holding a key visible to a row of this Q block,
// the block-uniform values in s_info (thread 0), and the first loads: K_1 (cp.async) and Q_i.
template <class Kt>
__device__ __forceinline__ void block_setup(const Args& a, BlockInfo& s_info, float* sQt, float* sK, int& n_begin,
                                            int& n_end) {
  constexpr int kBlockM = Kt::kBlockM, kBlockN = Kt::kBlockN;
  const TileCoords tile = tile_coords(a);
  const int m0 = tile.m_block * kBlockM;
  const int rows = min(kBlockM, a.S_q - m0);
  // begin and end of visible_keys(i) never decrease with i, so the block's rows see at most
  // [first.begin, last.end) and all of them see [last.begin, first.end).
  const int seqlen = a.vis.seqlen_k(tile.b);
  const IndexRange first = a.vis.keys(m0, seqlen), last = a.vis.keys(m0 + rows - 1, seqlen);
  // Clamped to [0, seqlen]: a range that starts past seqlen (a window far right of the keys)
  // is empty but has begin = end > seqlen.
  const int kv_lo = clamp_to(first.begin, seqlen), kv_hi = clamp_to(last.end, seqlen);
  const int full_lo = clamp_to(last.begin, seqlen), full_hi = clamp_to(first.end, seqlen);
  n_begin = kv_lo / kBlockN;
  n_end = kv_hi > kv_lo ? (kv_hi + kBlockN - 1) / kBlockN : n_begin;
  if (threadIdx.x == 0) {
    s_info.b = tile.b;
    s_info.h = tile.h;
    s_info.m0 = m0;
    s_info.seqlen = seqlen;
    s_info.kv_hi = kv_hi;
    const bool any_full = full_hi > full_lo;
    s_info.n_full_begin = any_full ? (full_lo + kBlockN - 1) / kBlockN : 0;
    s_info.n_full_end = any_full ? full_hi / kBlockN : 0;
  }
  if (n_end > n_begin) {  // block-uniform
    load_kv_tile<Kt>(sK, Kt::kLdK, k_head(a, tile.b, tile.h), a.k_st.row, n_begin * kBlockN, kv_hi);
    cp_async_commit();
    load_q_transposed<Kt>(sQt, a.q + tile.b * a.q_st.batch + tile.h * a.q_st.head + m0 * a.q_st.row,
                          a.q_st.row, rows, a.scale_log2);
  }
}

// S' += mask log2 e, from the bias tile staged in the Pᵀ buffer (load_bias_tile).
template <class Kt>
__device__ __forceinline__ void add_bias(float (&rS)[Kt::kTM][Kt::kSN], const float* sP_thr, int tc) {
  constexpr int kTM = Kt::kTM, kSN = Kt::kSN, kTN = Kt::kTN;
  cp_async_wait_all();
  __syncthreads();
#pragma unroll
  for (int t = 0; t < kSN; ++t) {
    const float* src = sP_thr + (tc + kTN * t) * Kt::kLdP;
    const float4 ba = *reinterpret_cast<const float4*>(src);
    const float4 bb = *reinterpret_cast<const float4*>(src + 4);
    const float rB[kTM] = {ba.x, ba.y, ba.z, ba.w, bb.x, bb.y, bb.z, bb.w};
#pragma unroll
    for (int r = 0; r < kTM; ++r) rS[r][t] = fmaf(rB[r], kLog2e, rS[r][t]);
  }
  __syncthreads();  // everyone has its bias before P overwrites the buffer
}

// Element mask of a K/V block that straddles a row's boundary: invisible keys -> -inf.
template <class Kt>
__device__ __forceinline__ void mask_scores(float (&rS)[Kt::kTM][Kt::kSN], const Args& a,
                                            const volatile BlockInfo& info, int n0) {
  constexpr int kTM = Kt::kTM, kSN = Kt::kSN, kTN = Kt::kTN;
  const int seqlen = info.seqlen;
  const int row0 = info.m0 + thread_index_here() / kTN * kTM;
  const int col0 = n0 + thread_index_here() % kTN;
#pragma unroll
  for (int r = 0; r < kTM; ++r) {
    const IndexRange keys = a.vis.keys(row0 + r, seqlen);
    const int lo = clamp_to(keys.begin, seqlen), hi = clamp_to(keys.end, seqlen);
#pragma unroll
    for (int t = 0; t < kSN; ++t) {
      const int j = col0 + kTN * t;
      if (j < lo || j >= hi) rS[r][t] = -INFINITY;
    }
  }
}

// m_new = max(m_i, rowmax(S)); P = exp(S - m_new); l_i = e^(m_i - m_new) l_i + rowsum(P);
// O_i = diag(e^(m_i - m_new)) O_i. A row with no finite score yet keeps m = -inf and
// subtracts 0 instead, so its P is exp(-inf) = 0 rather than NaN.
template <class Kt>
__device__ __forceinline__ void online_softmax(float (&rS)[Kt::kTM][Kt::kSN], float (&rO)[Kt::kTM][Kt::kON],
                                               float (&m_i)[Kt::kTM], float (&l_i)[Kt::kTM]) {
  constexpr int kTM = Kt::kTM, kSN = Kt::kSN, kON = Kt::kON, kTN = Kt::kTN;
#pragma unroll
  for (int r = 0; r < kTM; ++r) {
    float mx = rS[r][0];
#pragma unroll
    for (int t = 1; t < kSN; ++t) mx = fmaxf(mx, rS[r][t]);
#pragma unroll
    for (int off = kTN / 2; off > 0; off /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
    const float m_new = fmaxf(m_i[r], mx);
    const float m_use = m_new == -INFINITY ? 0.f : m_new;
    const float alpha = ex2(m_i[r] - m_use);
    m_i[r] = m_new;
    float rowsum = 0.f;
#pragma unroll
    for (int t = 0; t < kSN; ++t) {
      rS[r][t] = ex2(rS[r][t] - m_use);
      rowsum += rS[r][t];
    }
    l_i[r] = fmaf(l_i[r], alpha, rowsum);
#pragma unroll
    for (int c = 0; c < kON; ++c) rO[r][c] *= alpha;
  }
}

// P_ijᵀ to shared memory: for each owned key, its 8 rows as two 128-bit stores.
template <class Kt>
__device__ __forceinline__ void store_pt(float* sP_thr, const float (&rS)[Kt::kTM][Kt::kSN], int tc) {
  constexpr int kSN = Kt::kSN, kTN = Kt::kTN;
#pragma unroll
  for (int t = 0; t < kSN; ++t) {
    float* dst = sP_thr + (tc + kTN * t) * Kt::kLdP;
    *reinterpret_cast<float4*>(dst) = make_float4(rS[0][t], rS[1][t], rS[2][t], rS[3][t]);
    *reinterpret_cast<float4*>(dst + 4) = make_float4(rS[4][t], rS[5][t], rS[6][t], rS[7][t]);
  }
}

// Epilogue: O_i = diag(l_i)^-1 O_i;  L_i = m_i + log(l_i)  (natural log: m_i is in log2 units).
// The row sum is reduced over the row's kTN lanes first.
template <class Kt>
__device__ __forceinline__ void epilogue(const Args& a, const volatile BlockInfo& info,
                                         const float (&rO)[Kt::kTM][Kt::kON], const float (&m_i)[Kt::kTM],
                                         const float (&l_i)[Kt::kTM], int tr, int tc) {
  constexpr int kTM = Kt::kTM, kTN = Kt::kTN;
  const int b = info.b, h = info.h;
  float* gO = a.o + b * a.o_st.batch + h * a.o_st.head;
  float* gLse = a.lse + (static_cast<int64_t>(b) * a.H + h) * a.S_q;
#pragma unroll
  for (int r = 0; r < kTM; ++r) {
    float l = l_i[r];
#pragma unroll
    for (int off = kTN / 2; off > 0; off /= 2) l += __shfl_xor_sync(0xffffffffu, l, off);
    const int i = info.m0 + tr * kTM + r;
    if (i >= a.S_q) continue;
    const float inv_l = l > 0.f ? 1.f / l : 0.f;  // l = 0: no visible finite score, O = 0
    float* o_row = gO + i * a.o_st.row;
#pragma unroll
    for (int ch = 0; ch < Kt::kOChunks; ++ch)
      *reinterpret_cast<float4*>(o_row + 4 * (tc + kTN * ch)) =
          make_float4(rO[r][4 * ch] * inv_l, rO[r][4 * ch + 1] * inv_l, rO[r][4 * ch + 2] * inv_l,
                      rO[r][4 * ch + 3] * inv_l);
    if (tc == 0) gLse[i] = l > 0.f ? fmaf(m_i[r], kLn2, logf(l)) : -INFINITY;
  }
}

}  // namespace fa2_fwd
}  // namespace flashattn

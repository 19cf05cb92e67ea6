// The pieces of the fa2 backward kernels (kernels/fa2_bwd.cu): the thread tiles and per-head-dim
// traits, the kernel arguments, the visible query/key spans of a block, the cp.async loads, the
// register-tiled product over shared memory, and the softmax-gradient steps of Algorithm 2
// (P, dS, the dQ tile's atomic add, the dK/dV stores). Host-device where a host emulation may run
// them; included by fa2_bwd.cu alone.
#pragma once

#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "common/host_device.h"
#include "common/mask.cuh"
#include "common/math_constants.h"
#include "flashattn/params.h"

namespace flashattn {
namespace fa2_bwd {

// Unrolling pragmas for the device pass only: the helpers are host-device so a host emulation can
// run them, and the host compiler does not know the pragma.
#if defined(__CUDA_ARCH__)
#define FA2_UNROLL _Pragma("unroll")
#define FA2_UNROLL_2 _Pragma("unroll 2")
#else
#define FA2_UNROLL
#define FA2_UNROLL_2
#endif

constexpr int kNThreads = 256;  // 8 warps: 2 per scheduler at one block per SM
constexpr int kNWarps = kNThreads / 32;
// The largest dynamic shared memory an sm_80 block may opt into. Every head dim's tiles fit, so
// one set of traits serves sm_80 and sm_90.
constexpr int kSmemLimitSm80 = 163 * 1024;

// ---- thread tiles -------------------------------------------------------------------------------
// One thread's share of an (R, C) product tile: TR x TC accumulators on a GR x GC thread grid.
// Each dimension has one of two layouts, chosen by how its operand is read from shared memory:
//   strided: element i at t + G*i      — the operand is read along k (one LDS.128 gives 4 k's of
//            one row); neighbouring threads read neighbouring rows, so the row pitch / 4 must be
//            odd for the 4 (or 8) rows a warp reads to fall in distinct 16-byte bank groups;
//   quad:    element i at 4*(t + G*(i/4)) + i%4 — the operand is read as float4 along this
//            dimension; neighbouring threads read neighbouring 16 bytes: conflict-free.
// Lanes: bit 0 moves the column, bit 1 the row. Lanes l and l^1 then load the same A address and
// l and l^2 the same B address: the pairing with which an LDS.128 returns in 2 shared-memory
// cycles instead of 4 (documented for sm_70/75, assumed to carry over). The 128 B/clk return
// path, not the banks, is what bounds a CUDA-core SGEMM's operand feed.
template <int R, int C, int TR_, int TC_, bool kRowQuad_, bool kColQuad_>
struct ThreadTile {
  static constexpr int TR = TR_, TC = TC_;
  static constexpr bool kRowQuad = kRowQuad_, kColQuad = kColQuad_;
  static constexpr int GR = R / TR, GC = C / TC;
  static_assert(R % TR == 0 && C % TC == 0, "the tile splits evenly");
  static_assert(GR * GC == kNThreads, "every thread owns one micro-tile");
  static_assert(GR % 4 == 0 && GC % 8 == 0, "warps are 4 x 8 threads");
  static_assert((!kRowQuad || TR % 4 == 0) && (!kColQuad || TC % 4 == 0), "quads are float4s");

  FLASHATTN_HD static int row(int tr, int i) { return kRowQuad ? 4 * (tr + GR * (i / 4)) + i % 4 : tr + GR * i; }
  FLASHATTN_HD static int col(int tc, int j) { return kColQuad ? 4 * (tc + GC * (j / 4)) + j % 4 : tc + GC * j; }
  FLASHATTN_HD static int thread_row(int tid) {
    const int lane = tid % 32;
    return (tid / 32) / (GC / 8) * 4 + (((lane >> 1) & 1) | ((lane >> 3) & 2));
  }
  FLASHATTN_HD static int thread_col(int tid) {
    const int lane = tid % 32;
    return (tid / 32) % (GC / 8) * 8 + ((lane & 1) | ((lane >> 1) & 6));
  }
};

// ---- traits per head dim ------------------------------------------------------------------------
// kBlockM query rows per step, kBlockN keys per thread block; micro-tiles of the three product
// shapes: S and dP (kBlockM, kBlockN), dK and dV (kBlockN, D), dQ (kBlockM, D).
template <int kHeadDim_, int kBlockM_, int kBlockN_, int kSTR, int kSTC, int kKvTR, int kKvTC, int kQTR, int kQTC>
struct TraitsBase {
  static constexpr int kHeadDim = kHeadDim_, kBlockM = kBlockM_, kBlockN = kBlockN_;
  // S = Q K^T reads Q along d (rows strided) and K^T as float4s along keys (columns quad).
  using TileS = ThreadTile<kBlockM, kBlockN, kSTR, kSTC, /*row_quad=*/false, /*col_quad=*/true>;
  // dV = P^T dO, dK = dS^T Q read P / dS as float4s along keys and dO / Q as float4s along d.
  using TileKV = ThreadTile<kBlockN, kHeadDim, kKvTR, kKvTC, /*row_quad=*/true, /*col_quad=*/true>;
  // dQ = dS K reads dS along keys and K^T along keys: both strided, so one atomic instruction of
  // a warp covers 8 consecutive d of 4 rows (4 sectors).
  using TileQ = ThreadTile<kBlockM, kHeadDim, kQTR, kQTC, /*row_quad=*/false, /*col_quad=*/false>;

  static constexpr int kLdQ = kHeadDim + 4;  // sQ, sdO: (kBlockM, kLdQ)
  static constexpr int kLdKt = kBlockN + 4;  // sKt, sVt: (kHeadDim, kLdKt)
  static constexpr int kLdP = kBlockN + 4;   // sP (P, then dS): (kBlockM, kLdP)
  static_assert((kLdQ / 4) % 2 == 1 && (kLdKt / 4) % 2 == 1 && (kLdP / 4) % 2 == 1,
                "strided reads need pitch/4 odd to stay conflict-free");

  static constexpr int kOffLse = 0;                                // (kBlockM)
  static constexpr int kOffDelta = kOffLse + kBlockM;              // (kBlockM)
  static constexpr int kOffQ = kOffDelta + kBlockM;                // (kBlockM, kLdQ)
  static constexpr int kOffDo = kOffQ + kBlockM * kLdQ;            // (kBlockM, kLdQ)
  static constexpr int kOffKt = kOffDo + kBlockM * kLdQ;           // (kHeadDim, kLdKt)
  static constexpr int kOffVt = kOffKt + kHeadDim * kLdKt;         // (kHeadDim, kLdKt)
  static constexpr int kOffP = kOffVt + kHeadDim * kLdKt;          // (kBlockM, kLdP)
  static constexpr int kSmemFloats = kOffP + kBlockM * kLdP;
  static constexpr int kSmemBytes = kSmemFloats * static_cast<int>(sizeof(float));
  static_assert(kOffQ % 4 == 0, "float4 tiles start 16-byte aligned");
  static_assert(kSmemBytes <= kSmemLimitSm80, "one block must fit an sm_80 SM");

  static constexpr int kRowChunks = kBlockM * kHeadDim / 4;  // float4s of a Q or dO block
  static constexpr int kKvChunks = kBlockN * kHeadDim / 4 / kNThreads;  // float4s of K (or V) per thread
  static_assert(kRowChunks % kNThreads == 0 && kBlockN * kHeadDim / 4 % kNThreads == 0, "even loads");
  static_assert(2 * kBlockM <= kNThreads, "one thread per lse and per D_i entry");
};

template <int kHeadDim> struct Traits;
// Register budget (255 at one block per SM): the dK, dV accumulators (2 * kBlockN * D / 256 per
// thread) stay live across the whole loop, next to one S or dP tile and the operand fragments.
// D = 32: dK, dV are small, so 128 x 128 blocks give S the 8 x 8 tile (16 FMAs per LDS.128).
template <> struct Traits<32> : TraitsBase<32, 128, 128, 8, 8, 4, 4, 4, 4> {};
// D = 64, the speed target: 128 keys keep dK, dV (64 regs) and S, dP, dV, dK on 4 x 8 tiles
// (10.7 FMAs per LDS.128); only dQ has 4 x 4. 128 keys also halve the dQ atomics.
template <> struct Traits<64> : TraitsBase<64, 64, 128, 4, 8, 8, 4, 4, 4> {};
// D = 96: 64 keys would give dK, dV 24 values per thread, not float4 groups; 128 keys with 32
// query rows keep 96 accumulator registers and the shared memory under sm_80's limit.
template <> struct Traits<96> : TraitsBase<96, 32, 128, 2, 8, 4, 12, 2, 6> {};
// D = 128: dK, dV take 64 registers at 64 keys; 64 query rows fit 152 KB of shared memory.
template <> struct Traits<128> : TraitsBase<128, 64, 64, 4, 4, 4, 8, 4, 8> {};
// D = 256: 32 keys for 64 accumulator registers, 32 query rows for 142 KB; S is tiny (1 x 4
// per thread), so this one is bound by operand loads, not FMAs.
template <> struct Traits<256> : TraitsBase<256, 32, 32, 1, 4, 4, 8, 2, 16> {};

// ---- arguments ----------------------------------------------------------------------------------
struct Args {
  const float* q = nullptr;
  const float* k = nullptr;
  const float* v = nullptr;
  const float* o = nullptr;
  const float* dout = nullptr;
  const float* lse = nullptr;  // [B, H, S_q], natural log
  float* delta = nullptr;      // workspace [B, H, S_q]: D_i
  float* dq = nullptr;
  float* dk = nullptr;
  float* dv = nullptr;
  Strides q_st, k_st, v_st, o_st, do_st, dq_st, dk_st, dv_st;
  int B = 0, H = 0, H_kv = 0, S_q = 0, S_k = 0, D = 0;
  float scale = 0.f, scale_log2 = 0.f;
  Visibility vis;
  bool atomic_dq = true;  // false: the deterministic dQ kernel writes dq
};

FLASHATTN_HD inline int64_t min64(int64_t a, int64_t b) { return a < b ? a : b; }
FLASHATTN_HD inline int64_t max64(int64_t a, int64_t b) { return a > b ? a : b; }

// Queries that see any key of [n0, n0 + kBlockN): per key j they are [j - c - wr, j - c + wl]
// (c = S_k - S_q), intervals that slide by one per key, so their union is one interval.
FLASHATTN_HD inline IndexRange query_span(const Visibility& v, int64_t n0, int block_n, int seqlen) {
  if (n0 >= seqlen) return IndexRange{0, 0};
  const int64_t n_last = min64(n0 + block_n, seqlen) - 1;
  const int64_t c = static_cast<int64_t>(v.S_k) - v.S_q;
  IndexRange r{0, v.S_q};
  if (v.window_right >= 0) r.begin = max64(r.begin, n0 - c - v.window_right);
  if (v.window_left >= 0) r.end = min64(r.end, n_last - c + v.window_left + 1);
  if (r.end < r.begin) r.end = r.begin;
  return r;
}

// Keys that some query of [m0, m0 + kBlockM) sees (the same union, the other way round).
FLASHATTN_HD inline IndexRange key_span(const Visibility& v, int64_t m0, int block_m, int seqlen) {
  const int64_t m_last = min64(m0 + block_m, v.S_q) - 1;
  const int64_t c = static_cast<int64_t>(v.S_k) - v.S_q;
  IndexRange r{0, seqlen};
  if (v.window_left >= 0) r.begin = max64(r.begin, m0 + c - v.window_left);
  if (v.window_right >= 0) r.end = min64(r.end, m_last + c + v.window_right + 1);
  if (r.end < r.begin) r.end = r.begin;
  return r;
}

// True when every (query < S_q, key) of the block pair is visible: no element predicate needed.
// The extreme corners decide: the left edge binds at (last row, first key), the right edge at
// (first row, last key). Rows past S_q need none (their lse is +inf).
FLASHATTN_HD inline bool pair_fully_visible(const Visibility& v, int64_t m0, int block_m, int64_t n0, int block_n,
                                            int seqlen) {
  const int64_t m_last = min64(m0 + block_m, v.S_q) - 1;
  const int64_t c = static_cast<int64_t>(v.S_k) - v.S_q;
  if (n0 + block_n > seqlen) return false;
  if (v.window_left >= 0 && n0 < m_last + c - v.window_left) return false;
  if (v.window_right >= 0 && n0 + block_n - 1 > m0 + c + v.window_right) return false;
  return true;
}

// ---- loads --------------------------------------------------------------------------------------
// cp.async with zero fill (src-size 0) for rows past the end; the host branch lets the same
// per-thread code run in a host emulation.
FLASHATTN_HD inline void copy16_async(float* dst, const float* src, bool valid) {
#if defined(__CUDA_ARCH__)
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(src), "r"(valid ? 16 : 0)
               : "memory");
#else
  for (int e = 0; e < 4; ++e) dst[e] = valid ? src[e] : 0.f;
#endif
}

FLASHATTN_HD inline void copy4_async(float* dst, const float* src, bool valid) {
#if defined(__CUDA_ARCH__)
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(s), "l"(src), "r"(valid ? 4 : 0)
               : "memory");
#else
  *dst = valid ? *src : 0.f;
#endif
}

__device__ inline void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
__device__ inline void cp_async_wait_all() { asm volatile("cp.async.wait_all;\n" ::: "memory"); }

FLASHATTN_HD inline float4 lds128(const float* p) { return *reinterpret_cast<const float4*>(p); }

// 2^x in one MUFU.EX2 (2 ulp). Flushing subnormal results to zero drops P < 2^-126, far below
// what fp32 sums can see; exp2f would add a range check and two multiplies per element.
FLASHATTN_HD inline float exp2_ftz(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
#else
  return exp2f(x);
#endif
}

// Rows [m0, m0 + kBlockM) of one (batch, head) slice (row 0 at g) into s: (kBlockM, kLdQ).
template <class Tr>
FLASHATTN_HD inline void load_rows_async(float* s, const float* g, int64_t row_stride, int64_t m0, int S_q, int tid) {
  constexpr int kPerRow = Tr::kHeadDim / 4;
  FA2_UNROLL
  for (int t = 0; t < Tr::kRowChunks / kNThreads; ++t) {
    const int c = tid + t * kNThreads;
    const int m = c / kPerRow, d = 4 * (c % kPerRow);
    const bool valid = m0 + m < S_q;
    copy16_async(s + m * Tr::kLdQ + d, g + (valid ? m0 + m : 0) * row_stride + d, valid);
  }
}

// lse and D_i of rows [m0, m0 + kBlockM); row0 = (b*H + h)*S_q.
template <class Tr>
FLASHATTN_HD inline void load_stats_async(float* sLse, float* sDelta, const Args& a, int64_t row0, int64_t m0, int tid) {
  const int m = tid % Tr::kBlockM;
  if (tid >= 2 * Tr::kBlockM) return;
  const bool valid = m0 + m < a.S_q;
  const int64_t idx = row0 + (valid ? m0 + m : 0);
  if (tid < Tr::kBlockM) copy4_async(sLse + m, a.lse + idx, valid);
  else copy4_async(sDelta + m, a.delta + idx, valid);
}

// K (or V) rows [n0, n0 + kBlockN) into registers; consecutive threads take consecutive keys so
// the transposed stores below hit consecutive banks. Keys past S_k are zero.
template <class Tr>
FLASHATTN_HD inline void load_kv_regs(float4 (&r)[Tr::kKvChunks], const float* g, int64_t row_stride, int64_t n0,
                                      int S_k, int tid) {
  FA2_UNROLL
  for (int t = 0; t < Tr::kKvChunks; ++t) {
    const int c = tid + t * kNThreads;
    const int n = c % Tr::kBlockN, d = 4 * (c / Tr::kBlockN);
    r[t] = n0 + n < S_k ? *reinterpret_cast<const float4*>(g + (n0 + n) * row_stride + d) : make_float4(0.f, 0.f, 0.f, 0.f);
  }
}

// ... and from registers into sT: (kHeadDim, kLdKt), transposed.
template <class Tr>
FLASHATTN_HD inline void store_kv_transposed(float* sT, const float4 (&r)[Tr::kKvChunks], int tid) {
  FA2_UNROLL
  for (int t = 0; t < Tr::kKvChunks; ++t) {
    const int c = tid + t * kNThreads;
    const int n = c % Tr::kBlockN, d = 4 * (c / Tr::kBlockN);
    sT[(d + 0) * Tr::kLdKt + n] = r[t].x;
    sT[(d + 1) * Tr::kLdKt + n] = r[t].y;
    sT[(d + 2) * Tr::kLdKt + n] = r[t].z;
    sT[(d + 3) * Tr::kLdKt + n] = r[t].w;
  }
}

// ---- the product --------------------------------------------------------------------------------
// acc(i, j) += sum_k A(row i, k) B(k, col j) over k in [0, K), operands in shared memory:
//   A(r, k) = sA[r * kLdA + k] when rows are strided, sA[k * kLdA + r] when they are quads;
//   B(k, c) = sB[c * kLdB + k] when columns are strided, sB[k * kLdB + c] when they are quads.
// Four k per step: every operand is one LDS.128, whichever way it is stored.
template <class Tile, int K, int kLdA, int kLdB>
FLASHATTN_HD inline void gemm(float (&acc)[Tile::TR][Tile::TC], const float* sA, const float* sB, int tr, int tc) {
  constexpr int TR = Tile::TR, TC = Tile::TC;
  static_assert(K % 8 == 0, "two k-steps per loop trip");
  // Per-thread bases; the rest of each address is an immediate offset.
  const float* a_base = Tile::kRowQuad ? sA + Tile::row(tr, 0) : sA + Tile::row(tr, 0) * kLdA;
  const float* b_base = Tile::kColQuad ? sB + Tile::col(tc, 0) : sB + Tile::col(tc, 0) * kLdB;
  FA2_UNROLL_2
  for (int k0 = 0; k0 < K; k0 += 4) {
    float a[4][TR], b[4][TC];
    if constexpr (Tile::kRowQuad) {
      FA2_UNROLL
      for (int kk = 0; kk < 4; ++kk)
        FA2_UNROLL
        for (int q = 0; q < TR / 4; ++q) {
          const float4 x = lds128(a_base + (k0 + kk) * kLdA + 4 * Tile::GR * q);
          a[kk][4 * q + 0] = x.x, a[kk][4 * q + 1] = x.y, a[kk][4 * q + 2] = x.z, a[kk][4 * q + 3] = x.w;
        }
    } else {
      FA2_UNROLL
      for (int i = 0; i < TR; ++i) {
        const float4 x = lds128(a_base + Tile::GR * i * kLdA + k0);
        a[0][i] = x.x, a[1][i] = x.y, a[2][i] = x.z, a[3][i] = x.w;
      }
    }
    if constexpr (Tile::kColQuad) {
      FA2_UNROLL
      for (int kk = 0; kk < 4; ++kk)
        FA2_UNROLL
        for (int q = 0; q < TC / 4; ++q) {
          const float4 x = lds128(b_base + (k0 + kk) * kLdB + 4 * Tile::GC * q);
          b[kk][4 * q + 0] = x.x, b[kk][4 * q + 1] = x.y, b[kk][4 * q + 2] = x.z, b[kk][4 * q + 3] = x.w;
        }
    } else {
      FA2_UNROLL
      for (int j = 0; j < TC; ++j) {
        const float4 x = lds128(b_base + Tile::GC * j * kLdB + k0);
        b[0][j] = x.x, b[1][j] = x.y, b[2][j] = x.z, b[3][j] = x.w;
      }
    }
    FA2_UNROLL
    for (int kk = 0; kk < 4; ++kk)
      FA2_UNROLL
      for (int i = 0; i < TR; ++i)
        FA2_UNROLL
        for (int j = 0; j < TC; ++j) acc[i][j] = fmaf(a[kk][i], b[kk][j], acc[i][j]);
  }
}

template <int TR, int TC>
FLASHATTN_HD inline void zero(float (&acc)[TR][TC]) {
  FA2_UNROLL
  for (int i = 0; i < TR; ++i)
    FA2_UNROLL
    for (int j = 0; j < TC; ++j) acc[i][j] = 0.f;
}

// ---- softmax gradient pieces --------------------------------------------------------------------
// Where one block pair sits, for the element-wise steps.
struct Pair {
  int64_t m0 = 0, n0 = 0;
  int64_t b = 0, h = 0;
  int seqlen = 0;
  bool elementwise = false;  // a boundary pair, or an additive mask: per-element predicate and bias
};

// Alg. 2 line 11: P = exp(S - L_i), as exp2(S * scale*log2e - L_i*log2e): one FFMA and one
// MUFU.EX2 per element. An empty row (lse = -inf) or a row past S_q gets L = +inf: P = 0.
// P goes to sP, where dV (line 12) reads it along keys.
template <class Tr>
FLASHATTN_HD inline void scores_to_probs(float (&s)[Tr::TileS::TR][Tr::TileS::TC], float* sP, const float* sLse,
                                         const Args& a, const Pair& pr, int tr, int tc) {
  using Tile = typename Tr::TileS;
  FA2_UNROLL
  for (int i = 0; i < Tile::TR; ++i) {
    const int m = Tile::row(tr, i);
    const int64_t row = pr.m0 + m;
    const float lse = sLse[m];
    const float neg_lse2 = row < a.S_q && lse != -INFINITY ? -lse * kLog2e : -INFINITY;
    if (!pr.elementwise) {
      FA2_UNROLL
      for (int j = 0; j < Tile::TC; ++j) s[i][j] = exp2_ftz(fmaf(s[i][j], a.scale_log2, neg_lse2));
    } else {
      FA2_UNROLL
      for (int j = 0; j < Tile::TC; ++j) {
        const int64_t col = pr.n0 + Tile::col(tc, j);
        const bool visible = row < a.S_q && a.vis.visible(row, col, pr.seqlen);
        // The bias is read only where visible: rows past S_q and keys past S_k are out of bounds.
        const float bias2 = visible ? a.vis.bias(pr.b, pr.h, row, col) * kLog2e : 0.f;
        s[i][j] = visible ? exp2_ftz(fmaf(s[i][j], a.scale_log2, bias2 + neg_lse2)) : 0.f;
      }
    }
    FA2_UNROLL
    for (int q = 0; q < Tile::TC / 4; ++q)
      *reinterpret_cast<float4*>(sP + m * Tr::kLdP + Tile::col(tc, 4 * q)) =
          make_float4(s[i][4 * q], s[i][4 * q + 1], s[i][4 * q + 2], s[i][4 * q + 3]);
  }
}

// Line 14: dS = P o (dP - D_i), times the softmax scale that lines 15 and 16 need, written over
// this thread's own P entries (no other thread reads them after the dV product).
template <class Tr>
FLASHATTN_HD inline void probs_to_dscores(const float (&dp)[Tr::TileS::TR][Tr::TileS::TC], float* sP,
                                          const float* sDelta, float scale, int tr, int tc) {
  using Tile = typename Tr::TileS;
  FA2_UNROLL
  for (int i = 0; i < Tile::TR; ++i) {
    const int m = Tile::row(tr, i);
    const float d_i = sDelta[m];
    FA2_UNROLL
    for (int q = 0; q < Tile::TC / 4; ++q) {
      float4* p4 = reinterpret_cast<float4*>(sP + m * Tr::kLdP + Tile::col(tc, 4 * q));
      float4 p = *p4;
      p.x = p.x * scale * (dp[i][4 * q + 0] - d_i);
      p.y = p.y * scale * (dp[i][4 * q + 1] - d_i);
      p.z = p.z * scale * (dp[i][4 * q + 2] - d_i);
      p.w = p.w * scale * (dp[i][4 * q + 3] - d_i);
      *p4 = p;
    }
  }
}

// Line 15 (atomic path): this pair's dQ tile added to dq rows [m0, m0 + kBlockM) of one slice.
template <class Tr>
FLASHATTN_HD inline void add_dq_tile(const float (&acc)[Tr::TileQ::TR][Tr::TileQ::TC], float* g, int64_t row_stride,
                                     int64_t m0, int S_q, int tr, int tc) {
  using Tile = typename Tr::TileQ;
  FA2_UNROLL
  for (int i = 0; i < Tile::TR; ++i) {
    const int64_t row = m0 + Tile::row(tr, i);
    if (row >= S_q) continue;
    float* dst = g + row * row_stride;
    FA2_UNROLL
    for (int j = 0; j < Tile::TC; ++j) {
#if defined(__CUDA_ARCH__)
      atomicAdd(dst + Tile::col(tc, j), acc[i][j]);
#else
      dst[Tile::col(tc, j)] += acc[i][j];
#endif
    }
  }
}

// dK or dV rows [n0, n0 + kBlockN) of one slice (line 18), as float4s.
template <class Tr>
FLASHATTN_HD inline void store_kv_tile(const float (&acc)[Tr::TileKV::TR][Tr::TileKV::TC], float* g,
                                       int64_t row_stride, int64_t n0, int S_k, int tr, int tc) {
  using Tile = typename Tr::TileKV;
  FA2_UNROLL
  for (int i = 0; i < Tile::TR; ++i) {
    const int64_t key = n0 + Tile::row(tr, i);
    if (key >= S_k) continue;
    FA2_UNROLL
    for (int q = 0; q < Tile::TC / 4; ++q)
      *reinterpret_cast<float4*>(g + key * row_stride + Tile::col(tc, 4 * q)) =
          make_float4(acc[i][4 * q], acc[i][4 * q + 1], acc[i][4 * q + 2], acc[i][4 * q + 3]);
  }
}

}  // namespace fa2_bwd
}  // namespace flashattn

// The steps of the wmma forward kernel (kernels/wmma_fwd.cu): per key block, S = Q K^T into the
// warp's fp32 score tile, the online softmax that turns it into P (16-bit, over the same bytes),
// the rescale of O, and O += P V; around the loop, the key blocks of a Q block, the O and m_i, l_i
// initialisation, and the epilogue (1/l and L, then O to global memory). Tr is the kernel's
// Traits; kLdsm picks the fragment loader (ldmatrix or load_matrix_sync, common/wmma_frag.cuh).
#pragma once

#include <cuda_runtime.h>
#include <mma.h>

#include <cmath>
#include <cstdint>

#include "common/mask.cuh"
#include "common/math_constants.h"
#include "common/mma_sm80.cuh"
#include "common/wmma_frag.cuh"
#include "common/wmma_tile.cuh"

namespace flashattn {
namespace wmma_fwd {

namespace wmma = nvcuda::wmma;
using wmma_tile::AccFrag;
using wmma_tile::FragA;
using wmma_tile::FragB;
using wmma_tile::FragBT;


// Per-lane ldmatrix row offsets (elements) for the kernel's tile pitches; unused by load_matrix_sync.
template <class Tr>
struct LaneOffsets {
  int q, k, v, p;
  __device__ __forceinline__ explicit LaneOffsets(int lane)
      : q(wmma_frag::lane_offset_rows_first(lane, Tr::kPitchQKV)),
        k(wmma_frag::lane_offset_cols_first(lane, Tr::kPitchQKV)),
        v(wmma_frag::lane_offset_rows_first(lane, Tr::kPitchQKV)),
        p(wmma_frag::lane_offset_rows_first(lane, Tr::kPitchP)) {}
};

// The warp's Q rows (kWarpRows, kHeadDim) as matrix_a fragments (Tr::kQInRegs).
template <class Tr, class T>
using QFrags = FragA<T>[Tr::kMTiles][Tr::kDTiles];

template <class Tr, bool kLdsm, class T>
__device__ __forceinline__ void load_q_frags(QFrags<Tr, T>& qf, const T* sQw, const LaneOffsets<Tr>& lo) {
#pragma unroll
  for (int mi = 0; mi < Tr::kMTiles; ++mi)
#pragma unroll
    for (int kk = 0; kk < Tr::kDTiles; ++kk)
      wmma_frag::load_a<kLdsm>(qf[mi][kk], sQw + mi * 16 * Tr::kPitchQKV + kk * 16, Tr::kPitchQKV, lo.q);
}

// S (kWarpRows, kBlockN) = Q_warp · K_j^T, accumulated kQKTiles n16 tiles at a time and stored fp32
// to the warp's S tile. K is row-major (key, dim), read as the col-major B operand K^T. Q comes from
// the fragments qf with Tr::kQInRegs, otherwise from the warp's rows of the shared Q tile (sQw),
// once per pass.
template <class Tr, bool kLdsm, class T>
__device__ __forceinline__ void gemm_qk(float* sS, const T* sQw, const QFrags<Tr, T>* qf, const T* sK,
                                        const LaneOffsets<Tr>& lo) {
#pragma unroll
  for (int n0 = 0; n0 < Tr::kNTiles; n0 += Tr::kQKTiles) {
    AccFrag rS[Tr::kMTiles][Tr::kQKTiles];  // (kWarpRows, 16 * kQKTiles)
#pragma unroll
    for (int mi = 0; mi < Tr::kMTiles; ++mi)
#pragma unroll
      for (int ni = 0; ni < Tr::kQKTiles; ++ni) wmma::fill_fragment(rS[mi][ni], 0.f);
#pragma unroll
    for (int kk = 0; kk < Tr::kDTiles; ++kk) {
      FragA<T> rQ[Tr::kMTiles];
      if constexpr (!Tr::kQInRegs) {
#pragma unroll
        for (int mi = 0; mi < Tr::kMTiles; ++mi)
          wmma_frag::load_a<kLdsm>(rQ[mi], sQw + mi * 16 * Tr::kPitchQKV + kk * 16, Tr::kPitchQKV, lo.q);
      }
#pragma unroll
      for (int ni = 0; ni < Tr::kQKTiles; ++ni) {
        FragBT<T> rK;
        wmma_frag::load_bt<kLdsm>(rK, sK + (n0 + ni) * 16 * Tr::kPitchQKV + kk * 16, Tr::kPitchQKV, lo.k);
#pragma unroll
        for (int mi = 0; mi < Tr::kMTiles; ++mi) {
          if constexpr (Tr::kQInRegs) wmma::mma_sync(rS[mi][ni], (*qf)[mi][kk], rK, rS[mi][ni]);
          else wmma::mma_sync(rS[mi][ni], rQ[mi], rK, rS[mi][ni]);
        }
      }
    }
#pragma unroll
    for (int mi = 0; mi < Tr::kMTiles; ++mi)
#pragma unroll
      for (int ni = 0; ni < Tr::kQKTiles; ++ni)
        wmma::store_matrix_sync(sS + mi * 16 * Tr::kPitchS + (n0 + ni) * 16, rS[mi][ni], Tr::kPitchS,
                                wmma::mem_row_major);
  }
}

// O = diag(alpha) O over the warp's O tile. sRow holds alpha for the warp's rows; row_map is the
// row of each accumulator element (wmma_tile::probe_acc_rows).
template <class Tr>
__device__ __forceinline__ void rescale_o(AccFrag (&rO)[Tr::kMTiles][Tr::kDTiles], const float* sRow,
                                          uint32_t row_map) {
  // The row addresses depend on row_map alone: left to itself the compiler computes them once and
  // keeps 8 registers live across the key loop, which spill at 168 (D = 64). The empty asm makes
  // row_map opaque, so they are recomputed here, only when a rescale runs.
  asm volatile("" : "+r"(row_map));
#pragma unroll
  for (int mi = 0; mi < Tr::kMTiles; ++mi) {
    float f[AccFrag::num_elements];
#pragma unroll
    for (int e = 0; e < AccFrag::num_elements; ++e) f[e] = sRow[mi * 16 + wmma_tile::acc_row(row_map, e)];
#pragma unroll
    for (int di = 0; di < Tr::kDTiles; ++di)
#pragma unroll
      for (int e = 0; e < AccFrag::num_elements; ++e) rO[mi][di].x[e] *= f[e];
  }
}

// O (kWarpRows, kHeadDim) += P · V_j over the block's kBlockN keys; sP is the warp's P tile (16-bit,
// over its S tile). Each k16 step has kDTiles independent HMMA pairs per m16 tile in flight. With
// Tr::kPVUnroll the steps are unrolled, so the next step's P and V loads overlap this step's HMMAs;
// where registers are short (168 at three CTAs per SM) the loop stays rolled, because unrolled the
// compiler hoists the whole block's fragment loads beside O and spills. The load_matrix_sync
// fallback unrolls half as far: its bf16 loads take 64-bit generic addresses, and fully unrolled it
// spills at 255.
template <class Tr, bool kLdsm, class T>
__device__ __forceinline__ void gemm_pv(AccFrag (&rO)[Tr::kMTiles][Tr::kDTiles], const T* sP, const T* sV,
                                        const LaneOffsets<Tr>& lo) {
#pragma unroll !Tr::kPVUnroll ? 1 : kLdsm ? Tr::kNTiles : Tr::kNTiles / 2
  for (int kk = 0; kk < Tr::kNTiles; ++kk) {
    FragA<T> rP[Tr::kMTiles];
#pragma unroll
    for (int mi = 0; mi < Tr::kMTiles; ++mi)
      wmma_frag::load_a<kLdsm>(rP[mi], sP + mi * 16 * Tr::kPitchP + kk * 16, Tr::kPitchP, lo.p);
#pragma unroll
    for (int di = 0; di < Tr::kDTiles; ++di) {
      FragB<T> rV;
      wmma_frag::load_b<kLdsm>(rV, sV + kk * 16 * Tr::kPitchQKV + di * 16, Tr::kPitchQKV, lo.v);
#pragma unroll
      for (int mi = 0; mi < Tr::kMTiles; ++mi) wmma::mma_sync(rO[mi][di], rP[mi], rV, rO[mi][di]);
    }
  }
}

// Max / sum of n values in 8 independent chains, then a 3-level tree: a dependency depth of
// n/8 + 3 instead of n - 1 (a serial loop waits ~4 cycles per element).
template <int kN>
__device__ __forceinline__ float max_tree(const float (&x)[kN]) {
  static_assert(kN % 8 == 0, "eight chains");
  float m[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) m[i] = x[i];
#pragma unroll
  for (int i = 8; i < kN; ++i) m[i % 8] = fmaxf(m[i % 8], x[i]);
#pragma unroll
  for (int s = 4; s > 0; s /= 2)
#pragma unroll
    for (int i = 0; i < s; ++i) m[i] = fmaxf(m[i], m[i + s]);
  return m[0];
}
template <int kN>
__device__ __forceinline__ float sum_tree(const float (&x)[kN]) {
  static_assert(kN % 8 == 0, "eight chains");
  float m[8];
#pragma unroll
  for (int i = 0; i < 8; ++i) m[i] = x[i];
#pragma unroll
  for (int i = 8; i < kN; ++i) m[i % 8] += x[i];
#pragma unroll
  for (int s = 4; s > 0; s /= 2)
#pragma unroll
    for (int i = 0; i < s; ++i) m[i] += m[i + s];
  return m[0];
}

// Both softmax paths share the lane layout and the P write. Lane pair (2r, 2r+1) owns row r of each
// 16-row pass; lane 2r+h reads the 4-column groups 2q+h (q = 0 .. kBlockN/8-1), so a quarter-warp's
// 16-byte reads cover 4 rows x 2 groups on 32 distinct banks (pitch 8 mod 32 words): x[4q+e] is
// column 8q + 4h + e. m_i is per row (both lanes agree), l_i per lane (its columns only; the pair
// is summed once, in the epilogue). P (16-bit, un-normalised) goes over the S tile: P rows 16*pass
// .. 16*pass+15 overwrite S rows 8*pass .. 8*pass+7, read by this warp in this pass or the one
// before, hence the __syncwarp() before the store. Each row's O rescale factor goes to sRow; the
// return value says whether any row maximum of the warp moved (if not, O needs no rescale).
template <class Tr>
__device__ __forceinline__ void load_s_row(const float* sS, int r, int half, float (&x)[Tr::kBlockN / 2]) {
  const float* s_row = sS + r * Tr::kPitchS + 4 * half;
#pragma unroll
  for (int q = 0; q < Tr::kBlockN / 8; ++q) {
    const float4 v = *reinterpret_cast<const float4*>(s_row + 8 * q);
    x[4 * q + 0] = v.x, x[4 * q + 1] = v.y, x[4 * q + 2] = v.z, x[4 * q + 3] = v.w;
  }
}
template <class Tr, class T>
__device__ __forceinline__ void store_p_row(float* sS, int r, int half, const float (&x)[Tr::kBlockN / 2]) {
  T* p_row = reinterpret_cast<T*>(sS) + r * Tr::kPitchP + 4 * half;
#pragma unroll
  for (int q = 0; q < Tr::kBlockN / 8; ++q)
    wmma_tile::store4<T>(p_row + 8 * q, x[4 * q], x[4 * q + 1], x[4 * q + 2], x[4 * q + 3]);
}
// Bit c set: the key in this lane's column c (x[4q+e] is column c = 8q + e, counted from the lane's
// first column n0 + 4h) is visible to a row whose visible keys are `keys`. Each 4-column group is
// then one byte, which the compiler moves into predicates four at a time (R2P): a visibility test
// costs a quarter instruction and a select per score, and no register per score.
template <class Tr>
__device__ __forceinline__ uint64_t visible_bits(const IndexRange& keys, int n0, int half) {
  static_assert(Tr::kBlockN <= 64, "one bit per column of a 64-bit word");
  // Clamped first, so the shifts are 32-bit arithmetic.
  auto clamp = [](int64_t v) { return static_cast<int>(v < 0 ? 0 : v > Tr::kBlockN ? Tr::kBlockN : v); };
  auto bits_below = [](int n) -> uint64_t { return n >= 64 ? ~0ull : (1ull << n) - 1; };
  const int64_t first = static_cast<int64_t>(n0) + 4 * half;
  return bits_below(clamp(keys.end - first)) & ~bits_below(clamp(keys.begin - first));
}
__device__ __forceinline__ bool bit(uint64_t bits, int c) { return ((bits >> c) & 1) != 0; }

// The main path, for a positive scale c = scale * log2(e) and no additive mask: max(c s) = c max(s),
// so the row maximum is taken on the raw scores and the scale folds into the exponent,
// P = exp2(fma(s, c, -m_new)): one FFMA and one MUFU per score, and both reductions as trees.
// kBoundary blocks (causal diagonal, window edges, key tails) first set the scores outside the
// row's visible key range to -inf (visible_bits); the other blocks (most, for long sequences) skip
// that.
template <class Tr, bool kBoundary, class T>
__device__ __forceinline__ bool softmax_block_fast(float* sS, float* sRow, float (&m_i)[Tr::kMTiles],
                                                   float (&l_i)[Tr::kMTiles], float c, const Visibility& vis,
                                                   int64_t row0, int n0, int seqlen_k, int lane) {
  const int half = lane & 1;
  bool moved = false;
#pragma unroll
  for (int pass = 0; pass < Tr::kMTiles; ++pass) {
    const int r = pass * 16 + (lane >> 1);
    float x[Tr::kBlockN / 2];
    load_s_row<Tr>(sS, r, half, x);
    if constexpr (kBoundary) {
      const uint64_t visible = visible_bits<Tr>(vis.keys(row0 + r, seqlen_k), n0, half);
#pragma unroll
      for (int q = 0; q < Tr::kBlockN / 8; ++q)
#pragma unroll
        for (int e = 0; e < 4; ++e)
          if (!bit(visible, 8 * q + e)) x[4 * q + e] = -INFINITY;
    }
    // m_new = max(m_i, c rowmax(S))
    float mx = max_tree(x);
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    const float m_new = fmaxf(m_i[pass], mx * c);
    // Without a boundary every score is finite, and so is m_new (m_i may still be -inf: alpha = 0).
    // With one, a row may have seen nothing yet: exp2 against 0 keeps P = 0 and alpha = 0 finite
    // instead of (-inf) - (-inf) = NaN.
    const float m_use = kBoundary && m_new == -INFINITY ? 0.f : m_new;
    const float alpha = mma::exp2_approx(m_i[pass] - m_use);
    moved |= m_new != m_i[pass];
    m_i[pass] = m_new;
    // P = exp2(c S - m_new);  l_i = alpha l_i + rowsum(P)
#pragma unroll
    for (int j = 0; j < Tr::kBlockN / 2; ++j) x[j] = mma::exp2_approx(fmaf(x[j], c, -m_use));
    l_i[pass] = l_i[pass] * alpha + sum_tree(x);
    if (half == 0) sRow[r] = alpha;
    __syncwarp();
    store_p_row<Tr, T>(sS, r, half, x);
  }
  return __any_sync(0xffffffffu, moved);
}

// The general path, for an additive mask (read per score) or a scale <= 0: every block takes the
// visibility test. A is the kernel's Args.
template <class Tr, class A>
__device__ __forceinline__ bool softmax_block_general(float* sS, float* sRow, float (&m_i)[Tr::kMTiles],
                                                      float (&l_i)[Tr::kMTiles], const A& a, int b, int h,
                                                      int64_t row0, int n0, int seqlen_k, int lane) {
  using T = typename A::Elem;
  const int half = lane & 1;
  bool moved = false;
#pragma unroll
  for (int pass = 0; pass < Tr::kMTiles; ++pass) {
    const int r = pass * 16 + (lane >> 1);
    const int64_t i = row0 + r;
    float x[Tr::kBlockN / 2];
    load_s_row<Tr>(sS, r, half, x);
    // Visible keys as offsets from this lane's first column, clamped so the tests are 32-bit.
    const IndexRange keys = a.vis.keys(i, seqlen_k);
    auto clamp = [](int64_t v) { return static_cast<int>(v < -1 ? -1 : v > Tr::kBlockN ? Tr::kBlockN : v); };
    const int lo = clamp(keys.begin - n0 - 4 * half), hi = clamp(keys.end - n0 - 4 * half);
#pragma unroll
    for (int q = 0; q < Tr::kBlockN / 8; ++q)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int jj = 8 * q + e;
        x[4 * q + e] = jj < lo || jj >= hi ? -INFINITY : x[4 * q + e] * a.scale_log2;
      }
    // Rows past S_q (the last Q block's tail) are computed but never stored: no mask read. The mask
    // is read at visible keys only: it may be narrower than the padded key block.
    const MaskView& mask = a.vis.mask;
    if (mask.ptr != nullptr && i < a.S_q) {
      const float* bias =
          mask.ptr + b * mask.batch + h * mask.head + i * mask.row + (static_cast<int64_t>(n0) + 4 * half) * mask.col;
#pragma unroll
      for (int q = 0; q < Tr::kBlockN / 8; ++q) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int jj = 8 * q + e;
          if (jj >= lo && jj < hi) x[4 * q + e] = fmaf(__ldg(bias + e * mask.col), kLog2e, x[4 * q + e]);
        }
        bias += 8 * mask.col;
      }
    }
    // m_new = max(m_i, rowmax(x))
    float mx = max_tree(x);
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    const float m_new = fmaxf(m_i[pass], mx);
    // A row with nothing visible yet (or only -inf mask entries) keeps m = -inf: see softmax_block_fast.
    const float m_use = m_new == -INFINITY ? 0.f : m_new;
    const float alpha = mma::exp2_approx(m_i[pass] - m_use);
    moved |= m_new != m_i[pass];
    m_i[pass] = m_new;
    // P = exp2(x - m_new);  l_i = alpha l_i + rowsum(P)
#pragma unroll
    for (int j = 0; j < Tr::kBlockN / 2; ++j) x[j] = mma::exp2_approx(x[j] - m_use);
    l_i[pass] = l_i[pass] * alpha + sum_tree(x);
    if (half == 0) sRow[r] = alpha;
    __syncwarp();
    store_p_row<Tr, T>(sS, r, half, x);
  }
  return __any_sync(0xffffffffu, moved);
}

// Key blocks [begin, end) holding a key visible to some row of [i_first, i_last], and the full
// blocks (every key visible to every row) inside them. visible_keys() is monotone in the row, so
// the union is [begin(i_first), end(i_last)) and the intersection [begin(i_last), end(i_first)).
struct KeyBlocks {
  int begin = 0, end = 0, full_begin = 0, full_end = 0;
};
template <int kBlockN>
__device__ __forceinline__ KeyBlocks key_blocks(const Visibility& vis, int64_t i_first, int64_t i_last,
                                                int seqlen_k) {
  KeyBlocks kb;
  const IndexRange first = vis.keys(i_first, seqlen_k), last = vis.keys(i_last, seqlen_k);
  const int64_t lo = first.begin > 0 ? first.begin : 0, hi = last.end < seqlen_k ? last.end : seqlen_k;
  if (hi <= lo) return kb;
  kb.begin = static_cast<int>(lo / kBlockN);
  kb.end = static_cast<int>((hi + kBlockN - 1) / kBlockN);
  const int64_t flo = last.begin, fhi = first.end;
  if (fhi > flo) {
    kb.full_begin = static_cast<int>((flo + kBlockN - 1) / kBlockN);
    kb.full_end = static_cast<int>(fhi / kBlockN);
    if (kb.full_end < kb.full_begin) kb.full_end = kb.full_begin;
  }
  return kb;
}

// Line 5: O_i = 0, l_i = 0, m_i = -inf (the warp's rows).
template <class Tr>
__device__ __forceinline__ void init_o_stats(AccFrag (&rO)[Tr::kMTiles][Tr::kDTiles], float (&m_i)[Tr::kMTiles],
                                             float (&l_i)[Tr::kMTiles]) {
#pragma unroll
  for (int mi = 0; mi < Tr::kMTiles; ++mi)
#pragma unroll
    for (int di = 0; di < Tr::kDTiles; ++di) wmma::fill_fragment(rO[mi][di], 0.f);
#pragma unroll
  for (int mi = 0; mi < Tr::kMTiles; ++mi) m_i[mi] = -INFINITY, l_i[mi] = 0.f;
}

// Line 9 for key block n_block: m_new = max(m_i, rowmax(S)), P = exp2(S - m_new) over the S tile,
// l_i = alpha l_i + rowsum(P), alpha to sRow. The general path with an additive mask or a scale
// <= 0; otherwise the fast one, with the element mask only where the block is not full
// (kb: the blocks every row sees whole). True when a row maximum moved.
template <class Tr, class A>
__device__ __forceinline__ bool softmax_block(float* sS, float* sRow, float (&m_i)[Tr::kMTiles],
                                              float (&l_i)[Tr::kMTiles], const A& a, int b, int h, int64_t row0,
                                              int n_block, const KeyBlocks& kb, bool general_softmax, int seqlen_k,
                                              int lane) {
  using T = typename A::Elem;
  const int n0 = n_block * Tr::kBlockN;
  if (general_softmax) return softmax_block_general<Tr>(sS, sRow, m_i, l_i, a, b, h, row0, n0, seqlen_k, lane);
  const bool boundary = n_block < kb.full_begin || n_block >= kb.full_end;
  return boundary ? softmax_block_fast<Tr, /*kBoundary=*/true, T>(sS, sRow, m_i, l_i, a.scale_log2, a.vis, row0, n0,
                                                                 seqlen_k, lane)
                  : softmax_block_fast<Tr, /*kBoundary=*/false, T>(sS, sRow, m_i, l_i, a.scale_log2, a.vis, row0,
                                                                  n0, seqlen_k, lane);
}

// Lines 12-13: 1/l_i of the warp's rows to sRow (for store_o) and L_i = (m_i + log2 l_i) ln 2
// to global memory. The lane pair of a row sums its partial l first.
template <class Tr, class A>
__device__ __forceinline__ void finalize_rows(const A& a, float* sRow, const float (&m_i)[Tr::kMTiles],
                                              const float (&l_i)[Tr::kMTiles], int b, int h, int m0, int m_rows,
                                              int warp, int lane) {
  __syncwarp();  // every lane is done reading alpha before 1/l replaces it
  float* gLse = a.lse + (static_cast<int64_t>(b) * a.H + h) * a.S_q;
  const int half = lane & 1;
#pragma unroll
  for (int pass = 0; pass < Tr::kMTiles; ++pass) {
    const int r = pass * 16 + (lane >> 1);
    const float l = l_i[pass] + __shfl_xor_sync(0xffffffffu, l_i[pass], 1);
    const int row = warp * Tr::kWarpRows + r;  // within the block
    if (half == 0) {
      sRow[r] = l > 0.f ? 1.f / l : 0.f;
      if (row < m_rows) gLse[m0 + row] = l > 0.f ? (m_i[pass] + log2f(l)) * kLn2 : -INFINITY;
    }
  }
}

// Line 14: O_i (times 1/l_i from sRow) to global memory.
template <class Tr, class A>
__device__ __forceinline__ void store_o(const A& a, const AccFrag (&rO)[Tr::kMTiles][Tr::kDTiles], float* sS,
                                        const float* sRow, int b, int h, int m0, int m_rows, int warp, int lane) {
  using T = typename A::Elem;
  // Stage O through the warp's S tile, kWarpRows rows x kOChunk columns at a time, so each lane
  // writes whole 16-byte pieces of a row and a warp writes whole rows.
  T* gO = a.o + b * a.o_st.batch + h * a.o_st.head + static_cast<int64_t>(m0) * a.o_st.row;
  constexpr int kVecPerRow = Tr::kOChunk / 8;
#pragma unroll
  for (int d0 = 0; d0 < Tr::kHeadDim; d0 += Tr::kOChunk) {
    __syncwarp();  // 1/l written; the previous chunk (or P·V's reads of P) done with the tile
#pragma unroll
    for (int mi = 0; mi < Tr::kMTiles; ++mi)
#pragma unroll
      for (int dj = 0; dj < Tr::kOChunk / 16; ++dj)
        wmma::store_matrix_sync(sS + mi * 16 * Tr::kPitchS + dj * 16, rO[mi][d0 / 16 + dj], Tr::kPitchS,
                                wmma::mem_row_major);
    __syncwarp();
#pragma unroll
    for (int v = lane; v < Tr::kWarpRows * kVecPerRow; v += 32) {
      const int r = v / kVecPerRow, c = (v % kVecPerRow) * 8;
      const int row = warp * Tr::kWarpRows + r;
      const float inv_l = sRow[r];
      const float4 lo4 = *reinterpret_cast<const float4*>(sS + r * Tr::kPitchS + c);
      const float4 hi4 = *reinterpret_cast<const float4*>(sS + r * Tr::kPitchS + c + 4);
      const float o[8] = {lo4.x * inv_l, lo4.y * inv_l, lo4.z * inv_l, lo4.w * inv_l,
                          hi4.x * inv_l, hi4.y * inv_l, hi4.z * inv_l, hi4.w * inv_l};
      if (row < m_rows) wmma_tile::store8<T>(gO + row * a.o_st.row + d0 + c, o);
    }
  }
}

}  // namespace wmma_fwd
}  // namespace flashattn

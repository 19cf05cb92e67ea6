// The elementwise half of the backward step and the block ranges that bound its loops.
//
//   P_ij  = exp2(S_ij · scale·log2 e + mask_ij · log2 e − lse_i · log2 e)   (0 where invisible)
//   dS_ij = P_ij (dP_ij − D_i)
//
// applied to a warp's S and dP accumulator tiles: P first (S's registers become P's), then dS
// once dP exists. The dK/dV kernel keeps P in fp32 until then (dscores); the dQ kernel, whose
// registers hold a 16 x kHeadDim dQ besides, rounds P to 16-bit pairs first (pack_acc,
// dscores_packed) so that S and dP are never live as fp32 together.
// Empty rows (lse_i = -inf) must give P = 0 for every score, including masked ones (-inf) where
// s − lse would be (-inf) − (-inf) = NaN: their lse in log2 units is taken as +inf, so the
// exponent is -inf whatever the score.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <vector_types.h>

#include <cmath>
#include <cstdint>
#include <cstring>

#include "common/bwd_row_stats.cuh"
#include "common/key_blocks.cuh"
#include "common/mask.cuh"
#include "common/math_constants.h"
#include "common/mma_sm80.cuh"

namespace flashattn {
namespace mma_bwd {

// K blocks (of block_n keys) holding a key visible to one of the queries [m0, m0 + n_rows).
__host__ __device__ inline BlockRange key_blocks(const Visibility& vis, int m0, int n_rows, int seqlen,
                                                 int block_n) {
  if (n_rows <= 0) return {};
  const int64_t lo = vis.keys(m0, seqlen).begin;
  int64_t hi = vis.keys(m0 + n_rows - 1, seqlen).end;
  if (hi > seqlen) hi = seqlen;
  if (hi <= lo) return {};
  return {static_cast<int>(lo / block_n), static_cast<int>((hi + block_n - 1) / block_n)};
}

// Every key of [n0, n0 + n_keys) is visible to every query of [m0, m0 + n_rows): the visible set
// of a row is an interval moving right with the row, so the two inner corners decide. A block
// past seqlen (or S_k) fails the second test: its tail keys must be masked.
__host__ __device__ inline bool block_fully_visible(const Visibility& vis, int m0, int n_rows, int n0, int n_keys,
                                                    int seqlen) {
  return vis.visible(m0 + n_rows - 1, n0, seqlen) && vis.visible(m0, n0 + n_keys - 1, seqlen);
}

// Where a warp's accumulators sit in the problem: lane (g, t) holds rows i0 + 16 mt + 8 half and
// columns j0 + 8 nt + e (e = 0, 1) of its tiles.
struct TileCoords {
  int64_t b = 0, h = 0;
  int64_t i0 = 0;  // m0 + m_base + g
  int64_t j0 = 0;  // n0 + n_base + 2t
  int seqlen = 0;
};

// One statistic for the rows i0 + 16 mt + 8 half: lse_i·log2 e (is_lse; an empty row's -inf
// becomes +inf, see above) or D_i. Rows >= S_q read nothing and get +inf / 0 (P = 0, dS = 0).
template <int MT>
__device__ __forceinline__ void load_row_stat(float (&v)[MT][2], const float* rows, int64_t row0, int64_t i0, int S_q,
                                              bool is_lse) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int64_t di = 16 * mt + 8 * half;
      float x = is_lse ? INFINITY : 0.f;
      if (i0 + di < S_q) {
        x = rows[row0 + di];
        if (is_lse) x = lse_log2_units(x);
      }
      v[mt][half] = x;
    }
}

// s <- P in place, in one of three modes: kNone (one FFMA + one EX2 per score: blocks every
// query of which sees every key); kInterval (each row's visible key interval from mask.cuh, then
// two compares and a select per score: causal / window / padding / tail boundary blocks); and
// kIntervalAndBias (the additive mask's entry read per visible score, every block).
enum class MaskMode { kNone, kInterval, kIntervalAndBias };

template <MaskMode kMode, int MT, int NT>
__device__ __forceinline__ void probs(float (&s)[MT][NT][4], const float (&lse2)[MT][2], float scale_log2,
                                      const Visibility& vis, const TileCoords& c) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      int lo = 0, hi = 0;  // visible keys [lo, hi) of this row (within [0, seqlen])
      const float* mask_row = vis.mask.ptr;
      if constexpr (kMode != MaskMode::kNone) {
        const int64_t i = c.i0 + 16 * mt + 8 * half;
        const IndexRange keys = vis.keys(i, c.seqlen);
        // Rows past S_q have no lse (P = 0 anyway) and no mask row to read.
        if (!keys.empty() && i < vis.S_q) lo = static_cast<int>(keys.begin), hi = static_cast<int>(keys.end);
        if constexpr (kMode == MaskMode::kIntervalAndBias)
          mask_row += c.b * vis.mask.batch + c.h * vis.mask.head + i * vis.mask.row;
      }
#pragma unroll
      for (int nt = 0; nt < NT; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float& x = s[mt][nt][2 * half + e];
          x = fmaf(x, scale_log2, -lse2[mt][half]);
          if constexpr (kMode != MaskMode::kNone) {
            const int j = static_cast<int>(c.j0) + 8 * nt + e;
            const bool visible = j >= lo && j < hi;
            if constexpr (kMode == MaskMode::kIntervalAndBias) {
              if (visible) x += kLog2e * mask_row[j * vis.mask.col];
            }
            x = visible ? x : -INFINITY;
          }
          x = mma::exp2_approx(x);
        }
    }
}

// The same with the mode chosen at run time, as uniform branches around the exp2 alone (the
// deterministic path's dQ kernel; the dK/dV kernel instead copies its whole S -> dS stretch per
// mode).
template <int MT, int NT>
__device__ __forceinline__ void probs_any(float (&s)[MT][NT][4], const float (&lse2)[MT][2], float scale_log2,
                                          bool masked, const Visibility& vis, const TileCoords& c) {
  if (!masked) {
    probs<MaskMode::kNone>(s, lse2, scale_log2, vis, c);
  } else if (vis.mask.ptr == nullptr) {
    probs<MaskMode::kInterval>(s, lse2, scale_log2, vis, c);
  } else {
    probs<MaskMode::kIntervalAndBias>(s, lse2, scale_log2, vis, c);
  }
}

// Accumulator pairs (columns 2t, 2t + 1 of rows g and g + 8) rounded to 16 bits: the dQ
// kernel's P, kept in this form for dS so that S and dP need not be live together.
template <class T, int MT, int NT>
__device__ __forceinline__ void pack_acc(uint32_t (&r)[MT][NT][2], const float (&acc)[MT][NT][4]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      r[mt][nt][0] = mma::pack2<T>(acc[mt][nt][0], acc[mt][nt][1]);
      r[mt][nt][1] = mma::pack2<T>(acc[mt][nt][2], acc[mt][nt][3]);
    }
}

// dp <- dS = P ∘ (dP − D_i) with P in fp32 (the S accumulators after probs).
template <int MT, int NT>
__device__ __forceinline__ void dscores(float (&dp)[MT][NT][4], const float (&p)[MT][NT][4],
                                        const float (&dsum)[MT][2]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int r = 0; r < 4; ++r) dp[mt][nt][r] = p[mt][nt][r] * (dp[mt][nt][r] - dsum[mt][r / 2]);
}

// The same with P as 16-bit pairs (pack_acc), as the dtype-level reference rounds it.
template <class T, int MT, int NT>
__device__ __forceinline__ void dscores_packed(float (&dp)[MT][NT][4], const uint32_t (&p)[MT][NT][2],
                                               const float (&dsum)[MT][2]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int half = 0; half < 2; ++half) {
        const float2 pf = mma::unpack2<T>(p[mt][nt][half]);
        dp[mt][nt][2 * half] = pf.x * (dp[mt][nt][2 * half] - dsum[mt][half]);
        dp[mt][nt][2 * half + 1] = pf.y * (dp[mt][nt][2 * half + 1] - dsum[mt][half]);
      }
}

}  // namespace mma_bwd
}  // namespace flashattn

// Online softmax over mma.sync m16n8 accumulator fragments, kept entirely in registers
// (FlashAttention-2, Algorithm 1, lines 9-10 and 12-13).
//
// A warp holds kMTiles tiles of 16 rows; in each, lane = 4*g + t owns rows g and g+8 and, of every
// n8 column tile, the two columns 2t and 2t+1 (fragment element 2r+e is row g+8r, column 2t+e).
// The four lanes of a quad therefore share a row: a row max needs two shuffles (xor 1, 2), while
// the row sum stays a per-lane partial until the end (one reduction instead of one per block).
//
// Scores are in "log2 units up to a factor c": p = exp2(s*c - m*c). The fast path hands in raw
// q·k with c = scale*log2(e), so the scale costs nothing (one FFMA per score feeds MUFU.EX2); a
// caller that has already rescaled the scores (additive mask, scale <= 0) hands them in with c = 1.
#pragma once

#include <cuda_runtime.h>

#include <cmath>

#include "common/math_constants.h"
#include "common/mma_sm80.cuh"

namespace flashattn {
namespace mma {


template <int kMTiles, int kNTiles>
struct OnlineSoftmax {
  float m_i[kMTiles][2];  // running row max (score units)
  float l_i[kMTiles][2];  // this lane's share of the running row sum of exp2(s*c - m_i*c)

  __device__ __forceinline__ void init() {
#pragma unroll
    for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        m_i[mi][r] = -INFINITY;
        l_i[mi][r] = 0.f;
      }
  }

  // The row statistics both update_stats variants share, for row g + 8r of m tile mi:
  //   m_new = max(m_i, rowmax(S)) (a quad's four lanes hold the row: two shuffles);
  //   alpha = exp2((m_i - m_new) c), or 1 when the max did not move; m_i = m_new.
  // Returns the exponent base m_new * c (0 for a row with nothing visible yet, whose m stays
  // -inf: every P is then exp2(-inf) = 0 instead of exp2(-inf + inf) = NaN); `changed` collects
  // whether any row's max moved. m_i = -inf (first visible block) gives alpha = exp2(-inf) = 0: O
  // and l_i are 0 anyway.
  __device__ __forceinline__ float new_row_max(const float (&rS)[kMTiles][kNTiles][4], int mi, int r, float c,
                                               float (&alpha)[kMTiles][2], bool& changed) {
    float m_new = m_i[mi][r];
#pragma unroll
    for (int ni = 0; ni < kNTiles; ++ni) m_new = fmaxf(m_new, fmaxf(rS[mi][ni][2 * r], rS[mi][ni][2 * r + 1]));
    m_new = fmaxf(m_new, __shfl_xor_sync(0xffffffffu, m_new, 1));
    m_new = fmaxf(m_new, __shfl_xor_sync(0xffffffffu, m_new, 2));
    const float base = m_new == -INFINITY ? 0.f : m_new * c;
    const bool row_changed = m_new != m_i[mi][r];
    alpha[mi][r] = row_changed ? exp2_approx(fmaf(m_i[mi][r], c, -base)) : 1.f;
    changed |= row_changed;
    m_i[mi][r] = m_new;
    return base;
  }

  // Folds a block of scores into the statistics, writes the unnormalised probabilities P to rP
  // rounded to T in pairs (rP[mi][ni][r] = columns 2t, 2t+1 of row g+8r: the halves of the
  // mma A fragment), and rescales the output accumulator rO (any column count) to the new maxima.
  //   m_new = max(m_i, rowmax(S));  P = exp2(S*c - m_new*c)
  //   l_i = exp2((m_i - m_new)*c) * l_i + rowsum(P);  O = diag(exp2((m_i - m_new)*c)) O
  // Packing here, as each row's P is produced, lets the fp32 scores die early: the P·V that follows
  // holds 32-bit pairs only, which keeps its peak register count down.
  template <class T, int kDTiles>
  __device__ __forceinline__ void update(const float (&rS)[kMTiles][kNTiles][4], uint32_t (&rP)[kMTiles][kNTiles][2],
                                         float (&rO)[kMTiles][kDTiles][4], float c) {
    float alpha[kMTiles][2];
    const bool changed = update_stats<T>(rS, rP, alpha, c);
    rescale(rO, alpha, changed);
  }

  // The statistics half of update(): folds S in, writes P, and returns in alpha the factors O must
  // be rescaled by (and whether any lane of the warp has one that is not 1). For callers whose
  // previous P·V is still accumulating into O while this runs (the hopper kernel's overlap).
  template <class T>
  __device__ __forceinline__ bool update_stats(const float (&rS)[kMTiles][kNTiles][4],
                                               uint32_t (&rP)[kMTiles][kNTiles][2], float (&alpha)[kMTiles][2],
                                               float c) {
    bool changed = false;
#pragma unroll
    for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float base = new_row_max(rS, mi, r, c, alpha, changed);
        float sum = 0.f;
#pragma unroll
        for (int ni = 0; ni < kNTiles; ++ni) {
          const float p0 = exp2_approx(fmaf(rS[mi][ni][2 * r], c, -base));
          const float p1 = exp2_approx(fmaf(rS[mi][ni][2 * r + 1], c, -base));
          rP[mi][ni][r] = pack2<T>(p0, p1);
          sum += p0 + p1;
        }
        l_i[mi][r] = fmaf(l_i[mi][r], alpha[mi][r], sum);
      }
    return __any_sync(0xffffffffu, changed);
  }

  // update_stats() for callers that must not write P yet (its registers are still being read by
  // an in-flight P·V): the probabilities replace the scores in rS, in fp32; pack_probs() rounds
  // them to T pairs once P's registers are free. Same statistics, same alpha.
  __device__ __forceinline__ bool update_stats_in_place(float (&rS)[kMTiles][kNTiles][4], float (&alpha)[kMTiles][2],
                                                        float c) {
    bool changed = false;
#pragma unroll
    for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        const float base = new_row_max(rS, mi, r, c, alpha, changed);
        float sum = 0.f;
#pragma unroll
        for (int ni = 0; ni < kNTiles; ++ni)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            rS[mi][ni][2 * r + e] = exp2_approx(fmaf(rS[mi][ni][2 * r + e], c, -base));
            sum += rS[mi][ni][2 * r + e];
          }
        l_i[mi][r] = fmaf(l_i[mi][r], alpha[mi][r], sum);
      }
    return __any_sync(0xffffffffu, changed);
  }

  template <class T>
  __device__ __forceinline__ static void pack_probs(const float (&rS)[kMTiles][kNTiles][4],
                                                    uint32_t (&rP)[kMTiles][kNTiles][2]) {
#pragma unroll
    for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
      for (int ni = 0; ni < kNTiles; ++ni)
#pragma unroll
        for (int r = 0; r < 2; ++r) rP[mi][ni][r] = pack2<T>(rS[mi][ni][2 * r], rS[mi][ni][2 * r + 1]);
  }

  // O = diag(alpha) O. Once the maxima settle (long rows), most blocks change no max in the whole
  // warp: the vote in update_stats() skips the kMTiles*kDTiles*4 multiplies then, at the cost of
  // one warp-uniform branch.
  template <int kDTiles>
  __device__ __forceinline__ void rescale(float (&rO)[kMTiles][kDTiles][4], const float (&alpha)[kMTiles][2],
                                          bool changed) {
    if (changed) {
#pragma unroll
      for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
        for (int di = 0; di < kDTiles; ++di)
#pragma unroll
          for (int e = 0; e < 4; ++e) rO[mi][di][e] *= alpha[mi][e / 2];
    }
  }

  // End of the key loop: O = diag(l)^-1 O, and lse (natural log of the scaled scores) per owned
  // row. A row with no visible key (or only -inf scores) has l = 0: O = 0 and lse = -inf.
  template <int kDTiles>
  __device__ __forceinline__ void finalize(float (&rO)[kMTiles][kDTiles][4], float c, float (&lse)[kMTiles][2]) {
#pragma unroll
    for (int mi = 0; mi < kMTiles; ++mi)
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float l = l_i[mi][r];
        l += __shfl_xor_sync(0xffffffffu, l, 1);
        l += __shfl_xor_sync(0xffffffffu, l, 2);
        const bool empty = !(l > 0.f);
        const float inv = empty ? 0.f : 1.f / l;
        // lse = ln(sum_j exp(scale*s_ij)) = ln2 * (m*c + log2(l)), with m*c the base P was taken at.
        lse[mi][r] = empty ? -INFINITY : (m_i[mi][r] * c + log2f(l)) * kLn2;
#pragma unroll
        for (int di = 0; di < kDTiles; ++di) {
          rO[mi][di][2 * r] *= inv;
          rO[mi][di][2 * r + 1] *= inv;
        }
      }
  }
};

}  // namespace mma
}  // namespace flashattn

// Building blocks of the wmma backward pass (kernels/wmma_bwd.cu): tile shapes, the shared-memory
// layout, and the steps of FlashAttention-2's Algorithm 2 on one (Q block, K/V block) pair.
//
//   scores_to_p_ds   S = Q K^T and dP = dO V^T (wmma), through a warp's fp32 scratch tiles:
//                    P = exp2(S * scale * log2 e + mask * log2 e - lse * log2 e)   (0 where invisible)
//                    dS = P o (dP - D_i)                          both stored 16-bit, (kBlockM, kBlockN)
//   accumulate_kv    dV += P^T dO,  dK += dS^T Q                  (wmma, accumulators in registers)
//   dq_tile          dQ_tile = dS K                               (wmma)
// The 1/sqrt(d) of dK and dQ is applied once, when they are written.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <cmath>
#include <cstdint>

#include "common/mask.cuh"
#include "common/math_constants.h"
#include "common/mma_sm80.cuh"
#include "common/wmma_tile.cuh"
#include "flashattn/params.h"

namespace flashattn {
namespace wmma_bwd {

namespace wmma = nvcuda::wmma;
using wmma_tile::AccFrag;


// Tiles of one step: kBlockM query rows x kBlockN keys, 8 warps sharing each product's 16x16
// output tiles round-robin. kStages buffers of the tiles that change every step (Q/dO for the
// dK/dV kernel, K/V for the dQ kernel): 2 overlaps the next load with this step's products.
template <int kHeadDim_, int kBlockM_, int kBlockN_, int kStages_>
struct Traits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kStages = kStages_;
  static constexpr int kNWarps = 8;
  static constexpr int kThreads = kNWarps * 32;
  static constexpr int kMTiles = kBlockM / 16;
  static constexpr int kNTiles = kBlockN / 16;
  static constexpr int kDTiles = kHeadDim / 16;
  static constexpr int kPitchD = wmma_tile::pitch16<kHeadDim>();  // Q, dO, K, V rows (halves)
  static constexpr int kPitchN = wmma_tile::pitch16<kBlockN>();   // P, dS rows (halves)
  // Scratch tiles are 16x16 fp32 with a 20-float pitch: the 16-byte row reads of the element pass
  // (rows 0-7 per quarter-warp) land on 8 distinct bank groups.
  static constexpr int kScratchLd = 20;
  static constexpr int kScratchFloats = 2 * 16 * kScratchLd;  // S and dP tiles, per warp

  static constexpr int kTilesS = kMTiles * kNTiles / kNWarps;   // S/dP tiles per warp
  static constexpr int kTilesKV = kNTiles * kDTiles / kNWarps;  // dK (and dV) tiles per warp
  static constexpr int kTilesQ = kMTiles * kDTiles / kNWarps;   // dQ tiles per warp
  static_assert(kTilesS * kNWarps == kMTiles * kNTiles, "S tiles split evenly over the warps");
  static_assert(kTilesKV * kNWarps == kNTiles * kDTiles, "dK/dV tiles split evenly over the warps");
  static_assert(kTilesQ * kNWarps == kMTiles * kDTiles, "dQ tiles split evenly over the warps");
  static_assert(kStages == 1 || kStages == 2, "single or double buffer");
};

// Shared-memory layout; kStreamQ: Q/dO (and lse/D) change every step and get kStages buffers
// (dK/dV kernel), else K/V do (dQ kernel). Byte offsets, each a multiple of 128.
template <class Tr, bool kStreamQ>
struct Smem {
  static constexpr int kQStages = kStreamQ ? Tr::kStages : 1;
  static constexpr int kKStages = kStreamQ ? 1 : Tr::kStages;
  static constexpr int kBytesQ = Tr::kBlockM * Tr::kPitchD * 2;  // (kBlockM, kHeadDim)
  static constexpr int kBytesK = Tr::kBlockN * Tr::kPitchD * 2;  // (kBlockN, kHeadDim)
  static constexpr int kBytesP = Tr::kBlockM * Tr::kPitchN * 2;  // (kBlockM, kBlockN)
  static constexpr int kBytesRows = (Tr::kBlockM * 4 + 127) / 128 * 128;
  static constexpr int kQ = 0;
  static constexpr int kDO = kQ + kQStages * kBytesQ;
  static constexpr int kK = kDO + kQStages * kBytesQ;
  static constexpr int kV = kK + kKStages * kBytesK;
  static constexpr int kP = kV + kKStages * kBytesK;
  static constexpr int kDS = kP + kBytesP;
  static constexpr int kLse = kDS + kBytesP;  // kQStages x kBlockM floats: lse * log2 e (+inf: no P)
  static constexpr int kDelta = kLse + kQStages * kBytesRows;  // kQStages x kBlockM floats: D_i
  static constexpr int kScratch = kDelta + kQStages * kBytesRows;
  static constexpr int kBytes = kScratch + Tr::kNWarps * Tr::kScratchFloats * 4;
  static_assert(kBytesQ % 128 == 0 && kBytesK % 128 == 0 && kBytesP % 128 == 0, "128-byte aligned tiles");
  // sm_80 allows 163 KB of shared memory per block (opt-in).
  static_assert(kBytes <= 163 * 1024, "fits an sm_80 block");
};

template <class T>
struct Args {
  const T* q = nullptr;
  const T* k = nullptr;
  const T* v = nullptr;
  const T* o = nullptr;
  const T* dout = nullptr;
  T* dq = nullptr;
  T* dk = nullptr;
  T* dv = nullptr;
  Strides q_st, k_st, v_st, o_st, do_st, dq_st, dk_st, dv_st;
  const float* lse = nullptr;  // [B, H, S_q]
  float* dq_accum = nullptr;   // [B, H, S_q, D] fp32 workspace; null on the deterministic path
  float* dsum = nullptr;       // [B, H, S_q] fp32 workspace: D_i = rowsum(dO o O)
  int B = 0, H = 0, H_kv = 0, S_q = 0, S_k = 0, D = 0, group = 1;
  float scale = 0.f, scale_log2 = 0.f;
  Visibility vis;
};

// lse (as log2) and D_i of rows m0 .. m0+kBlockM-1 of head h into shared memory. Rows past S_q and
// rows without a visible key (lse = -inf) get +inf, which makes every P of the row exactly 0.
template <class Tr, class T>
__device__ __forceinline__ void load_row_stats(float* sLse, float* sDelta, const Args<T>& a, int b, int h, int m0,
                                               int tid) {
  if (tid < Tr::kBlockM) {
    const int i = m0 + tid;
    const int64_t row = (static_cast<int64_t>(b) * a.H + h) * a.S_q + i;
    const float lse = i < a.S_q ? a.lse[row] : -INFINITY;
    sLse[tid] = lse == -INFINITY ? INFINITY : lse * kLog2e;
    sDelta[tid] = i < a.S_q ? a.dsum[row] : 0.f;
  }
}

// Eight floats from 16-byte aligned shared memory.
__device__ __forceinline__ void load8(float (&x)[8], const float* src) {
  const float4 lo = *reinterpret_cast<const float4*>(src), hi = *reinterpret_cast<const float4*>(src + 4);
  x[0] = lo.x, x[1] = lo.y, x[2] = lo.z, x[3] = lo.w, x[4] = hi.x, x[5] = hi.y, x[6] = hi.z, x[7] = hi.w;
}

// P and dS of the step's (kBlockM, kBlockN) tile pair into sP and sdS (16-bit). Each warp owns
// kTilesS 16x16 tiles: S and dP accumulate in registers, go to the warp's scratch, and lane
// (r = lane % 16, half = lane / 16) turns columns 8*half .. 8*half+7 of row r into P and dS.
template <class Tr, class T>
__device__ __forceinline__ void scores_to_p_ds(const T* sQ, const T* sdO, const T* sK, const T* sV,
                                               const float* sLse, const float* sDelta, T* sP, T* sdS,
                                               float* scratch, const Args<T>& a, int b, int h, int m0,
                                               int n0, int seqlen_k, int warp, int lane) {
  float* sS = scratch;                        // (16, 16) fp32, pitch kScratchLd
  float* sdP = scratch + 16 * Tr::kScratchLd;  // (16, 16) fp32
  const int r = lane % 16, half = lane / 16;
  // Rolled: each tile is independent, and unrolled copies would sit beside the dK/dV accumulators.
#pragma unroll 1
  for (int u = 0; u < Tr::kTilesS; ++u) {
    const int t = warp + u * Tr::kNWarps;
    const int tm = t / Tr::kNTiles, tn = t % Tr::kNTiles;
    AccFrag acc_s, acc_dp;
    wmma::fill_fragment(acc_s, 0.f);
    wmma::fill_fragment(acc_dp, 0.f);
#pragma unroll
    for (int kk = 0; kk < Tr::kDTiles; ++kk) {
      wmma_tile::FragA<T> fa;
      wmma_tile::FragBT<T> fb;
      wmma::load_matrix_sync(fa, sQ + tm * 16 * Tr::kPitchD + kk * 16, Tr::kPitchD);
      wmma::load_matrix_sync(fb, sK + tn * 16 * Tr::kPitchD + kk * 16, Tr::kPitchD);
      wmma::mma_sync(acc_s, fa, fb, acc_s);  // S = Q K^T
      wmma::load_matrix_sync(fa, sdO + tm * 16 * Tr::kPitchD + kk * 16, Tr::kPitchD);
      wmma::load_matrix_sync(fb, sV + tn * 16 * Tr::kPitchD + kk * 16, Tr::kPitchD);
      wmma::mma_sync(acc_dp, fa, fb, acc_dp);  // dP = dO V^T
    }
    wmma::store_matrix_sync(sS, acc_s, Tr::kScratchLd, wmma::mem_row_major);
    wmma::store_matrix_sync(sdP, acc_dp, Tr::kScratchLd, wmma::mem_row_major);
    __syncwarp();

    const int row = tm * 16 + r;  // within the Q block
    const int64_t i = m0 + row;
    const int j0 = n0 + tn * 16 + 8 * half;
    const IndexRange keys = a.vis.keys(i, seqlen_k);
    const float lse_l2 = sLse[row], delta = sDelta[row];
    const MaskView& mask = a.vis.mask;
    const float* bias = mask.ptr != nullptr && i < a.S_q
                            ? mask.ptr + b * mask.batch + h * mask.head + i * mask.row + j0 * mask.col
                            : nullptr;
    float s[8], dp[8], p[8], ds[8];
    load8(s, sS + r * Tr::kScratchLd + 8 * half);
    load8(dp, sdP + r * Tr::kScratchLd + 8 * half);
#pragma unroll
    for (int e = 0; e < 8; ++e) {
      const int64_t j = j0 + e;
      float x = s[e] * a.scale_log2;
      const bool visible = j >= keys.begin && j < keys.end;
      if (visible && bias != nullptr) x = fmaf(bias[e * mask.col], kLog2e, x);
      // P = exp(scale s + mask - lse); an empty row (lse_l2 = +inf) gives exp2(-inf) = 0.
      p[e] = visible ? mma::exp2_approx(x - lse_l2) : 0.f;
      ds[e] = p[e] * (dp[e] - delta);  // dS = P o (dP - D_i)
    }
    wmma_tile::store8<T>(sP + row * Tr::kPitchN + tn * 16 + 8 * half, p);
    wmma_tile::store8<T>(sdS + row * Tr::kPitchN + tn * 16 + 8 * half, ds);
    __syncwarp();  // scratch is rewritten by the next tile
  }
}

// acc[u] += A^T B over the step's kBlockM rows for the warp's dK/dV tiles: A is P or dS
// (kBlockM, kBlockN), read transposed (col-major matrix_a); B is dO or Q (kBlockM, kHeadDim).
template <class Tr, class T>
__device__ __forceinline__ void accumulate_kv(AccFrag (&acc)[Tr::kTilesKV], const T* sA, const T* sB, int warp) {
#pragma unroll
  for (int u = 0; u < Tr::kTilesKV; ++u) {
    const int t = warp + u * Tr::kNWarps;
    const int tn = t / Tr::kDTiles, td = t % Tr::kDTiles;
    // Rolled: unrolled, the bf16 loads (generic 64-bit addresses) of all steps are hoisted beside
    // the accumulators and spill.
#pragma unroll 1
    for (int kk = 0; kk < Tr::kMTiles; ++kk) {
      wmma_tile::FragAT<T> fa;  // A^T tile (keys tn, rows kk): element (n, m) at sA[m * pitch + n]
      wmma_tile::FragB<T> fb;
      wmma::load_matrix_sync(fa, sA + kk * 16 * Tr::kPitchN + tn * 16, Tr::kPitchN);
      wmma::load_matrix_sync(fb, sB + kk * 16 * Tr::kPitchD + td * 16, Tr::kPitchD);
      wmma::mma_sync(acc[u], fa, fb, acc[u]);
    }
  }
}

// dQ tile (tm, td) of the step = dS (kBlockM, kBlockN) K (kBlockN, kHeadDim), added to acc.
template <class Tr, class T>
__device__ __forceinline__ void dq_tile(AccFrag& acc, const T* sdS, const T* sK, int tm, int td) {
#pragma unroll
  for (int kk = 0; kk < Tr::kNTiles; ++kk) {
    wmma_tile::FragA<T> fa;
    wmma_tile::FragB<T> fb;
    wmma::load_matrix_sync(fa, sdS + tm * 16 * Tr::kPitchN + kk * 16, Tr::kPitchN);
    wmma::load_matrix_sync(fb, sK + kk * 16 * Tr::kPitchD + td * 16, Tr::kPitchD);
    wmma::mma_sync(acc, fa, fb, acc);
  }
}

// Writes scale * (16x16 accumulator tile) to rows row0 .. row0+15 (those < rows) of a 16-bit
// global matrix, through the warp's scratch: lane (r = lane % 16, half) stores 16 bytes.
template <class T>
__device__ __forceinline__ void store_tile(T* g, int64_t row_stride, int row0, int rows, const AccFrag& acc,
                                           float scale, float* scratch, int ld, int lane) {
  wmma::store_matrix_sync(scratch, acc, ld, wmma::mem_row_major);
  __syncwarp();
  const int r = lane % 16, half = lane / 16;
  float x[8];
  load8(x, scratch + r * ld + 8 * half);
#pragma unroll
  for (int e = 0; e < 8; ++e) x[e] *= scale;
  if (row0 + r < rows) wmma_tile::store8<T>(g + (row0 + r) * row_stride + 8 * half, x);
  __syncwarp();
}

}  // namespace wmma_bwd
}  // namespace flashattn

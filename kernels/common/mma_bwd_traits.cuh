// Tile shapes of the mma.sync backward kernels, one traits struct per head dim and kernel, and
// the arguments every backward kernel receives.
//
// dK/dV kernel (one block per K/V block): five products per (Q block, K block) step,
//   S  = Q Kᵀ, dP = dO Vᵀ      (kBlockM x kBlockN)   warps kWarpsMS x kWarpsNS
//   dV += Pᵀ dO, dK += dSᵀ Q    (kBlockN x kHeadDim)  warps kWarpsNKV x kWarpsDKV, in registers
//   dQ  = dS K                  (kBlockM x kHeadDim)  warps kWarpsMQ x kWarpsDQ, added to fp32
// A warp's part of each product is MT x NT tiles of 16 x 8. Per k16 step it issues MT + NT/2
// ldmatrix.x4 for MT·NT mma, so squarer warp tiles read less shared memory per mma; the register
// file bounds them: dK and dV live in registers for the whole block (kBlockN·kHeadDim·2 floats
// over 256 threads), and for part of a step the fp32 P (S's accumulators) and dP next to them
// (the step keeps P in fp32 until dS, see common/mma_bwd_dkdv.cuh), then dQ. Accumulator
// registers at the peak are quoted below; fragments, addresses and row statistics take the rest
// of the 255.
//
// dQ kernel (deterministic path, one block per Q block): each warp owns 16 query rows and all
// kBlockN keys of S and dP, so dS leaves its accumulators as the A operand of dS K (no staging).
#pragma once

#include <cstdint>

#include "common/mask.cuh"
#include "common/mma_bwd_tile.cuh"
#include "flashattn/params.h"

namespace flashattn {
namespace mma_bwd {

// Spare dynamic shared memory per block, to align the tiles (see the kernels' entry points).
constexpr int kSmemSlack = 1024;
// The largest opt-in shared memory per block of sm_80 (163 KiB); sm_90 allows 227 KiB.
constexpr int kSmemLimit = 163 * 1024;
// Rows of the fp32 dQ accumulator per (batch, head): S_q rounded up to a multiple of every kBlockM,
// so that its fragment-ordered layout (common/mma_bwd_dkdv.cuh) has whole tiles.
constexpr int kAccumRowAlign = 128;

template <int kHeadDim_, int kBlockM_, int kBlockN_, int kNWarps_, int kWarpsMS_, int kWarpsNKV_, int kWarpsMQ_>
struct DkDvTraits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;  // query rows per step
  static constexpr int kBlockN = kBlockN_;  // keys per block
  static constexpr int kNWarps = kNWarps_;
  static constexpr int kThreads = 32 * kNWarps;

  static constexpr int kWarpsMS = kWarpsMS_, kWarpsNS = kNWarps / kWarpsMS;
  static constexpr int kMTS = kBlockM / (16 * kWarpsMS), kNTS = kBlockN / (8 * kWarpsNS);
  static constexpr int kWarpsNKV = kWarpsNKV_, kWarpsDKV = kNWarps / kWarpsNKV;
  static constexpr int kMTKV = kBlockN / (16 * kWarpsNKV), kNTKV = kHeadDim / (8 * kWarpsDKV);
  static constexpr int kWarpsMQ = kWarpsMQ_, kWarpsDQ = kNWarps / kWarpsMQ;
  static constexpr int kMTQ = kBlockM / (16 * kWarpsMQ), kNTQ = kHeadDim / (8 * kWarpsDQ);

  static_assert(kMTS * 16 * kWarpsMS == kBlockM && kNTS * 8 * kWarpsNS == kBlockN, "S tiles cover the block");
  static_assert(kMTKV * 16 * kWarpsNKV == kBlockN && kNTKV * 8 * kWarpsDKV == kHeadDim, "dK/dV tiles cover");
  static_assert(kMTQ * 16 * kWarpsMQ == kBlockM && kNTQ * 8 * kWarpsDQ == kHeadDim, "dQ tiles cover the block");
  static_assert(kNTS % 2 == 0 && kNTKV % 2 == 0 && kNTQ % 2 == 0, "B fragments load in n16 pairs");
  static_assert(kAccumRowAlign % kBlockM == 0, "Q blocks tile the padded dQ accumulator");

  using TileQ = SmemTile<kBlockM, kHeadDim>;   // Q_i, dO_i (double-buffered)
  using TileKV = SmemTile<kBlockN, kHeadDim>;  // K_j, V_j; dK_j, dV_j on the way out
  using TileP = SmemTile<kBlockM, kBlockN>;    // P_ij, dS_ij (16-bit)
  static constexpr int kSmemBytes = 2 * TileKV::kBytes + 4 * TileQ::kBytes + 2 * TileP::kBytes;
  static_assert(kSmemBytes + kSmemSlack <= kSmemLimit, "fits an A100 block");
};

template <int kHeadDim_, int kNWarps_, int kBlockN_>
struct DqTraits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kNWarps = kNWarps_;
  static constexpr int kThreads = 32 * kNWarps;
  static constexpr int kBlockM = 16 * kNWarps;  // one m16 row of tiles per warp
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kNTS = kBlockN / 8, kNTQ = kHeadDim / 8;
  static_assert(kNTS % 2 == 0 && kNTQ % 2 == 0, "B fragments load in n16 pairs");

  using TileQ = SmemTile<kBlockM, kHeadDim>;   // Q_i, dO_i (loaded once)
  using TileKV = SmemTile<kBlockN, kHeadDim>;  // K_j, V_j (double-buffered)
  static constexpr int kSmemBytes = 2 * TileQ::kBytes + 4 * TileKV::kBytes;
  static_assert(kSmemBytes + kSmemSlack <= kSmemLimit, "fits an A100 block");
};

// Per head dim. dK/dV: kBlockN = 128 keys per block wherever registers allow (each Q_i, dO_i
// load then serves 128 keys, and dQ takes S_k / 128 reduction passes); kBlockM shrinks as
// kHeadDim grows so that P and dP (live next to dK, dV) and shared memory stay within bounds.
template <int kHeadDim> struct Config;
// 160 accumulator registers: dK, dV 16 each, P and dP 64 each (32 x 64 warp tiles). 112 KiB smem.
template <> struct Config<32> {
  using DkDv = DkDvTraits<32, 128, 128, 8, /*kWarpsMS=*/4, /*kWarpsNKV=*/4, /*kWarpsMQ=*/4>;
  using Dq = DqTraits<32, 8, 128>;
};
// 192 accumulator registers: dK, dV 32 each (32 x 32 warp tiles), P and dP 64 each: the fullest
// register file of the five (255 on sm_90a without spilling; see mma_bwd.cu for sm_80). 160 KiB.
template <> struct Config<64> {
  using DkDv = DkDvTraits<64, 128, 128, 8, 4, 4, 4>;
  using Dq = DqTraits<64, 8, 128>;
};
// kBlockM = 64: dK, dV take 48 registers each (32 keys x 48 dims per warp), P and dP 32 each:
// 160 accumulator registers. 128 KiB smem.
template <> struct Config<96> {
  using DkDv = DkDvTraits<96, 64, 128, 8, 2, 4, 4>;
  using Dq = DqTraits<96, 8, 64>;
};
// 192 accumulator registers: dK, dV 64 each (32 x 64 warp tiles), then P and dP 32 each (32 x 32),
// or dQ 32. kBlockM = 128 would cut S and dP from 1/2 to 3/8 ldmatrix per mma but needs 256 KiB
// of smem with Q and dO double-buffered. 160 KiB smem.
template <> struct Config<128> {
  using DkDv = DkDvTraits<128, 64, 128, 8, 2, 4, 2>;
  using Dq = DqTraits<128, 8, 64>;
};
// kBlockN = 64 keeps dK, dV at 64 registers each (P, dP 8 each, dQ 32); kBlockM = 32 keeps the
// double-buffered Q and dO (the bulk of shared memory at this width) within an A100's 163 KiB:
// 136 KiB. The dQ kernel's accumulator is 16 x 256 per warp (128 registers), so its key blocks
// shrink to 16.
template <> struct Config<256> {
  using DkDv = DkDvTraits<256, 32, 64, 8, 2, 2, 2>;
  using Dq = DqTraits<256, 4, 16>;
};

// What every backward kernel reads: the params with the dtype applied and the workspace split.
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
  const float* lse = nullptr;  // [B, H, S_q], natural log, -inf for an empty row
  float* dsum = nullptr;       // workspace [B, H, S_q]: D_i = rowsum(dO_i ∘ O_i)
  float* dq_accum = nullptr;   // workspace [B, H, S_q_pad, D] fp32, or null on the deterministic path
  int B = 0, H = 0, H_kv = 0, S_q = 0, S_k = 0, D = 0;
  int S_q_pad = 0;  // rows of the dQ accumulator per (batch, head): S_q rounded up to kAccumRowAlign
  int group = 1;    // H / H_kv: query heads per kv head
  float scale = 0.f, scale_log2 = 0.f;
  Visibility vis;

  __host__ __device__ int64_t row_index(int64_t b, int64_t h, int64_t i) const { return (b * H + h) * S_q + i; }
  // Row i of (b, h) in the dQ accumulator (rows of D floats).
  __host__ __device__ int64_t accum_row(int64_t b, int64_t h, int64_t i) const { return (b * H + h) * S_q_pad + i; }
};

}  // namespace mma_bwd
}  // namespace flashattn

// mma, forward — rung 7 of the ladder: FlashAttention-2 on the tensor cores through mma.sync.
// Over rung 5 (fa2, the same algorithm on CUDA cores) it adds: both matmuls as warp-level
// mma.sync.m16n8k16 (fp16/bf16 in, fp32 accumulate) fed by ldmatrix from XOR-swizzled shared
// memory; P kept in registers (the accumulator layout of two n8 tiles, packed to 16 bits, is the
// A operand of P·V); K/V tiles double-buffered with cp.async (block j-1 loads while j computes);
// softmax in log2 space with the scale folded into one FFMA per score before MUFU.EX2.
//
// FlashAttention-2 (Dao 2023), Algorithm 1, one CTA per (Q block, head, batch), 4 warps:
//   load Q_i (kBlockM x D) to shared memory                                        line 4
//   O_i = 0, l_i = 0, m_i = -inf                                                   line 5
//   for each key block j with a visible key (last first):                          line 6
//     load K_j, V_j (in flight since the previous iteration)                       line 7
//     S_ij = Q_i K_j^T                        (each warp: its 16*kMTiles rows)     line 8
//     mask S_ij where the block straddles a boundary (or add the additive mask)
//     m_new = max(m_i, rowmax(S_ij)); P_ij = exp2(S_ij*c - m_new*c)                line 9
//     l_i = exp2((m_i - m_new)*c) l_i + rowsum(P_ij)
//     O_i = diag(exp2((m_i - m_new)*c)) O_i + P_ij V_j                             line 10
//   O_i = diag(l_i)^-1 O_i;  L_i = (m_i*c + log2(l_i)) * ln2                       lines 12-13
//   write O_i (staged through shared memory: 16-byte coalesced stores), L_i        lines 14-15
//
// Features: causal (bottom-right), window, key padding, additive mask, GQA/MQA, S_q != S_k, any
// length >= 1, empty rows (O = 0, lse = -inf), any scale, bhsd and bshd. Requires row strides
// that are multiples of 8 elements and 16-byte aligned tensors (checked).
// Limits: fp16/bf16, head dims 32, 64, 96, 128, 256, sm_80+.
// Instantiations: (head dim, dtype, kPrescale) = 5 x 2 x 2 = 20 kernels; the kPrescale = true
// half (additive mask, or scale <= 0) holds only the masked loop. Causal, window, padding and
// tails are run-time and block-uniform: key blocks with a boundary run a masked copy of the loop
// body, the others (most, for long sequences) an unmasked copy with no masking code at all.
// -DFLASHATTN_HDIMS=128 builds head dim 128 alone (4 kernels) for development.
// Measured: see README.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>
#include <vector>

#include "common/frag_softmax.cuh"
#include "common/head_dims.h"
#include "common/key_blocks.cuh"
#include "common/layout_checks.h"
#include "common/mask.cuh"
#include "common/mma_sm80.cuh"
#include "common/swizzled_smem.cuh"
#include "flashattn/check.h"
#include "flashattn/error.h"
#include "flashattn/registry.h"

namespace flashattn {
namespace mma_fwd {

// Spare dynamic shared memory so the tiles can start on a 128-byte boundary (see the kernel).
constexpr int kSmemAlign = 128;

// Tile configuration per head dim. Registers per thread are the constraint: each warp owns
// kWarpRows = kBlockM / kNWarps query rows, holding O (kWarpRows x D fp32) and S (kWarpRows x
// kBlockN fp32) in fragments, i.e. (kWarpRows * (D + kBlockN)) / 32 floats per lane, under the
// 255-register cap that two CTAs per SM (8 warps) allow. 32 rows per warp halve the shared-memory
// traffic per mma against 16 rows (every K/V fragment read feeds two m16 tiles).
template <int kHeadDim_, int kBlockM_, int kBlockN_, bool kQInRegs_>
struct Traits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kNWarps = 4;
  static constexpr int kThreads = kNWarps * 32;
  static constexpr int kMinBlocksPerSm = 2;  // 8 warps per SM: one CTA's softmax hides the other's mma
  // Q as A fragments in registers for the whole loop, or re-read from shared memory per block.
  static constexpr bool kQInRegs = kQInRegs_;
  static constexpr int kStages = 2;  // K/V double buffer: block j-1 loads during block j

  static constexpr int kWarpRows = kBlockM / kNWarps;
  static constexpr int kMTiles = kWarpRows / 16;  // m16 tiles per warp
  static constexpr int kNTiles = kBlockN / 8;     // n8 tiles of S per m16 tile
  static constexpr int kDTiles = kHeadDim / 8;    // n8 tiles of O per m16 tile
  static constexpr int kKStepsQK = kHeadDim / 16;
  static constexpr int kKStepsPV = kBlockN / 16;

  using TileQ = mma::SwizzledTile<kBlockM, kHeadDim>;  // also stages O in the epilogue
  using TileKV = mma::SwizzledTile<kBlockN, kHeadDim>;
  static constexpr int kSmemBytes = TileQ::kBytes + 2 * kStages * TileKV::kBytes;

  static_assert(kWarpRows % 16 == 0, "each warp owns whole m16 tiles");
  static_assert(kBlockN % 16 == 0 && kHeadDim % 16 == 0, "k16 steps and n8 tile pairs");
  static_assert(kStages == 2, "the main loop's single wait/barrier per block assumes two stages");
  // Hopper: 228 KB of shared memory per SM, 1 KB of it reserved per CTA.
  static_assert((kSmemBytes + kSmemAlign + 1024) * kMinBlocksPerSm <= 228 * 1024,
                "two CTAs per SM must fit in shared memory");
};

template <int kHeadDim> struct TraitsFor;
// D=32: S is 32x128 fp32 per warp (128 regs), O only 32, so Q (16 regs) fits in registers too.
// 40 KB shared.
template <> struct TraitsFor<32> { using type = Traits<32, 128, 128, true>; };
// D=64: O 64 + S 128 regs; Q in registers (+32) would spill, so it is re-read (4 KB/warp/block
// against 32 KB of K and V). 16 KB + 2 x 32 KB = 80 KB shared, two CTAs per SM.
template <> struct TraitsFor<64> { using type = Traits<64, 128, 128, false>; };
// D=96: O 96 + S 64 regs; kBlockN = 128 would push S to 128 and spill. 72 KB shared.
template <> struct TraitsFor<96> { using type = Traits<96, 128, 64, false>; };
// D=128: O 128 + S 64 regs, the 255-register budget's limit; 96 KB shared, two CTAs per SM.
template <> struct TraitsFor<128> { using type = Traits<128, 128, 64, false>; };
// D=256: O alone is 256 regs at 32 rows per warp, so 16 rows (kBlockM = 64): O 128 + S 16.
// kBlockN = 32 keeps shared memory at 96 KB (32 KB Q + 2 x 2 x 16 KB) for two CTAs per SM.
template <> struct TraitsFor<256> { using type = Traits<256, 64, 32, false>; };

template <class T>
struct Args {
  const T* q = nullptr;
  const T* k = nullptr;
  const T* v = nullptr;
  T* o = nullptr;
  float* lse = nullptr;  // [B, H, S_q]
  Strides q_st, k_st, v_st, o_st;
  int H = 0, h_per_kv = 1, S_q = 0;
  float scale_log2 = 0.f;
  float c = 0.f;  // the softmax's exp2 factor: scale_log2, or 1 with kPrescale
  // Keys visible to query i: [i + key_lo_shift, i + key_hi_shift) within [0, seqlen_k) (the
  // window with causal folded in; +-2^30 when unbounded), so a row's bounds cost two adds.
  int key_lo_shift = 0, key_hi_shift = 0;
  Visibility vis;
};

// Per-lane parts of the ldmatrix addresses (SwizzledTile::lane), computed once. Two lane
// patterns: "A" (rows lane%16, chunk half lane/16) reads Q as A fragments and V with .trans;
// "B" (rows lane%8 + 8*(lane/16), chunk half (lane/8)%2) reads K as B fragments.
template <class Tr>
struct LaneAddr {
  uint32_t q;  // shared address: sQ + the warp's first row + this lane's part
  uint32_t k;  // offsets within a K / V stage
  uint32_t v;
  __device__ __forceinline__ LaneAddr(uint32_t sQ, int warp, int lane) {
    using TileQ = typename Tr::TileQ;
    using TileKV = typename Tr::TileKV;
    const int a_row = lane & 15, a_chunk = lane >> 4;
    const int b_row = (lane & 7) | ((lane >> 4) << 3), b_chunk = (lane >> 3) & 1;
    q = sQ + TileQ::block(warp * Tr::kWarpRows, 0) + TileQ::lane(a_row, a_chunk);
    k = TileKV::lane(b_row, b_chunk);
    v = TileKV::lane(a_row, a_chunk);
  }
};

// Zeroes a fragment array (the O accumulators at the start, S before each Q K^T).
template <int M, int N>
__device__ __forceinline__ void zero_frags(float (&acc)[M][N][4]) {
#pragma unroll
  for (int mi = 0; mi < M; ++mi)
#pragma unroll
    for (int ni = 0; ni < N; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[mi][ni][e] = 0.f;
}

// Q fragments of m16 tile mi, k16 step kk: {a0, a1, a2, a3} = rows (g, g+8) x columns (2t, 2t+8).
template <class Tr>
__device__ __forceinline__ void load_q_frag(uint32_t (&a)[4], const LaneAddr<Tr>& la, int mi, int kk) {
  mma::ldsm_x4(a, Tr::TileQ::at(la.q, mi * 16, 2 * kk));
}

// S (kMTiles x kNTiles n8 tiles) = Q_warp · K^T over the head dim. Per k16 step: one ldmatrix.x4
// per m16 tile of Q and one per pair of n8 key tiles (b0, b1 of tile 2np, then of tile 2np+1).
template <class Tr, class T>
__device__ __forceinline__ void gemm_qk(float (&rS)[Tr::kMTiles][Tr::kNTiles][4],
                                        const uint32_t (&rQ)[Tr::kQInRegs ? Tr::kMTiles : 1]
                                                            [Tr::kQInRegs ? Tr::kKStepsQK : 1][4],
                                        uint32_t sK, const LaneAddr<Tr>& la) {
  using TileKV = typename Tr::TileKV;
  const uint32_t k_lane = sK + la.k;
#pragma unroll
  for (int kk = 0; kk < Tr::kKStepsQK; ++kk) {
    uint32_t a[Tr::kMTiles][4];
#pragma unroll
    for (int mi = 0; mi < Tr::kMTiles; ++mi) {
      if constexpr (Tr::kQInRegs) {
#pragma unroll
        for (int x = 0; x < 4; ++x) a[mi][x] = rQ[mi][kk][x];
      } else {
        load_q_frag<Tr>(a[mi], la, mi, kk);
      }
    }
#pragma unroll
    for (int np = 0; np < Tr::kNTiles / 2; ++np) {
      uint32_t b[4];
      mma::ldsm_x4(b, TileKV::at(k_lane, np * 16, 2 * kk));
      const uint32_t b_lo[2] = {b[0], b[1]}, b_hi[2] = {b[2], b[3]};
#pragma unroll
      for (int mi = 0; mi < Tr::kMTiles; ++mi) {
        mma::mma_16816<T>(rS[mi][2 * np], a[mi], b_lo, rS[mi][2 * np]);
        mma::mma_16816<T>(rS[mi][2 * np + 1], a[mi], b_hi, rS[mi][2 * np + 1]);
      }
    }
  }
}

// O += P · V. P never leaves registers: for k16 step kk, the fp32 accumulators of n8 tiles 2kk
// and 2kk+1 (rows g/g+8, columns 2t..2t+1), rounded in pairs by the softmax, are exactly the A
// fragment {a0: tile 2kk row g, a1: tile 2kk row g+8, a2: tile 2kk+1 row g, a3: tile 2kk+1 row g+8}.
// V is stored key-major, so ldmatrix.trans (keys lane%16, chunk half lane/16) yields the B
// fragments of two n8 head-dim tiles per instruction.
template <class Tr, class T>
__device__ __forceinline__ void gemm_pv(float (&rO)[Tr::kMTiles][Tr::kDTiles][4],
                                        const uint32_t (&rP)[Tr::kMTiles][Tr::kNTiles][2], uint32_t sV,
                                        const LaneAddr<Tr>& la) {
  using TileKV = typename Tr::TileKV;
  const uint32_t v_lane = sV + la.v;
#pragma unroll
  for (int kk = 0; kk < Tr::kKStepsPV; ++kk) {
    uint32_t a[Tr::kMTiles][4];
#pragma unroll
    for (int mi = 0; mi < Tr::kMTiles; ++mi) {
      a[mi][0] = rP[mi][2 * kk][0];
      a[mi][1] = rP[mi][2 * kk][1];
      a[mi][2] = rP[mi][2 * kk + 1][0];
      a[mi][3] = rP[mi][2 * kk + 1][1];
    }
#pragma unroll
    for (int dp = 0; dp < Tr::kDTiles / 2; ++dp) {
      uint32_t b[4];
      mma::ldsm_x4_trans(b, TileKV::at(v_lane, kk * 16, 2 * dp));
      const uint32_t b_lo[2] = {b[0], b[1]}, b_hi[2] = {b[2], b[3]};
#pragma unroll
      for (int mi = 0; mi < Tr::kMTiles; ++mi) {
        mma::mma_16816<T>(rO[mi][2 * dp], a[mi], b_lo, rO[mi][2 * dp]);
        mma::mma_16816<T>(rO[mi][2 * dp + 1], a[mi], b_hi, rO[mi][2 * dp + 1]);
      }
    }
  }
}

// The masked path of a key block: scores of invisible keys -> -inf. With kPrescale (additive
// mask, or a scale <= 0 that would turn max(s) into min(s*scale)) every block comes here and the
// visible scores become s*scale_log2 + mask*log2(e), already in log2 units (softmax c = 1).
template <class Tr, bool kPrescale, class T>
__device__ __forceinline__ void mask_scores(float (&rS)[Tr::kMTiles][Tr::kNTiles][4], const Args<T>& a, int b,
                                            int h, int row0, int n0, int seqlen_k, int lane) {
#pragma unroll
  for (int mi = 0; mi < Tr::kMTiles; ++mi)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int i = row0 + mi * 16 + r * 8 + lane / 4;
      // Visible keys of row i as offsets from n0: [jj_begin, jj_end); this lane's column of
      // element (ni, e) is ni*8 + e + 2t, so compare the compile-time ni*8 + e against bounds
      // shifted by 2t.
      const int jj_begin = max(i - n0 + a.key_lo_shift, 0) - 2 * (lane % 4);
      const int jj_end = min(i - n0 + a.key_hi_shift, seqlen_k - n0) - 2 * (lane % 4);
      const float* bias_row = nullptr;
      if constexpr (kPrescale) {
        const MaskView& mask = a.vis.mask;
        // Rows past S_q (the tail of the last Q block) are computed but never stored: no mask read.
        if (mask.ptr != nullptr && i < a.S_q)
          bias_row = mask.ptr + b * mask.batch + h * mask.head + i * mask.row + n0 * mask.col;
      }
#pragma unroll
      for (int ni = 0; ni < Tr::kNTiles; ++ni)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int jj = ni * 8 + e;
          float& s = rS[mi][ni][2 * r + e];
          const bool visible = jj >= jj_begin && jj < jj_end;
          if constexpr (kPrescale) {
            s *= a.scale_log2;
            if (visible && bias_row != nullptr)
              s = fmaf(__ldg(bias_row + (jj + 2 * (lane % 4)) * a.vis.mask.col), kLog2e, s);
          }
          if (!visible) s = -INFINITY;
        }
    }
}

// Lines 12-15: O_i = diag(l_i)^-1 O_i, L_i = (m_i*c + log2(l_i)) * ln2; write O_i (staged
// through the Q tile's shared memory) and L_i.
template <class Tr, class T>
__device__ __forceinline__ void epilogue(const Args<T>& a, float (&rO)[Tr::kMTiles][Tr::kDTiles][4],
                                         mma::OnlineSoftmax<Tr::kMTiles, Tr::kNTiles>& softmax, uint32_t sQ, int b,
                                         int h, int m0, int m_rows, int warp, int lane, int tid) {
  using TileQ = typename Tr::TileQ;
  float lse[Tr::kMTiles][2];
  softmax.finalize(rO, a.c, lse);  // O /= l

  // Stage O through shared memory (the Q tile's space) so global stores are whole 16-byte rows.
  __syncthreads();  // every warp has finished reading sQ, sK, sV
  float* gLse = a.lse + (static_cast<int64_t>(b) * a.H + h) * a.S_q;
  // Lane (g, t) holds columns 2t, 2t+1 of rows g, g+8 in every n8 tile: one 32-bit store each.
  const uint32_t o_lane = sQ + TileQ::block(warp * Tr::kWarpRows, 0) + TileQ::lane(lane / 4, 0) + 4 * (lane % 4);
#pragma unroll
  for (int mi = 0; mi < Tr::kMTiles; ++mi)
#pragma unroll
    for (int r = 0; r < 2; ++r) {
#pragma unroll
      for (int di = 0; di < Tr::kDTiles; ++di)
        mma::sts_32(TileQ::at(o_lane, mi * 16 + r * 8, di),
                    mma::pack2<T>(rO[mi][di][2 * r], rO[mi][di][2 * r + 1]));
      const int row = warp * Tr::kWarpRows + mi * 16 + r * 8 + lane / 4;
      if (lane % 4 == 0 && row < m_rows) gLse[m0 + row] = lse[mi][r];
    }
  __syncthreads();
  T* gO = a.o + b * a.o_st.batch + h * a.o_st.head + static_cast<int64_t>(m0) * a.o_st.row;
  mma::store_tile<TileQ, Tr::kThreads>(gO, a.o_st.row, m_rows, sQ, tid);
}

template <class Tr, class T, bool kPrescale>
__global__ void __launch_bounds__(Tr::kThreads, Tr::kMinBlocksPerSm) forward_kernel(const Args<T> a) {
  using TileQ = typename Tr::TileQ;
  using TileKV = typename Tr::TileKV;
  extern __shared__ __align__(128) unsigned char smem[];
  // The XOR-on-address form of the swizzle (SwizzledTile::at) needs 128-byte aligned tiles; the
  // launch asks for kSmemAlign spare bytes so the base can be rounded up whatever the runtime gives.
  const uint32_t sQ = (mma::smem_u32(smem) + kSmemAlign - 1) & ~uint32_t(kSmemAlign - 1);  // (kBlockM, kHeadDim)
  const uint32_t sK = sQ + TileQ::kBytes;                        // kStages x (kBlockN, kHeadDim)
  const uint32_t sV = sK + Tr::kStages * TileKV::kBytes;         // kStages x (kBlockN, kHeadDim)

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  // Heaviest Q blocks first: under a causal mask the last block sees the most keys, and starting
  // it first keeps the long tail of the grid short.
  const int m_block = gridDim.x - 1 - blockIdx.x;
  const int h = blockIdx.y, b = blockIdx.z;
  const int m0 = m_block * Tr::kBlockM;
  const int m_rows = min(Tr::kBlockM, a.S_q - m0);  // rows of this block inside S_q
  const int seqlen_k = a.vis.seqlen_k(b);
  const BlockRange nb = key_blocks<Tr::kBlockN>(a.vis, m0, m0 + m_rows - 1, seqlen_k);
  // Blocks whose keys are all visible to all rows take the unmasked loop; the others (causal
  // diagonal and key tail at the top, window edge at the bottom) the masked one, first.
  BlockRange full = full_key_blocks<Tr::kBlockN>(a.vis, m0, m0 + m_rows - 1, seqlen_k);
  full.begin = max(full.begin, nb.begin);
  full.end = min(full.end, nb.end);
  if (kPrescale || full.end <= full.begin) full = BlockRange{nb.begin, nb.begin};
  const int n_top = nb.end - full.end;              // masked, above the full range
  const int n_masked = n_top + full.begin - nb.begin;  // ... plus masked below it
  const int n_total = nb.end - nb.begin;
  // Visiting order: masked top blocks descending, masked bottom blocks descending, full blocks
  // descending.
  auto block_at = [&](int it) {
    return it < n_top ? nb.end - 1 - it : it < n_masked ? full.begin - 1 - (it - n_top) : full.end - 1 - (it - n_masked);
  };

  float rO[Tr::kMTiles][Tr::kDTiles][4];  // (kWarpRows, kHeadDim) per warp
  zero_frags(rO);
  mma::OnlineSoftmax<Tr::kMTiles, Tr::kNTiles> softmax;
  softmax.init();

  if (n_total > 0) {
    const T* gQ = a.q + b * a.q_st.batch + h * a.q_st.head + static_cast<int64_t>(m0) * a.q_st.row;
    const int hk = h / a.h_per_kv;  // GQA: the kv head this query head reads
    const mma::TileLoader<TileKV, Tr::kThreads, T> k_loader(a.k + b * a.k_st.batch + hk * a.k_st.head, a.k_st.row, tid);
    const mma::TileLoader<TileKV, Tr::kThreads, T> v_loader(a.v + b * a.v_st.batch + hk * a.v_st.head, a.v_st.row, tid);
    // K/V rows past seqlen_k are zero-filled rather than read: padded keys are masked anyway, and
    // zeros keep whatever the padding holds (even NaN) out of P·V. A whole block (true of every
    // unmasked one) skips the row test.
    auto load_kv = [&](auto whole_tag, int n_block, int stage) {
      constexpr bool kCheckRows = !decltype(whole_tag)::value;
      const int n0 = n_block * Tr::kBlockN;
      k_loader.template load<kCheckRows>(sK + stage * TileKV::kBytes, n0, seqlen_k - n0, a.k);
      v_loader.template load<kCheckRows>(sV + stage * TileKV::kBytes, n0, seqlen_k - n0, a.v);
    };

    mma::TileLoader<TileQ, Tr::kThreads, T>(gQ, a.q_st.row, tid).template load</*kCheckRows=*/true>(
        sQ, /*row=*/0, m_rows, gQ);  // Q_i
    mma::cp_async_commit();
    load_kv(/*whole=*/std::false_type{}, block_at(0), /*stage=*/0);
    mma::cp_async_commit();

    const LaneAddr<Tr> la(sQ, warp, lane);
    uint32_t rQ[Tr::kQInRegs ? Tr::kMTiles : 1][Tr::kQInRegs ? Tr::kKStepsQK : 1][4];  // A fragments of Q
    if constexpr (Tr::kQInRegs) {
      mma::cp_async_wait<1>();
      __syncthreads();
#pragma unroll
      for (int mi = 0; mi < Tr::kMTiles; ++mi)
#pragma unroll
        for (int kk = 0; kk < Tr::kKStepsQK; ++kk) load_q_frag<Tr>(rQ[mi][kk], la, mi, kk);
    }

    // One key block (n_block), prefetching the next one visited (none when negative) into the
    // other stage. kMasked is a compile-time tag so the unmasked loop carries none of the masking
    // code (nor the registers its loop invariants would pin).
    auto step = [&](auto masked_tag, int n_block, int next_block, int stage) {
      constexpr bool kMasked = decltype(masked_tag)::value;
      // K_j, V_j have landed, and every warp is done with the other stage (the previous block).
      mma::cp_async_wait<0>();
      __syncthreads();
      // An unmasked block is followed only by unmasked blocks (they are visited last).
      if (next_block >= 0) load_kv(std::bool_constant<!kMasked>{}, next_block, stage ^ 1);
      mma::cp_async_commit();

      float rS[Tr::kMTiles][Tr::kNTiles][4];  // (kWarpRows, kBlockN) per warp
      zero_frags(rS);
      gemm_qk<Tr, T>(rS, rQ, sK + stage * TileKV::kBytes, la);  // S = Q K_j^T
      if constexpr (kMasked)
        mask_scores<Tr, kPrescale, T>(rS, a, b, h, m0 + warp * Tr::kWarpRows, n_block * Tr::kBlockN, seqlen_k, lane);
      uint32_t rP[Tr::kMTiles][Tr::kNTiles][2];  // (kWarpRows, kBlockN) per warp, in T pairs
      softmax.template update<T>(rS, rP, rO, a.c);              // P = exp2(S*c - m*c), rescale O
      gemm_pv<Tr, T>(rO, rP, sV + stage * TileKV::kBytes, la);  // O += P V_j
    };
    for (int it = 0; it < n_masked; ++it)
      step(/*masked=*/std::true_type{}, block_at(it), it + 1 < n_total ? block_at(it + 1) : -1, it & 1);
    if constexpr (!kPrescale) {
      int stage = n_masked & 1;
      for (int n_block = full.end - 1; n_block >= full.begin; --n_block, stage ^= 1)
        step(/*masked=*/std::false_type{}, n_block, n_block > full.begin ? n_block - 1 : -1, stage);
    }
  }

  epilogue<Tr, T>(a, rO, softmax, sQ, b, h, m0, m_rows, warp, lane, tid);  // lines 12-15
}

template <class T, int kHeadDim>
void launch(const FwdParams& p, const LaunchContext& ctx) {
  using Tr = typename TraitsFor<kHeadDim>::type;
  Args<T> a;
  a.q = static_cast<const T*>(p.q);
  a.k = static_cast<const T*>(p.k);
  a.v = static_cast<const T*>(p.v);
  a.o = static_cast<T*>(p.o);
  a.lse = static_cast<float*>(p.lse);
  a.q_st = p.q_st, a.k_st = p.k_st, a.v_st = p.v_st, a.o_st = p.o_st;
  a.H = p.H;
  a.h_per_kv = p.H / p.H_kv;
  a.S_q = p.S_q;
  a.scale_log2 = p.scale_log2;
  a.vis = make_visibility(p);
  const KeyShifts shifts = key_shifts(a.vis);
  a.key_lo_shift = shifts.lo;
  a.key_hi_shift = shifts.hi;
  const bool prescale = p.mask.ptr != nullptr || !(p.scale_log2 > 0.f) || !std::isfinite(p.scale_log2);
  a.c = prescale ? 1.f : p.scale_log2;

  const auto kernel = prescale ? &forward_kernel<Tr, T, true> : &forward_kernel<Tr, T, false>;
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes + kSmemAlign));
  const dim3 grid((p.S_q + Tr::kBlockM - 1) / Tr::kBlockM, p.H, p.B);
  kernel<<<grid, Tr::kThreads, Tr::kSmemBytes + kSmemAlign, ctx.stream>>>(a);
  CHECK_LAUNCH("mma forward_kernel");
}

// Head dims with a variant; the build compiles those FLASHATTN_HDIMS enables (common/head_dims.h).
using KernelHeadDims = HeadDims<32, 64, 96, 128, 256>;

template <class T>
void dispatch_head_dim(const FwdParams& p, const LaunchContext& ctx) {
  KernelHeadDims::dispatch(p.D, "mma forward", [&](auto kD) { launch<T, decltype(kD)::value>(p, ctx); });
}


void run(const FwdParams& p, const LaunchContext& ctx) {
  if (static_cast<int64_t>(p.B) * p.H * p.S_q == 0) return;
  // cp.async and the epilogue move 16-byte rows of 8 elements.
  check_tiled_forward(p, "mma forward");
  switch (p.dtype) {
    case DType::F16: return dispatch_head_dim<__half>(p, ctx);
    case DType::BF16: return dispatch_head_dim<__nv_bfloat16>(p, ctx);
    default: throw RuntimeError(std::string("mma forward: no variant compiled for dtype ") + dtype_name(p.dtype));
  }
}

KernelMode make_entry() {
  KernelMode m;
  m.kernel = "mma";
  m.mode = Mode::Forward;
  m.summary = "FlashAttention-2 forward with mma.sync m16n8k16 + ldmatrix, P in registers, cp.async pipeline, "
              "swizzled smem";
  m.rung = 7;
  m.gpu = true;
  m.min_sm = 80;  // cp.async, ldmatrix, bf16 mma.sync
  m.dtypes = dtype_bit(DType::F16) | dtype_bit(DType::BF16);
  m.head_dims = KernelHeadDims::list();
  m.features = kAllFeatures;
  m.uses_atomics = false;  // each output element is written once by one thread: bitwise reproducible
  m.partial_outputs = true;  // a ring over several GPUs may merge its blocks (registry.h)
  m.fwd = &run;
  m.fwd_workspace = nullptr;
  return m;
}

}  // namespace mma_fwd
}  // namespace flashattn

FLASHATTN_REGISTER_KERNEL_MODE(mma_forward, flashattn::mma_fwd::make_entry)

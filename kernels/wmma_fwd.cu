// wmma, forward — rung 6 of the ladder: FlashAttention-2 on the tensor cores through the portable
// nvcuda::wmma API (16x16x16 fragments, fp16/bf16 in, fp32 accumulate). Over rung 5 (fa2, the same
// algorithm on CUDA cores) it moves both matrix products to the tensor cores; everything wmma does
// not expose goes through shared memory, which is what the next rung (mma) removes.
//
// FlashAttention-2 (Dao 2023), Algorithm 1, one CTA per (Q block, head, batch), 4 warps; each warp
// owns kWarpRows query rows, so the online softmax of its rows never leaves the warp:
//   load Q_i (cp.async; kQInRegs: into registers, once)                            line 4
//   O_i = 0 (wmma accumulators), l_i = 0, m_i = -inf                                line 5
//   for each key block j with a visible key, last first:                            line 6
//     K_j, V_j landed (loaded during the previous block)                            line 7
//     S_ij = Q_i K_j^T               wmma, accumulators stored fp32 to shared       line 8
//     x = S_ij * scale * log2(e); invisible keys -> -inf (boundary blocks only)
//     m_new = max(m_i, rowmax(x)); P_ij = exp2(x - m_new), stored 16-bit            line 9
//     l_i = exp2(m_i - m_new) l_i + rowsum(P_ij)
//     O_i = diag(exp2(m_i - m_new)) O_i  (in registers, skipped when no maximum moved) line 10
//     O_i += P_ij V_j                wmma                                           line 10
//   O_i = diag(l_i)^-1 O_i;  L_i = (m_i + log2(l_i)) ln 2                           lines 12-13
//   write O_i (staged through shared memory: 16-byte coalesced stores), L_i          lines 14-15
//
// Design (Traits below; the reason for each choice beside it). Every head dim: fragments built with
// ldmatrix (see "Fragments"), a softmax with the scale folded into the exponent and tree reductions,
// whole K/V tiles copied without per-row predicates (tails take a predicated copy), key blocks
// without a boundary skip the visibility test.
//   D    kBlockM x kBlockN  rows/warp  Q          K/V buffers  CTAs/SM (sm_90)  shared memory
//   32   128 x 64           32         registers  2            3                56.5 KB
//   64   128 x 64           32         registers  2            3                72.5 KB
//   96   128 x 64           32         registers  2            2                88.5 KB
//   128  128 x 64           32         shared     1            2                104.5 KB
//   256  64 x 32            16         shared     1            2                76.3 KB
// How it was chosen, on an H200 (bf16, B·S = 16384, H = 2048/D, S = 2048 and 8192, causal and not;
// TFLOP/s at S = 8192, not causal). From the plain wmma kernel (load_matrix_sync fragments,
// predicated loads, one softmax for all blocks; D64 159, D128 187 = 0.53x PyTorch's flash backend):
//   ldmatrix fragments                      D64 +32% (210)   D128 +47% (275); fp16 unchanged (its
//                                           wmma loads were LDSM already): the bf16 loads were the bound
//   + fast softmax, unpredicated K/V copies D64 +2% (214)    D128 +2% (280)
//   + D64: Q in registers, K/V double-buffered (one barrier per block): +10% (235)
//   + D64: three CTAs per SM instead of two (S in two passes, P·V rolled, to fit 168 registers):
//     +11% alone (237), +23% with the above (263): the kept configuration
//   + D128: P·V k16 loop unrolled: +2% (285): the kept configuration. P·V tiled 64 rows x 64
//     columns per warp pair instead: no gain (279); that and Q·K^T in one pass: 275
//   16 rows per warp, 8 warps (16 warps per SM, +30% fragment traffic per HMMA): D64 -8% (198),
//     D128 -16% (236)
// Not measured, derived from the above: D = 32 takes D = 64's design (three CTAs fit, with S in one
// pass); D = 96 fits only two CTAs (shared memory) but takes Q in registers and double-buffered K/V,
// worth +10% at D = 64 with two CTAs, and D = 128's unrolled P·V (255 registers, no spills); D = 256
// keeps 16 rows per warp (O alone is 128 registers per lane) with D = 128's other choices.
//
// Fragments. A wmma fragment's element -> (row, column) map is undocumented. For bf16,
// load_matrix_sync compiles to generic 32-bit loads (LD.E, plus MOVM for the transposed V operand)
// where ldmatrix needs one LDSM: ~4x the load instructions, all in the shared-memory pipe. So the
// operand fragments are built with ldmatrix, which relies on the mapping the sm_80/sm_90 compiler
// uses (common/wmma_frag.cuh). That reliance is checked, not assumed: at the first launch on a
// device and dtype a one-warp self-test compares ldmatrix-built fragments with load_matrix_sync's
// (bit for bit); if they differ, the kernel runs the same configuration with load_matrix_sync
// (correct, slower; a line on stderr says so). Both loaders are compiled for that reason.
//
// What limits WMMA, per warp and key block (32 query rows x 64 keys = 2*D HMMA.16816, as wmma
// m16n16k16 compiles to two of them):
//  1. S and P round-trip through shared memory. With no documented element map the softmax cannot
//     run on accumulator fragments in registers, and no matrix_a fragment can be built from them:
//     each score costs a 4-byte store and load (S, fp32) and a 2-byte store and load (P), 12 bytes
//     for the 2*D multiply-adds it feeds, i.e. 12288/D bytes per HMMA: 96 at D = 128, 192 at
//     D = 64, 384 at D = 32.
//  2. Fragment loads. Every operand is re-read from shared memory for every use: K and V fragments
//     128 bytes per HMMA, Q 32 per Q·K^T pass unless in registers, plus ~32 for the cp.async fills.
//     Total ~320 bytes per HMMA at D = 128 and ~350 at D = 64, against ~190 with P kept in
//     registers (the mma rung); at 128 B/clk/SM shared memory caps D = 128 at ~0.4 HMMA/clk/SM,
//     well below the tensor cores' rate. The main loop is bound by the shared-memory pipe (MIO),
//     which is why halving its instructions (ldmatrix) paid most, and why overlap across more
//     CTAs (D = 64) paid next.
//  3. Rescaling O needs the row of each accumulator element. O stays in registers; each thread
//     learns its elements' rows once, at start-up, by loading a matrix of row indices into an
//     accumulator fragment (common/wmma_tile.cuh): exact for whatever layout the compiler uses. A
//     rescale is then 8 shared loads per 16 rows, skipped when no row maximum moved (warp vote).
//  4. Registers: at 32 rows per warp O is D registers per lane. D = 96 and 128 run at the 255 cap
//     (S in two passes), which fixes two CTAs per SM; D = 32 and 64 fit 168 for three.
// Measured (H200, 2026-11-21, bf16, not causal / causal, x = ratio to PyTorch's flash backend):
//   D = 64:  S = 2048 252 TFLOP/s (0.85x) / 217 (0.83x);  S = 8192 263 (0.87x) / 245 (0.83x)
//   D = 128: S = 2048 272 TFLOP/s (0.80x) / 226 (0.80x);  S = 8192 285 (0.81x) / 254 (0.80x);
//            fp16 S = 8192: 284
// Features: causal (bottom-right), window, key padding, additive mask, GQA/MQA, S_q != S_k, any
// length >= 1, empty rows (O = 0, lse = -inf), any scale, bhsd and bshd. An additive mask or a
// scale <= 0 takes the general softmax (the visibility test and the mask read on every block).
// Requires 16-byte aligned tensors and strides that are multiples of 8 elements (checked).
// Limits: fp16/bf16, head dims 32, 64, 96, 128, 256, sm_80+ (bf16 wmma, cp.async). On sm_80
// (164 KB of shared memory per SM) D = 96 and 128 run one CTA per SM, the others two.
// Instantiations: head dim x dtype x fragment loader (ldmatrix, load_matrix_sync) = 5 x 2 x 2 = 20
// kernels, plus 2 self-test kernels; ~45 s of nvcc for sm_80 + sm_90a. Causal, window, padding,
// mask and tails are run-time and block-uniform. -DFLASHATTN_HDIMS=128 builds head dim 128 alone.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <string>

#include "common/head_dims.h"
#include "common/layout_checks.h"
#include "common/mask.cuh"
#include "common/math_constants.h"
#include "common/mma_sm80.cuh"
#include "common/wmma_frag.cuh"
#include "common/wmma_fwd_steps.cuh"
#include "common/wmma_tile.cuh"
#include "flashattn/check.h"
#include "flashattn/error.h"
#include "flashattn/registry.h"

namespace flashattn {
namespace wmma_fwd {


// Largest multiple of 16 that divides d and is at most n: the column chunk of O staged through a
// warp's score tile in the epilogue.
constexpr int o_chunk(int d, int n) {
  int c = (n < d ? n : d) / 16 * 16;
  while (d % c != 0) c -= 16;
  return c;
}

// kWarpRows query rows per warp (16 or 32): 32 halves the K/V fragment traffic per HMMA (each K/V
// fragment feeds two m16 tiles) and costs kHeadDim accumulator registers per lane for O.
// kQKTiles n16 tiles of S are accumulated per pass of Q·K^T (kMTiles * kQKTiles * 8 registers live
// beside O). kQInRegs: the warp's Q fragments are loaded once and stay in registers (kMTiles *
// kHeadDim / 4 of them); the shared Q tile this frees pays for second K and V buffers, so block
// j-1 loads during block j and one barrier per block suffices. kPVUnroll: see gemm_pv.
template <int kHeadDim_, int kBlockN_, int kWarpRows_, int kQKTiles_, int kMinBlocksPerSm_, bool kQInRegs_,
          bool kPVUnroll_>
struct Traits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kWarpRows = kWarpRows_;
  static constexpr int kNWarps = 4;
  static constexpr int kThreads = kNWarps * 32;
  static constexpr int kBlockM = kNWarps * kWarpRows;
  // CTAs per SM (__launch_bounds__): while one CTA's warps run the softmax, another's run HMMAs.
  // Three cap the registers at 168 per thread, two at 255.
  static constexpr int kMinBlocksPerSm = kMinBlocksPerSm_;
  static constexpr int kMTiles = kWarpRows / 16;
  static constexpr int kNTiles = kBlockN / 16;
  static constexpr int kDTiles = kHeadDim / 16;
  static constexpr int kQKTiles = kQKTiles_;
  static constexpr bool kQInRegs = kQInRegs_;
  static constexpr int kStages = kQInRegs ? 2 : 1;  // K and V buffers
  static constexpr bool kPVUnroll = kPVUnroll_;

  static constexpr int kPitchQKV = wmma_tile::pitch16<kHeadDim>();  // halves
  static constexpr int kPitchS = wmma_tile::pitch32<kBlockN>();     // floats
  // P overwrites the warp's own S tile: row r of P lies in the bytes of S row r/2, which the
  // softmax has read before it writes (see softmax_block_fast).
  static constexpr int kPitchP = kBlockN + 8;  // halves
  static constexpr int kOChunk = o_chunk(kHeadDim, kBlockN);

  static constexpr int kBytesQ = kQInRegs ? 0 : kBlockM * kPitchQKV * 2;  // (kBlockM, kHeadDim)
  static constexpr int kBytesKV = kBlockN * kPitchQKV * 2;                // (kBlockN, kHeadDim), per buffer
  static constexpr int kBytesS = kWarpRows * kPitchS * 4;                 // (kWarpRows, kBlockN) fp32 per warp
  static constexpr int kOffK = kBytesQ;
  static constexpr int kOffV = kOffK + kStages * kBytesKV;
  static constexpr int kOffS = kOffV + kStages * kBytesKV;
  static constexpr int kOffRow = kOffS + kNWarps * kBytesS;  // kBlockM floats: alpha, then 1/l
  static constexpr int kSmemBytes = kOffRow + kBlockM * 4;

  static_assert(kWarpRows == 16 || kWarpRows == 32, "one or two m16 tiles per warp");
  static_assert(kNTiles % kQKTiles == 0, "whole Q·K^T passes");
  static_assert(kBlockN % 32 == 0, "the softmax's lane pairs read 8-column groups of a row");
  static_assert(kPitchP % 8 == 0 && kPitchP * 2 * 2 == kPitchS * 4, "P rows are half an S row");
  static_assert(kBytesQ % 128 == 0 && kBytesKV % 128 == 0 && kBytesS % 128 == 0, "tiles stay 128-byte aligned");
  static_assert(kWarpRows * kPitchS >= 256, "the row probe uses the warp's S tile");
  static_assert(!kQInRegs || kWarpRows * kPitchQKV * 2 <= kBytesS, "Q rows are staged in the warp's S tile");
  // Hopper: 228 KB of shared memory per SM, 1 KB reserved per CTA.
  static_assert((kSmemBytes + 1024) * kMinBlocksPerSm <= 228 * 1024, "kMinBlocksPerSm CTAs fit an sm_90 SM");
};

template <int kHeadDim> struct TraitsFor;
// D = 32 and 64: Q in registers, three CTAs per SM (12 warps). D = 64 is the measured best (header):
// at 168 registers S takes two passes of 32 registers and the P·V loop stays rolled. D = 32 (O and
// Q 48 registers together) fits S in one pass and the unrolled P·V loop.
template <> struct TraitsFor<32> {
  using type = Traits<32, 64, 32, /*kQKTiles=*/4, /*kMinBlocksPerSm=*/3, /*kQInRegs=*/true, /*kPVUnroll=*/true>;
};
template <> struct TraitsFor<64> {
  using type = Traits<64, 64, 32, /*kQKTiles=*/2, /*kMinBlocksPerSm=*/3, /*kQInRegs=*/true, /*kPVUnroll=*/false>;
};
// D = 96 and 128: O takes 96 / 128 registers, so two CTAs per SM at up to 255, S in two passes and
// P·V unrolled (D = 128: +2% measured). D = 96 still has room for Q in registers (48 more); D = 128
// has not, so its Q stays in shared memory (re-read per S pass) with one K and one V buffer (a
// second pair would cost it a CTA per SM).
template <> struct TraitsFor<96> {
  using type = Traits<96, 64, 32, /*kQKTiles=*/2, /*kMinBlocksPerSm=*/2, /*kQInRegs=*/true, /*kPVUnroll=*/true>;
};
template <> struct TraitsFor<128> {
  using type = Traits<128, 64, 32, /*kQKTiles=*/2, /*kMinBlocksPerSm=*/2, /*kQInRegs=*/false, /*kPVUnroll=*/true>;
};
// D = 256: O alone is 128 registers at 16 rows per warp (kBlockM = 64); kBlockN = 32 keeps the
// shared memory at 76 KB so two CTAs fit on an SM (sm_80 too).
template <> struct TraitsFor<256> {
  using type = Traits<256, 32, 16, /*kQKTiles=*/2, /*kMinBlocksPerSm=*/2, /*kQInRegs=*/false, /*kPVUnroll=*/true>;
};

template <class T>
struct Args {
  using Elem = T;
  const T* q = nullptr;
  const T* k = nullptr;
  const T* v = nullptr;
  T* o = nullptr;
  float* lse = nullptr;  // [B, H, S_q]
  Strides q_st, k_st, v_st, o_st;
  int H = 0, h_per_kv = 1, S_q = 0;
  float scale_log2 = 0.f;
  Visibility vis;
};

template <class Tr, class T, bool kLdsm>
__global__ void __launch_bounds__(Tr::kThreads, Tr::kMinBlocksPerSm) forward_kernel(const Args<T> a) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  T* sQ = reinterpret_cast<T*>(smem);                                           // (kBlockM, kHeadDim), not with kQInRegs
  T* sK = reinterpret_cast<T*>(smem + Tr::kOffK);                               // kStages x (kBlockN, kHeadDim)
  T* sV = reinterpret_cast<T*>(smem + Tr::kOffV);                               // kStages x (kBlockN, kHeadDim)
  float* sS = reinterpret_cast<float*>(smem + Tr::kOffS + warp * Tr::kBytesS);  // (kWarpRows, kBlockN), the warp's
  const T* sP = reinterpret_cast<const T*>(sS);                                 // (kWarpRows, kBlockN), over sS
  float* sRow = reinterpret_cast<float*>(smem + Tr::kOffRow) + warp * Tr::kWarpRows;  // (kWarpRows)
  // With kQInRegs the warp's Q rows wait in its own S tile until they are in registers.
  T* sQw = Tr::kQInRegs ? reinterpret_cast<T*>(sS) : sQ + warp * Tr::kWarpRows * Tr::kPitchQKV;  // (kWarpRows, kHeadDim)
  constexpr int kStageElems = Tr::kBytesKV / 2;
  const LaneOffsets<Tr> lo(lane);

  // Heaviest Q blocks first: under a causal mask the last block sees the most keys.
  const int m_block = gridDim.x - 1 - blockIdx.x;
  const int h = blockIdx.y, b = blockIdx.z;
  const int m0 = m_block * Tr::kBlockM;
  const int m_rows = min(Tr::kBlockM, a.S_q - m0);
  const int seqlen_k = a.vis.seqlen_k(b);
  const KeyBlocks kb = key_blocks<Tr::kBlockN>(a.vis, m0, m0 + m_rows - 1, seqlen_k);
  // softmax_block_fast folds the scale into the exponent, which needs scale > 0 and no additive mask.
  const bool general_softmax = a.vis.mask.ptr != nullptr || !(a.scale_log2 > 0.f);

  const uint32_t row_map = wmma_tile::probe_acc_rows(sS, lane);  // row of each accumulator element

  AccFrag rO[Tr::kMTiles][Tr::kDTiles];  // (kWarpRows, kHeadDim)
  float m_i[Tr::kMTiles], l_i[Tr::kMTiles];
  init_o_stats<Tr>(rO, m_i, l_i);  // O_i = 0, l_i = 0, m_i = -inf

  if (kb.end > kb.begin) {
    const int hk = h / a.h_per_kv;  // GQA: the kv head this query head reads
    const T* gQ = a.q + b * a.q_st.batch + h * a.q_st.head;
    const T* gK = a.k + b * a.k_st.batch + hk * a.k_st.head;
    const T* gV = a.v + b * a.v_st.batch + hk * a.v_st.head;
    // K/V rows past seqlen_k are zero-filled, never read: padded keys are masked anyway, and zeros
    // keep whatever the padding holds (even NaN) out of P·V.
    auto load_k = [&](int n_block, int stage) {
      const int n0 = n_block * Tr::kBlockN;
      wmma_tile::load_tile_async_lean<Tr::kBlockN, Tr::kHeadDim, Tr::kThreads>(
          sK + stage * kStageElems, gK + n0 * a.k_st.row, a.k_st.row, seqlen_k - n0, gK, tid);
    };
    auto load_v = [&](int n_block, int stage) {
      const int n0 = n_block * Tr::kBlockN;
      wmma_tile::load_tile_async_lean<Tr::kBlockN, Tr::kHeadDim, Tr::kThreads>(
          sV + stage * kStageElems, gV + n0 * a.v_st.row, a.v_st.row, seqlen_k - n0, gV, tid);
    };
    const int64_t row0 = m0 + warp * Tr::kWarpRows;  // the warp's first query row
    // m_new, P, l_i of the warp's rows; alpha to sRow. True when a row maximum moved.
    auto softmax = [&](int n_block) -> bool {
      return softmax_block<Tr>(sS, sRow, m_i, l_i, a, b, h, row0, n_block, kb, general_softmax, seqlen_k, lane);
    };

    if constexpr (!Tr::kQInRegs) {
      wmma_tile::load_tile_async_lean<Tr::kBlockM, Tr::kHeadDim, Tr::kThreads>(sQ, gQ + m0 * a.q_st.row,
                                                                               a.q_st.row, m_rows, gQ, tid);  // Q_i
      load_k(kb.end - 1, 0);
      mma::cp_async_commit();
      // One buffer each for K and V, interleaved: V_j loads during S = Q K_j^T and the softmax,
      // K_{j-1} during O += P V_j.
      for (int n_block = kb.end - 1; n_block >= kb.begin; --n_block) {
        mma::cp_async_wait<0>();
        __syncthreads();  // K_j visible to all; every warp is done with V_{j+1}
        load_v(n_block, 0);
        mma::cp_async_commit();

        gemm_qk<Tr, kLdsm, T>(sS, sQw, nullptr, sK, lo);  // S = Q K_j^T
        __syncwarp();
        const bool moved = softmax(n_block);
        __syncwarp();                                  // P and alpha of every lane written
        if (moved) rescale_o<Tr>(rO, sRow, row_map);  // O = diag(alpha) O
        mma::cp_async_wait<0>();
        __syncthreads();  // V_j visible to all; every warp is done with K_j
        if (n_block > kb.begin) load_k(n_block - 1, 0);
        mma::cp_async_commit();
        gemm_pv<Tr, kLdsm, T>(rO, sP, sV, lo);  // O += P V_j
      }
    } else {
      // Each warp copies its own Q rows into its S tile (warp-local: no barrier) and takes them
      // into registers before the first S overwrites them.
      QFrags<Tr, T> qf;
      wmma_tile::load_tile_async_lean<Tr::kWarpRows, Tr::kHeadDim, 32>(
          sQw, gQ + row0 * a.q_st.row, a.q_st.row, m_rows - warp * Tr::kWarpRows, gQ, lane);
      load_k(kb.end - 1, 0);
      load_v(kb.end - 1, 0);
      mma::cp_async_commit();
      mma::cp_async_wait<0>();
      __syncwarp();
      load_q_frags<Tr, kLdsm, T>(qf, sQw, lo);
      // K_j and V_j were loaded during block j+1: one barrier per block, and every load has a
      // whole block of compute to land in.
      int stage = 0;
      for (int n_block = kb.end - 1; n_block >= kb.begin; --n_block, stage ^= 1) {
        mma::cp_async_wait<0>();
        __syncthreads();  // K_j, V_j visible to all; every warp is done with block j+1's buffers
        if (n_block > kb.begin) {
          load_k(n_block - 1, stage ^ 1);
          load_v(n_block - 1, stage ^ 1);
        }
        mma::cp_async_commit();

        gemm_qk<Tr, kLdsm, T>(sS, sQw, &qf, sK + stage * kStageElems, lo);  // S = Q K_j^T
        __syncwarp();
        const bool moved = softmax(n_block);
        __syncwarp();                                  // P and alpha of every lane written
        if (moved) rescale_o<Tr>(rO, sRow, row_map);  // O = diag(alpha) O
        gemm_pv<Tr, kLdsm, T>(rO, sP, sV + stage * kStageElems, lo);  // O += P V_j
      }
    }
  }

  // O = diag(l)^-1 O; L = (m + log2 l) ln 2 (lines 12-13), then O to global memory (line 14).
  finalize_rows<Tr>(a, sRow, m_i, l_i, b, h, m0, m_rows, warp, lane);
  store_o<Tr>(a, rO, sS, sRow, b, h, m0, m_rows, warp, lane);
}

template <class T>
Args<T> make_args(const FwdParams& p) {
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
  return a;
}

template <class Tr, class T, bool kLdsm>
void launch_kernel(const Args<T>& a, const FwdParams& p, const LaunchContext& ctx) {
  const auto kernel = &forward_kernel<Tr, T, kLdsm>;
  int optin = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, ctx.device));
  if (optin < Tr::kSmemBytes)
    throw RuntimeError("wmma forward: head dim " + std::to_string(Tr::kHeadDim) + " needs " +
                       std::to_string(Tr::kSmemBytes) + " bytes of shared memory per block, the device allows " +
                       std::to_string(optin));
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes));
  const dim3 grid((p.S_q + Tr::kBlockM - 1) / Tr::kBlockM, p.H, p.B);
  kernel<<<grid, Tr::kThreads, Tr::kSmemBytes, ctx.stream>>>(a);
  CHECK_LAUNCH("wmma forward_kernel");
}

// The ldmatrix-built fragments run only where the self-test confirmed them on this device (header,
// "Fragments"); otherwise the same configuration with load_matrix_sync.
template <class T, int kHeadDim>
void launch(const FwdParams& p, const LaunchContext& ctx) {
  using Tr = typename TraitsFor<kHeadDim>::type;
  const Args<T> a = make_args<T>(p);
  if (wmma_frag::ldsm_fragments_verified<T>(ctx.device, ctx.stream))
    launch_kernel<Tr, T, /*kLdsm=*/true>(a, p, ctx);
  else
    launch_kernel<Tr, T, /*kLdsm=*/false>(a, p, ctx);
}

// Head dims with a variant; the build compiles those FLASHATTN_HDIMS enables (common/head_dims.h).
using KernelHeadDims = HeadDims<32, 64, 96, 128, 256>;

template <class T>
void dispatch_head_dim(const FwdParams& p, const LaunchContext& ctx) {
  KernelHeadDims::dispatch(p.D, "wmma forward", [&](auto kD) { launch<T, decltype(kD)::value>(p, ctx); });
}


void run(const FwdParams& p, const LaunchContext& ctx) {
  if (static_cast<int64_t>(p.B) * p.H * p.S_q == 0) return;
  if (p.H_kv <= 0 || p.H % p.H_kv != 0) throw RuntimeError("wmma forward: H must be a multiple of H_kv");
  if (p.H > 65535 || p.B > 65535) throw RuntimeError("wmma forward: B and H must be at most 65535 (grid y/z)");
  if (p.S_q >= (1 << 30) || p.S_k >= (1 << 30)) throw RuntimeError("wmma forward: S_q and S_k must be below 2^30");
  // cp.async and the epilogue move 16-byte pieces of 8 elements.
  if (!aligned16(p.q) || !aligned16(p.k) || !aligned16(p.v) || !aligned16(p.o) || !strides_multiple_of(p.q_st, 8) ||
      !strides_multiple_of(p.k_st, 8) || !strides_multiple_of(p.v_st, 8) || !strides_multiple_of(p.o_st, 8))
    throw RuntimeError("wmma forward: tensors must be 16-byte aligned with strides a multiple of 8 elements");
  switch (p.dtype) {
    case DType::F16: return dispatch_head_dim<__half>(p, ctx);
    case DType::BF16: return dispatch_head_dim<__nv_bfloat16>(p, ctx);
    default: throw RuntimeError(std::string("wmma forward: no variant compiled for dtype ") + dtype_name(p.dtype));
  }
}

KernelMode make_entry() {
  KernelMode m;
  m.kernel = "wmma";
  m.mode = Mode::Forward;
  m.summary = "FlashAttention-2 forward with nvcuda::wmma 16x16x16, S/P through padded smem, cp.async K/V";
  m.rung = 6;
  m.gpu = true;
  m.min_sm = 80;  // bf16 wmma fragments, cp.async
  m.dtypes = dtype_bit(DType::F16) | dtype_bit(DType::BF16);
  m.head_dims = KernelHeadDims::list();
  m.features = kAllFeatures;
  m.uses_atomics = false;  // every output element is written once: bitwise reproducible
  m.fwd = &run;
  m.fwd_workspace = nullptr;
  return m;
}

}  // namespace wmma_fwd
}  // namespace flashattn

FLASHATTN_REGISTER_KERNEL_MODE(wmma_forward, flashattn::wmma_fwd::make_entry)

// mma, decode — rung 7 of the ladder in decode mode: flash-decoding on the tensor cores. A decode
// step reads the whole cache once for very few query rows, so it is bound by DRAM bandwidth; the
// kernel is built to keep enough bytes in flight and to read every K/V byte exactly once:
//   - GQA packing: the G = H / H_kv query heads x S_new new tokens of a kv group are the rows of
//     one m16 tile (padded with zero rows), so K and V are read once per group, not once per head;
//     groups with more than 16 rows take one CTA per 16-row tile.
//   - split-K: each (batch, kv head) cache is cut into pieces of whole 64-key blocks, one CTA per
//     piece, as many as it takes to fill the GPU (decode::choose_splits, or --splits N); the last
//     CTA of a group to finish merges the pieces by their lse (merge_splits: no second kernel).
//   - K/V blocks (64 keys) stream through a cp.async pipeline in 16-byte, fully coalesced copies
//     into XOR-swizzled shared memory, under an L2 eviction policy (choose_l2_policy): 3 stages
//     at D = 128 (two blocks in flight), two CTAs per SM when the grid fills the GPU several times
//     over, one per SM when the whole grid is one wave (up to one group per SM: ~1 piece per SM).
//     At D = 128 more blocks in flight made one-wave steps slower, not faster (docs/PERF.md); the
//     smaller head dims keep a deeper one-wave variant (DeepTraitsFor).
//   - within a CTA the 4 warps split each block's keys (16 each): every warp keeps its own online
//     softmax over its keys, and the warps merge through shared memory at the end.
// Per warp and block (FlashAttention-2, Algorithm 1, lines 8-10, with the roles of the loops
// swapped as in Flash-Decoding: the keys are split, the queries are few):
//   S = Q K_w^T                       8 k16 steps x 2 mma.m16n8k16 (Q fragments held in registers)
//   S *= scale * log2(e); S = -inf where key j > cache_seqlens[b] + i   (only in blocks that reach
//                                     past the first new token: causal at the bottom right)
//   m_new = max(m_i, rowmax(S)); P = 2^(S - m_new); l_i = 2^(m_i - m_new) l_i + rowsum(P)
//   O = diag(2^(m_i - m_new)) O + P V_w   (P stays in registers as the A fragment; V by ldmatrix.trans)
// Why mma.sync at M = 4 (G = 4, S_new = 1): the padded tile wastes 3/4 of the math, but the math is
// 2 mma per key against 512 bytes of K/V per key at D = 128: ~3 cycles per key of tensor-core time
// against ~30 cycles per key of an SM's share of DRAM bandwidth, so the padding is free, while a
// CUDA-core dot product would spend 4 shuffles per row and key on reductions (see fa2 decode).
//
// Paged caches: the loader looks each row's page up in the block table (kPaged instantiation; the
// contiguous one has no lookup). Features: GQA/MQA, per-batch lengths, S_new >= 1, paged caches,
// empty split pieces. Limits: fp16/bf16; head dims 32, 64, 96, 128, 256; sm_80+; q and caches
// 16-byte aligned with strides a multiple of 8 elements. Instantiations: (5 regular + 3 deep)
// pipelines x 2 dtypes x {contiguous, paged} = 32 (-DFLASHATTN_HDIMS=128: 4). Measured: see README.
// Traits, arguments, the K/V loader and the split merge: common/decode_mma_steps.cuh; this file holds
// the kernel, the launch choices and the registration.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <type_traits>

#include "common/decode.cuh"
#include "common/decode_mma_steps.cuh"
#include "common/dtype.cuh"
#include "common/frag_softmax.cuh"
#include "common/head_dims.h"
#include "common/layout_checks.h"
#include "common/mma_sm80.cuh"
#include "common/swizzled_smem.cuh"
#include "flashattn/check.h"
#include "flashattn/error.h"
#include "flashattn/registry.h"

namespace flashattn {
namespace mma_dec {

template <class Tr, class T, bool kPaged>
__global__ void __launch_bounds__(Tr::kThreads, Tr::kMinBlocksPerSm) decode_kernel(const Args<T> a) {
  using TileQ = typename Tr::TileQ;
  using TileKV = typename Tr::TileKV;
  extern __shared__ __align__(128) unsigned char smem_raw[];
  unsigned char* smem = smem_raw + ((kSmemAlign - (mma::smem_u32(smem_raw) & (kSmemAlign - 1))) & (kSmemAlign - 1));
  const uint32_t sQ = mma::smem_u32(smem);  // (kRows, kHeadDim)
  const uint32_t sKV = sQ + TileQ::kBytes;  // kStages x [K (kBlockN, kHeadDim), V (kBlockN, kHeadDim)]

  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int b = blockIdx.x / a.H_kv, g = blockIdx.x % a.H_kv, split = blockIdx.y;
  const int r0 = blockIdx.z * Tr::kRows;
  const int rows = a.group * a.S_new;
  const int m_rows = min(Tr::kRows, rows - r0);
  const int cache_len = a.uniform_len >= 0 ? a.uniform_len : a.cache_seqlens[b];
  const int L = min(cache_len + a.S_new, a.S_max);
  const decode::Range blocks = decode::split_range((L + Tr::kBlockN - 1) / Tr::kBlockN, a.splits, split);
  const int count = blocks.end - blocks.begin;

  float rO[1][Tr::kDTiles][4];  // (kRows, kHeadDim) per warp, over this warp's keys only
  zero_o(rO);  // O = 0
  mma::OnlineSoftmax<1, 2> softmax;
  softmax.init();

  if (count > 0) {
    load_q_tile<Tr>(a, sQ, b, g, r0, m_rows, tid);  // Q (kRows, kHeadDim), packed
    mma::cp_async_commit();
    const KVLoader<Tr, T, kPaged> loader(a, b, g, tid);
    load_first_stages<Tr>(loader, sKV, blocks.begin, count, L);  // blocks 0 .. kStages-2 in flight

    // Per-lane ldmatrix addresses: "A" rows lane%16 / chunk half lane/16 (Q, and V with .trans);
    // "B" rows lane%8 + 8*(lane/16) / chunk half (lane/8)%2 (K as the B operand of Q K^T).
    const uint32_t q_lane = sQ + TileQ::lane(lane & 15, lane >> 4);
    const uint32_t k_lane = TileKV::lane((lane & 7) | ((lane >> 4) << 3), (lane >> 3) & 1);
    const uint32_t v_lane = TileKV::lane(lane & 15, lane >> 4);
    uint32_t rQ[Tr::kQInRegs ? Tr::kKSteps : 1][4];
    if constexpr (Tr::kQInRegs) load_q_regs<Tr>(rQ, q_lane);  // Q as A fragments, for the whole loop

    // The first key a row may not see is cache_len + i + 1 >= cache_len + 1: blocks that end at or
    // below cache_len + 1 need no mask (all but the last one or two of a long cache).
    const int unmasked_end = cache_len + 1;
    int stage = 0;
    for (int n = 0; n < count; ++n) {
      // Block n has landed and every warp is done with the stage the prefetch below overwrites.
      mma::cp_async_wait<Tr::kStages - 2>();
      __syncthreads();
      prefetch_block<Tr>(loader, sKV, blocks.begin, n + Tr::kStages - 1, count, L);  // K/V of block n + kStages - 1

      const uint32_t sK = sKV + stage * Tr::kStageBytes, sV = sK + TileKV::kBytes;
      const int n0 = (blocks.begin + n) * Tr::kBlockN;
      const int w0 = warp * Tr::kWarpKeys;  // this warp's keys within the block
      // S = Q K_w^T: (kRows, 16) per warp.
      float rS[1][2][4];
#pragma unroll
      for (int ni = 0; ni < 2; ++ni)
#pragma unroll
        for (int e = 0; e < 4; ++e) rS[0][ni][e] = 0.f;
#pragma unroll
      for (int kk = 0; kk < Tr::kKSteps; ++kk) {
        uint32_t qa[4];
        if constexpr (Tr::kQInRegs) {
#pragma unroll
          for (int x = 0; x < 4; ++x) qa[x] = rQ[kk][x];
        } else {
          mma::ldsm_x4(qa, TileQ::at(q_lane, 0, 2 * kk));
        }
        uint32_t kb[4];
        mma::ldsm_x4(kb, TileKV::at(sK + k_lane, w0, 2 * kk));
        const uint32_t b_lo[2] = {kb[0], kb[1]}, b_hi[2] = {kb[2], kb[3]};
        mma::mma_16816<T>(rS[0][0], qa, b_lo, rS[0][0]);
        mma::mma_16816<T>(rS[0][1], qa, b_hi, rS[0][1]);
      }
      scale_scores(rS, a.scale_log2);  // S *= scale * log2(e)
      if (n0 + Tr::kBlockN > unmasked_end)
        mask_new_tokens(rS, cache_len, a.S_new, r0, n0 + w0, lane);  // S = -inf where j > cache_len + i
      uint32_t rP[1][2][2];
      softmax.template update<T>(rS, rP, rO, /*c=*/1.f);  // P = 2^(S - m_new), rescale O
      gemm_pv_warp<Tr, T>(rO, rP, sV + v_lane, w0);  // O += P V_w
      stage = stage + 1 == Tr::kStages ? 0 : stage + 1;
    }
    mma::cp_async_wait<0>();
  }

  // Merge the warps through shared memory (the K/V stages are free now):
  //   m = max_w m_w;  l = sum_w 2^(m_w - m) l_w;  O = sum_w (2^(m_w - m) / l) O_w
  // This runs once per CTA after its last block, on the step's critical path with one warp per
  // scheduler to hide latency, so it is kept short: 16 threads turn each row's (m_w, l_w) into
  // the weights 2^(m_w - m) / l, then every thread makes one float4 of O from the warps' float4s.
  __syncthreads();
  float* fO = reinterpret_cast<float*>(smem + Tr::TileQ::kBytes);  // [kNWarps][kRows][kLdO]
  float* fM = fO + Tr::kNWarps * Tr::kRows * Tr::kLdO;              // [kNWarps][kRows]
  float* fL = fM + Tr::kNWarps * Tr::kRows;                         // [kNWarps][kRows]
  float* fW = fL + Tr::kNWarps * Tr::kRows;                         // [kNWarps][kRows] weights
  float* fLse = fW + Tr::kNWarps * Tr::kRows;                       // [kRows]
  stage_warp_state<Tr>(fO, fM, fL, rO, softmax.m_i, softmax.l_i, warp, lane);  // O_w, m_w, l_w
  __syncthreads();
  if (tid < Tr::kRows) {
    float m = -INFINITY;
#pragma unroll
    for (int w = 0; w < Tr::kNWarps; ++w) m = fmaxf(m, fM[w * Tr::kRows + tid]);
    float f[Tr::kNWarps], l = 0.f;
#pragma unroll
    for (int w = 0; w < Tr::kNWarps; ++w) {
      const float mw = fM[w * Tr::kRows + tid];
      f[w] = mw == -INFINITY ? 0.f : exp2f(mw - m);
      l = fmaf(f[w], fL[w * Tr::kRows + tid], l);
    }
    const bool empty = !(l > 0.f);  // an empty split piece, or every key of the piece masked
    const float inv = empty ? 0.f : 1.f / l;
#pragma unroll
    for (int w = 0; w < Tr::kNWarps; ++w) fW[w * Tr::kRows + tid] = f[w] * inv;
    fLse[tid] = empty ? -INFINITY : (m + log2f(l)) * kLn2;
  }
  __syncthreads();
  write_merged<Tr>(a, fO, fW, fLse, b, g, split, r0, m_rows, tid);  // O = sum_w weight_w O_w, lse
  if (a.splits > 1) merge_splits<Tr>(a, b, g, r0, m_rows);
}

int row_tiles(const DecodeParams& p) { return (p.H / p.H_kv * p.S_new + 15) / 16; }

int ctas_per_sm(int D) {
  switch (D) {
    case 32: return TraitsFor<32>::type::kMinBlocksPerSm;
    case 64: return TraitsFor<64>::type::kMinBlocksPerSm;
    case 96: return TraitsFor<96>::type::kMinBlocksPerSm;
    case 256: return TraitsFor<256>::type::kMinBlocksPerSm;
    default: return TraitsFor<128>::type::kMinBlocksPerSm;
  }
}

int num_splits(const DecodeParams& p) {
  if (p.num_splits > 0) return p.num_splits;
  const int blocks = (p.max_seqlen + 63) / 64;
  const int64_t tiles = static_cast<int64_t>(p.B) * p.H_kv * row_tiles(p);
  // Up to one group per SM: one wave of ~1 piece per SM, one CTA per SM. The pieces' merge,
  // done after the last one on the critical path, grows with their number, and one CTA per SM
  // keeps the SM's share of DRAM busy: measured B1 H_kv8
  // S4096/S32768 steps ran 3-6 % faster with ~1 piece per SM than with ~2, and B16 S8192 1.3 %
  // faster unsplit in one wave than in two pieces per group at two CTAs per SM (docs/PERF.md).
  if (tiles <= p.num_sms) {
    const int want = std::max(1, std::min({p.num_sms / static_cast<int>(tiles), blocks / 2, 128}));
    const int per = (blocks + want - 1) / want;
    return (blocks + per - 1) / per;  // the pieces split_range really makes
  }
  return decode::choose_splits(tiles, blocks, p.num_sms, ctas_per_sm(p.D), /*min_units=*/2, /*max_splits=*/128);
}

// One arrival counter per (batch x kv head, row tile) group for the in-kernel merge.
int64_t merge_groups(const DecodeParams& p) { return static_cast<int64_t>(p.B) * p.H_kv * row_tiles(p); }

size_t workspace_bytes(const DecodeParams& p) { return decode::split_workspace_bytes(p, num_splits(p), merge_groups(p)); }

// The deep pipeline (head dims below 128) when the whole grid fits one CTA per SM and the device
// grants its shared memory (sm_90: 227 KB per CTA; sm_80: 163 KB).
template <class Tr>
bool use_deep(const DecodeParams& p, const LaunchContext& ctx, int splits) {
  return merge_groups(p) * splits <= static_cast<int64_t>(p.num_sms) &&
         static_cast<size_t>(Tr::kSmemBytes + kSmemAlign) <= ctx.smem_optin;
}

// L2 policy of the K/V stream. Evict-first keeps the stream from evicting what else L2 holds;
// measured on an H200 (docs/PERF.md), it shortens steps that read up to ~134 MB of K/V by 2-6 %
// (L2 there is full of dirty lines from the timing's flush, which then stay put instead of being
// written back during the step) and lengthens 537 MB steps by 4 %; evict-unchanged is as fast as
// plain loads there. So evict-first up to 4x the L2 size, evict-unchanged above.
bool choose_l2_policy(const DecodeParams& p, const LaunchContext& ctx) {
  const double kv_bytes = 2.0 * p.B * p.H_kv * static_cast<double>(p.max_seqlen) * p.D * dtype_size(p.dtype);
  return kv_bytes <= 4.0 * static_cast<double>(ctx.l2_bytes);
}

template <class Tr, class T>
void launch(const DecodeParams& p, const LaunchContext& ctx) {
  Args<T> a;
  a.q = static_cast<const T*>(p.q);
  a.q_st = p.q_st;
  a.k = static_cast<const T*>(p.k_cache);
  a.v = static_cast<const T*>(p.v_cache);
  a.k_st = p.k_cache_st, a.v_st = p.v_cache_st;
  a.cache_seqlens = p.cache_seqlens;
  a.uniform_len = p.uniform_seqlen;
  a.block_table = p.block_table;
  a.table_stride = p.block_table_stride;
  a.log2_page = p.block_table ? decode::log2_exact(p.page_size) : 0;
  a.o = static_cast<T*>(p.o);
  a.o_st = p.o_st;
  a.lse = static_cast<float*>(p.lse);
  a.H = p.H, a.H_kv = p.H_kv, a.group = p.H / p.H_kv, a.S_new = p.S_new, a.S_max = p.S_max;
  a.splits = num_splits(p);
  a.rows_total = static_cast<int64_t>(p.B) * p.H * p.S_new;
  a.scale_log2 = p.scale_log2;
  a.evict_first = choose_l2_policy(p, ctx);
  if (a.splits > 1) {
    if (p.workspace == nullptr || p.workspace_bytes < decode::split_workspace_bytes(p, a.splits, merge_groups(p)))
      throw RuntimeError("mma decode: workspace smaller than its workspace function asked for");
    a.ws = decode::split_workspace(p, a.splits, merge_groups(p));
  }
  const auto kernel = p.block_table ? &decode_kernel<Tr, T, true> : &decode_kernel<Tr, T, false>;
  // Once per instantiation: a decode step is a few microseconds, so host calls per launch count.
  static const bool configured = [&] {
    CUDA_CHECK(cudaFuncSetAttribute(&decode_kernel<Tr, T, true>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    Tr::kSmemBytes + kSmemAlign));
    CUDA_CHECK(cudaFuncSetAttribute(&decode_kernel<Tr, T, false>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    Tr::kSmemBytes + kSmemAlign));
    return true;
  }();
  (void)configured;
  const dim3 grid(static_cast<unsigned>(p.B * p.H_kv), static_cast<unsigned>(a.splits),
                  static_cast<unsigned>(row_tiles(p)));
  kernel<<<grid, Tr::kThreads, Tr::kSmemBytes + kSmemAlign, ctx.stream>>>(a);
  CHECK_LAUNCH("mma decode_kernel");  // splits > 1: merged in the kernel by each group's last CTA
}

template <class T, int kHeadDim>
void launch_for(const DecodeParams& p, const LaunchContext& ctx) {
  using Regular = typename TraitsFor<kHeadDim>::type;
  using Deep = typename DeepTraitsFor<kHeadDim>::type;
  if (!std::is_same<Regular, Deep>::value && use_deep<Deep>(p, ctx, num_splits(p))) return launch<Deep, T>(p, ctx);
  launch<Regular, T>(p, ctx);
}

// Head dims with a variant; the build compiles those FLASHATTN_HDIMS enables (common/head_dims.h).
using KernelHeadDims = HeadDims<32, 64, 96, 128, 256>;

template <class T>
void dispatch_head_dim(const DecodeParams& p, const LaunchContext& ctx) {
  KernelHeadDims::dispatch(p.D, "mma decode", [&](auto kD) { launch_for<T, decltype(kD)::value>(p, ctx); });
}


void run(const DecodeParams& p, const LaunchContext& ctx) {
  if (static_cast<int64_t>(p.B) * p.H * p.S_new == 0) return;
  if (p.H_kv <= 0 || p.H % p.H_kv != 0) throw RuntimeError("mma decode: H must be a multiple of H_kv");
  if (static_cast<int64_t>(p.B) * p.H_kv > 0x7fffffff) throw RuntimeError("mma decode: B * H_kv too large (grid x)");
  if (num_splits(p) > kMaxSplits || row_tiles(p) > 65535)
    throw RuntimeError("mma decode: at most " + std::to_string(kMaxSplits) + " splits and 65535 row tiles");
  if (p.block_table && (p.page_size < 16 || (p.page_size & (p.page_size - 1)) != 0))
    throw RuntimeError("mma decode: page size must be a power of two >= 16");
  // cp.async moves 16-byte rows of 8 elements.
  if (!aligned16(p.q) || !aligned16(p.k_cache) || !aligned16(p.v_cache) || !strides_multiple_of(p.q_st, 8) ||
      !strides_multiple_of(p.k_cache_st, 8) || !strides_multiple_of(p.v_cache_st, 8))
    throw RuntimeError("mma decode: q and the caches must be 16-byte aligned with strides a multiple of 8 elements");
  switch (p.dtype) {
    case DType::F16: return dispatch_head_dim<__half>(p, ctx);
    case DType::BF16: return dispatch_head_dim<__nv_bfloat16>(p, ctx);
    default: throw RuntimeError(std::string("mma decode: no variant compiled for dtype ") + dtype_name(p.dtype));
  }
}

KernelMode make_entry() {
  KernelMode m;
  m.kernel = "mma";
  m.mode = Mode::Decode;
  m.summary = "flash-decoding with mma.sync: GQA rows packed in one m16 tile, cp.async K/V stream, split-K + lse combine";
  m.rung = 7;
  m.gpu = true;
  m.min_sm = 80;
  m.dtypes = dtype_bit(DType::F16) | dtype_bit(DType::BF16);
  m.head_dims = KernelHeadDims::list();
  m.features = kFeatGQA | kFeatPadding | kFeatPaged;
  // One arrival counter per split group (the last CTA merges); the merge sums the pieces in split
  // order, so the outputs do not depend on which CTA arrives last.
  m.uses_atomics = true;
  m.bitwise_reproducible = true;
  m.dec = &run;
  m.dec_workspace = &workspace_bytes;
  m.dec_splits = &num_splits;
  return m;
}

}  // namespace mma_dec
}  // namespace flashattn

FLASHATTN_REGISTER_KERNEL_MODE(mma_decode, flashattn::mma_dec::make_entry)

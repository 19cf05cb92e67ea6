// wmma, backward — rung 6 of the ladder: FlashAttention-2's backward pass (Dao 2023, Algorithm 2)
// with nvcuda::wmma 16x16x16 fragments (fp16/bf16 operands, fp32 accumulators). Over rung 5 (fa2)
// all five products run on the tensor cores; as in the forward pass, every element-wise step (P,
// dS) goes through shared memory, because wmma fragments have no documented element layout.
//
//   preprocess   D_i = rowsum(dO_i o O_i) (fp32, workspace); the fp32 dQ accumulator zeroed
//   dK/dV        one CTA per (K/V block j, kv head, batch), 8 warps; loops over every query head of
//                its GQA group and every Q block that sees block j, so dK_j and dV_j accumulate in
//                registers with no atomics (common/wmma_bwd.cuh):
//                  S = Q_i K_j^T;  P = exp(S scale + mask - L_i)             (line 11, recomputed)
//                  dV_j += P^T dO_i                                           (line 12)
//                  dP = dO_i V_j^T;  dS = P o (dP - D_i)                      (lines 13-14)
//                  dQ_i += scale dS K_j   fp32 atomics into the workspace     (line 15)
//                  dK_j += scale dS^T Q_i                                     (line 16)
//                Q_i, dO_i (and L_i, D_i) arrive by cp.async one step ahead (double-buffered);
//                K_j, V_j once
//   convert      dQ = scale * accumulator -> dtype, 16-byte stores with dQ's strides
// --deterministic: no dQ atomics; a dQ kernel (one CTA per Q block and query head) recomputes S,
// P, dP, dS against every visible K/V block in a fixed order and accumulates dQ_i in registers:
// 7 products per (Q block, K/V block) pair instead of 5 (S and dP computed by both kernels).
//
// Masking: Q blocks that see no key of block j are never visited (mask.cuh ranges); inside a step
// every element is tested (causal, window, key padding, tails) and the additive mask read where
// visible. Empty rows (lse = -inf) give P = 0: nothing added to dK, dV, and dQ stays 0.
// This is the sound version, not the fast one: 16x16 tiles round-robin over 8 warps re-load
// their operands from shared memory for every product (no register blocking), and each P/dS tile
// makes a round trip through a per-warp fp32 scratch tile. See the mma rung for a tuned backward.
//
// Limits: fp16 and bf16; head dims 32, 64, 96, 128, 256; sm_80+ (bf16 wmma, cp.async); tensors
// 16-byte aligned with strides multiples of 8 elements (checked). Shared memory per CTA: 141 KB at
// D = 128 (Q/dO double-buffered), 128 KB at D = 256 (kBlockM = 32, single buffer); both fit sm_80.
// Workspace: D_i [B, H, S_q] fp32 plus, unless deterministic, the dQ accumulator [B, H, S_q, D] fp32.
// Instantiations: 2 dtypes x 5 head dims x (dK/dV, dQ) = 20 tensor-core kernels, plus the
// preprocess and convert kernels per dtype (4). -DFLASHATTN_HDIMS=128 builds head dim 128 alone.
// Measured: see README.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <string>

#include "common/dtype.cuh"
#include "common/head_dims.h"
#include "common/layout_checks.h"
#include "common/mask.cuh"
#include "common/wmma_bwd.cuh"
#include "common/wmma_tile.cuh"
#include "flashattn/check.h"
#include "flashattn/error.h"
#include "flashattn/registry.h"

namespace flashattn {
namespace wmma_bwd {

// kBlockM x kBlockN = 64 x 64 steps: 16 S tiles (2 per warp) and, at D = 128, 32 dK and 32 dV
// tiles (4 each per warp, 64 accumulator registers). D = 256 halves kBlockM and drops the second
// Q/dO buffer so shared memory fits an sm_80 block (128 KB); its 8 + 8 accumulator tiles per warp
// take 128 registers.
template <int kHeadDim> struct TraitsFor;
template <> struct TraitsFor<32> { using type = Traits<32, 64, 64, 2>; };
template <> struct TraitsFor<64> { using type = Traits<64, 64, 64, 2>; };
template <> struct TraitsFor<96> { using type = Traits<96, 64, 64, 2>; };
template <> struct TraitsFor<128> { using type = Traits<128, 64, 64, 2>; };
template <> struct TraitsFor<256> { using type = Traits<256, 32, 64, 1>; };

constexpr int kRowThreads = 256;
constexpr int kRowsPerBlock = kRowThreads / 8;  // preprocess: 8 lanes per row

// D_i = sum_d dO[i, d] O[i, d] for one row per 8 lanes (16-byte loads), and the row's dQ
// accumulator zeroed: every repetition starts from 0.
template <class T>
__global__ void __launch_bounds__(kRowThreads) preprocess_kernel(const Args<T> a, int64_t rows) {
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kRowsPerBlock + threadIdx.x / 8;  // (b*H + h)*S_q + i
  const int sub = threadIdx.x % 8;
  const bool valid = row < rows;
  float acc = 0.f;
  if (valid) {
    const int64_t i = row % a.S_q, bh = row / a.S_q, h = bh % a.H, b = bh / a.H;
    const T* o_row = a.o + b * a.o_st.batch + h * a.o_st.head + i * a.o_st.row;
    const T* do_row = a.dout + b * a.do_st.batch + h * a.do_st.head + i * a.do_st.row;
    for (int c = sub * 8; c < a.D; c += 64) {
      const uint4 ov = *reinterpret_cast<const uint4*>(o_row + c);
      const uint4 dv = *reinterpret_cast<const uint4*>(do_row + c);
      const T* o8 = reinterpret_cast<const T*>(&ov);
      const T* d8 = reinterpret_cast<const T*>(&dv);
#pragma unroll
      for (int e = 0; e < 8; ++e) acc += to_float(d8[e]) * to_float(o8[e]);
    }
    if (a.dq_accum != nullptr)
      for (int c = sub * 4; c < a.D; c += 32)
        *reinterpret_cast<float4*>(a.dq_accum + row * a.D + c) = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  // Every lane takes part in the shuffles (the 8 lanes of a row are valid together).
  acc += __shfl_xor_sync(0xffffffffu, acc, 4);
  acc += __shfl_xor_sync(0xffffffffu, acc, 2);
  acc += __shfl_xor_sync(0xffffffffu, acc, 1);
  if (valid && sub == 0) a.dsum[row] = acc;
}

// dQ = scale * accumulator, one 8-element chunk per thread.
template <class T>
__global__ void __launch_bounds__(kRowThreads) convert_dq_kernel(const Args<T> a, int64_t chunks) {
  const int per_row = a.D / 8;
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < chunks;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t row = c / per_row, col = (c % per_row) * 8;
    const int64_t i = row % a.S_q, bh = row / a.S_q, h = bh % a.H, b = bh / a.H;
    float x[8];
    load8(x, a.dq_accum + row * a.D + col);
#pragma unroll
    for (int e = 0; e < 8; ++e) x[e] *= a.scale;
    wmma_tile::store8<T>(a.dq + b * a.dq_st.batch + h * a.dq_st.head + i * a.dq_st.row + col, x);
  }
}

// One CTA per (K/V block, kv head, batch): dK_j, dV_j over the group's query heads and the Q
// blocks that see block j; dQ by atomics unless the deterministic path runs dq_kernel instead.
template <class Tr, class T>
__global__ void __launch_bounds__(Tr::kThreads, 1) dkdv_kernel(const Args<T> a) {
  using L = Smem<Tr, /*kStreamQ=*/true>;
  extern __shared__ __align__(128) unsigned char smem[];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int n_block = blockIdx.x, g = blockIdx.y, b = blockIdx.z;
  const int n0 = n_block * Tr::kBlockN;
  const int seqlen_k = a.vis.seqlen_k(b);
  T* sK = reinterpret_cast<T*>(smem + L::kK);    // (kBlockN, kHeadDim)
  T* sV = reinterpret_cast<T*>(smem + L::kV);    // (kBlockN, kHeadDim)
  T* sP = reinterpret_cast<T*>(smem + L::kP);    // (kBlockM, kBlockN)
  T* sdS = reinterpret_cast<T*>(smem + L::kDS);  // (kBlockM, kBlockN)
  float* scratch = reinterpret_cast<float*>(smem + L::kScratch) + warp * Tr::kScratchFloats;
  auto sQ = [&](int st) { return reinterpret_cast<T*>(smem + L::kQ + st * L::kBytesQ); };    // (kBlockM, kHeadDim)
  auto sdO = [&](int st) { return reinterpret_cast<T*>(smem + L::kDO + st * L::kBytesQ); };  // (kBlockM, kHeadDim)
  auto sLse = [&](int st) { return reinterpret_cast<float*>(smem + L::kLse + st * L::kBytesRows); };
  auto sDelta = [&](int st) { return reinterpret_cast<float*>(smem + L::kDelta + st * L::kBytesRows); };

  // Q blocks holding a query that sees some key of [n0, min(n0 + kBlockN, seqlen_k)): visible
  // queries move monotonically with the key, so their union runs from the first key's to the last's.
  int mb_begin = 0, mb_end = 0;
  if (n0 < seqlen_k) {
    const int j_last = min(n0 + Tr::kBlockN, seqlen_k) - 1;
    const IndexRange first = a.vis.queries(n0, seqlen_k), last = a.vis.queries(j_last, seqlen_k);
    if (last.end > first.begin) {
      mb_begin = static_cast<int>(first.begin / Tr::kBlockM);
      mb_end = static_cast<int>((last.end + Tr::kBlockM - 1) / Tr::kBlockM);
    }
  }
  const int n_mb = mb_end - mb_begin;
  const int steps = n_mb * a.group;  // (query head of the group, Q block) pairs

  AccFrag acc_dk[Tr::kTilesKV], acc_dv[Tr::kTilesKV];  // the warp's (16, 16) tiles of dK_j, dV_j
#pragma unroll
  for (int u = 0; u < Tr::kTilesKV; ++u) wmma::fill_fragment(acc_dk[u], 0.f), wmma::fill_fragment(acc_dv[u], 0.f);

  if (steps > 0) {
    const T* gK = a.k + b * a.k_st.batch + g * a.k_st.head;
    const T* gV = a.v + b * a.v_st.batch + g * a.v_st.head;
    // Keys past seqlen_k are zero-filled: invisible anyway, and never read from the padding.
    wmma_tile::load_tile_async<Tr::kBlockN, Tr::kHeadDim, Tr::kThreads>(sK, gK + n0 * a.k_st.row, a.k_st.row,
                                                                       seqlen_k - n0, gK, tid);
    wmma_tile::load_tile_async<Tr::kBlockN, Tr::kHeadDim, Tr::kThreads>(sV, gV + n0 * a.v_st.row, a.v_st.row,
                                                                       seqlen_k - n0, gV, tid);
    auto head_of = [&](int step) { return g * a.group + step / n_mb; };
    auto m0_of = [&](int step) { return (mb_begin + step % n_mb) * Tr::kBlockM; };
    auto issue = [&](int step, int st) {  // Q_i, dO_i, L_i, D_i of a step into stage st
      const int h = head_of(step), m0 = m0_of(step);
      const T* gQ = a.q + b * a.q_st.batch + h * a.q_st.head;
      const T* gdO = a.dout + b * a.do_st.batch + h * a.do_st.head;
      wmma_tile::load_tile_async<Tr::kBlockM, Tr::kHeadDim, Tr::kThreads>(sQ(st), gQ + m0 * a.q_st.row, a.q_st.row,
                                                                         a.S_q - m0, gQ, tid);
      wmma_tile::load_tile_async<Tr::kBlockM, Tr::kHeadDim, Tr::kThreads>(sdO(st), gdO + m0 * a.do_st.row,
                                                                         a.do_st.row, a.S_q - m0, gdO, tid);
      load_row_stats<Tr>(sLse(st), sDelta(st), a, b, h, m0, tid);
    };
    issue(0, 0);
    mma::cp_async_commit();

    for (int step = 0; step < steps; ++step) {
      const int st = Tr::kStages == 2 ? step & 1 : 0;
      const int h = head_of(step), m0 = m0_of(step);
      mma::cp_async_wait<0>();
      __syncthreads();  // this step's tiles are visible; every warp is done with the previous step
      if (Tr::kStages == 2 && step + 1 < steps) issue(step + 1, st ^ 1);
      mma::cp_async_commit();

      scores_to_p_ds<Tr>(sQ(st), sdO(st), sK, sV, sLse(st), sDelta(st), sP, sdS, scratch, a, b, h, m0, n0,
                         seqlen_k, warp, lane);
      __syncthreads();  // P and dS complete
      accumulate_kv<Tr>(acc_dv, sP, sdO(st), warp);  // dV_j += P^T dO_i
      accumulate_kv<Tr>(acc_dk, sdS, sQ(st), warp);  // dK_j += dS^T Q_i (scaled at the end)
      if (a.dq_accum != nullptr) {
        // dQ_i += dS K_j: each warp's tiles through its scratch, then atomics in which a warp
        // covers 2 rows x 64 contiguous bytes per instruction.
        float* gacc = a.dq_accum + ((static_cast<int64_t>(b) * a.H + h) * a.S_q + m0) * a.D;
#pragma unroll
        for (int u = 0; u < Tr::kTilesQ; ++u) {
          const int t = warp + u * Tr::kNWarps;
          const int tm = t / Tr::kDTiles, td = t % Tr::kDTiles;
          AccFrag acc;
          wmma::fill_fragment(acc, 0.f);
          dq_tile<Tr>(acc, sdS, sK, tm, td);
          wmma::store_matrix_sync(scratch, acc, Tr::kScratchLd, wmma::mem_row_major);
          __syncwarp();
#pragma unroll
          for (int q = 0; q < 8; ++q) {
            const int r = 2 * q + lane / 16, c = lane % 16;
            if (m0 + tm * 16 + r < a.S_q)
              atomicAdd(gacc + static_cast<int64_t>(tm * 16 + r) * a.D + td * 16 + c, scratch[r * Tr::kScratchLd + c]);
          }
          __syncwarp();
        }
      }
      if (Tr::kStages == 1 && step + 1 < steps) {
        __syncthreads();  // every warp is done with the single Q/dO buffer
        issue(step + 1, 0);
        mma::cp_async_commit();
      }
    }
  }

  // dK_j = scale * acc, dV_j = acc; rows past S_k are not stored, rows past seqlen_k store 0.
  T* gdK = a.dk + b * a.dk_st.batch + g * a.dk_st.head + static_cast<int64_t>(n0) * a.dk_st.row;
  T* gdV = a.dv + b * a.dv_st.batch + g * a.dv_st.head + static_cast<int64_t>(n0) * a.dv_st.row;
#pragma unroll
  for (int u = 0; u < Tr::kTilesKV; ++u) {
    const int t = warp + u * Tr::kNWarps;
    const int tn = t / Tr::kDTiles, td = t % Tr::kDTiles;
    store_tile<T>(gdK + td * 16, a.dk_st.row, tn * 16, a.S_k - n0, acc_dk[u], a.scale, scratch, Tr::kScratchLd,
                  lane);
    store_tile<T>(gdV + td * 16, a.dv_st.row, tn * 16, a.S_k - n0, acc_dv[u], 1.f, scratch, Tr::kScratchLd, lane);
  }
}

// Deterministic dQ: one CTA per (Q block, query head, batch), K/V blocks in ascending order, dQ_i
// in registers; no atomics.
template <class Tr, class T>
__global__ void __launch_bounds__(Tr::kThreads, 1) dq_kernel(const Args<T> a) {
  using L = Smem<Tr, /*kStreamQ=*/false>;
  extern __shared__ __align__(128) unsigned char smem[];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int m_block = gridDim.x - 1 - blockIdx.x;  // under causal masking the last Q block is the longest
  const int h = blockIdx.y, b = blockIdx.z;
  const int m0 = m_block * Tr::kBlockM;
  const int m_rows = min(Tr::kBlockM, a.S_q - m0);
  const int seqlen_k = a.vis.seqlen_k(b);
  T* sQ = reinterpret_cast<T*>(smem + L::kQ);    // (kBlockM, kHeadDim)
  T* sdO = reinterpret_cast<T*>(smem + L::kDO);  // (kBlockM, kHeadDim)
  T* sP = reinterpret_cast<T*>(smem + L::kP);    // (kBlockM, kBlockN)
  T* sdS = reinterpret_cast<T*>(smem + L::kDS);  // (kBlockM, kBlockN)
  float* sLse = reinterpret_cast<float*>(smem + L::kLse);
  float* sDelta = reinterpret_cast<float*>(smem + L::kDelta);
  float* scratch = reinterpret_cast<float*>(smem + L::kScratch) + warp * Tr::kScratchFloats;
  auto sK = [&](int st) { return reinterpret_cast<T*>(smem + L::kK + st * L::kBytesK); };  // (kBlockN, kHeadDim)
  auto sV = [&](int st) { return reinterpret_cast<T*>(smem + L::kV + st * L::kBytesK); };  // (kBlockN, kHeadDim)

  // Key blocks with a key visible to some row of the block (visible_keys is monotone in the row).
  const IndexRange first = a.vis.keys(m0, seqlen_k), last = a.vis.keys(m0 + m_rows - 1, seqlen_k);
  const int64_t lo = first.begin > 0 ? first.begin : 0, hi = last.end < seqlen_k ? last.end : seqlen_k;
  const int nb_begin = hi > lo ? static_cast<int>(lo / Tr::kBlockN) : 0;
  const int steps = hi > lo ? static_cast<int>((hi + Tr::kBlockN - 1) / Tr::kBlockN) - nb_begin : 0;

  AccFrag acc_dq[Tr::kTilesQ];  // the warp's (16, 16) tiles of dQ_i
#pragma unroll
  for (int u = 0; u < Tr::kTilesQ; ++u) wmma::fill_fragment(acc_dq[u], 0.f);

  if (steps > 0) {
    const int hk = h / a.group;
    const T* gQ = a.q + b * a.q_st.batch + h * a.q_st.head;
    const T* gdO = a.dout + b * a.do_st.batch + h * a.do_st.head;
    const T* gK = a.k + b * a.k_st.batch + hk * a.k_st.head;
    const T* gV = a.v + b * a.v_st.batch + hk * a.v_st.head;
    wmma_tile::load_tile_async<Tr::kBlockM, Tr::kHeadDim, Tr::kThreads>(sQ, gQ + m0 * a.q_st.row, a.q_st.row,
                                                                       m_rows, gQ, tid);
    wmma_tile::load_tile_async<Tr::kBlockM, Tr::kHeadDim, Tr::kThreads>(sdO, gdO + m0 * a.do_st.row, a.do_st.row,
                                                                       m_rows, gdO, tid);
    load_row_stats<Tr>(sLse, sDelta, a, b, h, m0, tid);
    auto issue = [&](int step, int st) {  // K_j, V_j of a step into stage st
      const int n0 = (nb_begin + step) * Tr::kBlockN;
      wmma_tile::load_tile_async<Tr::kBlockN, Tr::kHeadDim, Tr::kThreads>(sK(st), gK + n0 * a.k_st.row, a.k_st.row,
                                                                         seqlen_k - n0, gK, tid);
      wmma_tile::load_tile_async<Tr::kBlockN, Tr::kHeadDim, Tr::kThreads>(sV(st), gV + n0 * a.v_st.row, a.v_st.row,
                                                                         seqlen_k - n0, gV, tid);
    };
    issue(0, 0);
    mma::cp_async_commit();

    for (int step = 0; step < steps; ++step) {
      const int st = Tr::kStages == 2 ? step & 1 : 0;
      const int n0 = (nb_begin + step) * Tr::kBlockN;
      mma::cp_async_wait<0>();
      __syncthreads();  // this step's K/V are visible; every warp is done with the previous step
      if (Tr::kStages == 2 && step + 1 < steps) issue(step + 1, st ^ 1);
      mma::cp_async_commit();

      scores_to_p_ds<Tr>(sQ, sdO, sK(st), sV(st), sLse, sDelta, sP, sdS, scratch, a, b, h, m0, n0, seqlen_k, warp,
                         lane);
      __syncthreads();  // dS complete
#pragma unroll
      for (int u = 0; u < Tr::kTilesQ; ++u) {  // dQ_i += dS K_j (scaled at the end)
        const int t = warp + u * Tr::kNWarps;
        dq_tile<Tr>(acc_dq[u], sdS, sK(st), t / Tr::kDTiles, t % Tr::kDTiles);
      }
      if (Tr::kStages == 1 && step + 1 < steps) {
        __syncthreads();  // every warp is done with the single K/V buffer
        issue(step + 1, 0);
        mma::cp_async_commit();
      }
    }
  }

  T* gdQ = a.dq + b * a.dq_st.batch + h * a.dq_st.head + static_cast<int64_t>(m0) * a.dq_st.row;
#pragma unroll
  for (int u = 0; u < Tr::kTilesQ; ++u) {
    const int t = warp + u * Tr::kNWarps;
    const int tm = t / Tr::kDTiles, td = t % Tr::kDTiles;
    store_tile<T>(gdQ + td * 16, a.dq_st.row, tm * 16, m_rows, acc_dq[u], a.scale, scratch, Tr::kScratchLd, lane);
  }
}

// ---- host side ------------------------------------------------------------------------------------

size_t rows_of(const BwdParams& p) { return static_cast<size_t>(p.B) * p.H * p.S_q; }
size_t dq_accum_bytes(const BwdParams& p) { return p.deterministic ? 0 : rows_of(p) * p.D * sizeof(float); }
// The dQ accumulator first: its rows are D floats (a multiple of 32 bytes), so D_i behind it stays
// 16-byte aligned.
size_t workspace_bytes(const BwdParams& p) { return dq_accum_bytes(p) + rows_of(p) * sizeof(float); }

template <class T>
Args<T> make_args(const BwdParams& p) {
  Args<T> a;
  a.q = static_cast<const T*>(p.q);
  a.k = static_cast<const T*>(p.k);
  a.v = static_cast<const T*>(p.v);
  a.o = static_cast<const T*>(p.o);
  a.dout = static_cast<const T*>(p.dout);
  a.dq = static_cast<T*>(p.dq);
  a.dk = static_cast<T*>(p.dk);
  a.dv = static_cast<T*>(p.dv);
  a.q_st = p.q_st, a.k_st = p.k_st, a.v_st = p.v_st, a.o_st = p.o_st, a.do_st = p.do_st;
  a.dq_st = p.dq_st, a.dk_st = p.dk_st, a.dv_st = p.dv_st;
  a.lse = static_cast<const float*>(p.lse);
  char* ws = static_cast<char*>(p.workspace);
  a.dq_accum = p.deterministic ? nullptr : reinterpret_cast<float*>(ws);
  a.dsum = reinterpret_cast<float*>(ws + dq_accum_bytes(p));
  a.B = p.B, a.H = p.H, a.H_kv = p.H_kv, a.S_q = p.S_q, a.S_k = p.S_k, a.D = p.D;
  a.group = p.H / p.H_kv;
  a.scale = p.scale;
  a.scale_log2 = p.scale_log2;
  a.vis = make_visibility(p);
  return a;
}

unsigned blocks_of(int64_t n, int per_block) { return static_cast<unsigned>((n + per_block - 1) / per_block); }

template <class Kernel>
void prepare_smem(Kernel kernel, int bytes, const LaunchContext& ctx, int head_dim) {
  int optin = 0;
  CUDA_CHECK(cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, ctx.device));
  if (optin < bytes)
    throw RuntimeError("wmma backward: head dim " + std::to_string(head_dim) + " needs " + std::to_string(bytes) +
                       " bytes of shared memory per block, the device allows " + std::to_string(optin));
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
}

template <int kHeadDim, class T>
void launch(const BwdParams& p, const LaunchContext& ctx) {
  using Tr = typename TraitsFor<kHeadDim>::type;
  const Args<T> a = make_args<T>(p);
  const int64_t rows = static_cast<int64_t>(rows_of(p));

  preprocess_kernel<T><<<blocks_of(rows, kRowsPerBlock), kRowThreads, 0, ctx.stream>>>(a, rows);
  CHECK_LAUNCH("wmma_bwd preprocess_kernel");

  if (p.deterministic) {
    using L = Smem<Tr, false>;
    const auto kernel = &dq_kernel<Tr, T>;
    prepare_smem(kernel, L::kBytes, ctx, kHeadDim);
    const dim3 grid(blocks_of(p.S_q, Tr::kBlockM), p.H, p.B);
    kernel<<<grid, Tr::kThreads, L::kBytes, ctx.stream>>>(a);
    CHECK_LAUNCH("wmma_bwd dq_kernel");
  }

  using L = Smem<Tr, true>;
  const auto kernel = &dkdv_kernel<Tr, T>;
  prepare_smem(kernel, L::kBytes, ctx, kHeadDim);
  const dim3 grid(blocks_of(p.S_k, Tr::kBlockN), p.H_kv, p.B);
  kernel<<<grid, Tr::kThreads, L::kBytes, ctx.stream>>>(a);
  CHECK_LAUNCH("wmma_bwd dkdv_kernel");

  if (!p.deterministic) {
    const int64_t chunks = rows * p.D / 8;
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(blocks_of(chunks, kRowThreads), 1 << 20));
    convert_dq_kernel<T><<<blocks, kRowThreads, 0, ctx.stream>>>(a, chunks);
    CHECK_LAUNCH("wmma_bwd convert_dq_kernel");
  }
}

// Head dims with a variant; the build compiles those FLASHATTN_HDIMS enables (common/head_dims.h).
using KernelHeadDims = HeadDims<32, 64, 96, 128, 256>;

template <class T>
void dispatch_head_dim(const BwdParams& p, const LaunchContext& ctx) {
  KernelHeadDims::dispatch(p.D, "wmma backward", [&](auto kD) { launch<decltype(kD)::value, T>(p, ctx); });
}


void run(const BwdParams& p, const LaunchContext& ctx) {
  if (static_cast<int64_t>(p.B) * p.H * p.S_q == 0 || p.S_k == 0) return;
  if (p.H_kv <= 0 || p.H % p.H_kv != 0) throw RuntimeError("wmma backward: H must be a multiple of H_kv");
  if (p.H > 65535 || p.B > 65535) throw RuntimeError("wmma backward: B and H must be at most 65535 (grid y/z)");
  if (p.S_q >= (1 << 30) || p.S_k >= (1 << 30)) throw RuntimeError("wmma backward: S_q and S_k must be below 2^30");
  if (p.lse == nullptr) throw RuntimeError("wmma backward: needs the forward's lse");
  if (p.workspace == nullptr || p.workspace_bytes < workspace_bytes(p))
    throw RuntimeError("wmma backward: workspace smaller than its workspace function asked for");
  // 16-byte cp.async and vector loads/stores of whole 8-element chunks.
  const void* ptrs[] = {p.q, p.k, p.v, p.o, p.dout, p.dq, p.dk, p.dv};
  for (const void* ptr : ptrs)
    if (!aligned16(ptr)) throw RuntimeError("wmma backward: every tensor must be 16-byte aligned");
  const Strides* strides[] = {&p.q_st, &p.k_st, &p.v_st, &p.o_st, &p.do_st, &p.dq_st, &p.dk_st, &p.dv_st};
  for (const Strides* s : strides)
    if (!strides_multiple_of(*s, 8)) throw RuntimeError("wmma backward: strides must be multiples of 8 elements");
  switch (p.dtype) {
    case DType::F16: return dispatch_head_dim<__half>(p, ctx);
    case DType::BF16: return dispatch_head_dim<__nv_bfloat16>(p, ctx);
    default: throw RuntimeError(std::string("wmma backward: no variant compiled for dtype ") + dtype_name(p.dtype));
  }
}

KernelMode make_entry() {
  KernelMode m;
  m.kernel = "wmma";
  m.mode = Mode::Backward;
  m.summary = "FlashAttention-2 backward with nvcuda::wmma: K/V-block parallel, P/dS through smem, dQ by fp32 "
              "atomics (--deterministic: separate dQ pass)";
  m.rung = 6;
  m.gpu = true;
  m.min_sm = 80;  // bf16 wmma fragments, cp.async
  m.dtypes = dtype_bit(DType::F16) | dtype_bit(DType::BF16);
  m.head_dims = KernelHeadDims::list();
  m.features = kAllFeatures;
  m.uses_atomics = true;
  m.bitwise_reproducible = false;  // the order of the dQ atomics varies run to run
  m.has_deterministic_path = true;
  m.bwd = &run;
  m.bwd_workspace = &workspace_bytes;
  return m;
}

}  // namespace wmma_bwd
}  // namespace flashattn

FLASHATTN_REGISTER_KERNEL_MODE(wmma_backward, flashattn::wmma_bwd::make_entry)

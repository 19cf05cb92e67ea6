// The main backward kernel of the mma.sync ladder rung: one block per (K/V block j, kv head, batch)
// keeps dK_j and dV_j in registers while it walks every Q block i of every query head of its
// group (FlashAttention-2, Algorithm 2, lines 6-24):
//
//   load K_j, V_j -> shared memory (once)
//   for each query head h of the group, for each Q block i that sees a key of block j:
//     wait for Q_i, dO_i; barrier
//     S_ij  = Q_i K_jᵀ                                       (kBlockM x kBlockN)
//     prefetch Q, dO of the next step (cp.async into the other buffer)
//     P_ij  = exp2(S_ij·scale·log2 e − lse_i·log2 e)          masked -> 0, fp32 in S's registers
//     dP_ij = dO_i V_jᵀ
//     P_ij -> 16-bit -> shared memory
//     dS_ij = P_ij ∘ (dP_ij − D_i) -> 16-bit -> shared memory; barrier
//     dV_j += P_ijᵀ dO_i
//     dQ_i += dS_ij K_j          fp32 reductions into the workspace (skipped on the deterministic
//                                path, where a separate kernel computes dQ)
//     dK_j += dS_ijᵀ Q_i                                      (× scale once, at the end)
//   dK_j, dV_j -> 16-bit -> shared memory -> 16-byte stores
//
// P and dS go through shared memory. The alternative, computing Sᵀ = K Qᵀ so that its
// accumulators are the A operand of Pᵀ dO, needs each warp to own all kBlockM queries of its
// keys, i.e. 16-key x kBlockM warp tiles: per k16 step 1 + kBlockM/16 ldmatrix for kBlockM/8 mma,
// more shared-memory reads than the 32 x 32 tiles used here save on the 2 x 16-bit P store (dS
// must be staged for dQ = dS K in any case, so the barrier is paid either way).
//
// How the step is laid out, and what each choice bought. Each was measured against the step
// without it (bf16, H200, FlashAttention's grid B·S = 16384, D = 64 and 128, S = 1k/4k/16k,
// causal and not; geometric means over the six points of a head dim, D64 / D128):
// - dQ reductions into a fragment-ordered accumulator (atomic_add_frag): each thread adds its
//   dQ accumulators whole, so one RED.F32x4 of a warp covers 512 contiguous bytes (4 lines)
//   where row-major adds of column pairs cover 8 rows x 32 B (8 lines) per RED.F32x2, twice the
//   instructions, each row tested against S_q. The convert kernel un-permutes it. +7.4% / +11.0%.
// - dQ between dV and dK (FlashAttention-2's order): its reductions drain while dK's mma issue
//   instead of just before the next step's barrier. +1.0% / -2.0% alone: neutral; kept as part
//   of the measured whole.
// - The fully visible Q rows computed once per block (full_query_rows) instead of a visibility
//   test per step, and the next Q, dO prefetch issued without a branch after S = Q Kᵀ (past the
//   last step it only zero-fills): -8.3% / +1.8% alone, the base the two below were measured on.
// - S -> P -> dP -> dS as one branch-free basic block per masking mode (the dP product copied
//   into each) rather than a branch around the exp2 alone: +4.4% / -2.0%.
// - P kept in fp32 (S's accumulators) through dP, dS = P ∘ (dP − D_i) without unpacking 16-bit
//   pairs, and the 16-bit P stored only after dP: the P stores no longer precede dP's ldmatrix
//   in memory order, so the exp2 (MUFU) overlaps dP's ldmatrix and mma. Together +10.8% / +3.9%
//   (16-bit P kept in registers instead: 1.2% (stored after dP) to 5.4% (stored before) less at
//   D = 64, within 1% at D = 128).
// All together +15.0% / +12.8% over the plain step. Not taken: starting every block at the
// first Q block instead of a block-dependent one (+0.5% / +0.1%, within noise).
#pragma once

#include <cstdint>

#include "common/mma_bwd_softmax.cuh"
#include "common/mma_bwd_tile.cuh"
#include "common/mma_bwd_traits.cuh"

namespace flashattn {
namespace mma_bwd {

// acc added to the fragment-ordered dQ accumulator tile of one Q block at `tile`: float4 slot
// f·kThreads + tid holds the 4 values of this thread's accumulator tile f = mt·NT + nt, so each
// reduction of a warp covers 512 contiguous bytes. Rows past S_q fall in the tile's padding
// (kAccumRowAlign) and are never read.
template <int kThreads, int MT, int NT>
__device__ __forceinline__ void atomic_add_frag(float* tile, const float (&acc)[MT][NT][4], int tid) {
  float4* p = reinterpret_cast<float4*>(tile) + tid;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      float4* dst = p + (mt * NT + nt) * kThreads;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      // sm_90's red.global.add.v4.f32: one instruction for the four values.
      atomicAdd(dst, make_float4(acc[mt][nt][0], acc[mt][nt][1], acc[mt][nt][2], acc[mt][nt][3]));
#else
      float* d = reinterpret_cast<float*>(dst);
#pragma unroll
      for (int r = 0; r < 4; ++r) atomicAdd(d + r, acc[mt][nt][r]);
#endif
    }
}

// From S_ij (this warp's accumulator tiles) to P_ij and dS_ij in shared memory:
//   P = exp2(S' − lse') (probs_fn, in place, fp32);  dP = dO_i V_jᵀ;  P -> 16-bit -> sP;
//   dS = P ∘ (dP − D_i) -> 16-bit -> sdS
// P is stored after the dP product so that nothing orders dP's ldmatrix behind the exp2.
template <class Kt, class T, class ProbsFn>
__device__ __forceinline__ void scores_to_ds(const Args<T>& a, float (&acc_s)[Kt::kMTS][Kt::kNTS][4],
                                             ProbsFn&& probs_fn, int64_t row0, const TileCoords& c, uint32_t sP,
                                             uint32_t sdS, const LaneAddr<typename Kt::TileQ>& a_dp,
                                             const LaneAddr<typename Kt::TileKV>& b_dp, int s_m, int s_n, int lane) {
  using TileP = typename Kt::TileP;
  probs_fn();  // acc_s <- P
  float dsum[Kt::kMTS][2];  // D_i of this thread's rows
  load_row_stat(dsum, a.dsum, row0, c.i0, a.S_q, /*is_lse=*/false);
  float acc_dp[Kt::kMTS][Kt::kNTS][4];  // (kBlockM, kBlockN) over the warps
  zero(acc_dp);
  gemm_ss<Kt::kHeadDim, false, false, T>(acc_dp, a_dp, b_dp);  // dP = dO_i V_jᵀ
  uint32_t rP[Kt::kMTS][Kt::kNTS][2];  // P in 16 bits, as dV = Pᵀ dO reads it
  pack_acc<T>(rP, acc_s);
  store_pairs<TileP>(sP, rP, s_m, s_n, lane);
  dscores(acc_dp, acc_s, dsum);  // dS = P ∘ (dP − D_i)
  store_acc<TileP, T>(sdS, acc_dp, s_m, s_n, lane, 1.f);
}

// Load K_j, V_j -> shared memory (once per block): n_keys rows with data, zeros past them.
template <class Kt, class T>
__device__ __forceinline__ void load_kv(const Args<T>& a, T* sK, T* sV, int b, int kv_head, int n0, int n_keys,
                                        int tid) {
  using TileKV = typename Kt::TileKV;
  constexpr int kThreads = Kt::kThreads;
  copy_tile_async<TileKV, kThreads>(sK, a.k + b * a.k_st.batch + kv_head * a.k_st.head + n0 * a.k_st.row,
                                    a.k_st.row, n_keys, tid);
  copy_tile_async<TileKV, kThreads>(sV, a.v + b * a.v_st.batch + kv_head * a.v_st.head + n0 * a.v_st.row,
                                    a.v_st.row, n_keys, tid);
  mma::cp_async_commit();
}

// P, dP (dO_i Vᵀ), dS -> sP, sdS (scores_to_ds), with P = exp2(S' - lse') computed by probs_fn:
// one copy per masking mode (none, the visibility interval, interval and additive mask), each a
// single basic block. a_s, b_s: the lane addresses of S = Q Kᵀ; dP reads dO and V beside them.
template <class Kt, class T>
__device__ __forceinline__ void probs_to_ds(const Args<T>& a, float (&acc_s)[Kt::kMTS][Kt::kNTS][4],
                                            const float (&lse2)[Kt::kMTS][2], bool masked, int64_t row0,
                                            const TileCoords& c, T* sP, T* sdS,
                                            const LaneAddr<typename Kt::TileQ>& a_s,
                                            const LaneAddr<typename Kt::TileKV>& b_s, uint32_t buf_off, int s_m,
                                            int s_n, int lane) {
  constexpr uint32_t kdOOffset = 2 * Kt::TileQ::kBytes;
  auto to_ds = [&](auto&& probs_fn) {
    scores_to_ds<Kt>(a, acc_s, probs_fn, row0, c, ptx::smem_u32(sP), ptx::smem_u32(sdS),
                     a_s.shifted(buf_off + kdOOffset), b_s.shifted(Kt::TileKV::kBytes), s_m, s_n, lane);
  };
  const float scale_log2 = a.scale_log2;
  if (!masked) {
    to_ds([&] { probs<MaskMode::kNone>(acc_s, lse2, scale_log2, a.vis, c); });
  } else if (a.vis.mask.ptr == nullptr) {
    to_ds([&] { probs<MaskMode::kInterval>(acc_s, lse2, scale_log2, a.vis, c); });
  } else {
    to_ds([&] { probs<MaskMode::kIntervalAndBias>(acc_s, lse2, scale_log2, a.vis, c); });
  }
}

// Epilogue: dK_j (× scale) and dV_j through sK / sV (K and V are no longer needed, and the K/V
// copy has landed even when there was no step) to 16-byte stores of every key row < S_k.
template <class Kt, class T>
__device__ __forceinline__ void store_dk_dv(const Args<T>& a, const float (&acc_dk)[Kt::kMTKV][Kt::kNTKV][4],
                                            const float (&acc_dv)[Kt::kMTKV][Kt::kNTKV][4], T* sK, T* sV, int b,
                                            int kv_head, int n0, int kv_m, int kv_n, int lane, int tid) {
  using TileKV = typename Kt::TileKV;
  constexpr int kThreads = Kt::kThreads;
  mma::cp_async_wait<0>();
  __syncthreads();
  store_acc<TileKV, T>(ptx::smem_u32(sK), acc_dk, kv_m, kv_n, lane, a.scale);
  store_acc<TileKV, T>(ptx::smem_u32(sV), acc_dv, kv_m, kv_n, lane, 1.f);
  __syncthreads();
  const int n_rows = a.S_k - n0;
  store_tile<TileKV, kThreads>(a.dk + b * a.dk_st.batch + kv_head * a.dk_st.head + n0 * a.dk_st.row, a.dk_st.row,
                               sK, n_rows, tid);
  store_tile<TileKV, kThreads>(a.dv + b * a.dv_st.batch + kv_head * a.dv_st.head + n0 * a.dv_st.row, a.dv_st.row,
                               sV, n_rows, tid);
}

// Prefetch of step (r, mq): Q_i and dO_i of query head kv_head·group + r, Q block m_begin + mq,
// into buffer buf; any = false (past the last step) only zero-fills, from the tile of step
// (0, rot), an address that exists.
template <class Kt, class T>
__device__ __forceinline__ void load_q_do_tiles(const Args<T>& a, T* sQ, T* sdO, int b, int kv_head, int m_begin,
                                                int rot, int r, int mq, int buf, bool any, int tid) {
  using TileQ = typename Kt::TileQ;
  constexpr int kBlockM = Kt::kBlockM, kThreads = Kt::kThreads;
  if (!any) r = 0, mq = rot;
  const int h = kv_head * a.group + r, m0 = (m_begin + mq) * kBlockM;
  const int n_valid = any ? a.S_q - m0 : 0;
  copy_tile_async<TileQ, kThreads>(sQ + buf * TileQ::kElems,
                                   a.q + b * a.q_st.batch + h * a.q_st.head + m0 * a.q_st.row, a.q_st.row,
                                   n_valid, tid);
  copy_tile_async<TileQ, kThreads>(sdO + buf * TileQ::kElems,
                                   a.dout + b * a.do_st.batch + h * a.do_st.head + m0 * a.do_st.row, a.do_st.row,
                                   n_valid, tid);
  mma::cp_async_commit();
}

template <class Kt, class T>
__device__ __forceinline__ void dkdv_block(const Args<T>& a, char* smem, int tid, int n_block, int kv_head, int b) {
  using TileQ = typename Kt::TileQ;
  using TileKV = typename Kt::TileKV;
  using TileP = typename Kt::TileP;
  constexpr int kBlockM = Kt::kBlockM, kBlockN = Kt::kBlockN, kHeadDim = Kt::kHeadDim;
  constexpr int kThreads = Kt::kThreads;
  T* sK = reinterpret_cast<T*>(smem);  // (kBlockN, kHeadDim)
  T* sV = sK + TileKV::kElems;         // (kBlockN, kHeadDim)
  T* sQ = sV + TileKV::kElems;         // 2 x (kBlockM, kHeadDim)
  T* sdO = sQ + 2 * TileQ::kElems;     // 2 x (kBlockM, kHeadDim)
  T* sP = sdO + 2 * TileQ::kElems;     // (kBlockM, kBlockN)
  T* sdS = sP + TileP::kElems;         // (kBlockM, kBlockN)

  const int warp = tid / 32, lane = tid % 32;
  const int g = lane >> 2, t = lane & 3;
  // This warp's tiles in the three product shapes (first row, first column).
  const int s_m = (warp / Kt::kWarpsNS) * Kt::kMTS * 16, s_n = (warp % Kt::kWarpsNS) * Kt::kNTS * 8;
  const int kv_m = (warp / Kt::kWarpsDKV) * Kt::kMTKV * 16, kv_n = (warp % Kt::kWarpsDKV) * Kt::kNTKV * 8;
  const int q_m = (warp / Kt::kWarpsDQ) * Kt::kMTQ * 16, q_n = (warp % Kt::kWarpsDQ) * Kt::kNTQ * 8;

  const int n0 = n_block * kBlockN;
  const int seqlen = a.vis.seqlen_k(b);
  // Keys with data: rows past seqlen are zero-filled rather than loaded, so that whatever a
  // padded K/V row holds cannot reach dK or dQ as 0 · NaN.
  const int key_end = seqlen < a.S_k ? seqlen : a.S_k;
  const int n_keys = key_end - n0 < kBlockN ? key_end - n0 : kBlockN;

  load_kv<Kt>(a, sK, sV, b, kv_head, n0, n_keys, tid);  // load K_j, V_j -> shared memory (once)

  // Steps: (query head of the group) x (Q block that sees a key of this block). Blocks start at
  // a different Q block (rotated by n_block), so concurrent blocks of one head tend to add their
  // dQ partials to different rows (measured within noise of starting all at the first).
  const BlockRange mb = query_blocks(a.vis, n0, n_keys, seqlen, kBlockM);
  const int n_m = mb.size();
  const int steps = a.group * n_m;
  const int rot = n_m == 0 ? 0 : n_block % n_m;
  // Q rows whose blocks see every key of this block: no per-element mask there.
  const IndexRange full_rows = full_query_rows(a.vis, n0, kBlockN, seqlen);
  // A step is (r, mq): query head kv_head·group + r, Q block mb.begin + mq. any = false (past
  // the last step) only zero-fills, from a tile that exists as the clamped source address, so
  // the prefetch needs no branch.
  auto load_q_do = [&](int r, int mq, int buf, bool any) {
    load_q_do_tiles<Kt>(a, sQ, sdO, b, kv_head, mb.begin, rot, r, mq, buf, any, tid);
  };

  // Each lane's ldmatrix base address per operand role; a role's other tiles (dO beside Q, V
  // beside K, dS beside P, the second buffer) are fixed byte offsets away.
  constexpr uint32_t kQBytes = TileQ::kBytes, kdOOffset = 2 * TileQ::kBytes;
  const LaneAddr<TileQ> a_s = lane_a<TileQ>(ptx::smem_u32(sQ), s_m, lane);       // Q in S, dO in dP
  const LaneAddr<TileKV> b_s = lane_b<TileKV>(ptx::smem_u32(sK), s_n, lane);     // K in S, V in dP
  const LaneAddr<TileP> a_kv = lane_a_t<TileP>(ptx::smem_u32(sP), kv_m, lane);   // Pᵀ in dV, dSᵀ in dK
  const LaneAddr<TileQ> b_kv = lane_b_t<TileQ>(ptx::smem_u32(sQ), kv_n, lane);   // dO in dV, Q in dK
  const LaneAddr<TileP> a_q = lane_a<TileP>(ptx::smem_u32(sdS), q_m, lane);      // dS in dQ
  const LaneAddr<TileKV> b_q = lane_b_t<TileKV>(ptx::smem_u32(sK), q_n, lane);   // K in dQ

  float acc_dk[Kt::kMTKV][Kt::kNTKV][4];  // (kBlockN, kHeadDim) over the warps
  float acc_dv[Kt::kMTKV][Kt::kNTKV][4];  // (kBlockN, kHeadDim)
  zero(acc_dk);
  zero(acc_dv);
  if (steps > 0) load_q_do(0, rot, 0, true);

  // (r, mq) walks the steps; (next_r, next_mq) is the step after, prefetched during this one.
  int next_r = 0, next_mq = rot;
  for (int it = 0; it < steps; ++it) {
    const int buf = it & 1;
    const int r = next_r, mq = next_mq;
    if (++next_mq == n_m) next_mq = 0;
    if (next_mq == rot) ++next_r;
    const int h = kv_head * a.group + r, m0 = (mb.begin + mq) * kBlockM;
    const uint32_t buf_off = buf * kQBytes;
    mma::cp_async_wait<0>();
    // Q_i, dO_i have landed for every thread, and every warp is done with the previous step's
    // sP, sdS and the buffer the prefetch below overwrites.
    __syncthreads();

    TileCoords c;
    c.b = b, c.h = h, c.i0 = m0 + s_m + g, c.j0 = n0 + s_n + 2 * t, c.seqlen = seqlen;
    const int64_t row0 = a.row_index(b, h, c.i0);
    const int m_rows = a.S_q - m0 < kBlockM ? a.S_q - m0 : kBlockM;
    const bool masked = a.vis.mask.ptr != nullptr || !(m0 >= full_rows.begin && m0 + m_rows <= full_rows.end);
    float lse2[Kt::kMTS][2];  // lse_i·log2 e of this thread's rows
    load_row_stat(lse2, a.lse, row0, c.i0, a.S_q, /*is_lse=*/true);
    float acc_s[Kt::kMTS][Kt::kNTS][4];  // (kBlockM, kBlockN) over the warps
    zero(acc_s);
    gemm_ss<kHeadDim, false, false, T>(acc_s, a_s.shifted(buf_off), b_s);  // S = Q_i K_jᵀ
    load_q_do(next_r, next_mq, buf ^ 1, it + 1 < steps);

    // P, dP (dO_i Vᵀ), dS -> sP, sdS.
    probs_to_ds<Kt>(a, acc_s, lse2, masked, row0, c, sP, sdS, a_s, b_s, buf_off, s_m, s_n, lane);
    __syncthreads();  // P_ij and dS_ij complete in shared memory

    gemm_ss<kBlockM, true, true, T>(acc_dv, a_kv, b_kv.shifted(buf_off + kdOOffset));  // dV_j += P_ijᵀ dO_i
    // dQ_i += dS_ij K_j, added to the workspace (none on the deterministic path); its reductions
    // drain while dK's mma issue.
    if (a.dq_accum != nullptr) {
      float acc_dq[Kt::kMTQ][Kt::kNTQ][4];  // (kBlockM, kHeadDim) over the warps
      zero(acc_dq);
      gemm_ss<kBlockN, false, true, T>(acc_dq, a_q, b_q);
      atomic_add_frag<kThreads>(a.dq_accum + a.accum_row(b, h, m0) * kHeadDim, acc_dq, tid);
    }
    gemm_ss<kBlockM, true, true, T>(acc_dk, a_kv.shifted(TileP::kBytes), b_kv.shifted(buf_off));  // dK_j += dS_ijᵀ Q_i
  }

  // Epilogue: dK_j (× scale), dV_j -> 16-bit -> shared memory -> 16-byte stores.
  store_dk_dv<Kt>(a, acc_dk, acc_dv, sK, sV, b, kv_head, n0, kv_m, kv_n, lane, tid);
}

}  // namespace mma_bwd
}  // namespace flashattn

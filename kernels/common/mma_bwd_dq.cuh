// The smaller kernels of the mma.sync backward pass:
//   preprocess  D_i = rowsum(dO_i ∘ O_i) in fp32 (Algorithm 2, line 4), and the fp32 dQ
//               accumulator zeroed (all S_q_pad rows), so every run redoes the whole sum
//   convert     dQ = scale · accumulator, un-permuted from the dK/dV kernel's fragment order,
//               rounded to the dtype and stored with dQ's strides
//   dq_block    the deterministic path's dQ: one block per (Q block, query head) walks the K
//               blocks its rows see and accumulates dQ_i in registers in a fixed order:
//                 S = Q_i K_jᵀ, P, dP = dO_i V_jᵀ, dS (recomputed), dQ_i += dS K_j
//               Each warp owns 16 query rows and all kBlockN keys, so dS leaves its
//               accumulators as the A operand of dS K_j without touching shared memory. Cost:
//               S and dP are computed twice (here and in the dK/dV kernel), 7 products instead
//               of 5, about 1.4x the tensor work of the atomic path.
#pragma once

#include <vector_types.h>

#include <cstdint>

#include "common/dtype.cuh"
#include "common/mma_bwd_softmax.cuh"
#include "common/mma_bwd_tile.cuh"
#include "common/mma_bwd_traits.cuh"

namespace flashattn {
namespace mma_bwd {

// Preprocess: 4 lanes per row, each lane every 4th 16-byte chunk of it (a warp reads 8 rows x
// 64 contiguous bytes per load); 64 rows per 256-thread block. The convert kernel's blocks have
// kRowThreads threads too.
constexpr int kRowThreads = 256;
constexpr int kLanesPerRow = 4;
constexpr int kRowsPerBlock = kRowThreads / kLanesPerRow;

// The grid covers S_q_pad rows when there is a dQ accumulator (its padding rows are zeroed too:
// the fragment-ordered layout spreads a Q block's valid rows over its whole tile), else S_q rows.
template <class T>
__device__ __forceinline__ void preprocess_rows(const Args<T>& a, int tid, int row_block, int h, int b) {
  const int i = row_block * kRowsPerBlock + tid / kLanesPerRow, part = tid % kLanesPerRow;
  float acc = 0.f;
  if (i < a.S_q) {
    const T* o_row = a.o + b * a.o_st.batch + h * a.o_st.head + i * a.o_st.row;
    const T* do_row = a.dout + b * a.do_st.batch + h * a.do_st.head + i * a.do_st.row;
    for (int c = part; c < a.D / 8; c += kLanesPerRow) {
      const uint4 ov = *reinterpret_cast<const uint4*>(o_row + 8 * c);
      const uint4 dv = *reinterpret_cast<const uint4*>(do_row + 8 * c);
      const T* oe = reinterpret_cast<const T*>(&ov);
      const T* de = reinterpret_cast<const T*>(&dv);
#pragma unroll
      for (int e = 0; e < 8; ++e) acc += to_float(oe[e]) * to_float(de[e]);
    }
  }
  if (a.dq_accum != nullptr && i < a.S_q_pad) {
    float4* z = reinterpret_cast<float4*>(a.dq_accum + a.accum_row(b, h, i) * a.D);
    for (int c = part; c < a.D / 4; c += kLanesPerRow) z[c] = make_float4(0.f, 0.f, 0.f, 0.f);
  }
  // The row's 4 lanes are adjacent: two butterfly steps leave the sum in all of them.
  acc += __shfl_xor_sync(0xffffffffu, acc, 1);
  acc += __shfl_xor_sync(0xffffffffu, acc, 2);
  if (i < a.S_q && part == 0) a.dsum[a.row_index(b, h, i)] = acc;
}

// The fragment-ordered accumulator of one Q block (written by the dK/dV kernel's
// atomic_add_frag) -> dQ rows. Float4 slot f·kThreads + tid of the tile holds accumulator tile
// f = mt·kNTQ + nt of dK/dV-kernel thread tid: rows (g, g + 8) x columns (2t, 2t + 1) of that
// tile of the warp's dQ part. Coalesced float4 reads, scaled and rounded to 16-bit pairs in
// shared memory at their logical place, then 16-byte row stores. Row pitch kHeadDim/2 + 4 words:
// the 8 rows x 4 pairs a warp writes per step fall in 32 distinct banks.
template <class Kt>
struct DqFragTile {
  static constexpr int kPitch = Kt::kHeadDim / 2 + 4;  // 32-bit words per row
  static constexpr int kWords = Kt::kBlockM * kPitch;
};

template <class Kt, class T>
__device__ __forceinline__ void convert_dq(const Args<T>& a, uint32_t* s, int tid, int nthreads, int m_block, int h,
                                           int b) {
  constexpr int kBlockM = Kt::kBlockM, kHeadDim = Kt::kHeadDim, kPitch = DqFragTile<Kt>::kPitch;
  constexpr int kNTQ = Kt::kNTQ;
  const int m0 = m_block * kBlockM;
  const float4* tile = reinterpret_cast<const float4*>(a.dq_accum + a.accum_row(b, h, m0) * kHeadDim);
  for (int q = tid; q < kBlockM * kHeadDim / 4; q += nthreads) {
    const float4 x = tile[q];
    const int f = q / Kt::kThreads, src = q % Kt::kThreads;
    const int warp = src / 32, lane = src % 32, g = lane >> 2, t = lane & 3;
    const int row = (warp / Kt::kWarpsDQ) * Kt::kMTQ * 16 + (f / kNTQ) * 16 + g;
    const int col = (warp % Kt::kWarpsDQ) * kNTQ * 8 + (f % kNTQ) * 8 + 2 * t;
    s[row * kPitch + col / 2] = mma::pack2<T>(a.scale * x.x, a.scale * x.y);
    s[(row + 8) * kPitch + col / 2] = mma::pack2<T>(a.scale * x.z, a.scale * x.w);
  }
  __syncthreads();
  constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per row
  T* dst = a.dq + b * a.dq_st.batch + h * a.dq_st.head;
  for (int c = tid; c < kBlockM * kChunks; c += nthreads) {
    const int row = c / kChunks, chunk = c % kChunks;
    if (m0 + row >= a.S_q) continue;
    const uint4 v = *reinterpret_cast<const uint4*>(s + row * kPitch + chunk * 4);
    *reinterpret_cast<uint4*>(dst + (m0 + row) * a.dq_st.row + chunk * 8) = v;
  }
}

template <class Kt, class T>
__device__ __forceinline__ void dq_block(const Args<T>& a, char* smem, int tid, int m_block, int h, int b) {
  using TileQ = typename Kt::TileQ;
  using TileKV = typename Kt::TileKV;
  constexpr int kBlockM = Kt::kBlockM, kBlockN = Kt::kBlockN, kHeadDim = Kt::kHeadDim;
  constexpr int kThreads = Kt::kThreads;
  T* sQ = reinterpret_cast<T*>(smem);  // (kBlockM, kHeadDim)
  T* sdO = sQ + TileQ::kElems;         // (kBlockM, kHeadDim)
  T* sK = sdO + TileQ::kElems;         // 2 x (kBlockN, kHeadDim)
  T* sV = sK + 2 * TileKV::kElems;     // 2 x (kBlockN, kHeadDim)

  const int warp = tid / 32, lane = tid % 32;
  const int g = lane >> 2, t = lane & 3;
  const int m_w = 16 * warp;  // this warp's rows
  const int m0 = m_block * kBlockM;
  const int m_rows = a.S_q - m0 < kBlockM ? a.S_q - m0 : kBlockM;
  const int kv_head = h / a.group;
  const int seqlen = a.vis.seqlen_k(b);
  const int key_end = seqlen < a.S_k ? seqlen : a.S_k;  // keys with data (see dkdv_block)

  copy_tile_async<TileQ, kThreads>(sQ, a.q + b * a.q_st.batch + h * a.q_st.head + m0 * a.q_st.row, a.q_st.row,
                                   m_rows, tid);
  copy_tile_async<TileQ, kThreads>(sdO, a.dout + b * a.do_st.batch + h * a.do_st.head + m0 * a.do_st.row,
                                   a.do_st.row, m_rows, tid);
  mma::cp_async_commit();

  const BlockRange nb = key_blocks(a.vis, m0, m_rows, seqlen, kBlockN);
  auto load_kv = [&](int n_block, int buf) {
    const int n0 = n_block * kBlockN;
    copy_tile_async<TileKV, kThreads>(sK + buf * TileKV::kElems,
                                      a.k + b * a.k_st.batch + kv_head * a.k_st.head + n0 * a.k_st.row, a.k_st.row,
                                      key_end - n0, tid);
    copy_tile_async<TileKV, kThreads>(sV + buf * TileKV::kElems,
                                      a.v + b * a.v_st.batch + kv_head * a.v_st.head + n0 * a.v_st.row, a.v_st.row,
                                      key_end - n0, tid);
    mma::cp_async_commit();
  };
  if (nb.size() > 0) load_kv(nb.begin, 0);

  TileCoords c;
  c.b = b, c.h = h, c.i0 = m0 + m_w + g, c.seqlen = seqlen;
  float lse2[1][2], dsum[1][2];  // lse_i·log2 e and D_i of this thread's two rows
  load_row_stat(lse2, a.lse, a.row_index(b, h, c.i0), c.i0, a.S_q, /*is_lse=*/true);
  load_row_stat(dsum, a.dsum, a.row_index(b, h, c.i0), c.i0, a.S_q, /*is_lse=*/false);

  // Lane ldmatrix bases: Q (dO a tile further) in S / dP; K (V two tiles further, the second
  // buffer one tile further) in S / dP and in dQ.
  const LaneAddr<TileQ> a_s = lane_a<TileQ>(ptx::smem_u32(sQ), m_w, lane);
  const LaneAddr<TileKV> b_s = lane_b<TileKV>(ptx::smem_u32(sK), 0, lane);
  const LaneAddr<TileKV> b_q = lane_b_t<TileKV>(ptx::smem_u32(sK), 0, lane);

  float acc_dq[1][Kt::kNTQ][4];  // (16, kHeadDim) per warp
  zero(acc_dq);
  for (int n_block = nb.begin; n_block < nb.end; ++n_block) {
    const int buf = (n_block - nb.begin) & 1;
    const uint32_t buf_off = buf * TileKV::kBytes;
    mma::cp_async_wait<0>();
    __syncthreads();  // K_j, V_j landed; every warp is done with the buffer refilled below
    if (n_block + 1 < nb.end) load_kv(n_block + 1, buf ^ 1);

    const int n0 = n_block * kBlockN;
    const bool masked = a.vis.mask.ptr != nullptr || !block_fully_visible(a.vis, m0, m_rows, n0, kBlockN, seqlen);
    c.j0 = n0 + 2 * t;
    uint32_t rP[1][Kt::kNTS][2];  // P_ij in 16 bits, (16, kBlockN) per warp
    {
      float acc_s[1][Kt::kNTS][4];  // (16, kBlockN)
      zero(acc_s);
      gemm_ss<kHeadDim, false, false, T>(acc_s, a_s, b_s.shifted(buf_off));  // S = Q_i K_jᵀ
      probs_any(acc_s, lse2, a.scale_log2, masked, a.vis, c);                // P
      pack_acc<T>(rP, acc_s);
    }
    float acc_dp[1][Kt::kNTS][4];  // (16, kBlockN)
    zero(acc_dp);
    gemm_ss<kHeadDim, false, false, T>(acc_dp, a_s.shifted(TileQ::kBytes),
                                       b_s.shifted(buf_off + 2 * TileKV::kBytes));  // dP = dO_i V_jᵀ
    dscores_packed<T>(acc_dp, rP, dsum);                                            // dS
    uint32_t a_ds[Kt::kNTS / 2][4];  // dS as the A operand, (16, kBlockN)
    acc_to_a<T>(a_ds, acc_dp);
    gemm_rs<kBlockN, true, T>(acc_dq, a_ds, b_q.shifted(buf_off));  // dQ_i += dS_ij K_j
  }

  mma::cp_async_wait<0>();
  __syncthreads();  // every warp is done with sQ (and the Q copy has landed when there was no step)
  store_acc<TileQ, T>(ptx::smem_u32(sQ), acc_dq, m_w, 0, lane, a.scale);
  __syncthreads();
  store_tile<TileQ, kThreads>(a.dq + b * a.dq_st.batch + h * a.dq_st.head + m0 * a.dq_st.row, a.dq_st.row, sQ,
                              m_rows, tid);
}

}  // namespace mma_bwd
}  // namespace flashattn

// The hopper backward kernel's consumer warpgroup: its five wgmma products per step, the
// probabilities and dS between them, dQ handed to the dQ writer, and the dK/dV epilogue. Device
// code for kernels/hopper_bwd.cu alone; the configuration, arguments, shared-memory map and step
// list it works with are in hopper_bwd_tile.cuh.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "common/hopper_bwd_tile.cuh"
#include "common/mma_sm80.cuh"
#include "common/sm90.cuh"
#include "common/sm90_wgmma_ops.cuh"

namespace flashattn {
namespace hopper_bwd {

// One consumer warpgroup: 64 keys (rows key0 .. key0 + 63 of the CTA's K and V), their dK and dV
// in registers.
template <class Tr, bool kBf16>
struct Consumer {
  using T = std::conditional_t<kBf16, __nv_bfloat16, __half>;
  using MmaS = sm90::Wgmma<Tr::kBlockM, kBf16>;   // S^T, dP^T: (64 keys, kBlockM queries)
  using MmaKV = sm90::Wgmma<Tr::kHeadDim, kBf16>; // dV, dK: (64 keys, kHeadDim)
  using MmaQ = sm90::Wgmma<Tr::kHeadDim, kBf16>;  // dQ: (64 queries, kHeadDim)
  using DqAcc = float[Tr::kDqTiles][4];
  using Scores = float[Tr::kMTiles][4];
  using Packed = uint32_t[Tr::kMTiles][2];  // 16-bit pairs: the A fragments over the queries

  const Args& a;
  const Smem<Tr>& sm;
  const Steps<Tr>& st;
  int cw, ctid, lane, warp;
  float rdK[Tr::kDTiles][4];
  float rdV[Tr::kDTiles][4];

  __device__ Consumer(const Args& a_, const Smem<Tr>& sm_, const Steps<Tr>& st_, int cw_, int ctid_)
      : a(a_), sm(sm_), st(st_), cw(cw_), ctid(ctid_) {
    lane = ctid % 32;
    warp = ctid / 32;
#pragma unroll
    for (int di = 0; di < Tr::kDTiles; ++di)
#pragma unroll
      for (int e = 0; e < 4; ++e) rdK[di][e] = rdV[di][e] = 0.f;
  }

  // acc = X_w Y^T for X = K or V (this warpgroup's 64 rows) and Y = Q or dO of stage s: both
  // K-major, k16 steps over the head dim (32 bytes apart inside a panel, panel by panel).
  __device__ __forceinline__ void issue_scores(Scores& acc, uint32_t x_tile, uint32_t y_tile) const {
    const sm90::Desc da(x_tile + cw * 64 * 128, 16, 1024), db(y_tile, 16, 1024);
#pragma unroll
    for (int kk = 0; kk < Tr::kHeadDim / 16; ++kk) {
      const uint32_t off = (kk % 4) * 32;
      MmaS::ss(acc, da.at((kk / 4) * Tr::kPanelBytesK + off), db.at((kk / 4) * Tr::kPanelBytesQ + off), kk > 0 ? 1 : 0);
    }
  }

  // acc += P^T Y (or dS^T Y): A from registers (k16 steps over the queries), Y = dO or Q of the
  // stage read MN-major (16 queries are two 8-row groups, SBO 1024; head-dim panels LBO apart).
  __device__ __forceinline__ void issue_grad(float (&acc)[Tr::kDTiles][4], const Packed& rA, uint32_t y_tile) const {
    const sm90::Desc db(y_tile, Tr::kPanelBytesQ, 1024);
#pragma unroll
    for (int kk = 0; kk < Tr::kBlockM / 16; ++kk) {
      const uint32_t pa[4] = {rA[2 * kk][0], rA[2 * kk][1], rA[2 * kk + 1][0], rA[2 * kk + 1][1]};
      MmaKV::rs(acc, pa, db.at(kk * 2048), 1);
    }
  }

  // dQ = dS K over the CTA's 128 keys for 64 queries (all of them at D128, 64w .. 64w + 63 at
  // D64), all head-dim columns; k16 steps over the keys. dS is K-major (query rows of 64-key
  // panels), K is read MN-major ([keys][D] panels, LBO one panel).
  __device__ __forceinline__ void issue_dq(DqAcc& acc, uint32_t ds_tile) const {
    const uint32_t rows = Tr::kDqOneWG ? 0 : cw * 64 * 128;
    const sm90::Desc da(ds_tile + rows, 16, 1024), db(sm.k, Tr::kPanelBytesK, 1024);
#pragma unroll
    for (int kk = 0; kk < Tr::kBlockN / 16; ++kk)  // B MN-major
      MmaQ::template ss<0, 1>(acc, da.at((kk / 4) * Tr::kDsPanelBytes + (kk % 4) * 32), db.at(kk * 2048), kk > 0 ? 1 : 0);
  }

  // P^T = exp2(S^T·scale·log2 e − lse_i·log2 e), in place; -inf (P = 0) where key j (this lane's
  // rows) does not see query i (its columns): i in [j − hi + 1, j − lo + 1), j < seqlen_k.
  // Masked and unmasked steps are two code paths: a per-element test of a runtime flag costs a
  // compare and a branch per element, and the branches split the exponentials' schedule.
  template <bool kMasked>
  __device__ __forceinline__ void probs(Scores& rS, int s, int m0) const {
    const int key = st.n0 + cw * 64 + warp * 16 + lane / 4;
#pragma unroll
    for (int ni = 0; ni < Tr::kMTiles; ++ni) {
      const float2 lse = sm90::ld_shared_f32x2(sm.lse_stage(s) + (ni * 8 + 2 * (lane % 4)) * 4);
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float l = (e & 1) ? lse.y : lse.x;
        float x = fmaf(rS[ni][e], a.scale_log2, -l);
        if constexpr (kMasked) {
          const int j = key + (e / 2) * 8;
          const int i = m0 + ni * 8 + 2 * (lane % 4) + (e & 1);
          const bool vis = j < st.seqlen_k && i >= j - a.key_hi_shift + 1 && i < j - a.key_lo_shift + 1;
          if (!vis) x = -INFINITY;
        }
        rS[ni][e] = mma::exp2_approx(x);
      }
    }
  }

  // D_i of this lane's query columns (ni·8 + 2t, + 1), read from the stage's D_i.
  using Dsum = float2[Tr::kMTiles];
  __device__ __forceinline__ void load_dsum(Dsum& d, int s) const {
#pragma unroll
    for (int ni = 0; ni < Tr::kMTiles; ++ni) d[ni] = sm90::ld_shared_f32x2(sm.dsum_stage(s) + (ni * 8 + 2 * (lane % 4)) * 4);
  }

  // dS^T = P^T ∘ (dP^T − D_i), in place in dP's registers.
  __device__ __forceinline__ void dscores(Scores& rdP, const Scores& rP, const Dsum& d) const {
#pragma unroll
    for (int ni = 0; ni < Tr::kMTiles; ++ni)
#pragma unroll
      for (int e = 0; e < 4; ++e) rdP[ni][e] = rP[ni][e] * (rdP[ni][e] - ((e & 1) ? d[ni].y : d[ni].x));
  }

  // The same, packed to 16 bits as it goes, D_i read tile by tile: where the step's D_i (kMTiles
  // float2) does not fit beside S^T, dP^T, P and the gradients (D64's 128-query steps).
  __device__ __forceinline__ void dscores_packed(const Scores& rdP, const Scores& rP, int s, Packed& out) const {
#pragma unroll
    for (int ni = 0; ni < Tr::kMTiles; ++ni) {
      const float2 d = sm90::ld_shared_f32x2(sm.dsum_stage(s) + (ni * 8 + 2 * (lane % 4)) * 4);
      out[ni][0] = mma::pack2<T>(rP[ni][0] * (rdP[ni][0] - d.x), rP[ni][1] * (rdP[ni][1] - d.y));
      out[ni][1] = mma::pack2<T>(rP[ni][2] * (rdP[ni][2] - d.x), rP[ni][3] * (rdP[ni][3] - d.y));
    }
  }

  __device__ __forceinline__ static void pack(const Scores& x, Packed& out) {
#pragma unroll
    for (int ni = 0; ni < Tr::kMTiles; ++ni) {
      out[ni][0] = mma::pack2<T>(x[ni][0], x[ni][1]);
      out[ni][1] = mma::pack2<T>(x[ni][2], x[ni][3]);
    }
  }

  // dS^T (16-bit; this warp's 16 keys x kBlockM queries) -> dS, transposed by stmatrix: query q's
  // keys of this warp as two 16-byte chunks (2·warp, + 1) of row q of the warpgroup's key panel,
  // swizzled as TMA would. One stmatrix per two n8 tiles: matrices (ni, keys 0-7), (ni, keys 8-15),
  // (ni + 1, keys 0-7), (ni + 1, keys 8-15), lane 8m + i addressing query row i of matrix m.
  __device__ __forceinline__ void store_ds(const Packed& rdS, uint32_t ds_tile) const {
    static_assert(Tr::kMTiles % 2 == 0, "n8 tiles in pairs");
    const int m = lane / 8, chunk = 2 * warp + m % 2;
    const uint32_t panel = ds_tile + cw * Tr::kDsPanelBytes;
#pragma unroll
    for (int ni = 0; ni < Tr::kMTiles; ni += 2) {
      const int q = (ni + m / 2) * 8 + lane % 8;
      sm90::stmatrix_x4_trans(panel + sm90::swizzled_offset(q, chunk, 0), rdS[ni][0], rdS[ni][1], rdS[ni + 1][0],
                              rdS[ni + 1][1]);
    }
  }

  // This warpgroup's dQ -> the dQ buffer of step t (free: wait_dq_buffer) in the accumulator's
  // layout (DqLayout: each warp's 16 queries one group, float4 ni of its fragments at one of 32
  // consecutive 16-byte slots, conflict-free), published to the dQ writer, one arrival per warp.
  // Publishing is publish_dq, later: the async-proxy fence waits for the stores to complete.
  __device__ __forceinline__ void wait_dq_buffer(int t) const {
    sm90::mbar_wait(sm.dq_empty(sm.dq_slot(t)), sm.dq_parity(t) ^ 1);
  }
  __device__ __forceinline__ void store_dq(const DqAcc& rdQ, int t) const {
    constexpr int kGroupBytes = kDqAccumRows * Tr::kHeadDim * 4;
    const int group = (Tr::kDqOneWG ? 0 : 4 * cw) + warp;
    const uint32_t buf = sm.dq_buf(sm.dq_slot(t)) + group * kGroupBytes + lane * 16;
#pragma unroll
    for (int ni = 0; ni < Tr::kDqTiles; ++ni)
      sm90::st_shared_f32x4(buf + ni * 32 * 16, rdQ[ni][0], rdQ[ni][1], rdQ[ni][2], rdQ[ni][3]);
  }
  __device__ __forceinline__ void publish_dq(int t) const {
    sm90::fence_proxy_async();  // each thread's stores, before the warp's arrival publishes them
    release(sm.dq_full(sm.dq_slot(t)));
  }

  __device__ __forceinline__ void release(uint32_t bar) const {
    __syncwarp();
    if (lane == 0) sm90::mbar_arrive(bar);
  }

  // One step: FlashAttention-2's backward inner loop (Algorithm 2) for the Q block of step t.
  __device__ void step(int t) {
    const int s = t % Tr::kStages;
    const uint32_t phase = (t / Tr::kStages) & 1;
    const int m0 = st.m_block(t) * Tr::kBlockM;
    const bool masked = st.masked(t, a.S_q);
    Scores rS, rdP;
    sm90::mbar_wait(sm.full_q(s), phase);
    sm90::wgmma_fence();
    issue_scores(rS, sm.k, sm.q_stage(s));  // S^T = K_j Q_i^T
    sm90::wgmma_commit();
    sm90::mbar_wait(sm.full_do(s), phase);
    sm90::wgmma_fence();  // a fence after the wait's loop, or ptxas inserts one of its own
    issue_scores(rdP, sm.v, sm.do_stage(s));  // dP^T = V_j dO_i^T
    sm90::wgmma_commit();
    sm90::wgmma_wait<1>();
    sm90::fence_regs(rS);
    if (masked)
      probs<true>(rS, s, m0);
    else
      probs<false>(rS, s, m0);
    Packed rP;
    pack(rS, rP);
    sm90::wgmma_fence();
    issue_grad(rdV, rP, sm.do_stage(s));  // dV_j += P^T dO_i   (while dP may still run)
    sm90::wgmma_commit();
    // D_i read before the wait for dP, which the loads cannot cross, so their latency hides behind
    // it; at D64 there is no room, and they follow it, tile by tile.
    Packed rdS;
    if constexpr (Tr::kMTiles <= 8) {
      Dsum dsum;
      load_dsum(dsum, s);
      sm90::wgmma_wait<1>();
      sm90::fence_regs(rdP);
      dscores(rdP, rS, dsum);
      pack(rdP, rdS);
    } else {
      sm90::wgmma_wait<1>();
      sm90::fence_regs(rdP);
      dscores_packed(rdP, rS, s, rdS);
    }
    const uint32_t ds_tile = sm.ds_buf(t);
    if constexpr (Tr::kDqOneWG) return finish_one_wg_dq(rP, rdS, ds_tile, t);
    store_ds(rdS, ds_tile);
    sm90::fence_proxy_async();
    sm90::named_sync(/*id=*/1, /*threads=*/256);  // both warpgroups' halves of dS are in shared memory
    // dV has landed long since (issued before dS was formed): P's registers are free for dQ's.
    sm90::wgmma_wait<0>();
    sm90::fence_regs(rdV);
    sm90::fence_regs(rP);
    DqAcc rdQ;
    sm90::wgmma_fence();
    issue_dq(rdQ, ds_tile);  // dQ_i (this warpgroup's queries) = dS K_j
    sm90::wgmma_commit();
    issue_grad(rdK, rdS, sm.q_stage(s));  // dK_j += dS^T Q_i
    sm90::wgmma_commit();
    // dQ first: its store to the dQ buffer overlaps dK's product, and by the time dK has landed
    // the stores have too, so the fence that publishes them costs little.
    sm90::wgmma_wait<1>();
    sm90::fence_regs(rdQ);
    wait_dq_buffer(t);
    store_dq(rdQ, t);
    sm90::wgmma_wait<0>();
    sm90::fence_regs(rdK);
    sm90::fence_regs(rdS);
    publish_dq(t);
    release(sm.empty_qdo(s));
  }

  // The rest of a step where warpgroup 1 forms dQ alone (D128): dK issued from dS's registers
  // while dS is stored; once dV and dK have landed the stage is released and both warpgroups meet
  // (dS whole in shared memory). Warpgroup 1 issues dQ (its accumulator in the registers S^T and
  // dP^T held) and meets warpgroup 0 once more, so that warpgroup 0's next products queue behind
  // dQ on the tensor pipe, then stores dQ for the dQ writer; warpgroup 0 goes on to its next step.
  // The two dS buffers make that safe: warpgroup 0 writes this step's buffer again two steps on,
  // after the next first meeting, which warpgroup 1 reaches only once this dQ has landed.
  __device__ __forceinline__ void finish_one_wg_dq(Packed& rP, Packed& rdS, uint32_t ds_tile, int t) {
    sm90::wgmma_fence();
    issue_grad(rdK, rdS, sm.q_stage(t % Tr::kStages));  // dK_j += dS^T Q_i
    sm90::wgmma_commit();
    store_ds(rdS, ds_tile);
    sm90::fence_proxy_async();
    sm90::wgmma_wait<0>();
    sm90::fence_regs(rdV);
    sm90::fence_regs(rdK);
    sm90::fence_regs(rP);
    sm90::fence_regs(rdS);
    release(sm.empty_qdo(t % Tr::kStages));
    sm90::named_sync(/*id=*/1, /*threads=*/256);  // both warpgroups' halves of dS are in shared memory
    if (cw == 0) {
      sm90::named_sync(/*id=*/4, /*threads=*/256);  // dQ issued
      return;
    }
    DqAcc rdQ;
    sm90::wgmma_fence();
    issue_dq(rdQ, ds_tile);  // dQ_i = dS K_j
    sm90::wgmma_commit();
    wait_dq_buffer(t);
    sm90::named_sync(/*id=*/4, /*threads=*/256);  // dQ issued
    sm90::wgmma_wait<0>();
    sm90::fence_regs(rdQ);
    store_dq(rdQ, t);
    publish_dq(t);
  }

  // dK (x scale) and dV -> 16-bit -> this warpgroup's staging tiles (the Q/dO ring, idle now) ->
  // TMA stores, which drop the rows past S_k.
  __device__ void epilogue() {
    if (a.dk_f32 != nullptr) return store_f32();
    constexpr int kOutPanel = 64 * 128;  // 64 rows of one 64-column panel
    const uint32_t dk_tile = sm.q + cw * 2 * Tr::kPanels * kOutPanel;
    const uint32_t dv_tile = dk_tile + Tr::kPanels * kOutPanel;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = warp * 16 + r * 8 + lane / 4;
#pragma unroll
      for (int di = 0; di < Tr::kDTiles; ++di) {
        const uint32_t off = (di / 8) * kOutPanel + sm90::swizzled_offset(row, di % 8, lane % 4);
        sm90::st_shared_32(dk_tile + off, mma::pack2<T>(rdK[di][2 * r] * a.scale, rdK[di][2 * r + 1] * a.scale));
        sm90::st_shared_32(dv_tile + off, mma::pack2<T>(rdV[di][2 * r], rdV[di][2 * r + 1]));
      }
    }
    sm90::fence_proxy_async();
    sm90::named_sync(/*id=*/2 + cw, /*threads=*/128);
    if (ctid == 0) {
      const int key0 = st.n0 + cw * 64;
#pragma unroll
      for (int p = 0; p < Tr::kPanels; ++p) {
        sm90::tma_store_4d(&a.tm_dk, dk_tile + p * kOutPanel, p * 64, key0, st.kv_head, st.b);
        sm90::tma_store_4d(&a.tm_dv, dv_tile + p * kOutPanel, p * 64, key0, st.kv_head, st.b);
      }
      sm90::tma_store_commit();
      sm90::tma_store_wait_read();
    }
  }

  // grads_f32: each thread's accumulator pairs (columns 8·di + 2·(lane % 4), + 1 of its two
  // rows) straight to global memory as float2; a quad of lanes covers 32 contiguous bytes.
  __device__ void store_f32() {
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int key = st.n0 + cw * 64 + warp * 16 + r * 8 + lane / 4;
      if (key >= a.S_k) continue;
      float* dk = a.dk_f32 + st.b * a.dk_f32_st.batch + st.kv_head * a.dk_f32_st.head + key * a.dk_f32_st.row;
      float* dv = a.dv_f32 + st.b * a.dv_f32_st.batch + st.kv_head * a.dv_f32_st.head + key * a.dv_f32_st.row;
#pragma unroll
      for (int di = 0; di < Tr::kDTiles; ++di) {
        const int col = di * 8 + 2 * (lane % 4);
        *reinterpret_cast<float2*>(dk + col) = make_float2(rdK[di][2 * r] * a.scale, rdK[di][2 * r + 1] * a.scale);
        *reinterpret_cast<float2*>(dv + col) = make_float2(rdV[di][2 * r], rdV[di][2 * r + 1]);
      }
    }
  }
};

}  // namespace hopper_bwd
}  // namespace flashattn

// hopper, forward — rung 8 of the ladder: FlashAttention on Hopper's own instructions (sm_90a).
// Over rung 7 (mma, mma.sync fed by ldmatrix/cp.async) it adds:
//   - the tensor copy engine (TMA, cp.async.bulk.tensor): Q, K and V tiles arrive in 128-byte
//     swizzled shared memory through tensor maps, completion counted in bytes on mbarriers, K/V in a
//     kStages-deep ring; rows past a sequence arrive as zeros, and O leaves through a TMA store
//     that drops rows past S_q;
//   - warpgroup matrix products (wgmma.mma_async): S = Q K^T with both operands in shared memory,
//     O += P V with P straight from registers (the accumulator layout of S, rounded to 16 bits, is
//     the A-fragment layout) and V read transposed by the tensor cores;
//   - warp specialisation: warpgroup 0 is the producer (one thread issues every copy; setmaxnreg
//     gives its registers away), warpgroups 1..kConsumerWGs each own 64 query rows of the tile.
//
// FlashAttention-3 (Shah et al. 2024), Algorithm 1 with its two overlaps (Consumer::run_pipelined):
//   producer: load Q_i; for each key block j (masked blocks first, then the rest, descending):
//               wait until K's slot of stage s is free, load K_j; the same for V_j
//   consumer: wait for Q_i; S_0 = Q_i K_0^T; softmax(S_0) -> P_0
//             for each later j, on this warpgroup's turn (ping-pong with the other warpgroup):
//               issue S_j = Q_i K_j^T and O += P_{j-1} V_{j-1} (two wgmma groups)
//               wait for S_j only; release K_j; mask S_j on boundary blocks
//               m_new = max(m_i, rowmax(S_j)); P_j = exp2(S_j*c - m_new*c)
//               l_i = exp2((m_i - m_new)*c) l_i + rowsum(P_j)        (while P V still runs)
//               wait for P V; release V_{j-1}; O = diag(exp2((m_i - m_new)*c)) O
//             O += P_last V_last; O /= l_i; lse_i = (m_i*c + log2 l_i) ln 2
//             O -> swizzled smem -> TMA store; lse -> global
//
// Features: causal (bottom-right), window, key padding (seqlens_k; the padded K/V rows must hold
// finite values: they are multiplied by P = 0), GQA/MQA, S_q != S_k, any length >= 1, empty rows
// (O = 0, lse = -inf), bhsd and bshd. Not the additive mask (declared unsupported).
// Limits: fp16/bf16, head dims 64, 128, 256 (other head dims, and a scale <= 0, run the mma
// kernel instead); sm_90 only (the file is built for sm_90a alone); tensors 16-byte aligned with
// strides a multiple of 8 elements (tensor-map rules).
// Instantiations: 3 head dims x 2 dtypes = 6 kernels, plus the serial schedule at D128 bf16 for the
// ablation (FLASHATTN_HOPPER_SCHEDULE=serial).
// Measured 2026-11-25, H100 SXM (1980 MHz), bf16 B4 H16 S4096 D128: 685 TFLOP/s, 1.02x PyTorch's
// cuDNN backend and 1.93x its flash backend in the same run (docs/PERF.md has the grid).
#include <cuda.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <type_traits>

#include "common/frag_softmax.cuh"
#include "common/key_blocks.cuh"
#include "common/layout_checks.h"
#include "common/mask.cuh"
#include "common/mma_sm80.cuh"
#include "common/sm90.cuh"
#include "common/sm90_tma_host.h"
#include "common/sm90_wgmma_ops.cuh"
#include "flashattn/check.h"
#include "flashattn/error.h"
#include "flashattn/registry.h"

namespace flashattn {
namespace hopper_fwd {

// Tile configuration per head dim. wgmma's M is 64 per warpgroup, so each consumer warpgroup owns
// 64 query rows; the accumulators (O: 64 x D, S: 64 x kBlockN, fp32) live in its 128 threads'
// registers, D/2 + kBlockN/2 floats each, under the 240 registers setmaxnreg grants.
template <int kHeadDim_, int kBlockN_, int kStages_, bool kPingPong_>
struct Traits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kStages = kStages_;
  static constexpr bool kPingPong = kPingPong_;  // consumer warpgroups take turns issuing products
  static constexpr int kConsumerWGs = 2;
  static constexpr int kBlockM = 64 * kConsumerWGs;
  static constexpr int kThreads = 128 * (kConsumerWGs + 1);
  // 24 + 2 x 240 registers per thread-slot x 128 = 64512 <= 65536: the whole register file.
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = 240;

  static constexpr int kPanels = kHeadDim / 64;  // 64-element (128-byte) swizzle panels per row
  static constexpr int kPanelBytesQ = kBlockM * 128;
  static constexpr int kTileQBytes = kPanels * kPanelBytesQ;  // (kBlockM, kHeadDim)
  static constexpr int kPanelBytesKV = kBlockN * 128;
  static constexpr int kTileKVBytes = kPanels * kPanelBytesKV;  // (kBlockN, kHeadDim)
  static constexpr int kNTiles = kBlockN / 8;  // n8 tiles of S per warp
  static constexpr int kDTiles = kHeadDim / 8;  // n8 tiles of O per warp
  static constexpr int kBarrierBytes = 8 * (1 + 4 * kStages);
  // 1024 spare bytes so the tiles can start on a 1024-byte boundary (the swizzle atom).
  static constexpr int kSmemBytes = 1024 + kTileQBytes + 2 * kStages * kTileKVBytes + kBarrierBytes;

  static_assert(kHeadDim % 64 == 0, "whole 128-byte panels");
  static_assert(!kPingPong || kConsumerWGs == 2, "ping-pong alternates two warpgroups");
  static_assert(kBlockN % 16 == 0 && kBlockN <= 256, "wgmma N and k16 steps over keys");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory a CTA may opt in to on the H100");
};

template <int kHeadDim> struct TraitsFor;
// D=64: S 64 + O 32 registers; 16 KB Q + 2 x 2 x 16 KB of K/V = 80 KB shared.
template <> struct TraitsFor<64> { using type = Traits<64, 128, 2, true>; };
// D=128: S 64 + O 64 + P 32 registers; 32 KB + 2 x 2 x 32 KB = 160 KB shared.
template <> struct TraitsFor<128> { using type = Traits<128, 128, 2, true>; };
// D=256: O alone is 128 registers, so kBlockN = 64 (S 32); 64 KB + 2 x 2 x 32 KB = 192 KB shared.
template <> struct TraitsFor<256> { using type = Traits<256, 64, 2, true>; };

struct Args {
  CUtensorMap tm_q;  // (D, S_q, H, B), boxes of (64, kBlockM)
  CUtensorMap tm_k;  // (D, S_k, H_kv, B), boxes of (64, kBlockN)
  CUtensorMap tm_v;
  CUtensorMap tm_o;  // (D, S_q, H, B), boxes of (64, 64): one consumer warpgroup's rows
  float* lse = nullptr;  // [B, H, S_q]
  int H = 0, h_per_kv = 1, S_q = 0;
  float scale_log2 = 0.f;
  // Keys visible to query i: [i + key_lo_shift, i + key_hi_shift) within [0, seqlen_k) (the
  // window with causal folded in; +-2^30 when unbounded).
  int key_lo_shift = 0, key_hi_shift = 0;
  Visibility vis;
};

// The key blocks a query tile visits and their order, computed alike by the producer and the
// consumers: blocks that need masking first (top: causal diagonal and key tail, descending; then
// bottom: window edge, descending), then the full blocks, descending.
template <class Tr>
struct KeySchedule {
  BlockRange nb, full;
  int n_top = 0, n_masked = 0, n_total = 0;
  __device__ KeySchedule(const Visibility& vis, int m0, int m_last, int seqlen_k) {
    nb = key_blocks<Tr::kBlockN>(vis, m0, m_last, seqlen_k);
    full = full_key_blocks<Tr::kBlockN>(vis, m0, m_last, seqlen_k);
    full.begin = max(full.begin, nb.begin);
    full.end = min(full.end, nb.end);
    if (full.end <= full.begin) full = BlockRange{nb.begin, nb.begin};
    n_top = nb.end - full.end;
    n_masked = n_top + full.begin - nb.begin;
    n_total = max(nb.end - nb.begin, 0);
  }
  __device__ int block_at(int it) const {
    return it < n_top ? nb.end - 1 - it : it < n_masked ? full.begin - 1 - (it - n_top) : full.end - 1 - (it - n_masked);
  }
};

// Shared-memory map of one CTA (byte addresses in the shared window).
template <class Tr>
struct Smem {
  uint32_t q, k, v, bars;
  __device__ explicit Smem(uint32_t raw) {
    q = (raw + 1023) & ~1023u;                     // (kBlockM, kHeadDim), kPanels panels
    k = q + Tr::kTileQBytes;                        // kStages x (kBlockN, kHeadDim)
    v = k + Tr::kStages * Tr::kTileKVBytes;         // kStages x (kBlockN, kHeadDim)
    bars = v + Tr::kStages * Tr::kTileKVBytes;      // 8-byte mbarriers
  }
  __device__ uint32_t bar_q() const { return bars; }
  __device__ uint32_t full_k(int s) const { return bars + 8 * (1 + s); }
  __device__ uint32_t full_v(int s) const { return bars + 8 * (1 + Tr::kStages + s); }
  // K and V of a stage are released separately: K as soon as S = Q K^T is done, V after P V.
  __device__ uint32_t empty_k(int s) const { return bars + 8 * (1 + 2 * Tr::kStages + s); }
  __device__ uint32_t empty_v(int s) const { return bars + 8 * (1 + 3 * Tr::kStages + s); }
  __device__ uint32_t k_stage(int s) const { return k + s * Tr::kTileKVBytes; }
  __device__ uint32_t v_stage(int s) const { return v + s * Tr::kTileKVBytes; }
};

// Scores of keys invisible to a row -> -inf, on blocks that straddle a boundary. The warp's rows
// start at row0; lane (g, t) holds rows row0+g, row0+g+8, columns ni*8 + 2t + e.
template <class Tr>
__device__ __forceinline__ void mask_scores(float (&rS)[1][Tr::kNTiles][4], const Args& a, int row0, int n0,
                                            int seqlen_k, int lane) {
#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int i = row0 + r * 8 + lane / 4;
    const int jj_begin = max(i - n0 + a.key_lo_shift, 0) - 2 * (lane % 4);
    const int jj_end = min(i - n0 + a.key_hi_shift, seqlen_k - n0) - 2 * (lane % 4);
#pragma unroll
    for (int ni = 0; ni < Tr::kNTiles; ++ni)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int jj = ni * 8 + e;
        if (!(jj >= jj_begin && jj < jj_end)) rS[0][ni][2 * r + e] = -INFINITY;
      }
  }
}

// The producer: one thread issues every copy. Q once; then each key block's K and V into the
// next ring stage, after the consumers have released it.
template <class Tr>
__device__ __forceinline__ void produce(const Args& a, const Smem<Tr>& sm, const KeySchedule<Tr>& ks, int m0, int h,
                                        int b) {
  sm90::prefetch_tensor_map(&a.tm_q);
  sm90::prefetch_tensor_map(&a.tm_k);
  sm90::prefetch_tensor_map(&a.tm_v);
  sm90::mbar_arrive_expect_tx(sm.bar_q(), Tr::kTileQBytes);
#pragma unroll
  for (int p = 0; p < Tr::kPanels; ++p)
    sm90::tma_load_4d(sm.q + p * Tr::kPanelBytesQ, &a.tm_q, sm.bar_q(), p * 64, m0, h, b);
  const int hk = h / a.h_per_kv;  // GQA: the kv head this query head reads
  for (int it = 0; it < ks.n_total; ++it) {
    const int s = it % Tr::kStages;
    const uint32_t phase = (it / Tr::kStages) & 1;
    const int n0 = ks.block_at(it) * Tr::kBlockN;
    sm90::mbar_wait(sm.empty_k(s), phase ^ 1);  // the consumers are done with the K it held
    sm90::mbar_arrive_expect_tx(sm.full_k(s), Tr::kTileKVBytes);
#pragma unroll
    for (int p = 0; p < Tr::kPanels; ++p)
      sm90::tma_load_4d(sm.k_stage(s) + p * Tr::kPanelBytesKV, &a.tm_k, sm.full_k(s), p * 64, n0, hk, b);
    sm90::mbar_wait(sm.empty_v(s), phase ^ 1);  // ... and with its V
    sm90::mbar_arrive_expect_tx(sm.full_v(s), Tr::kTileKVBytes);
#pragma unroll
    for (int p = 0; p < Tr::kPanels; ++p)
      sm90::tma_load_4d(sm.v_stage(s) + p * Tr::kPanelBytesKV, &a.tm_v, sm.full_v(s), p * 64, n0, hk, b);
  }
}

// One consumer warpgroup's state and steps: 64 query rows, O (64 x D) and the softmax statistics
// in registers. The two schedules below (the default pipelined one and the serial one kept for
// the ablation) are built from these steps.
template <class Tr, bool kBf16>
struct Consumer {
  using T = std::conditional_t<kBf16, __nv_bfloat16, __half>;
  using MmaS = sm90::Wgmma<Tr::kBlockN, kBf16>;
  using MmaO = sm90::Wgmma<Tr::kHeadDim, kBf16>;
  using Scores = float[1][Tr::kNTiles][4];  // (64, kBlockN) per warpgroup, (16, kBlockN) per warp
  using Probs = uint32_t[1][Tr::kNTiles][2];  // P in T pairs: the A fragments of P V

  const Args& a;
  const Smem<Tr>& sm;
  const KeySchedule<Tr>& ks;
  int m0, h, b, seqlen_k, cw, ctid, lane, warp;
  uint32_t q_base;  // this warpgroup's 64 rows within each Q panel
  float rO[1][Tr::kDTiles][4];  // (64, kHeadDim) per warpgroup, (16, kHeadDim) per warp
  mma::OnlineSoftmax<1, Tr::kNTiles> softmax;

  __device__ Consumer(const Args& a_, const Smem<Tr>& sm_, const KeySchedule<Tr>& ks_, int m0_, int h_, int b_,
                      int seqlen_k_, int cw_, int ctid_)
      : a(a_), sm(sm_), ks(ks_), m0(m0_), h(h_), b(b_), seqlen_k(seqlen_k_), cw(cw_), ctid(ctid_) {
    lane = ctid % 32;
    warp = ctid / 32;
    q_base = sm.q + cw * 64 * 128;
#pragma unroll
    for (int di = 0; di < Tr::kDTiles; ++di)
#pragma unroll
      for (int e = 0; e < 4; ++e) rO[0][di][e] = 0.f;
    softmax.init();
  }

  // Issues S = Q K^T for the K in stage s: k16 steps over the head dim, 32 bytes apart inside a
  // 128-byte panel, panel by panel.
  __device__ __forceinline__ void issue_s(Scores& rS, int s) const {
#pragma unroll
    for (int kk = 0; kk < Tr::kHeadDim / 16; ++kk) {
      const uint32_t off = (kk % 4) * 32;
      const uint64_t da = sm90::make_desc(q_base + (kk / 4) * Tr::kPanelBytesQ + off, 16, 1024);
      const uint64_t db = sm90::make_desc(sm.k_stage(s) + (kk / 4) * Tr::kPanelBytesKV + off, 16, 1024);
      MmaS::ss(rS[0], da, db, kk > 0 ? 1 : 0);
    }
  }

  // Issues O += P V for the V in stage s: k16 steps over the keys. V is MN-major for this product:
  // 16 keys are two 8-row groups (SBO 1024), head-dim panels kPanelBytesKV apart (LBO).
  __device__ __forceinline__ void issue_o(const Probs& rP, int s) {
#pragma unroll
    for (int kk = 0; kk < Tr::kBlockN / 16; ++kk) {
      const uint32_t pa[4] = {rP[0][2 * kk][0], rP[0][2 * kk][1], rP[0][2 * kk + 1][0], rP[0][2 * kk + 1][1]};
      const uint64_t db = sm90::make_desc(sm.v_stage(s) + kk * 2048, Tr::kPanelBytesKV, 1024);
      MmaO::rs(rO[0], pa, db, 1);
    }
  }

  __device__ __forceinline__ void mask(Scores& rS, int it) const {
    mask_scores<Tr>(rS, a, m0 + cw * 64 + warp * 16, ks.block_at(it) * Tr::kBlockN, seqlen_k, lane);
  }

  // One arrival per consumer warp on an empty barrier of the ring.
  __device__ __forceinline__ void release(uint32_t bar) const {
    __syncwarp();
    if (lane == 0) sm90::mbar_arrive(bar);
  }

  // Ping-pong between the two consumer warpgroups (named barriers 3 and 4, both warpgroups
  // counted): a warpgroup issues its products only on its turn, then hands the turn over, so one's
  // softmax runs while the other's products occupy the tensor cores. Warpgroup 1 grants warpgroup
  // 0 the first turn; its own last hand-over is skipped so no arrival outlives the kernel.
  __device__ __forceinline__ void turn_wait() const {
    if constexpr (Tr::kPingPong) sm90::named_sync(3 + cw, 256);
  }
  __device__ __forceinline__ void turn_pass(bool last) const {
    if constexpr (Tr::kPingPong)
      if (!(last && cw == 1)) sm90::named_arrive(3 + (cw ^ 1), 256);
  }

  // FA3's intra-warpgroup overlap: block j's S = Q K_j^T and block j-1's O += P_{j-1} V_{j-1} are
  // issued together; the softmax of S_j runs while P V still accumulates, and O is rescaled to
  // the new maxima only once P V has landed.
  __device__ void run_pipelined() {
    if (ks.n_total == 0) return;
    sm90::mbar_wait(sm.bar_q(), 0);
    if (Tr::kPingPong && cw == 1) sm90::named_arrive(3, 256);
    Probs rP;
    {  // block 0: S only
      Scores rS;
      sm90::mbar_wait(sm.full_k(0), 0);
      turn_wait();
      sm90::wgmma_fence();
      issue_s(rS, 0);
      sm90::wgmma_commit();
      turn_pass(/*last=*/false);
      sm90::wgmma_wait<0>();
      sm90::fence_regs(rS[0]);
      release(sm.empty_k(0));
      if (ks.n_masked > 0) mask(rS, 0);
      float alpha[1][2];
      softmax.template update_stats<T>(rS, rP, alpha, a.scale_log2);  // O is still 0: nothing to rescale
    }
    // P alternates between two register sets (no copy at the end of a step: a copy of the
    // registers the next P V reads would land inside its wgmma stage and serialise it).
    Probs rP_b;
    auto step = [&](auto masked_tag, int it, Probs& rP_in, Probs& rP_out) {
      const int s = it % Tr::kStages, sp = (it - 1) % Tr::kStages;
      Scores rS;
      sm90::mbar_wait(sm.full_k(s), (it / Tr::kStages) & 1);
      sm90::mbar_wait(sm.full_v(sp), ((it - 1) / Tr::kStages) & 1);
      turn_wait();
      sm90::wgmma_fence();
      issue_s(rS, s);  // S_j = Q K_j^T
      sm90::wgmma_commit();
      issue_o(rP_in, sp);  // O += P_{j-1} V_{j-1}
      sm90::wgmma_commit();
      turn_pass(/*last=*/false);
      sm90::wgmma_wait<1>();  // S_j has landed; P V may still run
      sm90::fence_regs(rS[0]);
      release(sm.empty_k(s));
      if constexpr (decltype(masked_tag)::value) mask(rS, it);
      float alpha[1][2];
      const bool changed = softmax.template update_stats<T>(rS, rP_out, alpha, a.scale_log2);
      sm90::wgmma_wait<0>();
      sm90::fence_regs(rO[0]);
      sm90::fence_regs(rP_in[0]);
      release(sm.empty_v(sp));
      softmax.rescale(rO, alpha, changed);  // O = diag(exp2((m_old - m_new) c)) O
    };
    // Steps go in pairs so that P's register set is known at compile time in each.
    auto run_steps = [&](auto masked_tag, int& it, int end) {
      for (; it + 1 < end; it += 2) {
        step(masked_tag, it, rP, rP_b);
        step(masked_tag, it + 1, rP_b, rP);
      }
      if (it < end) {
        step(masked_tag, it, rP, rP_b);
        ++it;
        return true;  // P is in rP_b
      }
      return false;
    };
    int it = 1;
    bool in_b = run_steps(/*masked=*/std::true_type{}, it, ks.n_masked);
    // An odd masked run leaves P in rP_b; move it once (outside any wgmma stage) so the unmasked
    // run starts from rP.
    if (in_b) {
#pragma unroll
      for (int ni = 0; ni < Tr::kNTiles; ++ni) {
        rP[0][ni][0] = rP_b[0][ni][0];
        rP[0][ni][1] = rP_b[0][ni][1];
      }
    }
    in_b = run_steps(/*masked=*/std::false_type{}, it, ks.n_total);
    if (in_b) {
#pragma unroll
      for (int ni = 0; ni < Tr::kNTiles; ++ni) {
        rP[0][ni][0] = rP_b[0][ni][0];
        rP[0][ni][1] = rP_b[0][ni][1];
      }
    }
    {  // the last block's P V
      const int last = ks.n_total - 1, s = last % Tr::kStages;
      sm90::mbar_wait(sm.full_v(s), (last / Tr::kStages) & 1);
      turn_wait();
      sm90::wgmma_fence();
      issue_o(rP, s);
      sm90::wgmma_commit();
      turn_pass(/*last=*/true);
      sm90::wgmma_wait<0>();
      sm90::fence_regs(rO[0]);
      sm90::fence_regs(rP[0]);
      release(sm.empty_v(s));
    }
  }

  // The step-1 schedule, kept for the ablation (FLASHATTN_HOPPER_SCHEDULE=serial): per block
  // S, wait, softmax, P V, wait; no overlap inside the warpgroup, no turns.
  __device__ void run_serial() {
    if (ks.n_total == 0) return;
    sm90::mbar_wait(sm.bar_q(), 0);
    for (int it = 0; it < ks.n_total; ++it) {
      const int s = it % Tr::kStages;
      const uint32_t phase = (it / Tr::kStages) & 1;
      Scores rS;
      sm90::mbar_wait(sm.full_k(s), phase);
      sm90::wgmma_fence();
      issue_s(rS, s);
      sm90::wgmma_commit();
      sm90::wgmma_wait<0>();
      sm90::fence_regs(rS[0]);
      release(sm.empty_k(s));
      if (it < ks.n_masked) mask(rS, it);
      Probs rP;
      softmax.template update<T>(rS, rP, rO, a.scale_log2);
      sm90::mbar_wait(sm.full_v(s), phase);
      sm90::wgmma_fence();
      issue_o(rP, s);
      sm90::wgmma_commit();
      sm90::wgmma_wait<0>();
      sm90::fence_regs(rO[0]);
      sm90::fence_regs(rP[0]);
      release(sm.empty_v(s));
    }
  }

  // O /= l, lse; O goes back through this warpgroup's rows of the Q tile, in the same swizzled
  // panels, so one TMA store per panel writes it (and drops the rows past S_q).
  __device__ void epilogue() {
    float lse[1][2];
    softmax.finalize(rO, a.scale_log2, lse);
    float* gLse = a.lse + (static_cast<int64_t>(b) * a.H + h) * a.S_q;
    const int row_base = m0 + cw * 64;
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = warp * 16 + r * 8 + lane / 4;  // within the warpgroup's 64
      if (lane % 4 == 0 && row_base + row < a.S_q) gLse[row_base + row] = lse[0][r];
#pragma unroll
      for (int di = 0; di < Tr::kDTiles; ++di) {
        // Column 8*di + 2t: panel di/8, 16-byte chunk di%8 (swizzled by the row), word t.
        const uint32_t addr =
            q_base + (di / 8) * Tr::kPanelBytesQ + row * 128 + (((di % 8) ^ (row % 8)) << 4) + 4 * (lane % 4);
        sm90::st_shared_32(addr, mma::pack2<T>(rO[0][di][2 * r], rO[0][di][2 * r + 1]));
      }
    }
    sm90::fence_proxy_async();
    sm90::named_sync(/*id=*/1 + cw, /*threads=*/128);
    if (ctid == 0) {
#pragma unroll
      for (int p = 0; p < Tr::kPanels; ++p)
        sm90::tma_store_4d(&a.tm_o, q_base + p * Tr::kPanelBytesQ, p * 64, row_base, h, b);
      sm90::tma_store_commit();
      sm90::tma_store_wait_read();
    }
  }
};

template <class Tr, bool kBf16, bool kSerial>
__global__ void __launch_bounds__(Tr::kThreads, 1) forward_kernel(const __grid_constant__ Args a) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 900 && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  extern __shared__ __align__(1024) unsigned char smem[];
  const Smem<Tr> sm(sm90::smem_u32(smem));
  const int tid = threadIdx.x, wg = tid / 128;
  // Heaviest Q tiles first: under a causal mask the last tile sees the most keys.
  const int m_block = gridDim.x - 1 - blockIdx.x;
  const int h = blockIdx.y, b = blockIdx.z;
  const int m0 = m_block * Tr::kBlockM;
  const int m_last = min(m0 + Tr::kBlockM, a.S_q) - 1;
  const int seqlen_k = a.vis.seqlen_k(b);
  const KeySchedule<Tr> ks(a.vis, m0, m_last, seqlen_k);

  if (tid == 0) {
    sm90::mbar_init(sm.bar_q(), 1);
    for (int s = 0; s < Tr::kStages; ++s) {
      sm90::mbar_init(sm.full_k(s), 1);
      sm90::mbar_init(sm.full_v(s), 1);
      sm90::mbar_init(sm.empty_k(s), Tr::kConsumerWGs * 4);  // one arrival per consumer warp
      sm90::mbar_init(sm.empty_v(s), Tr::kConsumerWGs * 4);
    }
    sm90::fence_barrier_init();
  }
  __syncthreads();

  if (wg == 0) {
    sm90::setmaxnreg_dec<Tr::kProducerRegs>();
    if (tid == 0 && ks.n_total > 0) produce<Tr>(a, sm, ks, m0, h, b);
  } else {
    sm90::setmaxnreg_inc<Tr::kConsumerRegs>();
    Consumer<Tr, kBf16> c(a, sm, ks, m0, h, b, seqlen_k, wg - 1, tid - 128 * wg);
    if constexpr (kSerial)
      c.run_serial();
    else
      c.run_pipelined();
    c.epilogue();
  }
#endif
}

template <bool kBf16, int kHeadDim>
void launch(const FwdParams& p, const LaunchContext& ctx) {
  using Tr = typename TraitsFor<kHeadDim>::type;
  Args a;
  a.tm_q = sm90::make_tensor_map(p.q, p.dtype, p.q_st, p.B, p.H, p.S_q, p.D, Tr::kBlockM);
  a.tm_k = sm90::make_tensor_map(p.k, p.dtype, p.k_st, p.B, p.H_kv, p.S_k, p.D, Tr::kBlockN);
  a.tm_v = sm90::make_tensor_map(p.v, p.dtype, p.v_st, p.B, p.H_kv, p.S_k, p.D, Tr::kBlockN);
  a.tm_o = sm90::make_tensor_map(p.o, p.dtype, p.o_st, p.B, p.H, p.S_q, p.D, 64);
  a.lse = static_cast<float*>(p.lse);
  a.H = p.H;
  a.h_per_kv = p.H / p.H_kv;
  a.S_q = p.S_q;
  a.scale_log2 = p.scale_log2;
  a.vis = make_visibility(p);
  const KeyShifts shifts = key_shifts(a.vis);
  a.key_lo_shift = shifts.lo;
  a.key_hi_shift = shifts.hi;

  // FLASHATTN_HOPPER_SCHEDULE=serial runs the step-1 schedule (docs/PERF.md's ablation); it is
  // compiled for bf16 at D=128 only, to keep the build lean.
  const char* sched = std::getenv("FLASHATTN_HOPPER_SCHEDULE");
  const bool serial = sched != nullptr && std::string(sched) == "serial";
  if (sched != nullptr && !serial && std::string(sched) != "pipelined")
    throw RuntimeError(std::string("FLASHATTN_HOPPER_SCHEDULE: expected serial or pipelined, got '") + sched + "'");
  auto kernel = &forward_kernel<Tr, kBf16, false>;
  if (serial) {
    if constexpr (kBf16 && kHeadDim == 128)
      kernel = &forward_kernel<Tr, kBf16, true>;
    else
      throw RuntimeError("FLASHATTN_HOPPER_SCHEDULE=serial is built for bf16 at D=128 only");
  }
  CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, Tr::kSmemBytes));
  const dim3 grid((p.S_q + Tr::kBlockM - 1) / Tr::kBlockM, p.H, p.B);
  kernel<<<grid, Tr::kThreads, Tr::kSmemBytes, ctx.stream>>>(a);
  CHECK_LAUNCH("hopper forward_kernel");
}

template <bool kBf16>
void dispatch_head_dim(const FwdParams& p, const LaunchContext& ctx) {
  switch (p.D) {
    case 64: return launch<kBf16, 64>(p, ctx);
    case 128: return launch<kBf16, 128>(p, ctx);
    case 256: return launch<kBf16, 256>(p, ctx);
    default: throw RuntimeError("hopper forward: no variant compiled for head dim " + std::to_string(p.D));
  }
}

bool has_own_variant(const FwdParams& p) {
  const bool dim_ok = p.D == 64 || p.D == 128 || p.D == 256;
  const bool scale_ok = p.scale_log2 > 0.f && std::isfinite(p.scale_log2);
  return dim_ok && scale_ok && p.mask.ptr == nullptr;
}

void run(const FwdParams& p, const LaunchContext& ctx) {
  if (static_cast<int64_t>(p.B) * p.H * p.S_q == 0) return;
  if (!has_own_variant(p)) {
    // Head dims 32 and 96 (and a non-positive scale) take the mma.sync kernel, as --list says.
    const KernelMode* mma = Registry::find("mma", Mode::Forward);
    if (mma == nullptr || mma->fwd == nullptr) throw RuntimeError("hopper forward: the mma fallback is not built");
    return mma->fwd(p, ctx);
  }
  if (ctx.sm != 90) throw RuntimeError("hopper forward: built for sm_90a only; this GPU is sm_" + std::to_string(ctx.sm));
  // Tensor maps need 16-byte aligned base addresses and strides, too.
  check_tiled_forward(p, "hopper forward");
  switch (p.dtype) {
    case DType::F16: return dispatch_head_dim<false>(p, ctx);
    case DType::BF16: return dispatch_head_dim<true>(p, ctx);
    default: throw RuntimeError(std::string("hopper forward: no variant compiled for dtype ") + dtype_name(p.dtype));
  }
}

KernelMode make_entry() {
  KernelMode m;
  m.kernel = "hopper";
  m.mode = Mode::Forward;
  m.summary = "FlashAttention-3 style forward: TMA + mbarrier ring, wgmma (P from registers), producer/consumer "
              "warpgroups with setmaxnreg; sm_90a; D 32/96 run mma";
  m.rung = 8;
  m.gpu = true;
  m.min_sm = 90;
  m.max_sm = 90;  // sm_90a code runs on compute capability 9.0 only
  m.dtypes = dtype_bit(DType::F16) | dtype_bit(DType::BF16);
  m.head_dims = {32, 64, 96, 128, 256};
  m.fallback_head_dims = {32, 96};
  m.fallback_kernel = "mma";
  m.features = kAllFeatures & ~kFeatMask;
  m.uses_atomics = false;
  m.fwd = &run;
  m.fwd_workspace = nullptr;
  return m;
}

}  // namespace hopper_fwd
}  // namespace flashattn

FLASHATTN_REGISTER_KERNEL_MODE(hopper_forward, flashattn::hopper_fwd::make_entry)

// The hopper forward kernel's tile: its configuration per head dim, the kernel arguments, the
// shared-memory map, the key-block schedule, and the consumer warpgroup (its two schedules and
// its epilogue). Device code for kernels/hopper_fwd.cu alone; the file's header there describes
// the algorithm.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "common/frag_softmax.cuh"
#include "common/lse_merge.cuh"
#include "common/key_blocks.cuh"
#include "common/mask.cuh"
#include "common/mma_sm80.cuh"
#include "common/sm90.cuh"
#include "common/sm90_wgmma_ops.cuh"

namespace flashattn {
namespace hopper_fwd {

// Tile configuration per head dim. wgmma's M is 64 per warpgroup, so each consumer warpgroup owns
// 64 query rows; the accumulators (O: 64 x D, S: 64 x kBlockN, fp32) live in its 128 threads'
// registers, D/2 + kBlockN/2 floats each, under the registers setmaxnreg grants (240 with two
// consumer warpgroups, 160 with three).
template <int kHeadDim_, int kBlockN_, int kStages_, bool kPingPong_, int kConsumerWGs_ = 2,
          bool kPInPlace_ = (kConsumerWGs_ > 2)>
struct Traits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockN = kBlockN_;
  static constexpr int kStages = kStages_;
  static constexpr bool kPingPong = kPingPong_;  // consumer warpgroups take turns issuing products
  static constexpr int kConsumerWGs = kConsumerWGs_;
  static constexpr int kBlockM = 64 * kConsumerWGs;
  static constexpr int kThreads = 128 * (kConsumerWGs + 1);
  // __launch_bounds__(kThreads, 1) gives the CTA 65536 / kThreads registers per thread (168 at 384
  // threads, 128 at 512); setmaxnreg only moves them between warpgroups, so producer + consumers
  // must fit: (24 + 2 x 240) x 128 = 64512, (24 + 3 x 160) x 128 = 64512.
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = kConsumerWGs == 2 ? 240 : 160;
  // P in one register set, computed in place in the score registers and rounded into that set
  // once the previous P·V has landed; otherwise two sets, the next P written while the previous
  // P·V still reads the other. Three consumers (160 registers) have no room for two sets.
  static constexpr bool kPInPlace = kPInPlace_;

  static constexpr int kPanels = kHeadDim / 64;  // 64-element (128-byte) swizzle panels per row
  static constexpr int kPanelBytesQ = kBlockM * 128;
  static constexpr int kTileQBytes = kPanels * kPanelBytesQ;  // (kBlockM, kHeadDim)
  static constexpr int kPanelBytesKV = kBlockN * 128;
  static constexpr int kTileKVBytes = kPanels * kPanelBytesKV;  // (kBlockN, kHeadDim)
  static constexpr int kNTiles = kBlockN / 8;  // n8 tiles of S per warp
  static constexpr int kDTiles = kHeadDim / 8;  // n8 tiles of O per warp
  // mbarriers: Q full and empty, K/V full and empty per stage, tile-id slots full and empty (2
  // each); then the two tile ids.
  static constexpr int kBarrierBytes = 8 * (2 + 4 * kStages + 4) + 16;
  static constexpr int kBaseBytes = 1024 + kTileQBytes + 2 * kStages * kTileKVBytes + kBarrierBytes;
  // O is staged in a buffer of its own when it fits, so the next tile's Q can load while this
  // tile's O is still being stored; otherwise (D=256) in the Q tile, after the last S.
  static constexpr bool kSeparateO = kBaseBytes + kTileQBytes <= 227 * 1024;
  // 1024 spare bytes so the tiles can start on a 1024-byte boundary (the swizzle atom).
  static constexpr int kSmemBytes = kBaseBytes + (kSeparateO ? kTileQBytes : 0);

  static_assert(kHeadDim % 64 == 0, "whole 128-byte panels");
  static_assert(!kPingPong || kConsumerWGs == 2, "ping-pong alternates two warpgroups");
  static_assert(kConsumerWGs == 2 || kConsumerWGs == 3, "register split defined for 2 or 3 consumers");
  static_assert(kPInPlace || kConsumerWGs == 2, "two P register sets do not fit 160 registers");
  static_assert(kBlockN % 16 == 0 && kBlockN <= 256, "wgmma N and k16 steps over keys");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory a CTA may opt in to on the H100");
};

template <int kHeadDim> struct TraitsFor;
// D=64: 192-row tiles, three consumer warpgroups (S 64 + O 32 + P 32 registers each) without
// turns: the softmax, not the tensor cores, bounds D64, and three warpgroups keep more of it in
// flight than two taking turns; 24 KB Q + 2 x 2 x 16 KB of K/V + 24 KB O = 113 KB shared.
template <> struct TraitsFor<64> { using type = Traits<64, 128, 2, false, 3>; };
// D=64 under a causal mask or window below 2048 queries, or on a grid of under four waves:
// 128-row tiles, two warpgroups taking turns (hopper_fwd.cu, d64_wide_tiles, says why).
using TraitsD64Narrow = Traits<64, 128, 2, true>;
// D=128: S 64 + O 64 + P 32 registers; 32 KB + 2 x 2 x 32 KB = 160 KB shared.
template <> struct TraitsFor<128> { using type = Traits<128, 128, 2, true>; };
// D=128 on long rows: 192-row tiles, three consumer warpgroups without turns, 80 keys per block
// (S 40 + O 64 + P 20 registers, P in place, within 160; 96 keys spill inside the key loop): each
// K/V block feeds 192 query rows instead of 128, so a third less K/V leaves L2 per product, which
// is power the tensor cores get back where the GPU runs at its cap (hopper_fwd.cu,
// d128_wide_tiles, says where). 48 KB Q + 3 x 2 x 20 KB K/V + 48 KB O = 217 KB shared.
using TraitsD128Wide = Traits<128, 80, 3, false, 3>;
// D=256: O alone is 128 registers; 80 keys per block (S 40 + P 20 registers, P in place) fill the
// shared memory: 64 KB + 2 x 2 x 40 KB = 224 KB (4 % faster than 64 keys with two P sets).
template <> struct TraitsFor<256> { using type = Traits<256, 80, 2, true, 2, true>; };

// The tile counter of the persistent grid.
constexpr size_t kWorkspaceBytes = 16;

struct Args {
  CUtensorMap tm_q;  // (D, S_q, H, B), boxes of (64, kBlockM)
  CUtensorMap tm_k;  // (D, S_k, H_kv, B), boxes of (64, kBlockN)
  CUtensorMap tm_v;
  CUtensorMap tm_o;  // (D, S_q, H, B), boxes of (64, 64): one consumer warpgroup's rows
  float* lse = nullptr;  // [B, H, S_q], rows lse_stride floats apart
  int64_t lse_stride = 0;
  // FwdParams::merge_output: O (o_in, element strides o_sb, o_sh, o_ss by batch, head and row) and
  // lse already hold another result of the same rows, combined with this one in the epilogue.
  bool merge = false;
  const void* o_in = nullptr;
  int64_t o_sb = 0, o_sh = 0, o_ss = 0;
  // The persistent grid's tile counter (workspace; the launch zeroes it): CTA c starts with tile
  // c, then takes gridDim.x + the counter's old value, so tiles go out in order as CTAs free up.
  unsigned* tile_counter = nullptr;
  int num_m_blocks = 0, num_tiles = 0;  // tiles: (m block, head, batch), m block fastest
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
  uint32_t q, k, v, o, bars;
  __device__ explicit Smem(uint32_t raw) {
    q = (raw + 1023) & ~1023u;                     // (kBlockM, kHeadDim), kPanels panels
    k = q + Tr::kTileQBytes;                        // kStages x (kBlockN, kHeadDim)
    v = k + Tr::kStages * Tr::kTileKVBytes;         // kStages x (kBlockN, kHeadDim)
    o = Tr::kSeparateO ? v + Tr::kStages * Tr::kTileKVBytes : q;  // (kBlockM, kHeadDim)
    bars = v + Tr::kStages * Tr::kTileKVBytes + (Tr::kSeparateO ? Tr::kTileQBytes : 0);  // 8-byte mbarriers
  }
  __device__ uint32_t bar_q() const { return bars; }
  __device__ uint32_t empty_q() const { return bars + 8; }
  __device__ uint32_t full_k(int s) const { return bars + 8 * (2 + s); }
  __device__ uint32_t full_v(int s) const { return bars + 8 * (2 + Tr::kStages + s); }
  // K and V of a stage are released separately: K as soon as S = Q K^T is done, V after P V.
  __device__ uint32_t empty_k(int s) const { return bars + 8 * (2 + 2 * Tr::kStages + s); }
  __device__ uint32_t empty_v(int s) const { return bars + 8 * (2 + 3 * Tr::kStages + s); }
  // The producer hands each tile index (or -1: no more) to the consumers through two slots.
  __device__ uint32_t full_tile(int slot) const { return bars + 8 * (2 + 4 * Tr::kStages + slot); }
  __device__ uint32_t empty_tile(int slot) const { return bars + 8 * (4 + 4 * Tr::kStages + slot); }
  __device__ uint32_t tile_id(int slot) const { return bars + 8 * (6 + 4 * Tr::kStages) + 4 * slot; }
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

// A work tile: kBlockM query rows of one (head, batch). Tiles are numbered m block fastest, the
// last (under a causal mask the heaviest) m block first, so CTAs working at the same time share
// one head's K/V in L2, as the blocks of a one-tile-per-CTA grid would.
template <class Tr>
struct Tile {
  int m0, h, b, m_last, seqlen_k;
  __device__ Tile(const Args& a, int t) {
    const int m_block = a.num_m_blocks - 1 - t % a.num_m_blocks;
    const int hb = t / a.num_m_blocks;
    h = hb % a.H;
    b = hb / a.H;
    m0 = m_block * Tr::kBlockM;
    m_last = min(m0 + Tr::kBlockM, a.S_q) - 1;
    seqlen_k = a.vis.seqlen_k(b);
  }
};

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
  int it_base;      // ring position of this tile's first key block
  uint32_t q_base;  // this warpgroup's 64 rows within each Q panel
  uint32_t o_base;  // ... and within each panel of the O staging tile
  float rO[1][Tr::kDTiles][4];  // (64, kHeadDim) per warpgroup, (16, kHeadDim) per warp
  mma::OnlineSoftmax<1, Tr::kNTiles> softmax;

  __device__ Consumer(const Args& a_, const Smem<Tr>& sm_, const KeySchedule<Tr>& ks_, const Tile<Tr>& t, int cw_,
                      int ctid_, int it_base_)
      : a(a_), sm(sm_), ks(ks_), m0(t.m0), h(t.h), b(t.b), seqlen_k(t.seqlen_k), cw(cw_), ctid(ctid_),
        it_base(it_base_) {
    lane = ctid % 32;
    warp = ctid / 32;
    q_base = sm.q + cw * 64 * 128;
    o_base = sm.o + cw * 64 * 128;
#pragma unroll
    for (int di = 0; di < Tr::kDTiles; ++di)
#pragma unroll
      for (int e = 0; e < 4; ++e) rO[0][di][e] = 0.f;
    softmax.init();
  }

  // Issues S = Q K^T for the K in stage s: k16 steps over the head dim, 32 bytes apart inside a
  // 128-byte panel, panel by panel.
  __device__ __forceinline__ void issue_s(Scores& rS, int s) const {
    const sm90::Desc da(q_base, 16, 1024), db(sm.k_stage(s), 16, 1024);
#pragma unroll
    for (int kk = 0; kk < Tr::kHeadDim / 16; ++kk) {
      const uint32_t off = (kk % 4) * 32;
      MmaS::ss(rS[0], da.at((kk / 4) * Tr::kPanelBytesQ + off), db.at((kk / 4) * Tr::kPanelBytesKV + off), kk > 0 ? 1 : 0);
    }
  }

  // Issues O += P V for the V in stage s: k16 steps over the keys. V is MN-major for this product:
  // 16 keys are two 8-row groups (SBO 1024), head-dim panels kPanelBytesKV apart (LBO).
  __device__ __forceinline__ void issue_o(const Probs& rP, int s) {
    const sm90::Desc db(sm.v_stage(s), Tr::kPanelBytesKV, 1024);
#pragma unroll
    for (int kk = 0; kk < Tr::kBlockN / 16; ++kk) {
      const uint32_t pa[4] = {rP[0][2 * kk][0], rP[0][2 * kk][1], rP[0][2 * kk + 1][0], rP[0][2 * kk + 1][1]};
      MmaO::rs(rO[0], pa, db.at(kk * 2048), 1);
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

  // Ping-pong between the two consumer warpgroups (named barriers 5 and 6, both warpgroups counted;
  // 1 to 3 are the epilogue's): a warpgroup issues its products only on its turn, then hands the
  // turn over, so one's softmax runs while the other's products occupy the tensor cores. The turns
  // run on across tiles (both warpgroups see the same tiles): warpgroup 1 grants warpgroup 0 the
  // first turn when the kernel starts, and warpgroup 0 takes one turn more when it ends, which
  // consumes warpgroup 1's last hand-over (forward_kernel, before and after its tile loop).
  __device__ __forceinline__ void turn_wait() const {
    if constexpr (Tr::kPingPong) sm90::named_sync(5 + cw, 256);
  }
  __device__ __forceinline__ void turn_pass() const {
    if constexpr (Tr::kPingPong) sm90::named_arrive(5 + (cw ^ 1), 256);
  }
  // Stage and phase of the tile's key block it in the ring.
  __device__ __forceinline__ int stage(int it) const { return (it_base + it) % Tr::kStages; }
  __device__ __forceinline__ uint32_t phase(int it) const { return ((it_base + it) / Tr::kStages) & 1; }
  // With a separate O buffer the Q tile is free once the tile's last S is done.
  __device__ __forceinline__ void release_q_if_last(int it) const {
    if (Tr::kSeparateO && it == ks.n_total - 1) release(sm.empty_q());
  }

  // FA3's intra-warpgroup overlap: block j's S = Q K_j^T and block j-1's O += P_{j-1} V_{j-1} are
  // issued together; the softmax of S_j runs while P V still accumulates, and O is rescaled to
  // the new maxima only once P V has landed.
  __device__ void run_pipelined() {
    Probs rP;
    {  // block 0: S only
      Scores rS;
      sm90::mbar_wait(sm.full_k(stage(0)), phase(0));
      turn_wait();
      sm90::wgmma_fence();
      issue_s(rS, stage(0));
      sm90::wgmma_commit();
      turn_pass();
      sm90::wgmma_wait<0>();
      sm90::fence_regs(rS[0]);
      release(sm.empty_k(stage(0)));
      release_q_if_last(0);
      if (ks.n_masked > 0) mask(rS, 0);
      float alpha[1][2];
      softmax.template update_stats<T>(rS, rP, alpha, a.scale_log2);  // O is still 0: nothing to rescale
    }
    if constexpr (Tr::kPInPlace)
      run_in_place(rP);
    else
      run_two_sets(rP);
    last_pv(rP);
  }

  // The first half of step j (both schedules): on this warpgroup's turn, S_j = Q K_j^T and
  // O += P_{j-1} V_{j-1} issued as two wgmma groups; then the wait for S_j only (P V may still
  // run), K_j released, and S_j masked on a boundary block.
  template <bool kMasked>
  __device__ __forceinline__ void issue_step(Scores& rS, Probs& rP_in, int it) {
    const int s = stage(it), sp = stage(it - 1);
    sm90::mbar_wait(sm.full_k(s), phase(it));
    sm90::mbar_wait(sm.full_v(sp), phase(it - 1));
    turn_wait();
    sm90::wgmma_fence();
    issue_s(rS, s);  // S_j = Q K_j^T
    sm90::wgmma_commit();
    issue_o(rP_in, sp);  // O += P_{j-1} V_{j-1}
    sm90::wgmma_commit();
    turn_pass();
    sm90::wgmma_wait<1>();  // S_j has landed; P V may still run
    sm90::fence_regs(rS[0]);
    release(sm.empty_k(s));
    release_q_if_last(it);
    if constexpr (kMasked) mask(rS, it);
  }

  // P_{j-1} V_{j-1} has landed: O and P_{j-1}'s registers are settled, V_{j-1} is released.
  __device__ __forceinline__ void finish_pv(Probs& rP_in, int it) {
    sm90::wgmma_wait<0>();
    sm90::fence_regs(rO[0]);
    sm90::fence_regs(rP_in[0]);
    release(sm.empty_v(stage(it - 1)));
  }

  // Blocks 1 .. n-1 with P in two register sets, alternating (no copy at the end of a step: a copy
  // of the registers the next P V reads would land inside its wgmma stage and serialise it).
  __device__ __forceinline__ void run_two_sets(Probs& rP) {
    Probs rP_b;
    auto step = [&](auto masked_tag, int it, Probs& rP_in, Probs& rP_out) {
      Scores rS;
      issue_step<decltype(masked_tag)::value>(rS, rP_in, it);
      float alpha[1][2];
      const bool changed = softmax.template update_stats<T>(rS, rP_out, alpha, a.scale_log2);
      finish_pv(rP_in, it);
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
  }

  // The same schedule with one P register set (Tr::kPInPlace): block j's softmax leaves P in S's
  // registers (fp32) while P_{j-1} V_{j-1} still reads rP, and P is rounded into rP after it lands.
  __device__ __forceinline__ void run_in_place(Probs& rP) {
    auto step = [&](auto masked_tag, int it) {
      Scores rS;
      issue_step<decltype(masked_tag)::value>(rS, rP, it);
      float alpha[1][2];
      const bool changed = softmax.update_stats_in_place(rS, alpha, a.scale_log2);
      finish_pv(rP, it);
      softmax.rescale(rO, alpha, changed);
      softmax.template pack_probs<T>(rS, rP);
      sm90::fence_regs(rP[0]);  // rounded before the next wgmma stage opens
    };
    int it = 1;
    for (; it < ks.n_masked; ++it) step(std::true_type{}, it);
    for (; it < ks.n_total; ++it) step(std::false_type{}, it);
  }

  // The last block's P V.
  __device__ __forceinline__ void last_pv(Probs& rP) {
    const int last = ks.n_total - 1, s = stage(last);
    sm90::mbar_wait(sm.full_v(s), phase(last));
    turn_wait();
    sm90::wgmma_fence();
    issue_o(rP, s);
    sm90::wgmma_commit();
    turn_pass();
    sm90::wgmma_wait<0>();
    sm90::fence_regs(rO[0]);
    sm90::fence_regs(rP[0]);
    release(sm.empty_v(s));
  }

  // The step-1 schedule, kept for the ablation (FLASHATTN_HOPPER_SCHEDULE=serial): per block
  // S, wait, softmax, P V, wait; no overlap inside the warpgroup, no turns.
  __device__ void run_serial() {
    for (int it = 0; it < ks.n_total; ++it) {
      const int s = stage(it);
      Scores rS;
      sm90::mbar_wait(sm.full_k(s), phase(it));
      sm90::wgmma_fence();
      issue_s(rS, s);
      sm90::wgmma_commit();
      sm90::wgmma_wait<0>();
      sm90::fence_regs(rS[0]);
      release(sm.empty_k(s));
      release_q_if_last(it);
      if (it < ks.n_masked) mask(rS, it);
      Probs rP;
      softmax.template update<T>(rS, rP, rO, a.scale_log2);
      sm90::mbar_wait(sm.full_v(s), phase(it));
      sm90::wgmma_fence();
      issue_o(rP, s);
      sm90::wgmma_commit();
      sm90::wgmma_wait<0>();
      sm90::fence_regs(rO[0]);
      sm90::fence_regs(rP[0]);
      release(sm.empty_v(s));
    }
  }

  // FwdParams::merge_output: the result O and lse already hold for these rows (other keys) and
  // this tile's, combined by their lse before O is stored over it. Each thread reads its own
  // fragment's elements (two rows, kDTiles pairs each) and its rows' lse (the four lanes of a row
  // read the same word) first: no load depends on another, so all are in flight together. (Issuing
  // them earlier, under the last P V or the softmax's last reductions, costs spills in the main
  // loop.)
  __device__ void merge_output(float (&lse)[1][2], const float* gLse) {
    const T* gO = static_cast<const T*>(a.o_in) + b * a.o_sb + h * a.o_sh + 2 * (lane % 4);
    uint32_t o_in[2][Tr::kDTiles];
    float lse_in[2];
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = m0 + cw * 64 + warp * 16 + r * 8 + lane / 4;
      const bool valid = row < a.S_q;
      lse_in[r] = valid ? gLse[row - m0 - cw * 64] : -INFINITY;
      const T* src = gO + row * a.o_ss;
#pragma unroll
      for (int di = 0; di < Tr::kDTiles; ++di)
        o_in[r][di] = valid ? *reinterpret_cast<const uint32_t*>(src + 8 * di) : 0u;
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {  // a row past S_q: O unchanged, or 0 where both lse are -inf
      float merged, w_in, w_new;
      lse_merge_weights(lse_in[r], lse[0][r], &merged, &w_in, &w_new);
      lse[0][r] = merged;
#pragma unroll
      for (int di = 0; di < Tr::kDTiles; ++di) {
        const float2 x = mma::unpack2<T>(o_in[r][di]);
        rO[0][di][2 * r] = w_in * x.x + w_new * rO[0][di][2 * r];
        rO[0][di][2 * r + 1] = w_in * x.y + w_new * rO[0][di][2 * r + 1];
      }
    }
  }

  // O /= l, lse; O goes back through this warpgroup's rows of the staging tile (a buffer of its
  // own, or the Q tile where there is no room), in the Q tile's swizzled panels, so one TMA store
  // per panel writes it (and drops the rows past S_q).
  __device__ void epilogue() {
    float lse[1][2];
    softmax.finalize(rO, a.scale_log2, lse);
    const int row_base = m0 + cw * 64;
    // This warpgroup's rows of the (batch, head)'s lse, rows lse_stride floats apart.
    float* gLse = a.lse + (static_cast<int64_t>(b) * a.H + h) * a.lse_stride + row_base;
    if (a.merge) merge_output(lse, gLse);
    if constexpr (Tr::kSeparateO) {
      // The previous tile's store must have read these rows before they are written again.
      if (ctid == 0) sm90::tma_store_wait_read();
      sm90::named_sync(/*id=*/1 + cw, /*threads=*/128);
    }
#pragma unroll
    for (int r = 0; r < 2; ++r) {
      const int row = warp * 16 + r * 8 + lane / 4;  // within the warpgroup's 64
      if (lane % 4 == 0 && row_base + row < a.S_q) gLse[row] = lse[0][r];
#pragma unroll
      for (int di = 0; di < Tr::kDTiles; ++di) {
        // Column 8*di + 2t: panel di/8, 16-byte chunk di%8 (swizzled by the row), word t.
        const uint32_t addr =
            o_base + (di / 8) * Tr::kPanelBytesQ + sm90::swizzled_offset(row, di % 8, lane % 4);
        sm90::st_shared_32(addr, mma::pack2<T>(rO[0][di][2 * r], rO[0][di][2 * r + 1]));
      }
    }
    sm90::fence_proxy_async();
    sm90::named_sync(/*id=*/1 + cw, /*threads=*/128);
    if (ctid == 0) {
#pragma unroll
      for (int p = 0; p < Tr::kPanels; ++p)
        sm90::tma_store_4d(&a.tm_o, o_base + p * Tr::kPanelBytesQ, p * 64, row_base, h, b);
      sm90::tma_store_commit();
      if constexpr (!Tr::kSeparateO) sm90::tma_store_wait_read();
    }
    if constexpr (!Tr::kSeparateO) {  // O was staged in the Q tile: free it once the store has read it
      sm90::named_sync(/*id=*/1 + cw, /*threads=*/128);
      release(sm.empty_q());
    }
  }
};

}  // namespace hopper_fwd
}  // namespace flashattn

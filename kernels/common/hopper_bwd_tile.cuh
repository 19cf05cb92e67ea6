// The hopper backward kernel's pieces: its configuration per head dim, the kernel arguments, the
// shared-memory map, the step list every role walks, the producer and the dQ writer (the consumer
// warpgroup is in hopper_bwd_consumer.cuh). Device code for kernels/hopper_bwd.cu alone; the
// file's header there describes the algorithm.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "common/key_blocks.cuh"
#include "common/mask.cuh"
#include "common/sm90.cuh"
#include "flashattn/params.h"

namespace flashattn {
namespace hopper_bwd {

// One CTA owns kBlockN = 128 keys of one (kv head, batch); each of its two consumer warpgroups owns
// 64 of them (wgmma's M), with dK and dV of those keys (64 x D fp32 each) in its registers for the
// whole kernel. A step is one block of kBlockM queries of one query head of the group.
//   D = 128: kBlockM = 64. Registers per consumer thread: dK 64 + dV 64 + S^T 32 + dP^T 32, under
//            the 240 that setmaxnreg grants. dQ = dS K (64 queries x 128 head-dim columns, over the
//            CTA's 128 keys) is formed by consumer warpgroup 1 alone, once its dK and dV have
//            landed (its 64 accumulator registers take the place of S^T's and dP^T's); consumer
//            warpgroup 0 goes on to the next step meanwhile, so its products fill the tensor pipe
//            under warpgroup 1's dQ.
//   D = 64:  kBlockM = 128 (dK + dV are only 64 registers, so S^T and dP^T can be 64 x 128):
//            dQ = dS K, each warpgroup 64 of the queries (64w .. 64w + 63).
template <int kHeadDim_, int kBlockM_>
struct Traits {
  static constexpr int kHeadDim = kHeadDim_;
  static constexpr int kBlockM = kBlockM_;  // queries per step
  static constexpr int kBlockN = 128;       // keys per CTA
  static constexpr int kConsumerWGs = 2;
  static constexpr int kThreads = 128 * (kConsumerWGs + 1);
  static constexpr int kStages = 2;  // Q/dO/lse/D_i ring depth
  // (24 + 2 x 240) x 128 = 64512 <= 65536 registers of the SM.
  static constexpr int kProducerRegs = 24;
  static constexpr int kConsumerRegs = 240;

  static constexpr int kPanels = kHeadDim / 64;  // 128-byte swizzle panels per row
  static constexpr int kPanelBytesQ = kBlockM * 128;
  static constexpr int kTileQBytes = kPanels * kPanelBytesQ;  // Q, dO: (kBlockM, kHeadDim)
  static constexpr int kPanelBytesK = kBlockN * 128;
  static constexpr int kTileKBytes = kPanels * kPanelBytesK;  // K, V: (kBlockN, kHeadDim)
  static constexpr int kStatBytes = kBlockM * 4;               // lse·log2 e or D_i of a step
  // dS as (kBlockM queries, kBlockN keys) in two 64-key panels (warpgroup w writes panel w, its
  // keys, transposed from its dS^T registers): dQ's K-major operand over the keys. Two buffers, so
  // one warpgroup can write step t+1's while the other still reads t's.
  static constexpr int kDsPanelBytes = kBlockM * 128;
  static constexpr int kDsBytes = (kBlockN / 64) * kDsPanelBytes;
  // dQ of a step in fp32, in the accumulator's layout (DqLayout): what the copy engine adds into it.
  static constexpr int kDqBytes = kBlockM * kHeadDim * 4;
  static constexpr bool kDqOneWG = kHeadDim == 128;  // dQ by consumer warpgroup 1 alone; else half each
  // CTAs start in phase with the running ones (Args::phase): D128 (D64 has no registers to spare).
  static constexpr bool kPhased = kHeadDim == 128;
  static constexpr int kDqWarps = kDqOneWG ? 4 : 4 * kConsumerWGs;  // warps that store a step's dQ
  static constexpr int kDqTiles = kHeadDim / 8;  // n8 tiles of a dQ accumulator (64 queries)
  static constexpr int kMTiles = kBlockM / 8;   // n8 tiles of S^T per warp (columns are queries)
  static constexpr int kDTiles = kHeadDim / 8;  // n8 tiles of dK, dV per warp

  // mbarriers: K/V full; Q full, dO full, Q/dO empty per stage; dQ full, empty per buffer; t0.
  static constexpr int kBarrierBytes = 8 * (1 + 3 * kStages + 2 * 2 + 1);
  static constexpr int kBaseBytes = 1024 /* alignment slack */ + 2 * kTileKBytes + 2 * kStages * kTileQBytes +
                                    2 * kStages * kStatBytes + 2 * kDsBytes + kDqBytes + kBarrierBytes;
  // A second dQ buffer where it fits (D128: 226 KB; D64's 128-query dS buffers leave no room), so
  // the consumers need not wait for the copy engine to have read the previous step's dQ.
  static constexpr int kDqBuffers = kBaseBytes + kDqBytes <= 227 * 1024 ? 2 : 1;
  static constexpr int kSmemBytes = kBaseBytes + (kDqBuffers - 1) * kDqBytes;

  static_assert(kHeadDim % 64 == 0, "whole 128-byte panels");
  static_assert(kDqOneWG ? kBlockM == 64 : kBlockM == 64 * kConsumerWGs,
                "a warpgroup's dQ accumulator holds 64 queries (wgmma's M)");
  static_assert(kBlockM % kDqAccumRows == 0 && kBlockM <= kDqAccumSpare, "whole row groups of the dQ accumulator");
  static_assert(kSmemBytes <= 227 * 1024, "shared memory a CTA may opt in to on the H100");
};

template <int kHeadDim> struct TraitsFor;
template <> struct TraitsFor<64> { using type = Traits<64, 128>; };
template <> struct TraitsFor<128> { using type = Traits<128, 64>; };

// The dQ accumulator's layout (the workspace's and a caller's, BwdParams::dq_accum): fp32 rows of
// kHeadDim per (batch, head), in groups of kDqAccumRows = 16 rows; inside a group the 16 x kHeadDim
// floats lie in the order one warp's dQ fragments give them (16-byte stores without bank
// conflicts), so any step height that is a multiple of 16 writes whole groups. Float4 f = ni·32 +
// lane of a group (n8 tile ni of the warp's 16 queries) holds (row, col) = (lane / 4, 8·ni +
// 2·(lane % 4)), then the next column (+ step1), the row eight on (+ step2), and both.
template <int kHeadDim>
struct DqLayout {
  static constexpr int kGroupFloat4s = kDqAccumRows * kHeadDim / 4;
  static constexpr int step1_row = 0, step1_col = 1, step2_row = 8, step2_col = 0;
  int row, col;
  __device__ explicit DqLayout(int f) {
    const int lane = f % 32, ni = f / 32;
    row = lane / 4, col = 8 * ni + 2 * (lane % 4);
  }
};

struct Args {
  CUtensorMap tm_q, tm_do;   // (D, S_q, H, B), boxes of (64, kBlockM)
  CUtensorMap tm_k, tm_v;    // (D, S_k, H_kv, B), boxes of (64, kBlockN)
  CUtensorMap tm_dk, tm_dv;  // (D, S_k, H_kv, B), boxes of (64, 64): one warpgroup's keys
  const float* lse2 = nullptr;  // [B, H, S_pad]: lse·log2 e, +inf for empty rows and rows >= S_q
  const float* dsum = nullptr;  // [B, H, S_pad]: D_i = rowsum(dO ∘ O), 0 for rows >= S_q
  // [B, H, dq_rows, D] fp32 in DqLayout, the call's query row 0 at row dq_row0 of its (batch,
  // head): the workspace's (dq_rows = S_pad, zeroed by the launch), or the caller's
  // (BwdParams::dq_accum).
  float* dq_accum = nullptr;
  int dq_rows = 0, dq_row0 = 0;
  // --deterministic: [B, H, S_pad / kBlockM] counters (zeroed by the launch), null otherwise.
  int* dq_sem = nullptr;
  // [B, H_kv] (zeroed by the launch, null under --deterministic and at D64): where the CTAs of a
  // (batch, kv head) are, r·65536 + Q block, published by the producers; a CTA starts there.
  int* phase = nullptr;
  // BwdParams::tiles_*: CTA x takes tile tile0 + x of the (batch, kv head, key block) order, n_kb
  // key blocks per (batch, kv head), on a one-dimensional grid; n_kb = 0: the (key block, kv head,
  // batch) grid.
  int n_kb = 0, tile0 = 0;
  // BwdParams::grads_f32: dK and dV stored by the consumers in fp32 at these strides (floats),
  // keys below S_k (no TMA, no rounding); null otherwise.
  float* dk_f32 = nullptr;
  float* dv_f32 = nullptr;
  Strides dk_f32_st, dv_f32_st;
  int S_k = 0;
  int H = 0, group = 1, S_q = 0, S_pad = 0;
  float scale = 0.f, scale_log2 = 0.f;
  int key_lo_shift = 0, key_hi_shift = 0;  // keys visible to query i: [i + lo, i + hi) (hopper_fwd's)
  Visibility vis;
};

// The steps of a CTA, computed alike by every role: (query head r of the group, Q block) pairs,
// heads outer, Q blocks ascending; only Q blocks holding a query that sees one of the CTA's keys.
template <class Tr>
struct Steps {
  int n0, kv_head, b, seqlen_k, n_m, total;
  int t0 = 0;  // the first step, where the running CTAs are (Args::phase); the list wraps around
  BlockRange mb;
  IndexRange full_rows;  // Q blocks inside these rows see every key of the CTA: no masking
  __device__ Steps(const Args& a, int n_block, int kv_head_, int b_) : n0(n_block * Tr::kBlockN), kv_head(kv_head_), b(b_) {
    seqlen_k = a.vis.seqlen_k(b);
    const int key_end = min(seqlen_k, a.vis.S_k);
    const int n_keys = min(key_end - n0, Tr::kBlockN);
    mb = query_blocks(a.vis, n0, n_keys, seqlen_k, Tr::kBlockM);
    n_m = mb.size();
    total = a.group * n_m;
    full_rows = full_query_rows(a.vis, n0, Tr::kBlockN, seqlen_k);
  }
  __device__ int idx(int t) const { return !Tr::kPhased ? t : t + t0 < total ? t + t0 : t + t0 - total; }
  __device__ int head(int t) const { return idx(t) / n_m; }  // r: the query head within the group
  __device__ int m_block(int t) const { return mb.begin + idx(t) % n_m; }
  // The step of a published position (head r, Q block m), clamped into this CTA's steps.
  __device__ int step_at(int pos) const {
    const int r = min(pos >> 16, total / max(n_m, 1) - 1), m = pos & 0xffff;
    return n_m > 0 ? r * n_m + min(max(m - mb.begin, 0), n_m - 1) : 0;
  }
  __device__ static int position(int r, int m) { return (r << 16) | m; }
  __device__ bool masked(int t, int S_q) const {
    const int m0 = m_block(t) * Tr::kBlockM;
    return !(m0 >= full_rows.begin && min(m0 + Tr::kBlockM, S_q) <= full_rows.end);
  }
};

// Shared-memory map of one CTA (byte addresses in the shared window).
template <class Tr>
struct Smem {
  uint32_t k, v, q, dout, lse, dsum, ds, dq, bars;
  __device__ explicit Smem(uint32_t raw) {
    k = (raw + 1023) & ~1023u;                   // (kBlockN, kHeadDim)
    v = k + Tr::kTileKBytes;                     // (kBlockN, kHeadDim)
    q = v + Tr::kTileKBytes;                     // kStages x (kBlockM, kHeadDim)
    dout = q + Tr::kStages * Tr::kTileQBytes;    // kStages x (kBlockM, kHeadDim)
    ds = dout + Tr::kStages * Tr::kTileQBytes;   // 2 x (kBlockN, kBlockM)
    dq = ds + 2 * Tr::kDsBytes;                  // kDqBuffers x (kBlockM, kHeadDim) fp32
    lse = dq + Tr::kDqBuffers * Tr::kDqBytes;    // kStages x kBlockM fp32
    dsum = lse + Tr::kStages * Tr::kStatBytes;   // kStages x kBlockM fp32
    bars = dsum + Tr::kStages * Tr::kStatBytes;  // 8-byte mbarriers
  }
  __device__ uint32_t full_kv() const { return bars; }
  __device__ uint32_t full_q(int s) const { return bars + 8 * (1 + s); }
  __device__ uint32_t full_do(int s) const { return bars + 8 * (1 + Tr::kStages + s); }
  __device__ uint32_t empty_qdo(int s) const { return bars + 8 * (1 + 2 * Tr::kStages + s); }
  // dQ buffer of step t, and the parity of its t-th use.
  __device__ int dq_slot(int t) const { return t % Tr::kDqBuffers; }
  __device__ uint32_t dq_parity(int t) const { return (t / Tr::kDqBuffers) & 1; }
  __device__ uint32_t dq_full(int b) const { return bars + 8 * (1 + 3 * Tr::kStages + b); }
  __device__ uint32_t dq_empty(int b) const { return bars + 8 * (3 + 3 * Tr::kStages + b); }
  __device__ uint32_t dq_buf(int b) const { return dq + b * Tr::kDqBytes; }
  __device__ uint32_t first_step() const { return bars + 8 * (5 + 3 * Tr::kStages); }
  __device__ uint32_t q_stage(int s) const { return q + s * Tr::kTileQBytes; }
  __device__ uint32_t do_stage(int s) const { return dout + s * Tr::kTileQBytes; }
  __device__ uint32_t lse_stage(int s) const { return lse + s * Tr::kStatBytes; }
  __device__ uint32_t dsum_stage(int s) const { return dsum + s * Tr::kStatBytes; }
  __device__ uint32_t ds_buf(int t) const { return ds + (t & 1) * Tr::kDsBytes; }
};

// Places in the workspace for (batch b, query head h): the first of its S_pad rows of lse·log2 e
// and D_i; Q block mi's deterministic counter (chunks = S_pad / kBlockM, the Q blocks per (batch,
// head)); and the first float of query row m0's group in the dQ accumulator.
__device__ __forceinline__ int64_t stats_row(const Args& a, int b, int h) {
  return (static_cast<int64_t>(b) * a.H + h) * a.S_pad;
}
__device__ __forceinline__ int64_t q_block_index(const Args& a, int b, int h, int mi, int chunks) {
  return (static_cast<int64_t>(b) * a.H + h) * chunks + mi;
}
template <class Tr>
__device__ __forceinline__ int64_t dq_offset(const Args& a, int b, int h, int m0) {
  return ((static_cast<int64_t>(b) * a.H + h) * a.dq_rows + a.dq_row0 + m0) * Tr::kHeadDim;
}

// The producer: one thread issues every copy. K and V once; then per step Q with lse·log2 e and
// dO with D_i into the next stage of the ring once the consumers have released it.
template <class Tr>
__device__ __forceinline__ void produce(const Args& a, const Smem<Tr>& sm, const Steps<Tr>& st) {
  sm90::prefetch_tensor_map(&a.tm_q);
  sm90::prefetch_tensor_map(&a.tm_do);
  sm90::mbar_arrive_expect_tx(sm.full_kv(), 2 * Tr::kTileKBytes);
#pragma unroll
  for (int p = 0; p < Tr::kPanels; ++p) {
    sm90::tma_load_4d(sm.k + p * Tr::kPanelBytesK, &a.tm_k, sm.full_kv(), p * 64, st.n0, st.kv_head, st.b);
    sm90::tma_load_4d(sm.v + p * Tr::kPanelBytesK, &a.tm_v, sm.full_kv(), p * 64, st.n0, st.kv_head, st.b);
  }
  for (int t = 0; t < st.total; ++t) {
    const int s = t % Tr::kStages;
    const uint32_t phase = (t / Tr::kStages) & 1;
    const int h = st.kv_head * a.group + st.head(t), m0 = st.m_block(t) * Tr::kBlockM;
    const int64_t rows = stats_row(a, st.b, h) + m0;
    if (a.phase != nullptr && t % 8 == 0)
      sm90::st_relaxed_gpu(a.phase + st.b * (a.H / a.group) + st.kv_head, st.position(st.head(t), st.m_block(t)));
    sm90::mbar_wait(sm.empty_qdo(s), phase ^ 1);
    sm90::mbar_arrive_expect_tx(sm.full_q(s), Tr::kTileQBytes + Tr::kStatBytes);
#pragma unroll
    for (int p = 0; p < Tr::kPanels; ++p)
      sm90::tma_load_4d(sm.q_stage(s) + p * Tr::kPanelBytesQ, &a.tm_q, sm.full_q(s), p * 64, m0, h, st.b);
    sm90::bulk_load(sm.lse_stage(s), a.lse2 + rows, Tr::kStatBytes, sm.full_q(s));
    sm90::mbar_arrive_expect_tx(sm.full_do(s), Tr::kTileQBytes + Tr::kStatBytes);
#pragma unroll
    for (int p = 0; p < Tr::kPanels; ++p)
      sm90::tma_load_4d(sm.do_stage(s) + p * Tr::kPanelBytesQ, &a.tm_do, sm.full_do(s), p * 64, m0, h, st.b);
    sm90::bulk_load(sm.dsum_stage(s), a.dsum + rows, Tr::kStatBytes, sm.full_do(s));
  }
}

// The dQ writer: one thread of the producer warpgroup hands each step's dQ to the copy engine,
// which adds it into the workspace (cp.reduce.async.bulk .add.f32), then frees the buffer once the
// engine has read it. --deterministic: the CTAs adding into one Q block take turns in key-block
// order (a counter per Q block: this CTA waits until it reads its rank, adds, waits for the adds to
// complete, and counts on), so the sums are formed in the same order every run.
template <class Tr>
__device__ __forceinline__ void write_dq(const Args& a, const Smem<Tr>& sm, const Steps<Tr>& st) {
  const int n_block = st.n0 / Tr::kBlockN;
  const int chunks = a.S_pad / Tr::kBlockM;
  for (int t = 0; t < st.total; ++t) {
    const int h = st.kv_head * a.group + st.head(t), mi = st.m_block(t);
    const int slot = sm.dq_slot(t);
    sm90::mbar_wait(sm.dq_full(slot), sm.dq_parity(t));
    int* sem = a.dq_sem != nullptr ? a.dq_sem + q_block_index(a, st.b, h, mi, chunks) : nullptr;
    if (sem != nullptr) {
      // Key blocks that add into Q block mi, in order: this CTA's rank among them.
      const int m0 = mi * Tr::kBlockM, m_last = min(m0 + Tr::kBlockM, a.S_q) - 1;
      // A launch of part of the work (Args::n_kb) takes a (batch, kv head)'s key blocks from its
      // first tile's on: the earlier ones add elsewhere (another launch, another buffer).
      const int bh = st.b * (a.H / a.group) + st.kv_head;
      const int first = a.n_kb > 0 && bh == a.tile0 / a.n_kb ? a.tile0 % a.n_kb : 0;
      const int rank = n_block - max(key_blocks<Tr::kBlockN>(a.vis, m0, m_last, st.seqlen_k).begin, first);
      // The previous key block's CTA was launched before this one (grid order), so it runs or has
      // run; a wait this long means it never will: fail loudly instead of hanging.
      long long spins = 0;
      while (sm90::ld_acquire_gpu(sem) != rank) {
        __nanosleep(128);
        if (++spins > (1ll << 25)) __trap();
      }
    }
    sm90::bulk_reduce_add_f32(a.dq_accum + dq_offset<Tr>(a, st.b, h, mi * Tr::kBlockM), sm.dq_buf(slot), Tr::kDqBytes);
    sm90::tma_store_commit();
    if (sem != nullptr) {
      sm90::tma_store_wait_all();
      sm90::fence_proxy_async_global();
      sm90::red_release_gpu_add(sem, 1);
    } else {
      sm90::tma_store_wait_read();
    }
    sm90::mbar_arrive(sm.dq_empty(slot));
  }
}

}  // namespace hopper_bwd
}  // namespace flashattn

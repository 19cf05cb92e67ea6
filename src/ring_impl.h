// The ring's state (ring.h's Ring::Impl), shared by its parts: src/ring.cpp (setting up,
// gathering), src/ring_memory.cpp (shards in and out, registered buffers and windows, each rank's
// allocation), src/ring_steps.cpp (the steps of a repetition, transfers and merges, and their
// profile) and src/ring_lend.cpp (lending). Only with NCCL.
#pragma once

#ifdef FLASHATTN_HAVE_NCCL

#include <cuda_runtime_api.h>
#include <nccl.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "array.h"
#include "device_buffer.h"
#include "device_info.h"
#include "flashattn/check.h"
#include "flashattn/error.h"
#include "gpu_context.h"
#include "params_build.h"
#include "ring.h"
#include "ring_block.h"
#include "ring_plan.h"
#include "timing.h"

namespace flashattn {

// Shards of this many rows or more without a causal mask: the backward on one stream (Impl's
// side_bwd).
constexpr int kRingOneStreamRows = 65536;

namespace ring_detail {

inline void nccl_check(ncclResult_t r, const char* what, const char* file, int line) {
  if (r == ncclSuccess) return;
  throw RuntimeError(std::string(file) + ":" + std::to_string(line) + ": " + what +
                     " failed: " + ncclGetErrorString(r));
}

inline char* at(const DeviceBuffer& b, int64_t bytes) { return static_cast<char*>(b.get()) + bytes; }

inline cudaEvent_t make_event(bool timing) {
  cudaEvent_t e = nullptr;
  CUDA_CHECK(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
  return e;
}

}  // namespace ring_detail

#define NCCL_CHECK(expr) ::flashattn::ring_detail::nccl_check((expr), #expr, __FILE__, __LINE__)

// NCCL's copy-engine transfers (2.28: an AllGather between buffers of a symmetric window, on a
// communicator whose CTA policy is zero) need no SM.
#if NCCL_VERSION_CODE >= NCCL_VERSION(2, 28, 0)
#define FLASHATTN_RING_HAVE_CE 1
#else
#define FLASHATTN_RING_HAVE_CE 0
#endif

namespace ring_detail {

// Two slots of equal size in memory from ncclMemAlloc, registered with the communicator as a
// symmetric window (every rank registers the same size at once, Impl::register_windows): rank r's
// data in slot r, the other rank's arrives in slot 1 - r (Impl::copy_engine). Deregistered, then
// freed, on destruction.
struct Window {
  DeviceBuffer mem;
  ncclComm_t comm = nullptr;
#if FLASHATTN_RING_HAVE_CE
  ncclWindow_t win = nullptr;
  ~Window() {
    if (win) ncclCommWindowDeregister(comm, win);
  }
#endif
  size_t slot_bytes() const { return mem.bytes() / 2; }
  char* slot(int i) const { return static_cast<char*>(mem.get()) + i * slot_bytes(); }
};

}  // namespace ring_detail

struct Ring::Impl {
  // The block a rank computes against source `src`'s K/V shard (the same whichever step it falls
  // on), and its keys below each batch element's length.
  struct Block {
    RingCall call;
    DeviceBuffer seqlens;  // int32 [B]; empty without key padding
  };
  struct Dev {
    int id = -1, rank = 0;
    // compute: the kernels; comm: NCCL; merge: the element-wise work around them (merges,
    // accumulations), off the kernels' stream so it runs under the next block; side: the
    // blocks that run beside the others' stream (Impl::side(): the own block of the backward,
    // the remote ones of the forward), one priority below compute.
    cudaStream_t compute = nullptr, comm = nullptr, merge = nullptr, side = nullptr;
    ncclComm_t nccl = nullptr;
    std::optional<DeviceInfo> info;
    LaunchContext ctx, ctx_side;  // on compute, on side
    std::unique_ptr<L2Flusher> flusher;  // ranks > 0 (rank 0's is the caller's timer)
    RingShard shard;
    std::vector<Block> blocks;  // by source rank
    // Inputs: Q, dO [B, H, len, D]; the own K/V shard and two receive buffers, each K then V
    // ([B, H_kv, len_src, D] each), sized for the longest shard.
    DeviceBuffer q, dout, kv_own, kv[2];
    // Forward: the running result (fp32; none where the blocks merge in place), two blocks'
    // partial results (one being merged while the next is computed; the own block writes the
    // outputs), the outputs.
    DeviceBuffer o_acc, lse, o_part[2], lse_part[2], o;
    // Backward: lse of the second chunk's rows (contiguous), dQ's accumulator, two blocks'
    // gradients (dQ; dK then dV), the travelling dK/dV accumulators (fp32, dK then dV), outputs.
    DeviceBuffer lse_b, dq_acc, dq_part[2], dkv_part[2], acc[2], dq, dkv;
    // The backward's own block on its own stream (side_bwd): its dK/dV (fp32, dK then dV,
    // [B, H_kv, len, D] each) and, where dQ is not added by the kernel's reductions (dq_accum),
    // its dQ (fp32, [B, H, len, D]): its kernel's dQ pass runs beside the others'.
    DeviceBuffer dkv_own, dq_own;
    DeviceBuffer ws, ws_side;  // the kernels' workspaces: compute's, side's (two kernels at once)
    // copy_engine: the memory of kv_own and kv[0] (its two slots), and of acc[0] and acc[1]
    // (the backward's), which are then views into it.
    std::unique_ptr<ring_detail::Window> kv_window, acc_window;
    // Lending (Impl::lending): the helper's inputs of the lent heads (Q, O, dO [K·group, len_o, D]
    // each, then their lse over the block's rows, float) and its dQ for them (fp32, the kernel's
    // accumulator layout, [K·group, dq_rows(len_o), D]); the owner's copy of that dQ.
    DeviceBuffer lend_in, lend_dq, lend_dq_in;
    cudaEvent_t lend_in_arrived = nullptr, lend_done = nullptr, lend_dq_arrived = nullptr;
    size_t ws_bytes = 0;
    // Per step: its block computed, merged (or accumulated), its K/V arrived, its dK/dV
    // accumulators sent on (and the next step's arrived).
    std::vector<cudaEvent_t> computed, merged, kv_arrived, acc_arrived;
    cudaEvent_t zeroed = nullptr;  // the backward's accumulators zeroed (on compute)
    cudaEvent_t done = nullptr;
    cudaEvent_t loop_ready = nullptr, loop_done = nullptr;  // one GPU playing every rank (loopback)
  };

  std::vector<int> ids;
  std::vector<Dev> devs;
  // One GPU plays every rank (`--devices 0,0`): no communicator; each transfer is a copy on that
  // GPU from the sender's buffer into the receiver's, on the receiver's transfer stream once the
  // sender's has reached the group, and every rank's transfer stream goes on once all of the
  // group's copies have (group_end). The same steps, buffers and events as a ring of GPUs, for
  // checking a ring where one GPU is all there is; the ranks' blocks share its SMs, so the times
  // are not a ring's.
  bool loopback = false;
  std::vector<RingTransfer> loop_sends, loop_recvs;  // the open group's (loopback; ring_plan.h)
  std::vector<void*> loop_send_bufs, loop_recv_bufs;
  // A group of point-to-point transfers between this process's ranks (NCCL's group, or the
  // loopback's): send and recv enqueue on `d`'s transfer stream, group_end issues them.
  void group_begin();
  void group_end();
  void send(Dev& d, const void* buf, size_t bytes, int peer);
  void recv(Dev& d, void* buf, size_t bytes, int peer);
  const KernelMode* entry = nullptr;      // the run's entry (forward or backward)
  const KernelMode* fwd_entry = nullptr;  // its forward
  Problem prob;
  bool deterministic = false;
  bool backward = false;
  // The backward's kernel keeps the gradients in fp32 itself (KernelMode::fp32_gradients): dQ
  // added into dq_acc, the first step's dK/dV stored into the travelling accumulator, the later
  // steps' into fp32 partials; no 16-bit partials, no dQ passes. FLASHATTN_RING_FP32_GRADIENTS=0
  // turns it off (the ablation).
  bool f32_grads = false;
  // ... and adds dQ into dq_acc in its own layout (KernelMode::dq_finish; BwdParams::dq_accum):
  // no dQ pass per block, one at the end. Where every block's first row is a multiple of
  // kDqAccumRows (the zig-zag's second chunk starts at the chunk length), with kDqAccumSpare rows
  // of room past the shard; FLASHATTN_RING_DQ_ACCUM=0 turns it off (the ablation).
  bool dq_accum = false;
  int dq_rows(int len) const {
    return dq_accum ? (len + kDqAccumRows - 1) / kDqAccumRows * kDqAccumRows + kDqAccumSpare : len;
  }
  // Two kernel streams: the own block on one, the others' blocks on the other, so neither waits
  // for the other's last CTAs (a kernel's last wave leaves SMs idle that the other's CTAs take)
  // and the backward's own block fills the wait for the first K/V shard. The stream that must
  // finish first is the higher priority: its pending CTAs go first, the other takes what SMs it
  // leaves. Forward (more than two GPUs, or two with last_alone_fwd off): the own block (step 0,
  // compute) ahead of the others (side), whose merges follow it. Backward: the others (compute,
  // each accumulator sent on as soon as its block ends) ahead of the own block (side), the last
  // to finish, where the own dK/dV need no transfer. Both kernels run at once, so each has its
  // own workspace, and the backward's own block its own gradients (dkv_own; dq_own unless dQ
  // goes into dq_acc by the kernel's reductions), added when the outputs are rounded; the
  // backward needs fp32 gradients and not --deterministic (the order of dQ's additions).
  // Not in a backward whose shards are kRingOneStreamRows or more without a causal mask: there
  // the first K/V transfer is about 1 % of a block, nothing to fill, and the two kernels sharing
  // the GPU measured 0.8-2.7 % slower than one stream (128k, two GPUs; docs/PERF.md); 64k without
  // a mask was level, under a causal mask the second stream gained 0-1.6 %.
  // FLASHATTN_RING_SIDE_STREAM=0 or 1 overrides the choice (the ablation).
  // side_gated: under GQA the backward's own block starts only once the first K/V shard has
  // arrived. A GQA CTA sums its group's heads: started at once, the own block's first CTAs (under
  // causal the longest) held the SMs for several times the first transfer and the remote block
  // started late (32k GQA 32/8 causal: 3 % slower than one stream, docs/PERF.md ring step 9).
  // Gated, the own block's CTAs are issued after the remote block's last one, into its last
  // wave's idle SMs (its few, long CTAs: 15.5 waves at 64k), which one stream leaves idle.
  bool side_fwd = false, side_bwd = false, side_gated = false;
  bool side() const { return backward ? side_bwd : side_fwd; }
  bool on_side(int s) const { return side() && s >= 0 && own_step(s) == backward; }
  const LaunchContext& ctx_of(const Dev& d, int s) const { return on_side(s) ? d.ctx_side : d.ctx; }
  // The forward's last block on two GPUs shares the GPU with nothing once its K/V has arrived
  // (no transfer follows it, its merge waits for it), so its kernel takes the whole GPU
  // (LaunchContext::shares_device off: `hopper`'s persistent grid), after the own block on the
  // same stream (measured a little faster than beside it on the side stream). 0.3-0.8 % faster
  // than the per-tile grid beside the own block (docs/PERF.md, ring step 12).
  // FLASHATTN_RING_LAST_ALONE=0 turns it off (the ablation).
  bool last_alone_fwd = false;
  bool last_alone(int s) const { return last_alone_fwd && s == n() - 1; }  // the flag: forwards only
  // ... and, where its kernel merges into its outputs (KernelMode::merges_output), that block
  // combines its result with the own block's (complete: it ran first on the same stream) in its
  // epilogue, writing O and lse of its rows in place: no merge pass after it.
  // FLASHATTN_RING_KERNEL_MERGE=0 turns it off (the ablation).
  bool kernel_merge = false;
  // (kernel_merge implies last_alone_fwd, so two GPUs: the one other block merges in place.)
  bool merges_in_kernel(int s) const { return kernel_merge && s == n() - 1; }
  bool dq_apart() const { return backward && side_bwd && !dq_accum; }  // the own block's dQ in dq_own
  // The buffers NCCL sends from and receives into (the own K/V, the two receive buffers, the
  // backward's travelling accumulators) allocated by ncclMemAlloc and registered with the
  // communicator, so that a transfer between GPUs of one node goes straight from one rank's buffer
  // into the other's (no copy through NCCL's own staging buffers: fewer SMs and fewer memory
  // accesses beside the blocks' kernels). FLASHATTN_RING_REGISTER=0 turns it off (the ablation).
  bool registered = false;
  DeviceBuffer transfer_buffer(const Dev& d, size_t bytes) const;
  // Two GPUs exchange their K/V shards and the backward's accumulators by NCCL's copy engines: an
  // in-place AllGather over a symmetric window (ring_detail::Window) on communicators created with
  // the zero-CTA policy. NCCL's send/recv kernels take SMs (32 CTAs for a K/V shard, each holding
  // an SM that a block's CTA would use, and waiting there for its peer's); the copy engines take
  // none, so the blocks keep every SM while the shards travel. ce_comms: the communicators were
  // created so (two GPUs, NCCL 2.28, FLASHATTN_RING_COPY_ENGINE not 0); copy_engine: this run
  // exchanges so (ce_comms and registered buffers).
  bool ce_comms = false;
  bool copy_engine() const { return ce_comms && registered; }
  // Lending (two GPUs, backward; FLASHATTN_RING_LEND=R:K): rank R (the owner, a slower card) leaves
  // the last K kv heads' worth of its other block (step 0: its queries against the other rank's
  // K/V) to the other rank (the helper), which holds those keys and values itself. K need not be
  // whole: the kernel's key tiles (registry.h's key_tile; BwdParams::tiles_*) are the unit, the
  // last lend_tiles of the block's (kv head, key tile) order, so the first kv head touched may be
  // shared. The owner sends Q, O, dO and lse of the lend_kv kv heads touched at the start; the
  // helper computes its tiles after its own step-0 block, once the owner's dK/dV accumulator has
  // arrived, storing their dK/dV into it (the owner left those keys unwritten) and their dQ into a
  // buffer of its own that goes back to the owner, who adds it into its dQ accumulator before the
  // last pass (in a shared kv head, both GPUs' dQ terms). Each kv head lent moves 1 / (2 H_kv) of a
  // GPU's work from the owner to the helper. ring_lend.cpp.
  // FLASHATTN_RING_LEND=auto (one process): after the forward for O and lse, three profiled
  // repetitions without lending measure each GPU's blocks' end; the slower lends the tiles
  // ring_lend_tiles gives for the median lag (none where that rounds to 0). lend_lag_ms: that lag.
  bool lend_auto = false;
  double lend_lag_ms = 0;
  int lend_rank = -1;
  int lend_tiles = 0;  // key tiles lent: the last ones of the owner's other block
  int lend_tile = 0;   // keys per tile (the kernel's key_tile, or the block's keys)
  int lend_nkb = 0;    // key tiles per kv head of that block
  int lend_kv = 0;     // kv heads the lent tiles touch (the last ones)
  bool lending() const { return backward && lend_rank >= 0; }
  int lend_heads() const { return lend_kv * (dims().H / dims().H_kv); }
  int lend_first() const { return dims().H_kv * lend_nkb - lend_tiles; }  // the first lent tile
  double lend_kv_share() const { return double(lend_tiles) / lend_nkb; }  // kv heads' worth lent
  void lend_trim_owner(BwdParams* p) const;  // the owner's other block: the tiles before the lent ones
  // The block a lender's tiles come from: its queries against the other rank's K/V (step 0).
  RingCall lent_call(int owner) const { return ring_call(dims().S_q, 2, owner, 1 - owner, prob.causal); }
  void lend_unit(int rank, int* tile, int* nkb) const;  // keys per tile, tiles per kv head of that block
  void set_lend(int rank, int tiles);                   // lend_* from the lending rank and its tiles
  // After the forward, from profiled repetitions without lending: the lender and its tiles, and
  // their buffers (auto).
  void choose_lend(const std::vector<RingProfile>& runs);
  double block_flops(const RingCall& c) const;  // a block's attention FLOPs, the problem's counting
  double lent_flops() const;                     // what lending moves from the owner to the helper
  size_t lent_workspace(const Dev& d) const;     // the lent block's on the helper (0 elsewhere)
  std::unique_ptr<ring_detail::Window> window(const Dev& d, size_t slot_bytes) const;
  void register_windows();
  cudaEvent_t start = nullptr;  // on rank 0
  size_t bytes_held = 0;

  int world = 0;        // GPUs in the ring
  bool multi = false;   // ranks in several processes (devs holds this process's one)
  bool root() const { return !multi || devs[0].rank == 0; }
  int n() const { return world; }
  const Dims& dims() const { return prob.dims; }
  size_t es() const { return dtype_size(prob.dtype); }
  int next(int r) const { return (r + 1) % n(); }
  int prev(int r) const { return (r + n() - 1) % n(); }
  int64_t q_elems(int len) const { return int64_t(dims().B) * dims().H * len * dims().D; }
  int64_t kv_elems(int len) const { return int64_t(dims().B) * dims().H_kv * len * dims().D; }
  int shard_len(int rank) const { return ring_shard(dims().S_q, n(), rank).len(); }

  // ---- the order of the steps -----------------------------------------------------------------
  // Forward: the own shard first (no wait), then the shards of r-1, r-2, ... as they arrive.
  // Backward: the own shard last, so each dK/dV accumulator ends its trip at its owner, having
  // taken in the owner's block last: no hop after the last step (the forward's order would end
  // with every accumulator one hop from home, a transfer nothing overlaps). The price is the
  // first step's K/V, which has to arrive before the first remote block (half the bytes of that
  // hop); with the own block on its own stream (side_bwd) that block runs meanwhile.
  int src_of(int r, int s) const {
    const int shift = backward ? s + 1 : s;
    return ((r - shift) % n() + n()) % n();
  }
  // Step -1 stands for "before the first step" (what the first transfer sends): the own shard.
  bool own_step(int s) const { return s < 0 || (backward ? s == n() - 1 : s == 0); }
  // The K/V buffer step s computes from: the own shard, or the receive buffer it arrived in.
  const Block& block_of(const Dev& d, int s) const { return d.blocks[src_of(d.rank, s)]; }
  const DeviceBuffer& kv_buffer(const Dev& d, int s) const {
    if (own_step(s)) return d.kv_own;
    return d.kv[(backward ? s : s - 1) & 1];
  }

  // ---- one block ------------------------------------------------------------------------------
  RingBlockBuffers buffers(const Dev& d, int s, int part) const {
    const Block& blk = block_of(d, s);
    const RingCall& c = blk.call;
    RingBlockBuffers b;
    b.q = d.q.get();
    b.kv = kv_buffer(d, s).get();
    const bool into_outputs = !backward && own_step(s);  // the forward's own block: all the rows
    b.o_part = (into_outputs ? d.o : d.o_part[part]).get();
    b.lse_part = (into_outputs ? d.lse : d.lse_part[part]).get();
    b.seqlens = static_cast<const int32_t*>(blk.seqlens.get());
    b.workspace = (on_side(s) ? d.ws_side : d.ws).get();
    b.workspace_bytes = d.ws_bytes;
    b.o = d.o.get();
    b.lse = c.q_row0 == 0 ? d.lse.get() : d.lse_b.get();  // the block's rows, contiguous
    b.dout = d.dout.get();
    b.dq_part = d.dq_part[part].get();
    b.dkv_part = d.dkv_part[part].get();
    return b;
  }

  // A block's kernel parameters, forward or backward (ring_block.h builds both from the same call).
  template <class Params, class Build>
  Params block_call(const Dev& d, int s, int part, Build build) const {
    const int src = src_of(d.rank, s);
    Params p = build(prob, d.shard.len(), shard_len(src), block_of(d, s).call, buffers(d, s, part));
    p.num_sms = d.ctx.sm_count;
    p.deterministic = deterministic;
    return p;
  }
  FwdParams block_params(const Dev& d, int s, int part) const {
    FwdParams f = block_call<FwdParams>(d, s, part, ring_block_fwd);
    if (merges_in_kernel(s)) ring_block_merge_into(prob, d.shard.len(), block_of(d, s).call, d.o.get(), d.lse.get(), &f);
    return f;
  }
  BwdParams block_bwd_params(const Dev& d, int s, int part) const {
    BwdParams p = block_call<BwdParams>(d, s, part, ring_block_bwd);
    if (f32_grads) {
      // Step 0's block starts the accumulator of its keys (the own shard comes last: never step
      // 0); the own block on its own stream stores into its own buffers.
      const bool into_acc = s == 0 && !own_step(s), beside = on_side(s);
      float* dkv = static_cast<float*>(into_acc ? d.acc[0].get() : (beside ? d.dkv_own : d.dkv_part[part]).get());
      float* dq = static_cast<float*>((beside && dq_apart() ? d.dq_own : d.dq_acc).get());
      ring_block_grads_f32(prob, d.shard.len(), shard_len(src_of(d.rank, s)), block_of(d, s).call, dq, dkv,
                           into_acc || beside, &p);
      if (dq_accum) {
        p.dq_accum = static_cast<float*>(d.dq_acc.get());
        p.dq_accum_rows = dq_rows(d.shard.len());
        p.dq_accum_row0 = block_of(d, s).call.q_row0;
      }
    }
    if (lending() && d.rank == lend_rank && !own_step(s)) lend_trim_owner(&p);
    return p;
  }

  size_t kv_bytes_of(int rank) const { return 2 * kv_elems(shard_len(rank)) * es(); }
  size_t acc_bytes_of(int rank) const { return 2 * kv_elems(shard_len(rank)) * sizeof(float); }

  struct Timeline {  // profile(): timing events, per device
    std::vector<cudaEvent_t> begin, end;
    std::vector<cudaEvent_t> compute_end;                     // after the last block
    std::vector<cudaEvent_t> own_end;                         // after the own block (side() only)
    std::vector<std::vector<cudaEvent_t>> wait_in, wait_out;  // waits for a transfer
    std::vector<std::vector<char>> wait_on_kernels;           // ... on a kernels' stream (else merge)
    std::vector<std::vector<char>> wait_alone;                // ... with no kernel running beside it
    std::vector<std::vector<cudaEvent_t>> comm_in, comm_out;  // around each transfer
    std::vector<std::vector<double>> comm_bytes;              // received by each transfer
    std::vector<std::vector<cudaEvent_t>> block_in, block_out;  // around each block's kernel
    std::vector<std::vector<RingRecord::BlockSpan>> blocks;     // ... and what it was
  };

  void use(const Dev& d) const { CUDA_CHECK(cudaSetDevice(d.id)); }
  void init_dev(Dev& d, int id, int rank, ncclComm_t comm, bool flusher);

  // One NCCL group over this process's GPUs on their transfer streams: `calls(d)` enqueues a GPU's
  // sends and receives and returns the bytes it receives. Under profile() each GPU's part is
  // timed (Timeline::comm_in/comm_out/comm_bytes).
  template <class Calls>
  void group_transfer(Timeline* tl, Calls calls) {
    if (tl)
      for (Dev& d : devs) {
        use(d);
        tl->comm_in[d.rank].push_back(ring_detail::make_event(true));
        CUDA_CHECK(cudaEventRecord(tl->comm_in[d.rank].back(), d.comm));
      }
    group_begin();
    for (Dev& d : devs) {
      use(d);
      const double bytes = calls(d);
      if (tl) tl->comm_bytes[d.rank].push_back(bytes);
    }
    group_end();
    if (tl)
      for (Dev& d : devs) {
        use(d);
        tl->comm_out[d.rank].push_back(ring_detail::make_event(true));
        CUDA_CHECK(cudaEventRecord(tl->comm_out[d.rank].back(), d.comm));
      }
  }

  // A block's kernel, `launch()` on `stream`; under profile() its span is recorded
  // (RingRecord::block_spans: `span` with the times of the events around it).
  template <class Launch>
  void timed_block(Dev& d, cudaStream_t stream, const RingRecord::BlockSpan& span, Timeline* tl, Launch launch) {
    if (tl) {
      tl->blocks[d.rank].push_back(span);
      tl->block_in[d.rank].push_back(ring_detail::make_event(true));
      CUDA_CHECK(cudaEventRecord(tl->block_in[d.rank].back(), stream));
    }
    launch();
    if (tl) {
      tl->block_out[d.rank].push_back(ring_detail::make_event(true));
      CUDA_CHECK(cudaEventRecord(tl->block_out[d.rank].back(), stream));
    }
  }

  // ---- transfers ------------------------------------------------------------------------------
  // Every rank sends `send(r)` (the buffer of the block it used at step s: bytes_of(src) bytes)
  // to the next rank and receives from the previous one into `recv(r)`: one NCCL group over all
  // devices (one thread drives them all).
  // With copy_engine (two GPUs), `window` names the Window whose slots `send` and `recv` are: one
  // AllGather of a slot instead.
  template <class SendBuf, class RecvBuf, class Bytes>
  void ring_shift(int s, SendBuf send, RecvBuf recv, Bytes bytes_of, Timeline* tl,
                  std::unique_ptr<ring_detail::Window> Dev::*window);

  // The K/V of step s into its buffer (each rank passes on what it used at step s - 1), once the
  // buffer is free (step s - 2 computed from it). Steps on the own shard need none.
  void fetch_kv(int s, Timeline* tl);

  // ---- lending (ring_lend.cpp) ----------------------------------------------------------------
  void parse_lend();  // from the environment, in prepare (InputError where the ring cannot lend)
  void allocate_lend(Dev& d);
  BwdParams lent_params(const Dev& helper) const;
  void send_lend_inputs(Timeline* tl);  // on the transfer streams, after the first K/V shard
  void compute_lent(Dev& helper, Timeline* tl);  // the helper's compute stream
  void return_lent_dq(Timeline* tl);             // the transfer streams, after the lent block
  void add_lent_dq(Dev& owner, Timeline* tl);  // the owner's merge stream, before dQ is written

  // ---- a repetition ---------------------------------------------------------------------------
  // `stream` waits for `e`, a transfer's end; timed under profile(), where `alone` says no kernel
  // runs beside the wait (its whole span is exposed).
  void wait_for(Dev& d, cudaStream_t stream, cudaEvent_t e, Timeline* tl, bool alone = false);

  // The last step whose block is not empty (the own block, step 0 of the forward, never is
  // unless the shard is).
  int last_block(const Dev& d) const {
    int last = -1;
    for (int s = 0; s < n(); ++s)
      if (!d.blocks[src_of(d.rank, s)].call.skip) last = s;
    return last;
  }

  // The forward's other blocks merge straight into the own block's outputs: at most one block
  // besides the own one (two GPUs, or a ring whose other shards are empty).
  bool merges_in_place(const Dev& d) const {
    int others = 0;
    for (int s = 1; s < n(); ++s) others += d.blocks[src_of(d.rank, s)].call.skip ? 0 : 1;
    return others <= 1;
  }

  void enqueue(cudaStream_t stream0, bool flush, Timeline* tl);
  // The backward's accumulators zeroed where the first block does not store (compute stream).
  void zero_accumulators(Dev& d);

  int max_len() const {
    int m = 0;
    for (int r = 0; r < n(); ++r) m = std::max(m, shard_len(r));
    return m;
  }

  // Forward, on the merge stream: the blocks after the own one merged into the outputs (in place,
  // or through the fp32 running result).
  void merge_step(Dev& d, int s);

  // Backward, on the merge stream: dQ into its accumulator, dK/dV into the travelling one (which
  // arrived with the previous step's transfer).
  void accumulate_step(Dev& d, int s, Timeline* tl);

  // ---- shards ---------------------------------------------------------------------------------
  // Rows of `a` (the problem's layout, [B, heads, S, D]) that `shard` holds, as [B, heads, len, D].
  HostArray shard_rows(const HostArray& a, int heads, const RingShard& shard) const;

  // The inverse, from the device: a shard [B, heads, len, D] of `buf` (from element
  // `offset_elems`) into its rows of `out` (problem layout, or [B, H, S] for lse with D = 1).
  void unshard(const DeviceBuffer& buf, int64_t offset_elems, DType t, int heads, int D, bool lse_like,
               const RingShard& shard, HostArray* out) const;

  void allocate(Dev& d, const RunInputs& in);
};

}  // namespace flashattn

#endif  // FLASHATTN_HAVE_NCCL

#include "ring.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>
#include <thread>

#include "array.h"
#include "device_buffer.h"
#include "device_info.h"
#include "flashattn/check.h"
#include "flashattn/error.h"
#include "flashattn/ring_ops.h"
#include "gpu_context.h"
#include "nvtx.h"
#include "params_build.h"
#include "ring_block.h"
#include "ring_plan.h"
#include "ring_shards.h"
#include "timing.h"

#ifdef FLASHATTN_HAVE_NCCL
#include <nccl.h>
#include <unistd.h>
#endif

namespace flashattn {

#ifndef FLASHATTN_HAVE_NCCL

std::string ring_unavailable() {
  return "this build has no NCCL (nccl.h or libnccl was not found when it was configured), so it runs on one GPU "
         "only";
}

struct Ring::Impl {};
Ring::Ring(std::vector<int>) { throw InputError("--devices: " + ring_unavailable()); }
Ring::Ring(int, const RingProcess&) { throw InputError("--ring-rank: " + ring_unavailable()); }
bool Ring::root() const { return true; }
Ring::~Ring() = default;
int Ring::size() const { return 0; }
const std::vector<int>& Ring::devices() const {
  static const std::vector<int> none;
  return none;
}
void Ring::prepare(const KernelMode&, const RunInputs&, bool) {}
void Ring::poison_outputs() {}
void Ring::enqueue(cudaStream_t, bool) {}
KernelOutputs Ring::gather() const { return {}; }
RingProfile Ring::profile(cudaStream_t) { return {}; }
std::vector<double> Ring::flops_per_device() const { return {}; }
size_t Ring::bytes_per_device() const { return 0; }

#else

std::string ring_unavailable() { return ""; }

namespace {

void nccl_check(ncclResult_t r, const char* what, const char* file, int line) {
  if (r == ncclSuccess) return;
  throw RuntimeError(std::string(file) + ":" + std::to_string(line) + ": " + what +
                     " failed: " + ncclGetErrorString(r));
}
#define NCCL_CHECK(expr) nccl_check((expr), #expr, __FILE__, __LINE__)

char* at(const DeviceBuffer& b, int64_t bytes) { return static_cast<char*>(b.get()) + bytes; }

cudaEvent_t make_event(bool timing) {
  cudaEvent_t e = nullptr;
  CUDA_CHECK(cudaEventCreateWithFlags(&e, timing ? cudaEventDefault : cudaEventDisableTiming));
  return e;
}

}  // namespace

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
    // accumulations), off the kernels' stream so it runs under the next block.
    cudaStream_t compute = nullptr, comm = nullptr, merge = nullptr;
    ncclComm_t nccl = nullptr;
    std::optional<DeviceInfo> info;
    LaunchContext ctx;
    std::unique_ptr<L2Flusher> flusher;  // ranks > 0 (rank 0's is the caller's timer)
    RingShard shard;
    std::vector<Block> blocks;  // by source rank
    // Inputs: Q, dO [B, H, len, D]; the own K/V shard and two receive buffers, each K then V
    // ([B, H_kv, len_src, D] each), sized for the longest shard.
    DeviceBuffer q, dout, kv_own, kv[2];
    // Forward: the running result (fp32), two blocks' partial results (one being merged while
    // the next is computed), the outputs.
    DeviceBuffer o_acc, lse, o_part[2], lse_part[2], o;
    // Backward: lse of the second chunk's rows (contiguous), dQ's accumulator, two blocks'
    // gradients (dQ; dK then dV), the travelling dK/dV accumulators (fp32, dK then dV), outputs.
    DeviceBuffer lse_b, dq_acc, dq_part[2], dkv_part[2], acc[2], dq, dkv;
    DeviceBuffer ws;
    size_t ws_bytes = 0;
    // Per step: its block computed, merged (or accumulated), its K/V arrived, its dK/dV
    // accumulators sent on (and the next step's arrived).
    std::vector<cudaEvent_t> computed, merged, kv_arrived, acc_arrived;
    cudaEvent_t done = nullptr;
  };

  std::vector<int> ids;
  std::vector<Dev> devs;
  const KernelMode* entry = nullptr;      // the run's entry (forward or backward)
  const KernelMode* fwd_entry = nullptr;  // its forward
  Problem prob;
  bool deterministic = false;
  bool backward = false;
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
  // first step's K/V, which has to arrive before anything starts (half the bytes of that hop).
  // Step -1 stands for "before the first step": its shard is the own one.
  int src_of(int r, int s) const {
    const int shift = backward ? s + 1 : s;
    return ((r - shift) % n() + n()) % n();
  }
  // The K/V buffer step s computes from: the own shard, or the receive buffer it arrived in.
  bool own_step(int s) const { return s < 0 || (backward ? s == n() - 1 : s == 0); }
  const DeviceBuffer& kv_buffer(const Dev& d, int s) const {
    if (own_step(s)) return d.kv_own;
    return d.kv[(backward ? s : s - 1) & 1];
  }

  // ---- one block ------------------------------------------------------------------------------
  RingBlockBuffers buffers(const Dev& d, int s, int part) const {
    const RingCall& c = d.blocks[src_of(d.rank, s)].call;
    RingBlockBuffers b;
    b.q = d.q.get();
    b.kv = kv_buffer(d, s).get();
    b.o_part = d.o_part[part].get();
    b.lse_part = d.lse_part[part].get();
    b.seqlens = static_cast<const int32_t*>(d.blocks[src_of(d.rank, s)].seqlens.get());
    b.workspace = d.ws.get();
    b.workspace_bytes = d.ws_bytes;
    b.o = d.o.get();
    b.lse = c.q_row0 == 0 ? d.lse.get() : d.lse_b.get();  // the block's rows, contiguous
    b.dout = d.dout.get();
    b.dq_part = d.dq_part[part].get();
    b.dkv_part = d.dkv_part[part].get();
    return b;
  }

  FwdParams block_params(const Dev& d, int s, int part) const {
    const int src = src_of(d.rank, s);
    FwdParams f = ring_block_fwd(prob, d.shard.len(), shard_len(src), d.blocks[src].call, buffers(d, s, part));
    f.num_sms = d.info->sm_count;
    f.deterministic = deterministic;
    return f;
  }

  BwdParams block_bwd_params(const Dev& d, int s, int part) const {
    const int src = src_of(d.rank, s);
    BwdParams b = ring_block_bwd(prob, d.shard.len(), shard_len(src), d.blocks[src].call, buffers(d, s, part));
    b.num_sms = d.info->sm_count;
    b.deterministic = deterministic;
    return b;
  }

  size_t kv_bytes_of(int rank) const { return 2 * kv_elems(shard_len(rank)) * es(); }
  size_t acc_bytes_of(int rank) const { return 2 * kv_elems(shard_len(rank)) * sizeof(float); }

  struct Timeline {  // profile(): timing events, per device
    std::vector<cudaEvent_t> begin, end;
    std::vector<std::vector<cudaEvent_t>> wait_in, wait_out;  // waits for a transfer
    std::vector<std::vector<cudaEvent_t>> comm_in, comm_out;  // around each transfer
    std::vector<std::vector<double>> comm_bytes;              // received by each transfer
  };

  void use(const Dev& d) const { CUDA_CHECK(cudaSetDevice(d.id)); }
  void init_dev(Dev& d, int id, int rank, ncclComm_t comm, bool flusher);

  // ---- transfers ------------------------------------------------------------------------------
  // Every rank sends `send(r)` (the buffer of the block it used at step s: bytes_of(src) bytes)
  // to the next rank and receives from the previous one into `recv(r)`: one NCCL group over all
  // devices (one thread drives them all).
  template <class SendBuf, class RecvBuf, class Bytes>
  void ring_shift(int s, SendBuf send, RecvBuf recv, Bytes bytes_of, Timeline* tl) {
    if (tl)
      for (Dev& d : devs) {
        use(d);
        tl->comm_in[d.rank].push_back(make_event(true));
        CUDA_CHECK(cudaEventRecord(tl->comm_in[d.rank].back(), d.comm));
      }
    NCCL_CHECK(ncclGroupStart());
    for (Dev& d : devs) {
      const size_t out = bytes_of(src_of(d.rank, s)), in = bytes_of(src_of(prev(d.rank), s));
      if (out) NCCL_CHECK(ncclSend(send(d), out, ncclUint8, next(d.rank), d.nccl, d.comm));
      if (in) NCCL_CHECK(ncclRecv(recv(d), in, ncclUint8, prev(d.rank), d.nccl, d.comm));
      if (tl) tl->comm_bytes[d.rank].push_back(double(in));
    }
    NCCL_CHECK(ncclGroupEnd());
    if (tl)
      for (Dev& d : devs) {
        use(d);
        tl->comm_out[d.rank].push_back(make_event(true));
        CUDA_CHECK(cudaEventRecord(tl->comm_out[d.rank].back(), d.comm));
      }
  }

  // The K/V of step s into its buffer (each rank passes on what it used at step s - 1), once the
  // buffer is free (step s - 2 computed from it). Steps on the own shard need none.
  void fetch_kv(int s, Timeline* tl) {
    if (s >= n() || own_step(s)) return;
    for (Dev& d : devs) {
      use(d);
      if (s >= 2) CUDA_CHECK(cudaStreamWaitEvent(d.comm, d.computed[s - 2], 0));
    }
    ring_shift(
        s - 1, [&](Dev& d) { return kv_buffer(d, s - 1).get(); }, [&](Dev& d) { return kv_buffer(d, s).get(); },
        [&](int r) { return kv_bytes_of(r); }, tl);
    for (Dev& d : devs) {
      use(d);
      CUDA_CHECK(cudaEventRecord(d.kv_arrived[s], d.comm));
    }
  }

  // ---- a repetition ---------------------------------------------------------------------------
  // `stream` waits for `e`, a transfer's end; timed under profile().
  void wait_for(Dev& d, cudaStream_t stream, cudaEvent_t e, Timeline* tl) {
    if (tl) {
      tl->wait_in[d.rank].push_back(make_event(true));
      CUDA_CHECK(cudaEventRecord(tl->wait_in[d.rank].back(), stream));
    }
    CUDA_CHECK(cudaStreamWaitEvent(stream, e, 0));
    if (tl) {
      tl->wait_out[d.rank].push_back(make_event(true));
      CUDA_CHECK(cudaEventRecord(tl->wait_out[d.rank].back(), stream));
    }
  }

  // The last step whose block is not empty (the own block, step 0 of the forward, never is
  // unless the shard is).
  int last_block(const Dev& d) const {
    int last = -1;
    for (int s = 0; s < n(); ++s)
      if (!d.blocks[src_of(d.rank, s)].call.skip) last = s;
    return last;
  }

  void enqueue(cudaStream_t stream0, bool flush, Timeline* tl) {
    CUDA_CHECK(cudaSetDevice(devs[0].id));
    CUDA_CHECK(cudaEventRecord(start, stream0));
    for (Dev& d : devs) {
      use(d);
      if (flush && d.flusher) d.flusher->flush(d.compute);  // while rank 0 flushes before `start`
      for (cudaStream_t st : {d.compute, d.comm, d.merge}) CUDA_CHECK(cudaStreamWaitEvent(st, start, 0));
      if (tl) CUDA_CHECK(cudaEventRecord(tl->begin[d.rank], d.compute));
      if (backward) {
        ring_fill(static_cast<float*>(d.dq_acc.get()), 0.f, q_elems(d.shard.len()), d.merge);
        ring_fill(static_cast<float*>(d.acc[0].get()), 0.f, 2 * kv_elems(max_len()), d.merge);
      }
    }
    fetch_kv(0, tl);  // the backward's first shard (nothing to overlap it with)
    for (int s = 0; s < n(); ++s) {
      NvtxRange range("ring step " + std::to_string(s));
      fetch_kv(s + 1, tl);  // the next step's K/V travels while this step computes
      for (Dev& d : devs) {
        use(d);
        if (!own_step(s)) wait_for(d, d.compute, d.kv_arrived[s], tl);
        // The partial buffers of step s were merged from at step s - 2.
        if (s >= 2) CUDA_CHECK(cudaStreamWaitEvent(d.compute, d.merged[s - 2], 0));
        const Block& blk = d.blocks[src_of(d.rank, s)];
        if (!blk.call.skip) {
          if (backward)
            entry->bwd(block_bwd_params(d, s, s & 1), d.ctx);
          else
            entry->fwd(block_params(d, s, s & 1), d.ctx);
        }
        CUDA_CHECK(cudaEventRecord(d.computed[s], d.compute));
        CUDA_CHECK(cudaStreamWaitEvent(d.merge, d.computed[s], 0));
        if (backward)
          accumulate_step(d, s, tl);
        else
          merge_step(d, s);
        CUDA_CHECK(cudaEventRecord(d.merged[s], d.merge));
      }
      if (backward && s + 1 < n()) {  // the accumulators move on to the rank that computes them next
        for (Dev& d : devs) {
          use(d);
          CUDA_CHECK(cudaStreamWaitEvent(d.comm, d.merged[s], 0));
        }
        ring_shift(
            s, [&](Dev& d) { return d.acc[s & 1].get(); }, [&](Dev& d) { return d.acc[(s + 1) & 1].get(); },
            [&](int r) { return acc_bytes_of(r); }, tl);
        for (Dev& d : devs) {
          use(d);
          CUDA_CHECK(cudaEventRecord(d.acc_arrived[s], d.comm));
        }
      }
    }
    for (Dev& d : devs) {
      use(d);
      const int len = d.shard.len();
      if (backward) {  // the last step's block was the own one: its accumulator is complete here
        ring_round(prob.dtype, static_cast<const float*>(d.dq_acc.get()), d.dq.get(), q_elems(len), d.merge);
        ring_round(prob.dtype, static_cast<const float*>(d.acc[(n() - 1) & 1].get()), d.dkv.get(), 2 * kv_elems(len),
                   d.merge);
      }
      if (tl) CUDA_CHECK(cudaEventRecord(tl->end[d.rank], d.merge));
      CUDA_CHECK(cudaEventRecord(d.done, d.merge));
    }
    CUDA_CHECK(cudaSetDevice(devs[0].id));
    for (Dev& d : devs) CUDA_CHECK(cudaStreamWaitEvent(stream0, d.done, 0));
  }

  int max_len() const {
    int m = 0;
    for (int r = 0; r < n(); ++r) m = std::max(m, shard_len(r));
    return m;
  }

  // Forward, on the merge stream: the first block becomes the running result, the last one is
  // merged and the output written in the dtype in the same pass, the others are merged.
  void merge_step(Dev& d, int s) {
    const RingCall& c = d.blocks[src_of(d.rank, s)].call;
    const int len = d.shard.len(), last = last_block(d);
    if (c.skip || last < 0) return;
    const int B = dims().B, H = dims().H, D = dims().D;
    const void* o_part = d.o_part[s & 1].get();
    const float* lse_part = static_cast<const float*>(d.lse_part[s & 1].get());
    float* o_acc = static_cast<float*>(d.o_acc.get());
    float* lse = static_cast<float*>(d.lse.get());
    if (s == 0 && last == 0) {  // the only block: it is the result
      CUDA_CHECK(cudaMemcpyAsync(d.o.get(), o_part, q_elems(len) * es(), cudaMemcpyDeviceToDevice, d.merge));
      CUDA_CHECK(cudaMemcpyAsync(lse, lse_part, size_t(B) * H * len * sizeof(float), cudaMemcpyDeviceToDevice,
                                 d.merge));
    } else if (s == 0) {  // the own block covers every row of the shard
      ring_merge_first(prob.dtype, o_part, lse_part, o_acc, lse, int64_t(B) * H * len, D, d.merge);
    } else if (s == last) {
      ring_merge_last(prob.dtype, o_part, lse_part, o_acc, lse, d.o.get(), B, H, c.q_rows, c.q_row0, len, D, d.merge);
    } else {
      ring_merge_block(prob.dtype, o_part, lse_part, o_acc, lse, B, H, c.q_rows, c.q_row0, len, D, d.merge);
    }
  }

  // Backward, on the merge stream: dQ into its accumulator, dK/dV into the travelling one (which
  // arrived with the previous step's transfer).
  void accumulate_step(Dev& d, int s, Timeline* tl) {
    const int src = src_of(d.rank, s);
    const RingCall& c = d.blocks[src].call;
    const int len = d.shard.len(), len_src = shard_len(src);
    if (s > 0) wait_for(d, d.merge, d.acc_arrived[s - 1], tl);
    if (c.skip) return;
    const int B = dims().B, D = dims().D;
    ring_accumulate(prob.dtype, d.dq_part[s & 1].get(), static_cast<float*>(d.dq_acc.get()), B, dims().H, c.q_rows,
                    c.q_row0, len, D, d.merge);
    float* acc = static_cast<float*>(d.acc[s & 1].get());
    const DeviceBuffer& part = d.dkv_part[s & 1];
    ring_accumulate(prob.dtype, part.get(), acc, B, dims().H_kv, c.k_rows, c.k_row0, len_src, D, d.merge);
    ring_accumulate(prob.dtype, at(part, kv_elems(c.k_rows) * int64_t(es())), acc + kv_elems(len_src), B, dims().H_kv,
                    c.k_rows, c.k_row0, len_src, D, d.merge);
  }

  // ---- shards ---------------------------------------------------------------------------------
  // Rows of `a` (the problem's layout, [B, heads, S, D]) that `shard` holds, as [B, heads, len, D].
  HostArray shard_rows(const HostArray& a, int heads, const RingShard& shard) const {
    HostArray out(a.dtype, {dims().B, heads, shard.len(), dims().D});
    ring_gather_rows(a.bytes.data(), layout_strides(prob.layout, heads, dims().S_q, dims().D), dtype_size(a.dtype),
                     dims().B, heads, dims().D, shard, out.bytes.data());
    return out;
  }

  // The inverse, from the device: a shard [B, heads, len, D] of `buf` (from element
  // `offset_elems`) into its rows of `out` (problem layout, or [B, H, S] for lse with D = 1).
  void unshard(const DeviceBuffer& buf, int64_t offset_elems, DType t, int heads, int D, bool lse_like,
               const RingShard& shard, HostArray* out) const {
    const size_t bytes = size_t(dims().B) * heads * shard.len() * D * dtype_size(t);
    if (bytes == 0) return;
    std::vector<unsigned char> host(bytes);
    CUDA_CHECK(cudaMemcpy(host.data(), at(buf, offset_elems * int64_t(dtype_size(t))), bytes, cudaMemcpyDeviceToHost));
    const Strides st = lse_like ? Strides{int64_t(heads) * dims().S_q, dims().S_q, 1}
                                : layout_strides(prob.layout, heads, dims().S_q, D);
    ring_scatter_rows(host.data(), dtype_size(t), dims().B, heads, D, shard, st, out->bytes.data());
  }

  void allocate(Dev& d, const RunInputs& in) {
    const int len = d.shard.len(), max_kv = max_len();
    const size_t e = es(), B = dims().B, H = dims().H;
    // The largest block any step computes (rows of Q and of K), for the partial buffers; the
    // workspace for the largest any call asks (the forward's too: a backward runs it first).
    int q_rows = 0, k_rows = 0;
    d.ws_bytes = 0;
    for (int s = 0; s < n(); ++s) {
      const RingCall& c = d.blocks[src_of(d.rank, s)].call;
      q_rows = std::max(q_rows, c.q_rows), k_rows = std::max(k_rows, c.k_rows);
      if (c.skip) continue;
      if (backward && entry->bwd_workspace) d.ws_bytes = std::max(d.ws_bytes, entry->bwd_workspace(block_bwd_params(d, s, 0)));
      if (fwd_entry->fwd_workspace) d.ws_bytes = std::max(d.ws_bytes, fwd_entry->fwd_workspace(block_params(d, s, 0)));
    }
    // Q, dO, the own K/V and two receive buffers, the workspace; the forward's running result,
    // two partial results and O; the backward's accumulators, two partial gradients, outputs.
    size_t need = 2 * q_elems(len) * e + 3 * size_t(2 * kv_elems(max_kv)) * e + d.ws_bytes;
    need += q_elems(len) * (4 + e) + B * H * len * 4 + 2 * (q_elems(q_rows) * e + B * H * q_rows * 4);
    if (backward)
      need += q_elems(len) * (4 + e) + B * H * d.shard.len_b * 4 + 2 * (q_elems(q_rows) + 2 * kv_elems(k_rows)) * e +
              2 * size_t(2 * kv_elems(max_kv)) * 4 + 2 * kv_elems(len) * e;
    use(d);
    require_device_memory(entry->kernel + " (ring rank " + std::to_string(d.rank) + ")", need, d.id);
    bytes_held = std::max(bytes_held, need);
    d.q = upload_array(shard_rows(in.q, dims().H, d.shard));
    {
      const HostArray k = shard_rows(in.k, dims().H_kv, d.shard), v = shard_rows(in.v, dims().H_kv, d.shard);
      d.kv_own = DeviceBuffer(k.nbytes() + v.nbytes());
      if (k.nbytes()) {
        CUDA_CHECK(cudaMemcpy(d.kv_own.get(), k.bytes.data(), k.nbytes(), cudaMemcpyHostToDevice));
        CUDA_CHECK(cudaMemcpy(at(d.kv_own, int64_t(k.nbytes())), v.bytes.data(), v.nbytes(), cudaMemcpyHostToDevice));
      }
    }
    for (DeviceBuffer& b : d.kv) b = DeviceBuffer(2 * kv_elems(max_kv) * e);
    d.o_acc = DeviceBuffer(q_elems(len) * 4);
    d.lse = DeviceBuffer(B * H * len * 4);
    for (int i = 0; i < 2; ++i) {
      d.o_part[i] = DeviceBuffer(q_elems(q_rows) * e);
      d.lse_part[i] = DeviceBuffer(B * H * q_rows * 4);
    }
    d.o = DeviceBuffer(q_elems(len) * e);
    d.ws = DeviceBuffer(d.ws_bytes);
    if (d.ws_bytes) CUDA_CHECK(cudaMemset(d.ws.get(), 0xFF, d.ws_bytes));  // undefined to the kernel
    if (backward) {
      d.dout = upload_array(shard_rows(*in.dout, dims().H, d.shard));
      d.lse_b = DeviceBuffer(B * H * d.shard.len_b * 4);
      d.dq_acc = DeviceBuffer(q_elems(len) * 4);
      for (int i = 0; i < 2; ++i) {
        d.dq_part[i] = DeviceBuffer(q_elems(q_rows) * e);
        d.dkv_part[i] = DeviceBuffer(2 * kv_elems(k_rows) * e);
        d.acc[i] = DeviceBuffer(2 * kv_elems(max_kv) * 4);
      }
      d.dq = DeviceBuffer(q_elems(len) * e);
      d.dkv = DeviceBuffer(2 * kv_elems(len) * e);
    }
    const int32_t* seqlens = in.seqlens_k ? in.seqlens_k->data<int32_t>() : nullptr;
    for (int src = 0; src < n() && seqlens; ++src) {
      Block& blk = d.blocks[src];
      HostArray local(DType::I32, {dims().B});
      const RingShard kv = ring_shard(dims().S_k, n(), src);
      for (int b = 0; b < dims().B; ++b)
        local.data<int32_t>()[b] = ring_local_seqlen(kv, blk.call.k_row0, blk.call.k_rows, seqlens[b]);
      blk.seqlens = upload_array(local);
    }
  }
};

namespace {

// The NCCL unique id of a ring of processes, through a file: rank 0 creates it (atomically:
// written beside it, then renamed), the others wait for it.
ncclUniqueId exchange_id(const RingProcess& me) {
  ncclUniqueId id;
  const std::string& path = me.id_file;
  if (me.rank == 0) {
    if (std::FILE* f = std::fopen(path.c_str(), "rb")) {
      std::fclose(f);
      throw InputError("--ring-id: " + path + " exists; give each launch a new path (rank 0 creates it)");
    }
    NCCL_CHECK(ncclGetUniqueId(&id));
    const std::string tmp = path + ".tmp" + std::to_string(::getpid());
    std::FILE* f = std::fopen(tmp.c_str(), "wb");
    if (!f) throw InputError("--ring-id: cannot create " + tmp + ": " + std::strerror(errno));
    const bool ok = std::fwrite(&id, sizeof id, 1, f) == 1;
    if (std::fclose(f) != 0 || !ok || std::rename(tmp.c_str(), path.c_str()) != 0) {
      std::remove(tmp.c_str());
      throw RuntimeError("--ring-id: cannot write " + path + ": " + std::strerror(errno));
    }
    return id;
  }
  for (int tries = 0; tries < 1200; ++tries) {  // two minutes
    if (std::FILE* f = std::fopen(path.c_str(), "rb")) {
      const bool ok = std::fread(&id, sizeof id, 1, f) == 1;
      std::fclose(f);
      if (ok) return id;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  throw RuntimeError("--ring-id: " + path + " did not appear within two minutes (is rank 0 running, with the same path?)");
}

}  // namespace

void Ring::Impl::init_dev(Dev& d, int id, int rank, ncclComm_t comm, bool flusher) {
  d.id = id;
  d.rank = rank;
  d.nccl = comm;
  use(d);
  d.info = query_device(d.id);
  CUDA_CHECK(cudaStreamCreateWithFlags(&d.compute, cudaStreamNonBlocking));
  CUDA_CHECK(cudaStreamCreateWithFlags(&d.comm, cudaStreamNonBlocking));
  CUDA_CHECK(cudaStreamCreateWithFlags(&d.merge, cudaStreamNonBlocking));
  d.ctx = gpu_launch_context(*d.info, d.id, d.compute);
  if (flusher) d.flusher = std::make_unique<L2Flusher>(d.info->l2_bytes);
  for (int i = 0; i < world; ++i) {
    d.computed.push_back(make_event(false));
    d.merged.push_back(make_event(false));
    d.kv_arrived.push_back(make_event(false));
    d.acc_arrived.push_back(make_event(false));
  }
  d.done = make_event(false);
}

Ring::Ring(std::vector<int> devices) : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  // NVLink multicast (NVLS) stays off in every process of this tool.
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  s.ids = std::move(devices);
  s.world = static_cast<int>(s.ids.size());
  s.devs.resize(s.ids.size());
  std::vector<ncclComm_t> comms(s.ids.size());
  NCCL_CHECK(ncclCommInitAll(comms.data(), s.world, s.ids.data()));
  // The first GPU's L2 is flushed by the caller's timer, the others' here.
  for (int r = 0; r < s.world; ++r) s.init_dev(s.devs[r], s.ids[r], r, comms[r], r > 0);
  CUDA_CHECK(cudaSetDevice(s.ids[0]));
  s.start = make_event(false);
}

Ring::Ring(int device, const RingProcess& me) : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  s.ids = {device};
  s.world = me.size;
  s.multi = true;
  s.devs.resize(1);
  const ncclUniqueId id = exchange_id(me);
  CUDA_CHECK(cudaSetDevice(device));
  ncclComm_t comm = nullptr;
  NCCL_CHECK(ncclCommInitRank(&comm, me.size, id, me.rank));
  if (me.rank == 0) std::remove(me.id_file.c_str());  // every rank has joined: the id is spent
  s.init_dev(s.devs[0], device, me.rank, comm, false);  // this GPU's L2: the caller's timer
  CUDA_CHECK(cudaSetDevice(device));
  s.start = make_event(false);
}

Ring::~Ring() {
  Impl& s = *impl_;
  for (Impl::Dev& d : s.devs) {
    cudaSetDevice(d.id);
    for (cudaStream_t st : {d.compute, d.comm, d.merge})
      if (st) cudaStreamSynchronize(st);
  }
  for (Impl::Dev& d : s.devs)
    if (d.nccl) ncclCommDestroy(d.nccl);
  for (Impl::Dev& d : s.devs) {
    cudaSetDevice(d.id);
    for (auto* v : {&d.computed, &d.merged, &d.kv_arrived, &d.acc_arrived})
      for (cudaEvent_t e : *v) cudaEventDestroy(e);
    if (d.done) cudaEventDestroy(d.done);
    for (cudaStream_t st : {d.compute, d.comm, d.merge})
      if (st) cudaStreamDestroy(st);
    d = Impl::Dev{};  // the buffers and the flusher go while their device is current
  }
  if (!s.ids.empty()) cudaSetDevice(s.ids[0]);
  if (s.start) cudaEventDestroy(s.start);
}

int Ring::size() const { return impl_->n(); }
bool Ring::root() const { return impl_->root(); }
const std::vector<int>& Ring::devices() const { return impl_->ids; }

void Ring::prepare(const KernelMode& e, const RunInputs& in, bool deterministic) {
  Impl& s = *impl_;
  s.entry = &e;
  s.backward = e.mode == Mode::Backward;
  s.fwd_entry = s.backward ? Registry::find(e.kernel, Mode::Forward) : &e;
  if (!s.fwd_entry || !s.fwd_entry->fwd)
    throw InputError("kernel '" + e.kernel + "' has no forward pass to produce O and lse for the ring backward");
  s.prob = in.problem;
  s.deterministic = deterministic;
  const int S = s.dims().S_q;
  for (Impl::Dev& d : s.devs) {
    d.shard = ring_shard(S, s.n(), d.rank);
    d.blocks.clear();
    d.blocks.resize(s.n());
    for (int src = 0; src < s.n(); ++src) d.blocks[src].call = ring_call(S, s.n(), d.rank, src, s.prob.causal);
  }
  s.bytes_held = 0;
  for (Impl::Dev& d : s.devs) s.allocate(d, in);
  if (!s.backward) return;
  // O and lse for the backward: the ring forward once (not timed).
  NvtxRange range("ring forward for O and lse");
  const KernelMode* run_entry = s.entry;
  s.entry = s.fwd_entry;
  s.backward = false;
  CUDA_CHECK(cudaSetDevice(s.devs[0].id));
  s.enqueue(s.devs[0].compute, false, nullptr);
  s.entry = run_entry;
  s.backward = true;
  for (Impl::Dev& d : s.devs) {
    s.use(d);
    if (d.shard.len_b)  // O and lse are written on the merge stream
      ring_lse_rows(static_cast<const float*>(d.lse.get()), static_cast<float*>(d.lse_b.get()), s.dims().B,
                    s.dims().H, d.shard.len_b, d.shard.len_a, d.shard.len(), d.merge);
    CUDA_CHECK(cudaStreamSynchronize(d.merge));
  }
  CUDA_CHECK(cudaSetDevice(s.devs[0].id));
  CUDA_CHECK(cudaStreamSynchronize(s.devs[0].compute));
}

void Ring::poison_outputs() {
  Impl& s = *impl_;
  for (Impl::Dev& d : s.devs) {
    s.use(d);
    // The run's outputs only: a backward's O is its input (the ring forward's merged result).
    const std::vector<const DeviceBuffer*> outputs =
        s.backward ? std::vector<const DeviceBuffer*>{&d.dq, &d.dkv} : std::vector<const DeviceBuffer*>{&d.o};
    for (const DeviceBuffer* b : outputs)
      if (b->bytes()) CUDA_CHECK(cudaMemset(b->get(), 0xFF, b->bytes()));
  }
}

void Ring::enqueue(cudaStream_t stream0, bool flush) { impl_->enqueue(stream0, flush, nullptr); }

KernelOutputs Ring::gather() const {
  const Impl& s = *impl_;
  const Dims& dm = s.dims();
  auto shape = [&](int heads, int D) {
    return s.prob.layout == Layout::BHSD ? std::vector<int64_t>{dm.B, heads, dm.S_q, D}
                                         : std::vector<int64_t>{dm.B, dm.S_q, heads, D};
  };
  for (const Impl::Dev& d : s.devs) {
    s.use(d);
    CUDA_CHECK(cudaDeviceSynchronize());
  }
  // Each output: which buffer of a shard holds it, from which element, and its shape.
  struct Piece {
    const DeviceBuffer Impl::Dev::*buffer;
    bool second_half;  // dV, behind dK in the same buffer
    DType t;
    int heads, D;
    bool lse_like;
    std::optional<HostArray>* out;
  };
  KernelOutputs out;
  std::vector<Piece> pieces;
  if (!s.backward) {
    pieces.push_back({&Impl::Dev::o, false, s.prob.dtype, dm.H, dm.D, false, &out.o});
    pieces.push_back({&Impl::Dev::lse, false, DType::F32, dm.H, 1, true, &out.lse});
  } else {
    pieces.push_back({&Impl::Dev::dq, false, s.prob.dtype, dm.H, dm.D, false, &out.dq});
    pieces.push_back({&Impl::Dev::dkv, false, s.prob.dtype, dm.H_kv, dm.D, false, &out.dk});
    pieces.push_back({&Impl::Dev::dkv, true, s.prob.dtype, dm.H_kv, dm.D, false, &out.dv});
  }
  const bool root = s.root();
  for (const Piece& pc : pieces) {
    if (root) *pc.out = HostArray(pc.t, pc.lse_like ? std::vector<int64_t>{dm.B, dm.H, dm.S_q} : shape(pc.heads, pc.D));
    auto offset = [&](int len) { return pc.second_half ? s.kv_elems(len) : int64_t(0); };
    auto bytes = [&](int len) { return size_t(dm.B) * pc.heads * len * pc.D * dtype_size(pc.t); };
    for (const Impl::Dev& d : s.devs)
      if (root) s.unshard(d.*pc.buffer, offset(d.shard.len()), pc.t, pc.heads, pc.D, pc.lse_like, d.shard, &**pc.out);
    if (!s.multi) continue;
    // Across processes: every other rank's shard comes to rank 0.
    const Impl::Dev& d = s.devs[0];
    s.use(d);
    std::vector<DeviceBuffer> from(s.n());
    NCCL_CHECK(ncclGroupStart());
    if (root) {
      for (int r = 1; r < s.n(); ++r) {
        const int len = s.shard_len(r);
        from[r] = DeviceBuffer(bytes(len));
        if (bytes(len)) NCCL_CHECK(ncclRecv(from[r].get(), bytes(len), ncclUint8, r, d.nccl, d.comm));
      }
    } else if (bytes(d.shard.len())) {
      NCCL_CHECK(ncclSend(at(d.*pc.buffer, offset(d.shard.len()) * int64_t(dtype_size(pc.t))), bytes(d.shard.len()),
                          ncclUint8, 0, d.nccl, d.comm));
    }
    NCCL_CHECK(ncclGroupEnd());
    CUDA_CHECK(cudaStreamSynchronize(d.comm));
    for (int r = 1; root && r < s.n(); ++r)
      s.unshard(from[r], 0, pc.t, pc.heads, pc.D, pc.lse_like, ring_shard(dm.S_q, s.n(), r), &**pc.out);
  }
  return out;
}

RingProfile Ring::profile(cudaStream_t stream0) {
  Impl& s = *impl_;
  Impl::Timeline tl;
  for (auto* v : {&tl.wait_in, &tl.wait_out, &tl.comm_in, &tl.comm_out}) v->resize(s.n());
  tl.comm_bytes.resize(s.n());
  for (Impl::Dev& d : s.devs) {
    s.use(d);
    tl.begin.push_back(make_event(true));
    tl.end.push_back(make_event(true));
  }
  s.enqueue(stream0, true, &tl);
  RingProfile p;
  for (Impl::Dev& d : s.devs) {
    s.use(d);
    CUDA_CHECK(cudaStreamSynchronize(d.merge));
    CUDA_CHECK(cudaStreamSynchronize(d.comm));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, tl.begin[d.rank], tl.end[d.rank]));
    p.compute_ms.push_back(ms);
    double waiting = 0;
    for (size_t i = 0; i < tl.wait_in[d.rank].size(); ++i) {
      CUDA_CHECK(cudaEventElapsedTime(&ms, tl.wait_in[d.rank][i], tl.wait_out[d.rank][i]));
      waiting += ms;
    }
    // The link's rate: the best transfer's bytes over its time (a transfer's events also hold
    // the wait for its partner, so the fastest is the closest to the link's own rate).
    for (size_t i = 0; i < tl.comm_in[d.rank].size(); ++i) {
      CUDA_CHECK(cudaEventElapsedTime(&ms, tl.comm_in[d.rank][i], tl.comm_out[d.rank][i]));
      if (ms > 0 && tl.comm_bytes[d.rank][i] >= (1 << 20))
        p.link_gbps = std::max(p.link_gbps, tl.comm_bytes[d.rank][i] / (ms * 1e-3) / 1e9);
    }
    p.waiting_ms.push_back(waiting);
    p.total_ms = std::max(p.total_ms, p.compute_ms.back());
    p.exposed_comm_ms = std::max(p.exposed_comm_ms, waiting);
  }
  for (Impl::Dev& d : s.devs) {
    s.use(d);
    for (cudaEvent_t e : {tl.begin[d.rank], tl.end[d.rank]}) cudaEventDestroy(e);
    for (auto* v : {&tl.wait_in[d.rank], &tl.wait_out[d.rank], &tl.comm_in[d.rank], &tl.comm_out[d.rank]})
      for (cudaEvent_t e : *v) cudaEventDestroy(e);
  }
  CUDA_CHECK(cudaSetDevice(s.devs[0].id));
  return p;
}

std::vector<double> Ring::flops_per_device() const {
  const Impl& s = *impl_;
  std::vector<double> f;
  for (const Impl::Dev& d : s.devs) {
    double sum = 0;
    for (const Impl::Block& blk : d.blocks) {
      if (blk.call.skip) continue;
      Problem p = s.prob;
      p.dims.S_q = blk.call.q_rows, p.dims.S_k = blk.call.k_rows;
      p.causal = blk.call.causal;
      p.has_padding = false;
      sum += s.backward ? backward_flops(p, nullptr) : forward_flops(p, nullptr);
    }
    f.push_back(sum);
  }
  return f;
}

size_t Ring::bytes_per_device() const { return impl_->bytes_held; }

#endif  // FLASHATTN_HAVE_NCCL

}  // namespace flashattn

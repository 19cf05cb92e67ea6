#include "ring.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <optional>

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
#endif

namespace flashattn {

#ifndef FLASHATTN_HAVE_NCCL

std::string ring_unavailable() {
  return "this build has no NCCL (nccl.h or libnccl was not found when it was configured), so it runs on one GPU "
         "only";
}

struct Ring::Impl {};
Ring::Ring(std::vector<int>) { throw InputError("--devices: " + ring_unavailable()); }
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
  struct Step {
    int src = 0;  // whose K/V shard this step computes against
    RingCall call;
    DeviceBuffer seqlens;  // int32 [B]: the block's keys below each batch element's length
  };
  struct Dev {
    int id = -1, rank = 0;
    cudaStream_t compute = nullptr, comm = nullptr;
    ncclComm_t nccl = nullptr;
    std::optional<DeviceInfo> info;
    LaunchContext ctx;
    std::unique_ptr<L2Flusher> flusher;  // ranks > 0 (rank 0's is the caller's timer)
    RingShard shard;
    std::vector<Step> steps;
    // Inputs: Q, dO [B, H, len, D]; the own K/V shard and two receive buffers, each K then V
    // ([B, H_kv, len_src, D] each), sized for the longest shard.
    DeviceBuffer q, dout, kv_own, kv[2];
    // Forward: the running result (fp32), one block's partial result, the outputs.
    DeviceBuffer o_acc, lse, o_part, lse_part, o;
    // Backward: lse of the second chunk's rows (contiguous), dQ's accumulator, one block's
    // gradients (dQ; dK then dV), the travelling dK/dV accumulators (fp32, dK then dV), outputs.
    DeviceBuffer lse_b, dq_acc, dq_part, dkv_part, acc[2], dq, dkv;
    DeviceBuffer ws;
    size_t ws_bytes = 0;
    std::vector<cudaEvent_t> computed, kv_arrived, acc_arrived;  // per step
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

  int n() const { return static_cast<int>(devs.size()); }
  const Dims& dims() const { return prob.dims; }
  size_t es() const { return dtype_size(prob.dtype); }
  int next(int r) const { return (r + 1) % n(); }
  int prev(int r) const { return (r + n() - 1) % n(); }
  int src_of(int r, int s) const { return ((r - s) % n() + n()) % n(); }
  int64_t q_elems(int len) const { return int64_t(dims().B) * dims().H * len * dims().D; }
  int64_t kv_elems(int len) const { return int64_t(dims().B) * dims().H_kv * len * dims().D; }
  int shard_len(int rank) const { return ring_shard(dims().S_q, n(), rank).len(); }

  void use(const Dev& d) const { CUDA_CHECK(cudaSetDevice(d.id)); }

  // ---- one block ------------------------------------------------------------------------------
  RingBlockBuffers buffers(const Dev& d, const Step& st) const {
    RingBlockBuffers b;
    b.q = d.q.get();
    b.kv = kv_for(d, st).get();
    b.o_part = d.o_part.get();
    b.lse_part = d.lse_part.get();
    b.seqlens = static_cast<const int32_t*>(st.seqlens.get());
    b.workspace = d.ws.get();
    b.workspace_bytes = d.ws_bytes;
    b.o = d.o.get();
    b.lse = st.call.q_row0 == 0 ? d.lse.get() : d.lse_b.get();  // the block's rows, contiguous
    b.dout = d.dout.get();
    b.dq_part = d.dq_part.get();
    b.dkv_part = d.dkv_part.get();
    return b;
  }

  FwdParams block_params(const Dev& d, const Step& st) const {
    FwdParams f = ring_block_fwd(prob, d.shard.len(), shard_len(st.src), st.call, buffers(d, st));
    f.num_sms = d.info->sm_count;
    f.deterministic = deterministic;
    return f;
  }

  BwdParams block_bwd_params(const Dev& d, const Step& st) const {
    BwdParams b = ring_block_bwd(prob, d.shard.len(), shard_len(st.src), st.call, buffers(d, st));
    b.num_sms = d.info->sm_count;
    b.deterministic = deterministic;
    return b;
  }

  // Step s computes against the own shard (s = 0) or the buffer its K/V arrived in.
  const DeviceBuffer& kv_for(const Dev& d, const Step& st) const {
    const int s = static_cast<int>(&st - d.steps.data());
    return s == 0 ? d.kv_own : d.kv[(s - 1) & 1];
  }

  size_t kv_bytes_of(int rank) const { return 2 * kv_elems(shard_len(rank)) * es(); }
  size_t acc_bytes_of(int rank) const { return 2 * kv_elems(shard_len(rank)) * sizeof(float); }

  // ---- transfers ------------------------------------------------------------------------------
  // Every rank sends `send(r)` (bytes_of(src) bytes) to the next rank and receives from the
  // previous one into `recv(r)`: one NCCL group over all devices (one thread drives them all).
  template <class SendBuf, class RecvBuf, class Bytes>
  void ring_shift(int s, SendBuf send, RecvBuf recv, Bytes bytes_of) {
    NCCL_CHECK(ncclGroupStart());
    for (Dev& d : devs) {
      const size_t out = bytes_of(src_of(d.rank, s)), in = bytes_of(src_of(prev(d.rank), s));
      if (out) NCCL_CHECK(ncclSend(send(d), out, ncclUint8, next(d.rank), d.nccl, d.comm));
      if (in) NCCL_CHECK(ncclRecv(recv(d), in, ncclUint8, prev(d.rank), d.nccl, d.comm));
    }
    NCCL_CHECK(ncclGroupEnd());
  }

  // ---- a repetition ---------------------------------------------------------------------------
  struct Timeline {  // profile(): timing events on every compute stream
    std::vector<cudaEvent_t> begin, end;                     // per device
    std::vector<std::vector<cudaEvent_t>> wait_in, wait_out;  // per device, per wait
  };

  void wait_for(Dev& d, cudaEvent_t e, Timeline* tl) {
    if (tl) {
      tl->wait_in[d.rank].push_back(make_event(true));
      CUDA_CHECK(cudaEventRecord(tl->wait_in[d.rank].back(), d.compute));
    }
    CUDA_CHECK(cudaStreamWaitEvent(d.compute, e, 0));
    if (tl) {
      tl->wait_out[d.rank].push_back(make_event(true));
      CUDA_CHECK(cudaEventRecord(tl->wait_out[d.rank].back(), d.compute));
    }
  }

  void enqueue(cudaStream_t stream0, bool flush, Timeline* tl) {
    CUDA_CHECK(cudaSetDevice(devs[0].id));
    CUDA_CHECK(cudaEventRecord(start, stream0));
    for (Dev& d : devs) {
      use(d);
      if (flush && d.flusher) d.flusher->flush(d.compute);  // while rank 0 flushes before `start`
      CUDA_CHECK(cudaStreamWaitEvent(d.compute, start, 0));
      CUDA_CHECK(cudaStreamWaitEvent(d.comm, start, 0));
      if (tl) CUDA_CHECK(cudaEventRecord(tl->begin[d.rank], d.compute));
      if (backward) {
        ring_fill(static_cast<float*>(d.dq_acc.get()), 0.f, q_elems(d.shard.len()), d.compute);
        ring_fill(static_cast<float*>(d.acc[0].get()), 0.f, 2 * kv_elems(d.shard.len()), d.compute);
      } else {
        ring_fill(static_cast<float*>(d.o_acc.get()), 0.f, q_elems(d.shard.len()), d.compute);
        ring_fill(static_cast<float*>(d.lse.get()), -std::numeric_limits<float>::infinity(),
                  int64_t(dims().B) * dims().H * d.shard.len(), d.compute);
      }
    }
    for (int s = 0; s < n(); ++s) {
      NvtxRange range("ring step " + std::to_string(s));
      // The next step's K/V (into the buffer the previous step computed from) while this one runs.
      if (s + 1 < n()) {
        for (Dev& d : devs) {
          use(d);
          if (s > 0) CUDA_CHECK(cudaStreamWaitEvent(d.comm, d.computed[s - 1], 0));
        }
        ring_shift(
            s, [&](Dev& d) { return (s == 0 ? d.kv_own : d.kv[(s - 1) & 1]).get(); },
            [&](Dev& d) { return d.kv[s & 1].get(); }, [&](int r) { return kv_bytes_of(r); });
        for (Dev& d : devs) {
          use(d);
          CUDA_CHECK(cudaEventRecord(d.kv_arrived[s], d.comm));
        }
      }
      for (Dev& d : devs) {
        use(d);
        if (s > 0) wait_for(d, d.kv_arrived[s - 1], tl);
        compute_step(d, s, tl);
        CUDA_CHECK(cudaEventRecord(d.computed[s], d.compute));
      }
      if (backward) {  // this step's dK/dV accumulators travel on (after the last step: home)
        for (Dev& d : devs) {
          use(d);
          CUDA_CHECK(cudaStreamWaitEvent(d.comm, d.computed[s], 0));
        }
        ring_shift(
            s, [&](Dev& d) { return d.acc[s & 1].get(); }, [&](Dev& d) { return d.acc[(s + 1) & 1].get(); },
            [&](int r) { return acc_bytes_of(r); });
        for (Dev& d : devs) {
          use(d);
          CUDA_CHECK(cudaEventRecord(d.acc_arrived[s], d.comm));
        }
      }
    }
    for (Dev& d : devs) {
      use(d);
      const int len = d.shard.len();
      if (backward) {
        wait_for(d, d.acc_arrived[n() - 1], tl);
        ring_round(prob.dtype, static_cast<const float*>(d.dq_acc.get()), d.dq.get(), q_elems(len), d.compute);
        ring_round(prob.dtype, static_cast<const float*>(d.acc[n() & 1].get()), d.dkv.get(), 2 * kv_elems(len),
                   d.compute);
      } else {
        ring_round(prob.dtype, static_cast<const float*>(d.o_acc.get()), d.o.get(), q_elems(len), d.compute);
      }
      if (tl) CUDA_CHECK(cudaEventRecord(tl->end[d.rank], d.compute));
      CUDA_CHECK(cudaEventRecord(d.done, d.compute));
    }
    CUDA_CHECK(cudaSetDevice(devs[0].id));
    for (Dev& d : devs) CUDA_CHECK(cudaStreamWaitEvent(stream0, d.done, 0));
  }

  void compute_step(Dev& d, int s, Timeline* tl) {
    const Step& st = d.steps[s];
    const RingCall& c = st.call;
    const int len = d.shard.len(), len_src = shard_len(st.src);
    if (!backward) {
      if (c.skip) return;
      entry->fwd(block_params(d, st), d.ctx);
      ring_merge_block(prob.dtype, d.o_part.get(), static_cast<const float*>(d.lse_part.get()),
                       static_cast<float*>(d.o_acc.get()), static_cast<float*>(d.lse.get()), dims().B, dims().H,
                       c.q_rows, c.q_row0, len, dims().D, d.compute);
      return;
    }
    if (!c.skip) {
      entry->bwd(block_bwd_params(d, st), d.ctx);
      ring_accumulate(prob.dtype, d.dq_part.get(), static_cast<float*>(d.dq_acc.get()), dims().B, dims().H, c.q_rows,
                      c.q_row0, len, dims().D, d.compute);
    }
    // The accumulators of src's K/V arrived with the previous step's transfer.
    if (s > 0) wait_for(d, d.acc_arrived[s - 1], tl);
    if (c.skip) return;
    float* acc = static_cast<float*>(d.acc[s & 1].get());
    const size_t part_dv = kv_elems(c.k_rows) * es();
    ring_accumulate(prob.dtype, d.dkv_part.get(), acc, dims().B, dims().H_kv, c.k_rows, c.k_row0, len_src, dims().D,
                    d.compute);
    ring_accumulate(prob.dtype, at(d.dkv_part, int64_t(part_dv)), acc + kv_elems(len_src), dims().B, dims().H_kv,
                    c.k_rows, c.k_row0, len_src, dims().D, d.compute);
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
    const int len = d.shard.len();
    int max_len = 0;
    for (int r = 0; r < n(); ++r) max_len = std::max(max_len, shard_len(r));
    const size_t e = es(), B = dims().B, H = dims().H;
    // The largest block any step computes (rows of Q and of K), for the partial buffers.
    int q_rows = 0, k_rows = 0;
    for (const Step& st : d.steps) q_rows = std::max(q_rows, st.call.q_rows), k_rows = std::max(k_rows, st.call.k_rows);
    d.ws_bytes = 0;
    for (const Step& st : d.steps) {
      if (st.call.skip) continue;
      if (backward) {
        if (entry->bwd_workspace) d.ws_bytes = std::max(d.ws_bytes, entry->bwd_workspace(block_bwd_params(d, st)));
      } else if (entry->fwd_workspace) {
        d.ws_bytes = std::max(d.ws_bytes, entry->fwd_workspace(block_params(d, st)));
      }
      if (fwd_entry->fwd_workspace) d.ws_bytes = std::max(d.ws_bytes, fwd_entry->fwd_workspace(block_params(d, st)));
    }
    size_t need = 2 * q_elems(len) * e + 3 * size_t(2 * kv_elems(max_len)) * e + d.ws_bytes;  // Q, dO, K/V x3
    need += q_elems(len) * (4 + e) + B * H * len * 4 * 2 + q_elems(q_rows) * e + B * H * q_rows * 4;  // forward
    if (backward)
      need += q_elems(len) * (4 + e) + q_elems(q_rows) * e + 2 * kv_elems(k_rows) * e + 2 * size_t(2 * kv_elems(max_len)) * 4 +
              2 * kv_elems(len) * e;
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
    for (DeviceBuffer& b : d.kv) b = DeviceBuffer(2 * kv_elems(max_len) * e);
    d.o_acc = DeviceBuffer(q_elems(len) * 4);
    d.lse = DeviceBuffer(B * H * len * 4);
    d.o_part = DeviceBuffer(q_elems(q_rows) * e);
    d.lse_part = DeviceBuffer(B * H * q_rows * 4);
    d.o = DeviceBuffer(q_elems(len) * e);
    d.ws = DeviceBuffer(d.ws_bytes);
    if (d.ws_bytes) CUDA_CHECK(cudaMemset(d.ws.get(), 0xFF, d.ws_bytes));  // undefined to the kernel
    if (backward) {
      d.dout = upload_array(shard_rows(*in.dout, dims().H, d.shard));
      d.lse_b = DeviceBuffer(B * H * d.shard.len_b * 4);
      d.dq_acc = DeviceBuffer(q_elems(len) * 4);
      d.dq_part = DeviceBuffer(q_elems(q_rows) * e);
      d.dkv_part = DeviceBuffer(2 * kv_elems(k_rows) * e);
      for (DeviceBuffer& b : d.acc) b = DeviceBuffer(2 * kv_elems(max_len) * 4);
      d.dq = DeviceBuffer(q_elems(len) * e);
      d.dkv = DeviceBuffer(2 * kv_elems(len) * e);
    }
    const int32_t* seqlens = in.seqlens_k ? in.seqlens_k->data<int32_t>() : nullptr;
    for (Step& st : d.steps) {
      if (!seqlens) continue;
      HostArray local(DType::I32, {dims().B});
      const RingShard kv = ring_shard(dims().S_k, n(), st.src);
      for (int b = 0; b < dims().B; ++b)
        local.data<int32_t>()[b] = ring_local_seqlen(kv, st.call.k_row0, st.call.k_rows, seqlens[b]);
      st.seqlens = upload_array(local);
    }
  }
};

Ring::Ring(std::vector<int> devices) : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  // NVLink multicast (NVLS) stays off in every process of this tool.
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  s.ids = std::move(devices);
  s.devs.resize(s.ids.size());
  std::vector<ncclComm_t> comms(s.ids.size());
  NCCL_CHECK(ncclCommInitAll(comms.data(), static_cast<int>(s.ids.size()), s.ids.data()));
  for (size_t r = 0; r < s.ids.size(); ++r) {
    Impl::Dev& d = s.devs[r];
    d.id = s.ids[r];
    d.rank = static_cast<int>(r);
    d.nccl = comms[r];
    s.use(d);
    d.info = query_device(d.id);
    CUDA_CHECK(cudaStreamCreateWithFlags(&d.compute, cudaStreamNonBlocking));
    CUDA_CHECK(cudaStreamCreateWithFlags(&d.comm, cudaStreamNonBlocking));
    d.ctx = gpu_launch_context(*d.info, d.id, d.compute);
    if (r > 0) d.flusher = std::make_unique<L2Flusher>(d.info->l2_bytes);
    for (size_t i = 0; i < s.ids.size(); ++i) {
      d.computed.push_back(make_event(false));
      d.kv_arrived.push_back(make_event(false));
      d.acc_arrived.push_back(make_event(false));
    }
    d.done = make_event(false);
  }
  CUDA_CHECK(cudaSetDevice(s.ids[0]));
  s.start = make_event(false);
}

Ring::~Ring() {
  Impl& s = *impl_;
  for (Impl::Dev& d : s.devs) {
    cudaSetDevice(d.id);
    if (d.compute) cudaStreamSynchronize(d.compute);
    if (d.comm) cudaStreamSynchronize(d.comm);
  }
  for (Impl::Dev& d : s.devs)
    if (d.nccl) ncclCommDestroy(d.nccl);
  for (Impl::Dev& d : s.devs) {
    cudaSetDevice(d.id);
    for (auto* v : {&d.computed, &d.kv_arrived, &d.acc_arrived})
      for (cudaEvent_t e : *v) cudaEventDestroy(e);
    if (d.done) cudaEventDestroy(d.done);
    for (cudaStream_t st : {d.compute, d.comm})
      if (st) cudaStreamDestroy(st);
    d = Impl::Dev{};  // the buffers and the flusher go while their device is current
  }
  if (!s.ids.empty()) cudaSetDevice(s.ids[0]);
  if (s.start) cudaEventDestroy(s.start);
}

int Ring::size() const { return impl_->n(); }
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
    d.steps.clear();
    d.steps.resize(s.n());
    for (int st = 0; st < s.n(); ++st) {
      d.steps[st].src = s.src_of(d.rank, st);
      d.steps[st].call = ring_call(S, s.n(), d.rank, d.steps[st].src, s.prob.causal);
    }
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
    if (d.shard.len_b)
      ring_lse_rows(static_cast<const float*>(d.lse.get()), static_cast<float*>(d.lse_b.get()), s.dims().B,
                    s.dims().H, d.shard.len_b, d.shard.len_a, d.shard.len(), d.compute);
    CUDA_CHECK(cudaStreamSynchronize(d.compute));
  }
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
  KernelOutputs out;
  for (const Impl::Dev& d : s.devs) {
    s.use(d);
    CUDA_CHECK(cudaDeviceSynchronize());
  }
  if (!s.backward) {
    out.o = HostArray(s.prob.dtype, shape(dm.H, dm.D));
    out.lse = HostArray(DType::F32, {dm.B, dm.H, dm.S_q});
    for (const Impl::Dev& d : s.devs) {
      s.unshard(d.o, 0, s.prob.dtype, dm.H, dm.D, false, d.shard, &*out.o);
      s.unshard(d.lse, 0, DType::F32, dm.H, 1, true, d.shard, &*out.lse);
    }
    return out;
  }
  out.dq = HostArray(s.prob.dtype, shape(dm.H, dm.D));
  out.dk = HostArray(s.prob.dtype, shape(dm.H_kv, dm.D));
  out.dv = HostArray(s.prob.dtype, shape(dm.H_kv, dm.D));
  for (const Impl::Dev& d : s.devs) {
    s.unshard(d.dq, 0, s.prob.dtype, dm.H, dm.D, false, d.shard, &*out.dq);
    s.unshard(d.dkv, 0, s.prob.dtype, dm.H_kv, dm.D, false, d.shard, &*out.dk);
    s.unshard(d.dkv, s.kv_elems(d.shard.len()), s.prob.dtype, dm.H_kv, dm.D, false, d.shard, &*out.dv);
  }
  return out;
}

RingProfile Ring::profile(cudaStream_t stream0) {
  Impl& s = *impl_;
  Impl::Timeline tl;
  tl.wait_in.resize(s.n());
  tl.wait_out.resize(s.n());
  for (Impl::Dev& d : s.devs) {
    s.use(d);
    tl.begin.push_back(make_event(true));
    tl.end.push_back(make_event(true));
  }
  s.enqueue(stream0, true, &tl);
  RingProfile p;
  for (Impl::Dev& d : s.devs) {
    s.use(d);
    CUDA_CHECK(cudaStreamSynchronize(d.compute));
    float ms = 0;
    CUDA_CHECK(cudaEventElapsedTime(&ms, tl.begin[d.rank], tl.end[d.rank]));
    p.compute_ms.push_back(ms);
    double waiting = 0;
    for (size_t i = 0; i < tl.wait_in[d.rank].size(); ++i) {
      CUDA_CHECK(cudaEventElapsedTime(&ms, tl.wait_in[d.rank][i], tl.wait_out[d.rank][i]));
      waiting += ms;
    }
    p.waiting_ms.push_back(waiting);
    p.total_ms = std::max(p.total_ms, p.compute_ms.back());
    p.exposed_comm_ms = std::max(p.exposed_comm_ms, waiting);
  }
  for (Impl::Dev& d : s.devs) {
    s.use(d);
    for (cudaEvent_t e : {tl.begin[d.rank], tl.end[d.rank]}) cudaEventDestroy(e);
    for (auto* v : {&tl.wait_in[d.rank], &tl.wait_out[d.rank]})
      for (cudaEvent_t e : *v) cudaEventDestroy(e);
  }
  return p;
}

std::vector<double> Ring::flops_per_device() const {
  const Impl& s = *impl_;
  std::vector<double> f;
  for (const Impl::Dev& d : s.devs) {
    double sum = 0;
    for (const Impl::Step& st : d.steps) {
      if (st.call.skip) continue;
      Problem p = s.prob;
      p.dims.S_q = st.call.q_rows, p.dims.S_k = st.call.k_rows;
      p.causal = st.call.causal;
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

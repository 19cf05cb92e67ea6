// The ring (ring.h): its GPUs set up (one process driving them all, or one rank of several), and
// the outputs gathered out; its memory (the shards, buffers, windows) is src/ring_memory.cpp, the
// steps of a repetition src/ring_steps.cpp.
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

#include "ring_impl.h"
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
bool Ring::fp32_gradients() const { return false; }
bool Ring::side_stream() const { return false; }
bool Ring::side_after_first_shard() const { return false; }
bool Ring::last_block_alone() const { return false; }
bool Ring::registered_buffers() const { return false; }
bool Ring::copy_engine() const { return false; }
bool Ring::loopback() const { return false; }
int Ring::lend_rank() const { return -1; }
double Ring::lend_kv_heads() const { return 0; }
bool Ring::lend_auto() const { return false; }
double Ring::lend_lag_ms() const { return 0; }
bool Ring::last_block_merges() const { return false; }
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
std::vector<double> Ring::share(const std::vector<double>& values) const { return values; }
RingProfile Ring::profile(cudaStream_t) { return {}; }
std::vector<double> Ring::flops_per_device() const { return {}; }
size_t Ring::bytes_per_device() const { return 0; }

#else

std::string ring_unavailable() { return ""; }

using namespace ring_detail;

namespace {

// A choice from the environment (an ablation): NAME=0 or 1 decides, unset leaves `dflt`;
// anything else is refused.
bool env_choice(const char* name, bool dflt) {
  const char* v = std::getenv(name);
  if (v == nullptr) return dflt;
  if (std::string(v) != "0" && std::string(v) != "1")
    throw RuntimeError(std::string(name) + ": expected 0 or 1, got '" + v + "'");
  return std::string(v) == "1";
}
// A switch that can only be turned off: `on` unless NAME says 0.
bool env_switch(const char* name, bool on) { return on && env_choice(name, true); }

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

// Whether a ring of `world` GPUs exchanges by NCCL's copy engines (ring_impl.h's copy_engine):
// two GPUs and NCCL 2.28 or later, unless FLASHATTN_RING_COPY_ENGINE=0 (the ablation).
bool ce_wanted(int world) {
  return env_switch("FLASHATTN_RING_COPY_ENGINE", FLASHATTN_RING_HAVE_CE && world == 2);
}

}  // namespace

void Ring::Impl::init_dev(Dev& d, int id, int rank, ncclComm_t comm, bool flusher) {
  d.id = id;
  d.rank = rank;
  d.nccl = comm;
  use(d);
  d.info = query_device(d.id);
  // The transfers' and the merges' streams at the highest priority: NCCL's kernels and the merge
  // passes need SMs while a block's kernel fills them all; at a higher priority their CTAs go first
  // as soon as any SM frees, so a transfer or merge enqueued while a block computes (the
  // backward's accumulators) is not held until the block's last CTA has been issued. The side
  // stream's blocks (ring_impl.h) at the lowest, compute's one above it where the range allows
  // (numerically lower is higher; one level more than the default where the GPU has them).
  int lowest = 0, highest = 0;
  CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&lowest, &highest));
  const int kernels = lowest - highest >= 2 ? lowest - 1 : lowest;
  CUDA_CHECK(cudaStreamCreateWithPriority(&d.compute, cudaStreamNonBlocking, kernels));
  CUDA_CHECK(cudaStreamCreateWithPriority(&d.side, cudaStreamNonBlocking, lowest));
  CUDA_CHECK(cudaStreamCreateWithPriority(&d.comm, cudaStreamNonBlocking, highest));
  CUDA_CHECK(cudaStreamCreateWithPriority(&d.merge, cudaStreamNonBlocking, highest));
  d.ctx = gpu_launch_context(*d.info, d.id, d.compute);
  d.ctx.shares_device = true;  // the blocks' kernels run beside the transfers and merges
  d.ctx_side = d.ctx;
  d.ctx_side.stream = d.side;
  if (flusher) d.flusher = std::make_unique<L2Flusher>(d.info->l2_bytes);
  for (int i = 0; i < world; ++i) {
    d.computed.push_back(make_event(false));
    d.merged.push_back(make_event(false));
    d.kv_arrived.push_back(make_event(false));
    d.acc_arrived.push_back(make_event(false));
  }
  d.zeroed = make_event(false);
  d.done = make_event(false);
  d.lend_in_arrived = make_event(false);
  d.lend_done = make_event(false);
  d.lend_dq_arrived = make_event(false);
  if (loopback) d.loop_ready = make_event(false), d.loop_done = make_event(false);
}

Ring::Ring(std::vector<int> devices) : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  // NVLink multicast (NVLS) stays off in every process of this tool.
  setenv("NCCL_NVLS_ENABLE", "0", 1);
  s.ids = std::move(devices);
  s.world = static_cast<int>(s.ids.size());
  s.devs.resize(s.ids.size());
  std::vector<ncclComm_t> comms(s.ids.size());
  // One GPU listed for every rank: the loopback (ring_impl.h), no communicator.
  s.loopback = ring_one_gpu_for_all(s.ids);
  s.ce_comms = !s.loopback && ce_wanted(s.world);
  if (s.ce_comms) {  // ncclCommInitAll's communicators, with the zero-CTA policy
#if FLASHATTN_RING_HAVE_CE
    ncclUniqueId id;
    NCCL_CHECK(ncclGetUniqueId(&id));
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.CTAPolicy = NCCL_CTA_POLICY_ZERO;
    NCCL_CHECK(ncclGroupStart());
    for (int r = 0; r < s.world; ++r) {
      CUDA_CHECK(cudaSetDevice(s.ids[r]));
      NCCL_CHECK(ncclCommInitRankConfig(&comms[r], s.world, id, r, &config));
    }
    NCCL_CHECK(ncclGroupEnd());
#endif
  } else if (!s.loopback) {
    NCCL_CHECK(ncclCommInitAll(comms.data(), s.world, s.ids.data()));
  }
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
  s.ce_comms = ce_wanted(s.world);
#if FLASHATTN_RING_HAVE_CE
  ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
  if (s.ce_comms) config.CTAPolicy = NCCL_CTA_POLICY_ZERO;
  NCCL_CHECK(ncclCommInitRankConfig(&comm, me.size, id, me.rank, &config));
#else
  NCCL_CHECK(ncclCommInitRank(&comm, me.size, id, me.rank));
#endif
  if (me.rank == 0) std::remove(me.id_file.c_str());  // every rank has joined: the id is spent
  s.init_dev(s.devs[0], device, me.rank, comm, false);  // this GPU's L2: the caller's timer
  CUDA_CHECK(cudaSetDevice(device));
  s.start = make_event(false);
}

Ring::~Ring() {
  Impl& s = *impl_;
  for (Impl::Dev& d : s.devs) {
    cudaSetDevice(d.id);
    for (cudaStream_t st : {d.compute, d.comm, d.merge, d.side})
      if (st) cudaStreamSynchronize(st);
  }
  std::vector<ncclComm_t> comms;  // destroyed last: the registered buffers leave them first
  for (Impl::Dev& d : s.devs) {
    comms.push_back(d.nccl);
    cudaSetDevice(d.id);
    for (auto* v : {&d.computed, &d.merged, &d.kv_arrived, &d.acc_arrived})
      for (cudaEvent_t e : *v) cudaEventDestroy(e);
    for (cudaEvent_t e : {d.zeroed, d.done, d.lend_in_arrived, d.lend_done, d.lend_dq_arrived, d.loop_ready, d.loop_done})
      if (e) cudaEventDestroy(e);
    for (cudaStream_t st : {d.compute, d.comm, d.merge, d.side})
      if (st) cudaStreamDestroy(st);
    d = Impl::Dev{};  // the buffers and the flusher go while their device is current
  }
  for (ncclComm_t c : comms)
    if (c) ncclCommDestroy(c);
  if (!s.ids.empty()) cudaSetDevice(s.ids[0]);
  if (s.start) cudaEventDestroy(s.start);
}

int Ring::size() const { return impl_->n(); }
bool Ring::root() const { return impl_->root(); }
bool Ring::fp32_gradients() const { return impl_->f32_grads; }
bool Ring::side_stream() const { return impl_->side(); }
bool Ring::side_after_first_shard() const { return impl_->side_gated; }  // implies side_bwd
bool Ring::last_block_alone() const { return impl_->last_alone_fwd; }
bool Ring::registered_buffers() const { return impl_->registered; }
bool Ring::copy_engine() const { return impl_->copy_engine(); }
bool Ring::loopback() const { return impl_->loopback; }
int Ring::lend_rank() const { return impl_->lending() ? impl_->lend_rank : -1; }
double Ring::lend_kv_heads() const { return impl_->lending() ? impl_->lend_kv_share() : 0; }
bool Ring::lend_auto() const { return impl_->lend_auto; }
double Ring::lend_lag_ms() const { return impl_->lend_lag_ms; }
bool Ring::last_block_merges() const { return impl_->kernel_merge; }
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
  s.f32_grads = s.backward && e.fp32_gradients != nullptr && e.fp32_gradients(ring_block_bwd(s.prob, 1, 1, RingCall{}, {}));
  s.f32_grads = env_switch("FLASHATTN_RING_FP32_GRADIENTS", s.f32_grads);
  // dQ in the kernel's own layout (ring_impl.h), where every block starts on a whole row group.
  s.dq_accum = s.f32_grads && e.dq_finish != nullptr;
  for (const Impl::Dev& d : s.devs)
    for (const Impl::Block& blk : d.blocks) s.dq_accum = s.dq_accum && blk.call.q_row0 % kDqAccumRows == 0;
  s.dq_accum = env_switch("FLASHATTN_RING_DQ_ACCUM", s.dq_accum);
  // The own block beside the others on a second kernels' stream, except in a two-GPU forward
  // whose last block takes the whole GPU, and a backward whose shards are 65536 rows or more
  // without a causal mask (ring_impl.h). FLASHATTN_RING_SIDE_STREAM=0 or 1 decides instead.
  const bool big_unmasked = !s.prob.causal && S / s.n() >= kRingOneStreamRows;
  const bool side = s.n() > 1 && env_choice("FLASHATTN_RING_SIDE_STREAM", !(s.backward && big_unmasked));
  s.last_alone_fwd = !s.backward && s.n() == 2 && env_switch("FLASHATTN_RING_LAST_ALONE", true);
  s.side_fwd = side && !s.last_alone_fwd;
  s.kernel_merge = s.last_alone_fwd && s.fwd_entry->merges_output != nullptr &&
                   s.fwd_entry->merges_output(ring_block_fwd(s.prob, 1, 1, RingCall{}, {})) &&
                   env_switch("FLASHATTN_RING_KERNEL_MERGE", true);
  s.side_bwd = s.backward && side && s.f32_grads && !deterministic;
  s.side_gated = s.side_bwd && s.dims().H != s.dims().H_kv;
  s.registered = !s.loopback && env_switch("FLASHATTN_RING_REGISTER", NCCL_VERSION_CODE >= NCCL_VERSION(2, 19, 0));
  s.parse_lend();
  s.bytes_held = 0;
  for (Impl::Dev& d : s.devs) s.allocate(d, in);
  if (s.copy_engine()) s.register_windows();
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
  if (s.lend_auto) {  // the lender from three profiled repetitions without lending, after one more
    NvtxRange calibrate("ring lending: calibration");
    s.enqueue(s.devs[0].compute, true, nullptr);
    std::vector<RingProfile> runs;
    for (int i = 0; i < 3; ++i) runs.push_back(profile(s.devs[0].compute));
    s.choose_lend(runs);
    CUDA_CHECK(cudaSetDevice(s.devs[0].id));
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

std::vector<double> Ring::share(const std::vector<double>& values) const {
  const Impl& s = *impl_;
  if (!s.multi) return values;
  const Impl::Dev& d = s.devs[0];
  s.use(d);
  const size_t bytes = values.size() * sizeof(double);
  std::vector<double> all(values.size() * size_t(s.n()));
  if (bytes == 0) return all;
  DeviceBuffer buf(bytes * size_t(s.n()));
  CUDA_CHECK(cudaMemcpy(at(buf, int64_t(bytes) * d.rank), values.data(), bytes, cudaMemcpyHostToDevice));
  NCCL_CHECK(ncclGroupStart());
  for (int r = 0; r < s.n(); ++r) {
    if (r == d.rank) continue;
    NCCL_CHECK(ncclSend(at(buf, int64_t(bytes) * d.rank), bytes, ncclUint8, r, d.nccl, d.comm));
    NCCL_CHECK(ncclRecv(at(buf, int64_t(bytes) * r), bytes, ncclUint8, r, d.nccl, d.comm));
  }
  NCCL_CHECK(ncclGroupEnd());
  CUDA_CHECK(cudaStreamSynchronize(d.comm));
  CUDA_CHECK(cudaMemcpy(all.data(), buf.get(), bytes * size_t(s.n()), cudaMemcpyDeviceToHost));
  return all;
}

double Ring::Impl::block_flops(const RingCall& c) const {
  if (c.skip) return 0.0;
  Problem p = prob;
  p.dims.S_q = c.q_rows, p.dims.S_k = c.k_rows;
  p.causal = c.causal;
  p.has_padding = false;
  return backward ? backward_flops(p, nullptr) : forward_flops(p, nullptr);
}

std::vector<double> Ring::flops_per_device() const {
  const Impl& s = *impl_;
  const double lent = s.lent_flops();  // lending moves it from the owner to the helper
  std::vector<double> f;
  for (const Impl::Dev& d : s.devs) {
    double sum = d.rank == s.lend_rank ? -lent : lent;
    for (const Impl::Block& blk : d.blocks) sum += s.block_flops(blk.call);
    f.push_back(sum);
  }
  return f;
}

size_t Ring::bytes_per_device() const { return impl_->bytes_held; }

#endif  // FLASHATTN_HAVE_NCCL

}  // namespace flashattn

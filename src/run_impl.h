// Session::Impl (run.h's Session): the inputs on the device, the one-GPU and host runs
// (src/run.cpp), and the ring runs (src/ring_run.cpp). Private to those two files.
#pragma once

#include "run.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>

#include "dataset.h"
#include "device_buffer.h"
#include "flashattn/device_fill.h"
#include "flashattn/check.h"
#include "flashattn/error.h"
#include "nvtx.h"
#include "gpu_context.h"
#include "params_build.h"
#include "ring.h"
#include "ring_plan.h"
#include "run_check.h"
#include "stopwatch.h"

namespace flashattn {

struct Session::Impl {
  // Random streams of generated inputs (the same tensor ids as flashattn-gen).
  enum GenStream : uint64_t { kGenQ = 1, kGenK = 2, kGenV = 3, kGenDO = 4 };

  // A kernel's forward/backward workspace starts as NaN bytes (0xFF) where it is allocated: its
  // contents are undefined to the kernel (every call rewrites what it reads), so a kernel that reads
  // workspace it never wrote turns the checked outputs NaN instead of passing on zeros. It also
  // gives compute-sanitizer's initcheck a defined starting state for memory that cuBLAS fills
  // through paths the tool does not track.
  static void poison_workspace(const DeviceBuffer& ws, size_t bytes, cudaStream_t stream) {
    if (bytes) CUDA_CHECK(cudaMemsetAsync(ws.get(), 0xFF, bytes, stream));
  }

  static DeviceBuffer upload(const HostArray& a) { return upload_array(a); }

  static HostArray download(const DeviceBuffer& d, DType t, std::vector<int64_t> shape) {
    return download_array(d, t, std::move(shape));
  }

  static std::vector<int64_t> tensor_shape(Layout l, int B, int H, int S, int D) {
    return l == Layout::BHSD ? std::vector<int64_t>{B, H, S, D} : std::vector<int64_t>{B, S, H, D};
  }

  static void fill_nan(HostArray& a) {
    if (a.dtype == DType::F64) {
      std::fill(a.data<double>(), a.data<double>() + a.numel(), std::numeric_limits<double>::quiet_NaN());
    } else {
      std::memset(a.bytes.data(), 0xFF, a.nbytes());  // all-ones is NaN in fp32, fp16 and bf16
    }
  }

  RunInputs in;
  SessionOptions opt;
  std::optional<DeviceInfo> dev;
  cudaStream_t stream = nullptr;
  std::unique_ptr<CublasHandle> cublas;  // for the kernels that use cuBLAS, created on first use
  std::unique_ptr<GpuTimer> timer;
  std::unique_ptr<Ring> ring;  // runs over several GPUs, created on first use
  size_t free_at_start = 0;

  // Device copies of the inputs (uploaded on first GPU use).
  bool uploaded = false;
  DeviceBuffer d_q, d_k, d_v, d_do, d_mask, d_seqlens;

  CheckCache checks;  // the reference for --check, kept for every kernel checked on these inputs

  const Dims& dims() const { return in.problem.dims; }

  void init_device() {
    if (opt.device < 0) return;
    CUDA_CHECK(cudaSetDevice(opt.device));
    dev = query_device(opt.device);
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    cublas = std::make_unique<CublasHandle>(stream);
    timer = std::make_unique<GpuTimer>(dev->l2_bytes);
    size_t total = 0;
    CUDA_CHECK(cudaMemGetInfo(&free_at_start, &total));
  }


  bool generated() const { return in.generate_seed.has_value(); }
  bool has_dout() const { return in.dout.has_value() || generated(); }

  void ensure_uploaded(const std::string& kernel) {
    if (uploaded) return;
    const size_t es = dtype_size(in.problem.dtype);
    const size_t q_bytes = size_t(dims().B) * dims().H * dims().S_q * dims().D * es;
    const size_t kv_bytes = size_t(dims().B) * dims().H_kv * dims().S_k * dims().D * es;
    size_t needed = 2 * q_bytes + 2 * kv_bytes;  // generated: Q, K, V, dO
    if (!generated()) {
      needed = in.q.nbytes() + in.k.nbytes() + in.v.nbytes() + (in.dout ? in.dout->nbytes() : 0) +
               (in.mask ? in.mask->nbytes() : 0) + (in.seqlens_k ? in.seqlens_k->nbytes() : 0);
    }
    require_memory(kernel, needed);
    if (generated()) {
      generate_on_device(q_bytes, kv_bytes);
      return;
    }
    d_q = upload(in.q);
    d_k = upload(in.k);
    d_v = upload(in.v);
    if (in.dout) d_do = upload(*in.dout);
    if (in.mask) d_mask = upload(*in.mask);
    if (in.seqlens_k) d_seqlens = upload(*in.seqlens_k);
    uploaded = true;
  }

  void generate_on_device(size_t q_bytes, size_t kv_bytes) {
    const DType t = in.problem.dtype;
    const uint64_t seed = *in.generate_seed;
    NvtxRange range("generate inputs");
    d_q = DeviceBuffer(q_bytes), d_k = DeviceBuffer(kv_bytes), d_v = DeviceBuffer(kv_bytes), d_do = DeviceBuffer(q_bytes);
    const int64_t nq = int64_t(q_bytes / dtype_size(t)), nkv = int64_t(kv_bytes / dtype_size(t));
    fill_normal_device(d_q.get(), t, nq, seed, kGenQ, stream);
    fill_normal_device(d_k.get(), t, nkv, seed, kGenK, stream);
    fill_normal_device(d_v.get(), t, nkv, seed, kGenV, stream);
    fill_normal_device(d_do.get(), t, nq, seed, kGenDO, stream);
    CUDA_CHECK(cudaStreamSynchronize(stream));
    uploaded = true;
  }

  // Host copies of generated inputs, for the reference and host kernels: downloaded once when the
  // device made them, else computed on the host (same values).
  void ensure_host_inputs() {
    if (!generated() || !in.q.bytes.empty()) return;
    const DType t = in.problem.dtype;
    if (uploaded) {
      in.q = download(d_q, t, q_shape());
      in.k = download(d_k, t, kv_shape());
      in.v = download(d_v, t, kv_shape());
      in.dout = download(d_do, t, q_shape());
      return;
    }
    const uint64_t seed = *in.generate_seed;
    in.q = HostArray(t, q_shape()), in.k = HostArray(t, kv_shape()), in.v = HostArray(t, kv_shape());
    in.dout = HostArray(t, q_shape());
    fill_normal_host(in.q.bytes.data(), t, in.q.numel(), seed, kGenQ);
    fill_normal_host(in.k.bytes.data(), t, in.k.numel(), seed, kGenK);
    fill_normal_host(in.v.bytes.data(), t, in.v.numel(), seed, kGenV);
    fill_normal_host(in.dout->bytes.data(), t, in.dout->numel(), seed, kGenDO);
  }

  // Device memory in use now beyond what was in use when the session started (inputs, outputs,
  // workspaces, library allocations): measured while the run's buffers are still allocated.
  long long device_used() const {
    return static_cast<long long>(free_at_start) - static_cast<long long>(device_free_bytes());
  }

  void require_memory(const std::string& kernel, size_t needed) const { require_device_memory(kernel, needed, opt.device); }

  LaunchContext context(const KernelMode& e) {
    if (!e.gpu) {
      LaunchContext ctx;
      ctx.cpu_threads = opt.cpu_threads;
      return ctx;
    }
    LaunchContext ctx = gpu_launch_context(*dev, opt.device, stream, opt.cpu_threads);
    if (e.uses_cublas) ctx.cublas = cublas->get();
    return ctx;
  }

  // Forward params with the problem's sizes and flags; pointers filled by the caller.
  FwdParams base_params(bool gpu) const {
    FwdParams f = forward_params(in.problem);
    f.num_sms = gpu && dev ? dev->sm_count : 0;
    f.deterministic = opt.deterministic;
    return f;
  }

  void set_masks(FwdParams& f, const void* mask_ptr, const void* seqlens_ptr) const {
    if (in.mask) f.mask = mask_view(in.mask->shape, dims(), static_cast<const float*>(mask_ptr), "mask");
    f.seqlens_k = static_cast<const int32_t*>(seqlens_ptr);
  }

  std::vector<int64_t> q_shape() const { return tensor_shape(in.problem.layout, dims().B, dims().H, dims().S_q, dims().D); }
  std::vector<int64_t> kv_shape() const {
    return tensor_shape(in.problem.layout, dims().B, dims().H_kv, dims().S_k, dims().D);
  }
  std::vector<int64_t> lse_shape() const { return {dims().B, dims().H, dims().S_q}; }
  DType lse_dtype() const { return in.problem.dtype == DType::F64 ? DType::F64 : DType::F32; }

  // ---- host kernels ---------------------------------------------------------------------------
  struct HostRun {
    KernelOutputs out;
    TimingStats timing;
  };

  HostRun run_host(const KernelMode& e, bool timed) {
    ensure_host_inputs();
    const LaunchContext ctx = context(e);
    const DType t = in.problem.dtype;
    HostRun r;
    HostArray o(t, q_shape()), lse(lse_dtype(), lse_shape());
    fill_nan(o);
    fill_nan(lse);
    FwdParams f = base_params(false);
    f.q = in.q.bytes.data(), f.k = in.k.bytes.data(), f.v = in.v.bytes.data();
    set_masks(f, in.mask ? in.mask->bytes.data() : nullptr, in.seqlens_k ? in.seqlens_k->bytes.data() : nullptr);
    f.o = o.bytes.data();
    f.lse = lse.bytes.data();
    if (e.mode == Mode::Forward) {
      auto call = [&] { e.fwd(f, ctx); };
      call();
      if (timed) r.timing = time_cpu(call, opt.cpu_timing);
      r.out.o = std::move(o);
      r.out.lse = std::move(lse);
      return r;
    }
    const KernelMode* fe = Registry::find(e.kernel, Mode::Forward);
    if (!fe) throw InputError("kernel '" + e.kernel + "' has no forward pass to produce O and lse for backward");
    fe->fwd(f, ctx);
    BwdParams b;
    static_cast<FwdParams&>(b) = f;
    HostArray dq(t, q_shape()), dk(t, kv_shape()), dv(t, kv_shape());
    fill_nan(dq), fill_nan(dk), fill_nan(dv);
    b.dout = in.dout->bytes.data();
    b.do_st = b.dq_st = f.q_st;
    b.dk_st = f.k_st, b.dv_st = f.v_st;
    b.dq = dq.bytes.data(), b.dk = dk.bytes.data(), b.dv = dv.bytes.data();
    auto call = [&] { e.bwd(b, ctx); };
    call();
    if (timed) r.timing = time_cpu(call, opt.cpu_timing);
    r.out.dq = std::move(dq), r.out.dk = std::move(dk), r.out.dv = std::move(dv);
    return r;
  }

  // ---- GPU kernels ----------------------------------------------------------------------------
  struct GpuRun {
    KernelOutputs out;
    TimingStats timing;
    MemoryStats mem;
    int clock_start = -1, clock_end = -1;
  };

  // The timed loop, with the SM clock read before, during (per batch) and after it.
  TimingStats timed_run(const std::function<void()>& call, GpuRun& r, const TimingOptions* timing = nullptr) {
    ClockProbe probe;
    const DeviceInfo info = *dev;
    probe.sm_clock_mhz = [info] { return nvml_sm_clock_mhz(info); };
    probe.throttle_reasons = [info] { return nvml_slowdown_reasons(info); };
    r.clock_start = nvml_sm_clock_mhz(*dev);
    TimingStats t = timer->time(call, stream, timing ? *timing : opt.timing, &probe);
    r.clock_end = nvml_sm_clock_mhz(*dev);
    return t;
  }

  // Runs `e` once with poisoned outputs (the checked run) and, if `timed`, times it.
  GpuRun run_gpu(const KernelMode& e, bool timed) {
    ensure_uploaded(e.kernel);
    const LaunchContext ctx = context(e);
    const Dims& d = dims();
    const size_t es = dtype_size(in.problem.dtype);
    const size_t q_bytes = size_t(d.B) * d.H * d.S_q * d.D * es;
    const size_t kv_bytes = size_t(d.B) * d.H_kv * d.S_k * d.D * es;
    const size_t lse_bytes = size_t(d.B) * d.H * d.S_q * sizeof(float);
    const size_t mask_bytes = d_mask.bytes() + d_seqlens.bytes();
    const size_t lib_ws = e.uses_cublas ? kCublasWorkspaceBytes : 0;

    FwdParams f = base_params(true);
    f.q = d_q.get(), f.k = d_k.get(), f.v = d_v.get();
    set_masks(f, d_mask.get(), d_seqlens.get());

    GpuRun r;
    const KernelMode* fe = e.mode == Mode::Forward ? &e : Registry::find(e.kernel, Mode::Forward);
    if (!fe || !fe->fwd)
      throw InputError("kernel '" + e.kernel + "' has no forward pass to produce O and lse for backward");
    const size_t fwd_ws = fe->fwd_workspace ? fe->fwd_workspace(f) : 0;
    require_memory(e.kernel, q_bytes + lse_bytes + fwd_ws + (e.mode == Mode::Forward ? 0 : q_bytes + 2 * kv_bytes));
    DeviceBuffer o(q_bytes), lse(lse_bytes);
    f.o = o.get();
    f.lse = lse.get();

    if (e.mode == Mode::Forward) {
      DeviceBuffer ws(fwd_ws);
      f.workspace = ws.get();
      f.workspace_bytes = fwd_ws;
      poison_workspace(ws, fwd_ws, stream);
      CUDA_CHECK(cudaMemsetAsync(o.get(), 0xFF, q_bytes, stream));  // poison: NaN in every dtype
      CUDA_CHECK(cudaMemsetAsync(lse.get(), 0xFF, lse_bytes, stream));
      auto call = [&] { e.fwd(f, ctx); };
      {
        NvtxRange range("check");  // the run whose outputs are validated and written
        call();
        CUDA_CHECK(cudaStreamSynchronize(stream));
      }
      r.out.o = download(o, in.problem.dtype, q_shape());
      r.out.lse = download(lse, DType::F32, lse_shape());
      r.mem.inputs_bytes = q_bytes + 2 * kv_bytes + mask_bytes;
      r.mem.outputs_bytes = q_bytes;
      r.mem.workspace_bytes = fwd_ws + lib_ws;
      r.mem.extra_bytes = r.mem.workspace_bytes + lse_bytes;
      if (timed) r.timing = timed_run(call, r);
      r.mem.device_used_bytes = device_used();
    } else {
      {
        // O and lse from the same kernel's forward pass (not timed).
        NvtxRange range("forward for O and lse");
        DeviceBuffer ws(fwd_ws);
        f.workspace = ws.get();
        f.workspace_bytes = fwd_ws;
        poison_workspace(ws, fwd_ws, stream);
        // Poisoned like a forward run's outputs: an element the forward leaves unwritten reaches
        // the backward as NaN and fails --check. (cuBLAS writes O through a path compute-
        // sanitizer's initcheck does not see; without a defined start, every read of O by the
        // cublas backward was reported as uninitialized although the values are the GEMM's.)
        CUDA_CHECK(cudaMemsetAsync(o.get(), 0xFF, q_bytes, stream));
        CUDA_CHECK(cudaMemsetAsync(lse.get(), 0xFF, lse_bytes, stream));
        const LaunchContext fctx = context(*fe);
        fe->fwd(f, fctx);
        CUDA_CHECK(cudaStreamSynchronize(stream));
      }
      BwdParams b;
      static_cast<FwdParams&>(b) = f;
      b.workspace = nullptr;
      b.workspace_bytes = 0;
      b.dout = d_do.get();
      b.do_st = b.dq_st = f.q_st;
      b.dk_st = f.k_st, b.dv_st = f.v_st;
      const size_t bwd_ws = e.bwd_workspace ? e.bwd_workspace(b) : 0;
      require_memory(e.kernel, q_bytes + 2 * kv_bytes + bwd_ws);
      DeviceBuffer dq(q_bytes), dk(kv_bytes), dv(kv_bytes), ws(bwd_ws);
      b.dq = dq.get(), b.dk = dk.get(), b.dv = dv.get();
      b.workspace = ws.get();
      b.workspace_bytes = bwd_ws;
      poison_workspace(ws, bwd_ws, stream);
      CUDA_CHECK(cudaMemsetAsync(dq.get(), 0xFF, q_bytes, stream));
      CUDA_CHECK(cudaMemsetAsync(dk.get(), 0xFF, kv_bytes, stream));
      CUDA_CHECK(cudaMemsetAsync(dv.get(), 0xFF, kv_bytes, stream));
      auto call = [&] { e.bwd(b, ctx); };
      {
        NvtxRange range("check");
        call();
        CUDA_CHECK(cudaStreamSynchronize(stream));
      }
      r.out.dq = download(dq, in.problem.dtype, q_shape());
      r.out.dk = download(dk, in.problem.dtype, kv_shape());
      r.out.dv = download(dv, in.problem.dtype, kv_shape());
      r.mem.inputs_bytes = 3 * q_bytes + 2 * kv_bytes + lse_bytes + mask_bytes;  // Q, K, V, O, dO, lse
      r.mem.outputs_bytes = q_bytes + 2 * kv_bytes;
      r.mem.workspace_bytes = bwd_ws + lib_ws;
      r.mem.extra_bytes = r.mem.workspace_bytes;
      if (timed) r.timing = timed_run(call, r);
      r.mem.device_used_bytes = device_used();
    }
    r.mem.peak_bytes = r.mem.inputs_bytes + r.mem.outputs_bytes + r.mem.extra_bytes;
    return r;
  }

  // ---- several GPUs (src/ring_run.cpp) ----------------------------------------------------------
  int ring_size() const { return opt.ring_process.size > 1 ? opt.ring_process.size : int(opt.devices.size()); }
  bool on_ring(const KernelMode& e) const { return e.gpu && ring_size() > 1; }

  // The ring run (ring.h): checked run with poisoned outputs, the timed loop on the first
  // device's stream (every GPU's work lies between its events), one profiled repetition; then
  // the same kernel on the first GPU alone for the scaling efficiency and the comparison.
  GpuRun run_ring(const KernelMode& e, RingRecord* info);
  // The same kernel on one GPU alone, timed the same way: on the root's GPU, whose outputs the
  // ring's are compared with (RingRecord::one_gpu_*); then (ring_baseline_each) on each other
  // card of the ring in turn, timed only, while the others idle. Across processes the ranks take
  // turns, each on its own GPU, and share their times.
  void ring_one_gpu_runs(const KernelMode& e, const KernelOutputs& ring_out, RingRecord* info);
  // `e` timed alone on session `s`'s GPU (a card of the ring other than the root's).
  static RingRecord::CardTime time_alone(const KernelMode& e, Impl* s);
  // The inputs for a session on another GPU: generated ones from their seed there (the same
  // values), else a copy of the host arrays.
  RunInputs inputs_for_another_card() const;
  // Session::run's ring path: the run, its record's ring object, the scaling and the note.
  void run_on_ring(const KernelMode& e, RunRecord& rec);

  void validate(const KernelMode& e, RunRecord& rec) {
    const DType t = in.problem.dtype;
    // The oracle (KernelRole::Reference) in fp64 is the reference itself; in another dtype its
    // outputs are the reference rounded once to that dtype, and are checked like any kernel's.
    if (e.role == KernelRole::Reference && t == DType::F64) {
      rec.check.performed = false;
      rec.check.note = "cpu is the reference";
      return;
    }
    ensure_host_inputs();
    rec.check = checks.check(rec.outputs, e.mode, in, opt);
  }
};

}  // namespace flashattn

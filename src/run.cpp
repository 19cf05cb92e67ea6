// The Session (run.h): one-GPU and host runs, checked and timed; its ring runs are in
// src/ring_run.cpp, the Impl both share in run_impl.h.
#include "run_impl.h"

namespace flashattn {

RunInputs generated_inputs(const Problem& problem, uint64_t seed) {
  RunInputs in;
  in.problem = problem;
  in.generate_seed = seed;
  return in;
}

Session::Session(RunInputs inputs, SessionOptions opt) : impl_(std::make_unique<Impl>()) {
  impl_->in = std::move(inputs);
  impl_->opt = std::move(opt);
  impl_->init_device();
}

Session::~Session() {
  impl_->cublas.reset();  // before its stream
  if (impl_->stream) cudaStreamDestroy(impl_->stream);
}

const DeviceInfo* Session::device() const { return impl_->dev ? &*impl_->dev : nullptr; }
const RunInputs& Session::inputs() const { return impl_->in; }
const SessionOptions& Session::options() const { return impl_->opt; }

RunRecord Session::run(const KernelMode& e) {
  Impl& s = *impl_;
  const Problem& p = s.in.problem;
  const std::string why = why_unsupported(e, p, s.dev ? s.dev->sm() : 0);
  if (!why.empty()) throw InputError(why);
  if (e.mode == Mode::Backward && !s.has_dout()) throw InputError("backward needs dO (none loaded or generated)");
  if ((e.mode == Mode::Forward && !e.fwd) || (e.mode == Mode::Backward && !e.bwd))
    throw InputError("kernel '" + e.kernel + "' registered " + mode_name(e.mode) + " without an entry point");

  RunRecord rec;
  rec.kernel = e.kernel;
  rec.mode = e.mode;
  rec.gpu = e.gpu;
  const int32_t* seqlens = s.in.seqlens_k ? s.in.seqlens_k->data<int32_t>() : nullptr;
  rec.flops = e.mode == Mode::Forward ? forward_flops(p, seqlens) : backward_flops(p, seqlens);
  rec.bytes = min_bytes_moved(p, e.mode, s.in.mask.has_value(), s.in.seqlens_k.has_value());

  if (s.on_ring(e)) {
    s.run_on_ring(e, rec);
  } else if (e.gpu) {
    NvtxRange range(nvtx_name(e, p));
    Impl::GpuRun r = s.run_gpu(e, /*timed=*/true);
    rec.outputs = std::move(r.out);
    rec.timing = std::move(r.timing);
    rec.memory = r.mem;
    rec.sm_clock_start_mhz = r.clock_start;
    rec.sm_clock_end_mhz = r.clock_end;
    add_timing_notes(rec);
  } else {
    Impl::HostRun r = s.run_host(e, /*timed=*/true);
    rec.outputs = std::move(r.out);
    rec.timing = std::move(r.timing);
  }
  const std::string fallback = fallback_note(e, p.dims.D);
  if (!fallback.empty()) rec.notes.push_back(fallback);
  const std::string fault = inject_fault_if_asked(e.kernel, rec.outputs);
  if (!fault.empty()) rec.notes.push_back(fault);
  if (s.opt.check && (!rec.ring || s.ring->root())) {  // a ring's root has the outputs
    const Stopwatch since_start;
    s.validate(e, rec);
    judge_ring_vs_one_gpu(rec);
    if (rec.check.performed) rec.check.seconds = since_start.seconds();
  }

  const double sec = rec.timing.median_ms * 1e-3;
  if (sec > 0) {
    rec.tflops = rec.flops / sec / 1e12;
    rec.gbps = rec.bytes / sec / 1e9;
    if (e.gpu && s.dev) {
      const double peak = peak_tflops_for(*s.dev, dtype_name(p.dtype));
      // A ring's TFLOP/s are every GPU's together: its fraction is of their peaks together.
      const double gpus = rec.ring ? double(rec.ring->size) : 1.0;
      if (peak > 0) rec.peak_fraction = rec.tflops / (peak * gpus);
    }
  }
  return rec;
}

}  // namespace flashattn

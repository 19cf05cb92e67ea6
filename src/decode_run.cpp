#include "decode_run.h"

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <set>
#include <tuple>

#include "flashattn/decode_cache.h"
#include "decode_reference.h"
#include "device_buffer.h"
#include "flashattn/check.h"
#include "flashattn/error.h"
#include "gpu_context.h"
#include "nvtx.h"
#include "params_build.h"
#include "validate.h"
#include "stopwatch.h"

namespace flashattn {

namespace {

using Buffer = DeviceBuffer;

Buffer upload(const HostArray& a) { return upload_array(a); }
HostArray download(const Buffer& d, DType t, std::vector<int64_t> shape) { return download_array(d, t, std::move(shape)); }

// Elements of `got` that differ bitwise from `want` (same dtype and shape).
int64_t count_mismatches(const HostArray& got, const HostArray& want) {
  if (got.nbytes() != want.nbytes()) return std::max(got.numel(), want.numel());
  const size_t es = dtype_size(got.dtype);
  int64_t n = 0;
  for (size_t off = 0; off < got.nbytes(); off += es) n += std::memcmp(got.bytes.data() + off, want.bytes.data() + off, es) != 0;
  return n;
}

}  // namespace

std::string decode_why_unsupported(const KernelMode& e, const DecodeDims& d, DType dtype, int sm) {
  const uint32_t features = (d.H != d.H_kv ? kFeatGQA : 0u) | (d.paged() ? kFeatPaged : 0u);
  return why_unsupported(e, Requirements{dtype, d.D, features}, sm);
}

double decode_visible_pairs(const DecodeDims& d, const HostArray& cache_seqlens) {
  double pairs = 0;
  for (int b = 0; b < d.B; ++b) {
    const double c = cache_seqlens.data<int32_t>()[b];
    // query i sees c + i + 1 keys
    pairs += d.S_new * (c + 1) + 0.5 * d.S_new * (d.S_new - 1.0);
  }
  return pairs * d.H;
}

double decode_kv_bytes(const DecodeDims& d, const HostArray& cache_seqlens, DType dtype) {
  double keys = 0;
  for (int b = 0; b < d.B; ++b) keys += cache_seqlens.data<int32_t>()[b] + d.S_new;
  return keys * d.H_kv * d.D * 2.0 * double(dtype_size(dtype));
}

struct DecodeSession::Impl {
  DecodeInputs in;
  DecodeOptions opt;
  DeviceInfo dev;  // valid when opt.device >= 0
  cudaStream_t stream = nullptr;
  std::unique_ptr<GpuTimer> timer;
  size_t free_at_start = 0;

  bool uploaded = false;
  Buffer d_q, d_kn, d_vn, d_kc, d_vc, d_seqlens, d_table;

  // Validation state, computed once per session.
  std::vector<DecodeRowId> rows;
  bool have_reference = false;
  ReferenceRows reference;
  std::optional<OutputErrors> baseline;
  std::optional<HostArray> expected_k, expected_v;

  const DecodeDims& dims() const { return in.dims; }
  int max_seqlen() const {
    int m = 0;
    for (int b = 0; b < dims().B; ++b) m = std::max(m, in.cache_seqlens.data<int32_t>()[b] + dims().S_new);
    return m;
  }
  int uniform_seqlen() const {
    const int32_t* l = in.cache_seqlens.data<int32_t>();
    for (int b = 1; b < dims().B; ++b)
      if (l[b] != l[0]) return -1;
    return dims().B > 0 ? l[0] : -1;
  }
  std::vector<int64_t> q_shape() const { return {dims().B, dims().H, dims().S_new, dims().D}; }
  std::vector<int64_t> lse_shape() const { return {dims().B, dims().H, dims().S_new}; }

  void require_memory(const std::string& kernel, size_t needed) const { require_device_memory(kernel, needed, opt.device); }

  void ensure_uploaded(const std::string& kernel) {
    if (uploaded) return;
    size_t need = in.q.nbytes() + in.k_new.nbytes() + in.v_new.nbytes() + in.k_cache.nbytes() + in.v_cache.nbytes() +
                  in.cache_seqlens.nbytes() + (in.block_table ? in.block_table->nbytes() : 0);
    require_memory(kernel, need);
    d_q = upload(in.q);
    d_kn = upload(in.k_new);
    d_vn = upload(in.v_new);
    d_kc = upload(in.k_cache);
    d_vc = upload(in.v_cache);
    d_seqlens = upload(in.cache_seqlens);
    if (in.block_table) d_table = upload(*in.block_table);
    uploaded = true;
  }

  DecodeParams params() const {
    DecodeParams p = decode_params(dims(), in.dtype, in.scale);
    p.q = d_q.get();
    p.k_new = d_kn.get(), p.v_new = d_vn.get();
    p.k_cache = d_kc.get(), p.v_cache = d_vc.get();
    p.cache_seqlens = static_cast<const int32_t*>(d_seqlens.get());
    if (in.block_table) p.block_table = static_cast<const int32_t*>(d_table.get());
    p.max_seqlen = max_seqlen();
    p.uniform_seqlen = uniform_seqlen();
    p.num_splits = opt.splits;
    p.num_sms = dev.sm_count;
    return p;
  }

  LaunchContext context() const { return gpu_launch_context(dev, opt.device, stream, opt.cpu_threads); }

  struct Step {
    KernelOutputs out;
    KernelOutputs first;  // the first of the checked run's two back-to-back steps (GPU kernels)
    std::optional<HostArray> k_cache, v_cache;
    TimingStats step, attend;
    int clock_start = -1, clock_end = -1;
    long long device_used = -1;  // memory growth since the session started, with the step's buffers held
    size_t workspace = 0;
    int splits = 1;
  };

  TimingStats timed(const std::function<void()>& fn, Step* s) {
    ClockProbe probe;
    const DeviceInfo info = dev;
    probe.sm_clock_mhz = [info] { return nvml_sm_clock_mhz(info); };
    probe.throttle_reasons = [info] { return nvml_slowdown_reasons(info); };
    if (s) s->clock_start = nvml_sm_clock_mhz(dev);
    TimingStats t = timer->time(fn, stream, opt.timing, &probe);
    if (s) s->clock_end = nvml_sm_clock_mhz(dev);
    return t;
  }

  // One checked step of `e` (poisoned outputs), then, when `timed`, the timings.
  Step run_step(const KernelMode& e, bool timed_run, bool keep_caches) {
    ensure_uploaded(e.kernel);
    DecodeParams p = params();
    Step s;
    s.splits = e.dec_splits ? e.dec_splits(p) : 1;
    s.workspace = e.dec_workspace ? e.dec_workspace(p) : 0;
    const size_t o_bytes = in.q.nbytes(), lse_bytes = size_t(dims().B) * dims().H * dims().S_new * sizeof(float);
    require_memory(e.kernel, o_bytes + lse_bytes + s.workspace);
    Buffer o(o_bytes), lse(lse_bytes), ws(s.workspace);
    p.o = o.get(), p.lse = lse.get();
    p.workspace = ws.get(), p.workspace_bytes = s.workspace;
    const LaunchContext ctx = context();
    // Zero-filled once (DecodeParams::workspace): kernels keep arrival counters there.
    if (s.workspace) CUDA_CHECK(cudaMemsetAsync(ws.get(), 0, s.workspace, stream));
    CUDA_CHECK(cudaMemsetAsync(o.get(), 0xFF, o_bytes, stream));  // poison: NaN in every dtype
    CUDA_CHECK(cudaMemsetAsync(lse.get(), 0xFF, lse_bytes, stream));
    auto attend = [&] { e.dec(p, ctx); };
    auto step = [&] {
      decode_append_kv(p, stream);  // update-cache kernel, then the attention over the new cache
      e.dec(p, ctx);
    };
    {
      // Two steps back to back on the same workspace, outputs poisoned before each: the first
      // call must leave the workspace (split arrival counters) as it found it, or the second,
      // the one validated, merges wrongly; and both must give the same bits.
      NvtxRange range("check");
      step();
      CUDA_CHECK(cudaStreamSynchronize(stream));
      s.first.o = download(o, in.dtype, q_shape());
      s.first.lse = download(lse, DType::F32, lse_shape());
      CUDA_CHECK(cudaMemsetAsync(o.get(), 0xFF, o_bytes, stream));
      CUDA_CHECK(cudaMemsetAsync(lse.get(), 0xFF, lse_bytes, stream));
      step();
      CUDA_CHECK(cudaStreamSynchronize(stream));
    }
    s.out.o = download(o, in.dtype, q_shape());
    s.out.lse = download(lse, DType::F32, lse_shape());
    if (keep_caches) {
      s.k_cache = download(d_kc, in.dtype, in.k_cache.shape);
      s.v_cache = download(d_vc, in.dtype, in.v_cache.shape);
    }
    if (timed_run) {
      s.step = timed(step, &s);
      if (opt.time_attention) {
        NvtxRange range("attention alone");
        s.attend = timed(attend, nullptr);
      }
    }
    s.device_used = static_cast<long long>(free_at_start) - static_cast<long long>(device_free_bytes());
    return s;
  }

  // A host kernel's step (cpu): the host appends k_new/v_new to copies of the caches, then the
  // kernel attends over them with host pointers; timed with the host clock.
  Step run_host_step(const KernelMode& e, bool keep_caches) {
    const DecodeDims& d = dims();
    const HostArray* table = in.block_table ? &*in.block_table : nullptr;
    HostArray kc = append_on_host(in.k_cache, in.k_new, in.cache_seqlens, table, d.page_size);
    HostArray vc = append_on_host(in.v_cache, in.v_new, in.cache_seqlens, table, d.page_size);
    DecodeParams p = params();
    p.q = in.q.bytes.data();
    p.k_new = in.k_new.bytes.data(), p.v_new = in.v_new.bytes.data();
    p.k_cache = kc.bytes.data(), p.v_cache = vc.bytes.data();
    p.cache_seqlens = in.cache_seqlens.data<int32_t>();
    p.block_table = table ? table->data<int32_t>() : nullptr;
    p.num_sms = 0;
    Step s;
    HostArray o(in.dtype, q_shape()), lse(DType::F32, lse_shape());
    std::memset(o.bytes.data(), 0xFF, o.nbytes());  // poison: NaN in every dtype
    std::memset(lse.bytes.data(), 0xFF, lse.nbytes());
    p.o = o.bytes.data(), p.lse = lse.bytes.data();
    LaunchContext ctx;
    ctx.cpu_threads = opt.cpu_threads;
    auto attend = [&] { e.dec(p, ctx); };
    attend();
    s.step = time_cpu(attend, opt.cpu_timing);
    s.out.o = std::move(o);
    s.out.lse = std::move(lse);
    if (keep_caches) s.k_cache = std::move(kc), s.v_cache = std::move(vc);
    return s;
  }

  // ---- validation -------------------------------------------------------------------------------
  void select_rows() {
    if (!rows.empty()) return;
    const DecodeDims& d = dims();
    const std::vector<int> L = decode_lengths(in.cache_seqlens, d.S_new);
    double cost = 0;
    for (int b = 0; b < d.B; ++b) cost += double(L[b]) * d.D * 2.0 * d.H * d.S_new;
    const int64_t total = int64_t(d.B) * d.H * d.S_new;
    if (cost <= opt.check_budget_macs) {
      for (int b = 0; b < d.B; ++b)
        for (int h = 0; h < d.H; ++h)
          for (int i = 0; i < d.S_new; ++i) rows.push_back({b, h, i});
      return;
    }
    const int64_t want = std::max<int64_t>(64, static_cast<int64_t>(opt.check_budget_macs / (cost / double(total))));
    std::set<std::tuple<int, int, int>> picked = {{0, 0, 0}, {d.B - 1, d.H - 1, d.S_new - 1}};
    std::mt19937_64 rng(opt.seed ^ 0x6465636f6465ull);
    std::uniform_int_distribution<int64_t> any(0, total - 1);
    while (static_cast<int64_t>(picked.size()) < std::min(want, total)) {
      const int64_t r = any(rng);
      picked.insert({int(r / (int64_t(d.H) * d.S_new)), int(r / d.S_new % d.H), int(r % d.S_new)});
    }
    for (const auto& t : picked) rows.push_back({std::get<0>(t), std::get<1>(t), std::get<2>(t)});
  }

  DecodeRefInputs ref_inputs() const {
    DecodeRefInputs r;
    const DecodeDims& d = dims();
    r.B = d.B, r.H = d.H, r.H_kv = d.H_kv, r.S_new = d.S_new, r.D = d.D;
    r.scale = in.scale;
    r.q = &in.q, r.k_new = &in.k_new, r.v_new = &in.v_new, r.k_cache = &in.k_cache, r.v_cache = &in.v_cache;
    r.cache_seqlens = in.cache_seqlens.data<int32_t>();
    if (in.block_table) {
      r.block_table = in.block_table->data<int32_t>();
      r.block_table_stride = d.max_blocks;
      r.page_size = d.page_size;
    }
    r.threads = opt.cpu_threads;
    return r;
  }

  const ReferenceRows& reference_rows() {
    if (have_reference) return reference;
    select_rows();
    reference.o.resize(rows.size() * dims().D);
    reference.lse.resize(rows.size());
    NvtxRange range("decode reference");
    decode_reference_rows(ref_inputs(), rows, reference.o.data(), reference.lse.data());
    have_reference = true;
    return reference;
  }

  ReferenceRows gather(const KernelOutputs& out) {
    select_rows();
    const DecodeDims& d = dims();
    ReferenceRows r;
    r.o.resize(rows.size() * d.D);
    r.lse.resize(rows.size());
    for (size_t k = 0; k < rows.size(); ++k) {
      const int64_t row = (int64_t(rows[k].b) * d.H + rows[k].h) * d.S_new + rows[k].i;
      for (int c = 0; c < d.D; ++c) r.o[k * d.D + c] = element_as_double(*out.o, row * d.D + c);
      r.lse[k] = element_as_double(*out.lse, row);
    }
    return r;
  }

  std::vector<std::pair<std::string, ErrorStats>> errors_of(const KernelOutputs& out) {
    const ReferenceRows& want = reference_rows();
    return measure_errors(gather(out), want, dims().D);
  }

  // The same-dtype baseline's errors (fp16/bf16) against the reference, on the same rows.
  const OutputErrors* baseline_errors() {
    if (!baseline) {
      select_rows();
      ReferenceRows b;
      b.o.resize(rows.size() * dims().D);
      b.lse.resize(rows.size());
      NvtxRange range("same-dtype baseline");
      decode_baseline_rows(ref_inputs(), in.dtype, rows, b.o.data(), b.lse.data());
      baseline = measure_errors(b, reference_rows(), dims().D);
    }
    return &*baseline;
  }

  OutputCheck cache_check(const char* name, const HostArray& got, const HostArray& cache, const HostArray& fresh,
                          std::optional<HostArray>& expected, int64_t* mismatches) {
    if (!expected)
      expected = append_on_host(cache, fresh, in.cache_seqlens, in.block_table ? &*in.block_table : nullptr,
                                dims().page_size);
    OutputCheck c;
    c.name = name;
    c.metric = "mismatches";
    c.rule = "bitwise equal to the cache with k_new/v_new appended on the host";
    c.err.count = got.numel();
    c.err.nonfinite = 0;
    const int64_t n = count_mismatches(got, *expected);
    *mismatches += n;
    c.measured = double(n);
    c.tolerance = 0;
    c.passed = n == 0;
    return c;
  }

  // The second back-to-back step against the first, bit for bit (a kernel declared reproducible).
  static OutputCheck repeat_check(const Step& s) {
    OutputCheck c;
    c.name = "repeat";
    c.metric = "mismatches";
    c.rule = "a second step right after the first, on the same workspace, gives the same O and lse bits";
    c.err.count = s.out.o->numel() + s.out.lse->numel();
    const double n = double(count_mismatches(*s.out.o, *s.first.o) + count_mismatches(*s.out.lse, *s.first.lse));
    c.measured = n;
    c.tolerance = 0;
    c.passed = n == 0;
    return c;
  }

  void validate(const KernelMode& e, Step& s, DecodeRecord& rec) {
    const Stopwatch since_start;
    auto errs = errors_of(s.out);
    const bool half = in.dtype == DType::F16 || in.dtype == DType::BF16;
    rec.run.check = judge(errs, in.dtype, half ? baseline_errors() : nullptr);
    if (s.first.o && e.bitwise_reproducible) {
      rec.run.check.outputs.push_back(repeat_check(s));
      rec.run.check.passed = rec.run.check.passed && rec.run.check.outputs.back().passed;
    }
    rec.run.check.rows_checked = static_cast<int64_t>(rows.size());
    rec.run.check.rows_total = int64_t(dims().B) * dims().H * dims().S_new;
    if (s.k_cache && s.v_cache) {
      rec.cache_checked = true;
      rec.run.check.outputs.push_back(cache_check("K_cache", *s.k_cache, in.k_cache, in.k_new, expected_k, &rec.cache_mismatches));
      rec.run.check.outputs.push_back(cache_check("V_cache", *s.v_cache, in.v_cache, in.v_new, expected_v, &rec.cache_mismatches));
      rec.cache_ok = rec.cache_mismatches == 0;
      rec.run.check.passed = rec.run.check.passed && rec.cache_ok;
    }
    rec.run.check.seconds = since_start.seconds();
  }
};

DecodeSession::DecodeSession(DecodeInputs inputs, DecodeOptions opt) : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  s.in = std::move(inputs);
  s.opt = std::move(opt);
  if (s.opt.device < 0) return;  // host kernels only
  CUDA_CHECK(cudaSetDevice(s.opt.device));
  s.dev = query_device(s.opt.device);
  CUDA_CHECK(cudaStreamCreateWithFlags(&s.stream, cudaStreamNonBlocking));
  s.timer = std::make_unique<GpuTimer>(s.dev.l2_bytes);
  size_t total = 0;
  CUDA_CHECK(cudaMemGetInfo(&s.free_at_start, &total));
}

DecodeSession::~DecodeSession() {
  if (impl_->stream) cudaStreamDestroy(impl_->stream);
}

const DeviceInfo* DecodeSession::device() const { return impl_->opt.device >= 0 ? &impl_->dev : nullptr; }
const DecodeInputs& DecodeSession::inputs() const { return impl_->in; }

DecodeRecord DecodeSession::run(const KernelMode& e) {
  Impl& s = *impl_;
  const std::string why = decode_why_unsupported(e, s.dims(), s.in.dtype, s.opt.device >= 0 ? s.dev.sm() : 0);
  if (!why.empty()) throw InputError(why);
  if (e.mode != Mode::Decode || !e.dec)
    throw InputError("kernel '" + e.kernel + "' registered decode without an entry point");

  DecodeRecord rec;
  RunRecord& r = rec.run;
  r.kernel = e.kernel;
  r.mode = Mode::Decode;
  r.gpu = e.gpu;
  rec.kv_bytes = decode_kv_bytes(s.dims(), s.in.cache_seqlens, s.in.dtype);
  r.flops = 4.0 * s.dims().D * decode_visible_pairs(s.dims(), s.in.cache_seqlens);
  r.bytes = rec.kv_bytes;

  Impl::Step st;
  const bool keep = s.opt.keep_caches || s.opt.check;
  if (e.gpu) {
    NvtxRange range("decode " + e.kernel);
    st = s.run_step(e, /*timed=*/true, keep);
  } else {
    st = s.run_host_step(e, keep);
  }
  rec.splits = st.splits;
  const std::string fault = inject_fault_if_asked(e.kernel, st.out);
  if (!fault.empty()) r.notes.push_back(fault);
  // Validate before the outputs move into the record: validate() reads st.out.
  if (s.opt.check) s.validate(e, st, rec);
  r.outputs = std::move(st.out);
  r.timing = std::move(st.step);
  rec.attend = std::move(st.attend);
  r.sm_clock_start_mhz = st.clock_start;
  r.sm_clock_end_mhz = st.clock_end;
  if (e.gpu) add_timing_notes(r);
  if (s.opt.keep_caches) {
    rec.k_cache = std::move(st.k_cache);
    rec.v_cache = std::move(st.v_cache);
  }

  const size_t lse_bytes = size_t(s.dims().B) * s.dims().H * s.dims().S_new * sizeof(float);
  r.memory.inputs_bytes = s.in.q.nbytes() + s.in.k_new.nbytes() + s.in.v_new.nbytes() + s.in.k_cache.nbytes() +
                          s.in.v_cache.nbytes() + s.in.cache_seqlens.nbytes() +
                          (s.in.block_table ? s.in.block_table->nbytes() : 0);
  r.memory.outputs_bytes = s.in.q.nbytes();  // O (the caches are updated in place)
  r.memory.workspace_bytes = st.workspace;
  r.memory.extra_bytes = st.workspace + lse_bytes;
  r.memory.peak_bytes = r.memory.inputs_bytes + r.memory.outputs_bytes + r.memory.extra_bytes;
  r.memory.device_used_bytes = st.device_used;

  const double sec = r.timing.median_ms * 1e-3;
  if (sec > 0) {
    r.tflops = r.flops / sec / 1e12;
    r.gbps = r.bytes / sec / 1e9;
  }
  return rec;
}

}  // namespace flashattn

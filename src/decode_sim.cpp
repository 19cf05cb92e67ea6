#include "decode_sim.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>

#include "flashattn/decode_cache.h"
#include "decode_reference.h"
#include "device_buffer.h"
#include "flashattn/device_fill.h"
#include "flashattn/check.h"
#include "flashattn/error.h"
#include "gpu_context.h"
#include "nvtx.h"
#include "params_build.h"
#include "problem.h"
#include "random.h"
#include "validate.h"
#include "stopwatch.h"

namespace flashattn {

namespace {

// Random streams of the generated tensors (distinct from flashattn-gen's 1..6).
enum SimStream : uint64_t { kPromptQ = 101, kPromptK = 102, kPromptV = 103, kStepBase = 1000 };

std::vector<int> prompt_lengths(const DecodeInputs& shape, const DecodeSimOptions& opt) {
  std::vector<int> P(static_cast<size_t>(shape.dims.B));
  for (int b = 0; b < shape.dims.B; ++b) P[b] = opt.prompt_len > 0 ? opt.prompt_len : shape.cache_seqlens.data<int32_t>()[b];
  return P;
}

// Nearest-rank percentile of sorted samples.
double percentile(const std::vector<double>& sorted, double q) {
  if (sorted.empty()) return 0;
  const size_t rank = static_cast<size_t>(std::ceil(q * double(sorted.size())));
  return sorted[std::min(sorted.size() - 1, rank == 0 ? 0 : rank - 1)];
}

}  // namespace

std::string decode_sim_unsupported(const KernelMode& dec, const DecodeInputs& shape, const DecodeSimOptions& opt, int sm) {
  const DecodeDims& d = shape.dims;
  const std::string why = decode_why_unsupported(dec, d, shape.dtype, sm);
  if (!why.empty()) return why;
  if (!dec.gpu) return "--steps: kernel '" + dec.kernel + "' runs on the host; the simulation times GPU kernels";
  const KernelMode* fe = Registry::find(dec.kernel, Mode::Forward);
  if (!fe || !fe->fwd) return "--steps: kernel '" + dec.kernel + "' has no forward pass for the prefill";
  const std::vector<int> P = prompt_lengths(shape, opt);
  Problem fp;
  const int P_max = *std::max_element(P.begin(), P.end());
  fp.dims = {d.B, d.H, d.H_kv, std::max(P_max, 1), std::max(P_max, 1), d.D};
  fp.dtype = shape.dtype;
  fp.causal = true;
  fp.has_padding = std::any_of(P.begin(), P.end(), [&](int p) { return p != P_max; });
  return why_unsupported(*fe, fp, sm);
}

namespace {

// One simulation: the cache, the prefill (TTFT), the decode steps (TBT), the check of the last
// step, and the report, in that order (simulate_decode).
class Simulation {
 public:
  Simulation(const KernelMode& dec, const DecodeInputs& shape, const DecodeSimOptions& opt)
      : dec_(dec), shape_(shape), opt_(opt), d_(shape.dims), t_(shape.dtype), es_(dtype_size(t_)),
        P_(prompt_lengths(shape, opt)), P_max_(*std::max_element(P_.begin(), P_.end())),
        fe_(Registry::find(dec.kernel, Mode::Forward)) {
    for (int b = 0; b < d_.B; ++b) {
      if (P_[b] < 1)
        throw InputError("--steps: the prompt of batch element " + std::to_string(b) +
                         " is empty (cache_seqlens is 0); give --prompt-len N");
      if (static_cast<int64_t>(P_[b]) + static_cast<int64_t>(opt.steps) * d_.S_new > d_.S_max)
        throw InputError(fmt::format("--steps: prompt {} + {} steps x S_new {} exceeds the cache's {} positions (batch element {})",
                                     P_[b], opt.steps, d_.S_new, d_.S_max, b));
    }
    CUDA_CHECK(cudaSetDevice(opt.device));
    dev_ = query_device(opt.device);
    CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
    cublas_ = std::make_unique<CublasHandle>(stream_);
    timer_ = std::make_unique<GpuTimer>(dev_.l2_bytes);
    ctx_ = gpu_launch_context(dev_, opt.device, stream_);
  }
  ~Simulation() {
    cublas_.reset();  // before its stream
    if (stream_) cudaStreamDestroy(stream_);
  }
  Simulation(const Simulation&) = delete;
  Simulation& operator=(const Simulation&) = delete;

  // The cache: contiguous, or a fresh pool with a shuffled block table covering S_max per element.
  void make_cache() {
    cd_ = d_;
    if (d_.paged()) {
      cd_.max_blocks = (d_.S_max + d_.page_size - 1) / d_.page_size;
      cd_.num_blocks = d_.B * cd_.max_blocks;
    }
    cache_shape_ = d_.paged() ? std::vector<int64_t>{cd_.num_blocks, d_.H_kv, d_.page_size, d_.D}
                              : std::vector<int64_t>{d_.B, d_.H_kv, d_.S_max, d_.D};
    const int64_t cache_rows = d_.paged() ? int64_t(cd_.num_blocks) * d_.page_size : int64_t(d_.B) * d_.S_max;
    const size_t cache_bytes = size_t(cache_rows) * d_.H_kv * d_.D * es_;
    kc_ = DeviceBuffer(cache_bytes), vc_ = DeviceBuffer(cache_bytes);
    if (d_.paged()) {
      h_table_ = HostArray(DType::I32, {d_.B, cd_.max_blocks});
      int32_t* tp = h_table_->data<int32_t>();
      std::iota(tp, tp + h_table_->numel(), 0);
      Rng rng(opt_.seed, kStepBase - 1);
      for (int64_t k = h_table_->numel() - 1; k > 0; --k) std::swap(tp[k], tp[rng.below(k + 1)]);
      table_ = upload_array(*h_table_);
    }
  }

  // Prefill: the forward pass over the prompts (causal, per-element lengths as key padding), then
  // the update-cache kernel writing their K/V at [0, P_max) of every element. TTFT times both.
  void prefill() {
    const int64_t nq = int64_t(d_.B) * d_.H * P_max_ * d_.D, nkv = int64_t(d_.B) * d_.H_kv * P_max_ * d_.D;
    DeviceBuffer pq(nq * es_), pk(nkv * es_), pv(nkv * es_), po(nq * es_), plse(size_t(d_.B) * d_.H * P_max_ * sizeof(float));
    fill_normal_device(pq.get(), t_, nq, opt_.seed, kPromptQ, stream_);
    fill_normal_device(pk.get(), t_, nkv, opt_.seed, kPromptK, stream_);
    fill_normal_device(pv.get(), t_, nkv, opt_.seed, kPromptV, stream_);
    HostArray h_prompt_lens(DType::I32, {d_.B}), h_zeros(DType::I32, {d_.B});
    for (int b = 0; b < d_.B; ++b) h_prompt_lens.data<int32_t>()[b] = P_[b];
    const bool padded = std::any_of(P_.begin(), P_.end(), [&](int p) { return p != P_max_; });
    DeviceBuffer d_prompt_lens = upload_array(h_prompt_lens), d_zeros = upload_array(h_zeros);

    Problem prompt;
    prompt.dims = {d_.B, d_.H, d_.H_kv, P_max_, P_max_, d_.D};
    prompt.dtype = t_;
    prompt.scale = shape_.scale;
    prompt.causal = true;
    prompt.has_padding = padded;
    FwdParams f = forward_params(prompt);
    f.seqlens_k = padded ? static_cast<const int32_t*>(d_prompt_lens.get()) : nullptr;
    f.q = pq.get(), f.k = pk.get(), f.v = pv.get();
    f.o = po.get(), f.lse = plse.get();
    f.num_sms = dev_.sm_count;
    fwd_ws_ = fe_->fwd_workspace ? fe_->fwd_workspace(f) : 0;
    DeviceBuffer fws(fwd_ws_);
    f.workspace = fws.get(), f.workspace_bytes = fwd_ws_;
    LaunchContext fctx = ctx_;
    if (fe_->uses_cublas) fctx.cublas = cublas_->get();

    DecodeDims fill_dims = cd_;
    fill_dims.S_new = P_max_;
    DecodeParams fill = decode_params(fill_dims, t_, shape_.scale);
    fill.k_new = pk.get(), fill.v_new = pv.get();
    fill.k_cache = kc_.get(), fill.v_cache = vc_.get();
    fill.cache_seqlens = static_cast<const int32_t*>(d_zeros.get());
    if (d_.paged()) fill.block_table = static_cast<const int32_t*>(table_.get());
    auto run = [&] {
      fe_->fwd(f, fctx);
      decode_append_kv(fill, stream_);
    };
    NvtxRange range("prefill (TTFT)");
    ttft_ = timer_->time(run, stream_, opt_.timing);
  }

  // The decode steps, each timed once: generate S_new tokens (untimed), then append + attend.
  void steps() {
    const int64_t nsq = int64_t(d_.B) * d_.H * d_.S_new * d_.D, nskv = int64_t(d_.B) * d_.H_kv * d_.S_new * d_.D;
    sq_ = DeviceBuffer(nsq * es_), skn_ = DeviceBuffer(nskv * es_), svn_ = DeviceBuffer(nskv * es_);
    so_ = DeviceBuffer(nsq * es_), slse_ = DeviceBuffer(size_t(d_.B) * d_.H * d_.S_new * sizeof(float));
    DeviceBuffer d_lens(size_t(d_.B) * sizeof(int32_t));
    DecodeParams p = decode_params(cd_, t_, shape_.scale);
    p.q = sq_.get(), p.k_new = skn_.get(), p.v_new = svn_.get();
    p.k_cache = kc_.get(), p.v_cache = vc_.get();
    if (d_.paged()) p.block_table = static_cast<const int32_t*>(table_.get());
    p.cache_seqlens = static_cast<const int32_t*>(d_lens.get());
    p.o = so_.get(), p.lse = slse_.get();
    p.num_splits = opt_.splits;
    p.num_sms = dev_.sm_count;
    lens_.assign(P_.begin(), P_.end());
    const int longest = *std::max_element(lens_.begin(), lens_.end());
    for (int s = 0; s < opt_.steps; ++s) {
      p.max_seqlen = longest + s * d_.S_new + d_.S_new;
      ws_bytes_ = std::max(ws_bytes_, dec_.dec_workspace ? dec_.dec_workspace(p) : size_t(0));
    }
    DeviceBuffer ws(ws_bytes_);
    if (ws_bytes_) CUDA_CHECK(cudaMemsetAsync(ws.get(), 0, ws_bytes_, stream_));  // DecodeParams::workspace
    p.workspace = ws.get(), p.workspace_bytes = ws_bytes_;
    auto step = [&] {
      decode_append_kv(p, stream_);
      dec_.dec(p, ctx_);
    };
    lens_arr_ = HostArray(DType::I32, {d_.B});
    NvtxRange range("decode steps (TBT)");
    for (int s = 0; s < opt_.steps; ++s) {
      std::copy(lens_.begin(), lens_.end(), lens_arr_.data<int32_t>());
      CUDA_CHECK(cudaMemcpyAsync(d_lens.get(), lens_arr_.bytes.data(), lens_arr_.nbytes(), cudaMemcpyHostToDevice, stream_));
      const uint64_t base = kStepBase + 3 * uint64_t(s);
      fill_normal_device(sq_.get(), t_, nsq, opt_.seed, base, stream_);
      fill_normal_device(skn_.get(), t_, nskv, opt_.seed, base + 1, stream_);
      fill_normal_device(svn_.get(), t_, nskv, opt_.seed, base + 2, stream_);
      p.max_seqlen = *std::max_element(lens_.begin(), lens_.end()) + d_.S_new;
      p.uniform_seqlen = std::all_of(lens_.begin(), lens_.end(), [&](int32_t v) { return v == lens_[0]; }) ? lens_[0] : -1;
      const int splits = dec_.dec_splits ? dec_.dec_splits(p) : 1;
      if (s == 0) {
        splits_first_ = splits;
        step();  // untimed warm-up: the same rows as the timed step 0, so it changes nothing
        CUDA_CHECK(cudaStreamSynchronize(stream_));
      }
      splits_last_ = splits;
      if (opt_.check && s + 1 == opt_.steps) {
        // The checked step starts from poisoned outputs, as every checked run does: an element it
        // leaves unwritten reads NaN (outside the step's events).
        CUDA_CHECK(cudaMemsetAsync(so_.get(), 0xFF, so_.bytes(), stream_));
        CUDA_CHECK(cudaMemsetAsync(slse_.get(), 0xFF, slse_.bytes(), stream_));
      }
      samples_.push_back(timer_->time_once(step, stream_));
      bytes_.push_back(decode_kv_bytes(d_, lens_arr_, t_));
      if (s + 1 < opt_.steps)
        for (int32_t& l : lens_) l += d_.S_new;
    }
  }

  // The last step's O and lse against the fp64 reference over the cache the run built.
  CheckResult check_last_step() const {
    const Stopwatch since_start;
    const DecodeDims& d = d_;
    DecodeInputs h;
    h.dims = cd_;
    h.dtype = t_;
    h.k_cache = download_array(kc_, t_, cache_shape_);
    h.v_cache = download_array(vc_, t_, cache_shape_);
    h.q = download_array(sq_, t_, {d.B, d.H, d.S_new, d.D});
    h.k_new = download_array(skn_, t_, {d.B, d.H_kv, d.S_new, d.D});
    h.v_new = download_array(svn_, t_, {d.B, d.H_kv, d.S_new, d.D});
    h.cache_seqlens = lens_arr_;  // the last step's lengths (its rows are in the cache already)
    const HostArray o = download_array(so_, t_, {d.B, d.H, d.S_new, d.D});
    const HostArray lse = download_array(slse_, DType::F32, {d.B, d.H, d.S_new});
    DecodeRefInputs ri;
    ri.B = d.B, ri.H = d.H, ri.H_kv = d.H_kv, ri.S_new = d.S_new, ri.D = d.D, ri.scale = shape_.scale;
    ri.q = &h.q, ri.k_new = &h.k_new, ri.v_new = &h.v_new, ri.k_cache = &h.k_cache, ri.v_cache = &h.v_cache;
    ri.cache_seqlens = h.cache_seqlens.data<int32_t>();
    if (h_table_) ri.block_table = h_table_->data<int32_t>(), ri.block_table_stride = cd_.max_blocks, ri.page_size = d.page_size;
    ri.threads = opt_.cpu_threads;
    std::vector<DecodeRowId> rows;
    for (int b = 0; b < d.B; ++b)
      for (int hh = 0; hh < d.H; ++hh)
        for (int i = 0; i < d.S_new; ++i) rows.push_back({b, hh, i});
    ReferenceRows want, got;
    want.o.resize(rows.size() * d.D), want.lse.resize(rows.size());
    decode_reference_rows(ri, rows, want.o.data(), want.lse.data());
    for (size_t k = 0; k < rows.size(); ++k) {
      for (int c = 0; c < d.D; ++c) got.o.push_back(element_as_double(o, int64_t(k) * d.D + c));
      got.lse.push_back(element_as_double(lse, int64_t(k)));
    }
    OutputErrors base;
    const bool half = t_ == DType::F16 || t_ == DType::BF16;
    if (half) {
      ReferenceRows b;
      b.o.resize(rows.size() * d.D), b.lse.resize(rows.size());
      decode_baseline_rows(ri, t_, rows, b.o.data(), b.lse.data());
      base = measure_errors(b, want, d.D);
    }
    CheckResult c = judge(measure_errors(got, want, d.D), t_, half ? &base : nullptr);
    c.rows_checked = c.rows_total = static_cast<int64_t>(rows.size());
    c.note = "the last step, against the cache the run built";
    c.seconds = since_start.seconds();
    return c;
  }

  DecodeSimResult result() const;

 private:
  const KernelMode& dec_;
  const DecodeInputs& shape_;
  const DecodeSimOptions& opt_;
  const DecodeDims& d_;
  const DType t_;
  const size_t es_;
  const std::vector<int> P_;  // prompt length per batch element
  const int P_max_;
  const KernelMode* fe_;  // the prefill's forward pass
  DeviceInfo dev_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<CublasHandle> cublas_;  // created if the prefill kernel uses cuBLAS
  std::unique_ptr<GpuTimer> timer_;
  LaunchContext ctx_;
  DecodeDims cd_;  // the cache's dims (a paged cache: the simulation's own pool)
  std::vector<int64_t> cache_shape_;
  DeviceBuffer kc_, vc_, table_;
  std::optional<HostArray> h_table_;
  size_t fwd_ws_ = 0, ws_bytes_ = 0;
  TimingStats ttft_;
  DeviceBuffer sq_, skn_, svn_, so_, slse_;  // the last step's tensors
  std::vector<int32_t> lens_;                 // the last step's cache lengths
  HostArray lens_arr_;
  std::vector<double> samples_, bytes_;
  int splits_first_ = 1, splits_last_ = 1;
};

DecodeSimResult Simulation::result() const {
  DecodeSimResult res;
  RunRecord& r = res.run;
  r.kernel = dec_.kernel;
  r.mode = Mode::Decode;
  r.gpu = true;
  r.timing = summarize(samples_);
  r.timing.device_events = true;
  r.timing.held = GpuTimer::holds_stream();
  r.timing.l2_flush = false;
  r.timing.warmup = 1;
  r.timing.min_samples = opt_.steps;
  r.timing.stop_reason = "steps";
  r.bytes = std::accumulate(bytes_.begin(), bytes_.end(), 0.0) / std::max<size_t>(bytes_.size(), 1);
  if (r.timing.median_ms > 0) r.gbps = r.bytes / (r.timing.median_ms * 1e-3) / 1e9;
  r.memory.workspace_bytes = ws_bytes_ + fwd_ws_ + (fe_->uses_cublas ? kCublasWorkspaceBytes : 0);

  std::vector<double> sorted = samples_;
  std::sort(sorted.begin(), sorted.end());
  const double mean = samples_.empty() ? 0 : std::accumulate(samples_.begin(), samples_.end(), 0.0) / samples_.size();
  std::vector<int> final_lens(lens_.begin(), lens_.end());
  for (int& l : final_lens) l += d_.S_new;  // after the last step's append
  const TimingStats& t = ttft_;
  res.sim = {{"prefill_kernel", fe_->kernel + " forward"},
             {"prompt_lengths", P_},
             {"steps", opt_.steps},
             {"S_new", d_.S_new},
             {"final_lengths", final_lens},
             {"ttft_ms", t.median_ms},
             {"ttft", {{"median_ms", t.median_ms}, {"min_ms", t.min_ms}, {"max_ms", t.max_ms},
                       {"repeat", t.samples_ms.size()}, {"l2_flush", t.l2_flush}, {"samples_ms", t.samples_ms}}},
             {"tbt_ms", {{"mean", mean}, {"p50", percentile(sorted, 0.5)}, {"p99", percentile(sorted, 0.99)},
                         {"min", sorted.empty() ? 0 : sorted.front()}, {"max", sorted.empty() ? 0 : sorted.back()}}},
             {"tbt_samples_ms", samples_},
             {"kv_bytes_first", bytes_.empty() ? 0 : bytes_.front()},
             {"kv_bytes_last", bytes_.empty() ? 0 : bytes_.back()},
             {"splits_first", splits_first_},
             {"splits_last", splits_last_},
             {"paged", d_.paged()},
             {"page_size", d_.page_size},
             {"timed", "TTFT: forward + cache fill, events around both, median of the timing repetitions; "
                       "TBT: each step (update-cache kernel + attention) once, events around it, no L2 flush; "
                       "new tokens are generated outside the timed region"}};
  res.summary = fmt::format("{}: TTFT {:.3f} ms (prefill {} tokens), TBT mean {:.4f} ms p50 {:.4f} p99 {:.4f} over {} steps "
                            "(lengths {}..{}, splits {}..{})",
                            dec_.kernel, t.median_ms, P_max_, mean, percentile(sorted, 0.5), percentile(sorted, 0.99),
                            opt_.steps, *std::min_element(P_.begin(), P_.end()),
                            *std::max_element(final_lens.begin(), final_lens.end()), splits_first_, splits_last_);
  return res;
}

}  // namespace

DecodeSimResult simulate_decode(const KernelMode& dec, const DecodeInputs& shape, const DecodeSimOptions& opt) {
  Simulation sim(dec, shape, opt);
  sim.make_cache();
  sim.prefill();
  sim.steps();
  DecodeSimResult res = sim.result();
  if (opt.check && opt.steps > 0) res.run.check = sim.check_last_step();
  return res;
}

}  // namespace flashattn

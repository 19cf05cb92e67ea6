#include "decode_sim.h"

#include <cuda_runtime_api.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <numeric>
#include <optional>

#include "flashattn/decode_cache.h"
#include "decode_reference.h"
#include "device_buffer.h"
#include "flashattn/device_fill.h"
#include "flashattn/check.h"
#include "flashattn/error.h"
#include "nvtx.h"
#include "problem.h"
#include "random.h"
#include "validate.h"

namespace flashattn {

namespace {

// Random streams of the generated tensors (distinct from flashattn-gen's 1..6).
enum SimStream : uint64_t { kPromptQ = 101, kPromptK = 102, kPromptV = 103, kStepBase = 1000 };

std::vector<int> prompt_lengths(const DecodeInputs& shape, const DecodeSimOptions& opt) {
  std::vector<int> P(static_cast<size_t>(shape.dims.B));
  for (int b = 0; b < shape.dims.B; ++b) P[b] = opt.prompt_len > 0 ? opt.prompt_len : shape.cache_seqlens.data<int32_t>()[b];
  return P;
}

Strides bhsd(int H, int S, int D) { return layout_strides(Layout::BHSD, H, S, D); }

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
  if (fe->uses_cublas) return "--steps: kernel '" + dec.kernel + "' prefills with cuBLAS, which the simulation does not set up";
  const std::vector<int> P = prompt_lengths(shape, opt);
  Problem fp;
  const int P_max = *std::max_element(P.begin(), P.end());
  fp.dims = {d.B, d.H, d.H_kv, std::max(P_max, 1), std::max(P_max, 1), d.D};
  fp.dtype = shape.dtype;
  fp.causal = true;
  fp.has_padding = std::any_of(P.begin(), P.end(), [&](int p) { return p != P_max; });
  return why_unsupported(*fe, fp, sm);
}

DecodeSimResult simulate_decode(const KernelMode& dec, const DecodeInputs& shape, const DecodeSimOptions& opt) {
  const DecodeDims& d = shape.dims;
  const DType t = shape.dtype;
  const size_t es = dtype_size(t);
  const std::vector<int> P = prompt_lengths(shape, opt);
  const int P_max = *std::max_element(P.begin(), P.end());
  for (int b = 0; b < d.B; ++b) {
    if (P[b] < 1)
      throw InputError("--steps: the prompt of batch element " + std::to_string(b) +
                       " is empty (cache_seqlens is 0); give --prompt-len N");
    if (static_cast<int64_t>(P[b]) + static_cast<int64_t>(opt.steps) * d.S_new > d.S_max)
      throw InputError(fmt::format("--steps: prompt {} + {} steps x S_new {} exceeds the cache's {} positions (batch element {})",
                                   P[b], opt.steps, d.S_new, d.S_max, b));
  }
  const KernelMode* fe = Registry::find(dec.kernel, Mode::Forward);
  CUDA_CHECK(cudaSetDevice(opt.device));
  const DeviceInfo dev = query_device(opt.device);
  cudaStream_t stream = nullptr;
  CUDA_CHECK(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  struct StreamGuard {
    cudaStream_t s;
    ~StreamGuard() { cudaStreamDestroy(s); }
  } guard{stream};
  GpuTimer timer(dev.l2_bytes);
  LaunchContext ctx;
  ctx.stream = stream, ctx.device = opt.device, ctx.sm = dev.sm(), ctx.sm_count = dev.sm_count;
  ctx.smem_optin = dev.smem_per_block_optin, ctx.l2_bytes = dev.l2_bytes;

  // ---- the cache: contiguous, or a fresh pool with a shuffled block table ------------------------
  const int page = d.page_size;
  const int max_blocks = d.paged() ? (d.S_max + page - 1) / page : 0;
  const int64_t cache_rows = d.paged() ? int64_t(d.B) * max_blocks * page : int64_t(d.B) * d.S_max;
  const std::vector<int64_t> cache_shape = d.paged() ? std::vector<int64_t>{int64_t(d.B) * max_blocks, d.H_kv, page, d.D}
                                                     : std::vector<int64_t>{d.B, d.H_kv, d.S_max, d.D};
  const size_t cache_bytes = size_t(cache_rows) * d.H_kv * d.D * es;
  DeviceBuffer kc(cache_bytes), vc(cache_bytes), table;
  std::optional<HostArray> h_table;
  if (d.paged()) {
    h_table = HostArray(DType::I32, {d.B, max_blocks});
    int32_t* tp = h_table->data<int32_t>();
    std::iota(tp, tp + h_table->numel(), 0);
    Rng rng(opt.seed, kStepBase - 1);
    for (int64_t k = h_table->numel() - 1; k > 0; --k) std::swap(tp[k], tp[rng.below(k + 1)]);
    table = upload_array(*h_table);
  }

  // ---- prefill: forward over the prompt, then the cache fill ---------------------------------------
  const Strides q_st = bhsd(d.H, P_max, d.D), kv_st = bhsd(d.H_kv, P_max, d.D);
  const int64_t nq = int64_t(d.B) * d.H * P_max * d.D, nkv = int64_t(d.B) * d.H_kv * P_max * d.D;
  DeviceBuffer pq(nq * es), pk(nkv * es), pv(nkv * es), po(nq * es), plse(size_t(d.B) * d.H * P_max * sizeof(float));
  fill_normal_device(pq.get(), t, nq, opt.seed, kPromptQ, stream);
  fill_normal_device(pk.get(), t, nkv, opt.seed, kPromptK, stream);
  fill_normal_device(pv.get(), t, nkv, opt.seed, kPromptV, stream);
  HostArray h_prompt_lens(DType::I32, {d.B}), h_zeros(DType::I32, {d.B});
  for (int b = 0; b < d.B; ++b) h_prompt_lens.data<int32_t>()[b] = P[b];
  const bool padded = std::any_of(P.begin(), P.end(), [&](int p) { return p != P_max; });
  DeviceBuffer d_prompt_lens = upload_array(h_prompt_lens), d_zeros = upload_array(h_zeros);

  FwdParams f;
  f.dtype = t;
  f.layout = Layout::BHSD;
  f.B = d.B, f.H = d.H, f.H_kv = d.H_kv, f.S_q = P_max, f.S_k = P_max, f.D = d.D;
  f.scale_f64 = shape.scale;
  f.scale = static_cast<float>(shape.scale);
  f.scale_log2 = static_cast<float>(shape.scale * 1.4426950408889634074);
  f.causal = true;
  f.window_right = 0;  // causal folded in, as the driver does
  f.seqlens_k = padded ? static_cast<const int32_t*>(d_prompt_lens.get()) : nullptr;
  f.q = pq.get(), f.k = pk.get(), f.v = pv.get();
  f.q_st = f.o_st = q_st;
  f.k_st = f.v_st = kv_st;
  f.o = po.get(), f.lse = plse.get();
  f.num_sms = dev.sm_count;
  const size_t fwd_ws = fe->fwd_workspace ? fe->fwd_workspace(f) : 0;
  DeviceBuffer fws(fwd_ws);
  f.workspace = fws.get(), f.workspace_bytes = fwd_ws;
  const LaunchContext fctx = ctx;

  DecodeParams fill;  // the prompt's K/V written at [0, P_max) of every element
  fill.dtype = t;
  fill.B = d.B, fill.H = d.H, fill.H_kv = d.H_kv, fill.S_new = P_max, fill.S_max = d.S_max, fill.D = d.D;
  fill.k_new = pk.get(), fill.v_new = pv.get();
  fill.k_new_st = fill.v_new_st = kv_st;
  fill.k_cache = kc.get(), fill.v_cache = vc.get();
  fill.k_cache_st = fill.v_cache_st = bhsd(d.H_kv, d.paged() ? page : d.S_max, d.D);
  fill.cache_seqlens = static_cast<const int32_t*>(d_zeros.get());
  if (d.paged()) {
    fill.block_table = static_cast<const int32_t*>(table.get());
    fill.block_table_stride = max_blocks, fill.page_size = page, fill.num_blocks = int(int64_t(d.B) * max_blocks);
  }
  auto prefill = [&] {
    fe->fwd(f, fctx);
    decode_append_kv(fill, stream);
  };
  TimingStats ttft;
  {
    NvtxRange range("prefill (TTFT)");
    ttft = timer.time(prefill, stream, opt.timing);
  }

  // ---- decode steps ---------------------------------------------------------------------------------
  const int64_t nsq = int64_t(d.B) * d.H * d.S_new * d.D, nskv = int64_t(d.B) * d.H_kv * d.S_new * d.D;
  DeviceBuffer sq(nsq * es), skn(nskv * es), svn(nskv * es), so(nsq * es), slse(size_t(d.B) * d.H * d.S_new * sizeof(float));
  DeviceBuffer d_lens(size_t(d.B) * sizeof(int32_t));
  DecodeParams p = fill;
  p.S_new = d.S_new;
  p.scale_f64 = shape.scale, p.scale = f.scale, p.scale_log2 = f.scale_log2;
  p.q = sq.get(), p.q_st = p.o_st = bhsd(d.H, d.S_new, d.D);
  p.k_new = skn.get(), p.v_new = svn.get();
  p.k_new_st = p.v_new_st = bhsd(d.H_kv, d.S_new, d.D);
  p.cache_seqlens = static_cast<const int32_t*>(d_lens.get());
  p.o = so.get(), p.lse = slse.get();
  p.num_splits = opt.splits;
  p.num_sms = dev.sm_count;
  std::vector<int32_t> lens(P.begin(), P.end());
  auto max_len = [&](int step) {
    return *std::max_element(lens.begin(), lens.end()) + step * d.S_new + d.S_new;
  };
  size_t ws_bytes = 0;
  for (int s = 0; s < opt.steps; ++s) {
    p.max_seqlen = max_len(s);
    ws_bytes = std::max(ws_bytes, dec.dec_workspace ? dec.dec_workspace(p) : size_t(0));
  }
  DeviceBuffer ws(ws_bytes);
  if (ws_bytes) CUDA_CHECK(cudaMemsetAsync(ws.get(), 0, ws_bytes, stream));  // DecodeParams::workspace
  p.workspace = ws.get(), p.workspace_bytes = ws_bytes;
  auto generate = [&](int s) {
    const uint64_t base = kStepBase + 3 * uint64_t(s);
    fill_normal_device(sq.get(), t, nsq, opt.seed, base, stream);
    fill_normal_device(skn.get(), t, nskv, opt.seed, base + 1, stream);
    fill_normal_device(svn.get(), t, nskv, opt.seed, base + 2, stream);
  };
  auto step = [&] {
    decode_append_kv(p, stream);
    dec.dec(p, ctx);
  };
  std::vector<double> samples;
  std::vector<double> bytes;
  int splits_first = 1, splits_last = 1;
  HostArray lens_arr(DType::I32, {d.B});
  {
    NvtxRange range("decode steps (TBT)");
    for (int s = 0; s < opt.steps; ++s) {
      std::copy(lens.begin(), lens.end(), lens_arr.data<int32_t>());
      CUDA_CHECK(cudaMemcpyAsync(d_lens.get(), lens_arr.bytes.data(), lens_arr.nbytes(), cudaMemcpyHostToDevice, stream));
      generate(s);
      p.max_seqlen = *std::max_element(lens.begin(), lens.end()) + d.S_new;
      p.uniform_seqlen = std::all_of(lens.begin(), lens.end(), [&](int32_t v) { return v == lens[0]; }) ? lens[0] : -1;
      const int splits = dec.dec_splits ? dec.dec_splits(p) : 1;
      if (s == 0) {
        splits_first = splits;
        step();  // untimed warm-up: the same rows as the timed step 0, so it changes nothing
        CUDA_CHECK(cudaStreamSynchronize(stream));
      }
      splits_last = splits;
      if (opt.check && s + 1 == opt.steps) {
        // The checked step starts from poisoned outputs, as every checked run does: an element it
        // leaves unwritten reads NaN (outside the step's events).
        CUDA_CHECK(cudaMemsetAsync(so.get(), 0xFF, so.bytes(), stream));
        CUDA_CHECK(cudaMemsetAsync(slse.get(), 0xFF, slse.bytes(), stream));
      }
      samples.push_back(timer.time_once(step, stream));
      DecodeDims dd = d;
      bytes.push_back(decode_kv_bytes(dd, lens_arr, t));
      if (s + 1 < opt.steps)
        for (int32_t& l : lens) l += d.S_new;
    }
  }

  DecodeSimResult res;
  RunRecord& r = res.run;
  r.kernel = dec.kernel;
  r.mode = Mode::Decode;
  r.gpu = true;
  r.timing = summarize(samples);
  r.timing.device_events = true;
  r.timing.held = GpuTimer::holds_stream();
  r.timing.l2_flush = false;
  r.timing.warmup = 1;
  r.timing.min_samples = opt.steps;
  r.timing.stop_reason = "steps";
  r.bytes = std::accumulate(bytes.begin(), bytes.end(), 0.0) / std::max<size_t>(bytes.size(), 1);
  if (r.timing.median_ms > 0) r.gbps = r.bytes / (r.timing.median_ms * 1e-3) / 1e9;
  r.memory.workspace_bytes = ws_bytes + fwd_ws;

  // ---- check the last step against the fp64 reference ---------------------------------------------
  if (opt.check && opt.steps > 0) {
    DecodeInputs h;
    h.dims = d;
    if (d.paged()) h.dims.num_blocks = int(int64_t(d.B) * max_blocks), h.dims.max_blocks = max_blocks;
    h.dtype = t;
    h.k_cache = download_array(kc, t, cache_shape);
    h.v_cache = download_array(vc, t, cache_shape);
    h.q = download_array(sq, t, {d.B, d.H, d.S_new, d.D});
    h.k_new = download_array(skn, t, {d.B, d.H_kv, d.S_new, d.D});
    h.v_new = download_array(svn, t, {d.B, d.H_kv, d.S_new, d.D});
    h.cache_seqlens = lens_arr;  // the last step's lengths (its rows are in the cache already)
    KernelOutputs out;
    out.o = download_array(so, t, {d.B, d.H, d.S_new, d.D});
    out.lse = download_array(slse, DType::F32, {d.B, d.H, d.S_new});
    DecodeRefInputs ri;
    ri.B = d.B, ri.H = d.H, ri.H_kv = d.H_kv, ri.S_new = d.S_new, ri.D = d.D, ri.scale = shape.scale;
    ri.q = &h.q, ri.k_new = &h.k_new, ri.v_new = &h.v_new, ri.k_cache = &h.k_cache, ri.v_cache = &h.v_cache;
    ri.cache_seqlens = h.cache_seqlens.data<int32_t>();
    if (h_table) ri.block_table = h_table->data<int32_t>(), ri.block_table_stride = max_blocks, ri.page_size = page;
    ri.threads = opt.cpu_threads;
    std::vector<DecodeRowId> rows;
    for (int b = 0; b < d.B; ++b)
      for (int hh = 0; hh < d.H; ++hh)
        for (int i = 0; i < d.S_new; ++i) rows.push_back({b, hh, i});
    ReferenceRows want, got;
    want.o.resize(rows.size() * d.D), want.lse.resize(rows.size());
    decode_reference_rows(ri, rows, want.o.data(), want.lse.data());
    for (size_t k = 0; k < rows.size(); ++k) {
      for (int c = 0; c < d.D; ++c) got.o.push_back(element_as_double(*out.o, int64_t(k) * d.D + c));
      got.lse.push_back(element_as_double(*out.lse, int64_t(k)));
    }
    OutputErrors base;
    const bool half = t == DType::F16 || t == DType::BF16;
    if (half) {
      ReferenceRows b;
      b.o.resize(rows.size() * d.D), b.lse.resize(rows.size());
      decode_baseline_rows(ri, t, rows, b.o.data(), b.lse.data());
      base = measure_errors(b, want, d.D);
    }
    r.check = judge(measure_errors(got, want, d.D), t, half ? &base : nullptr);
    r.check.rows_checked = r.check.rows_total = static_cast<int64_t>(rows.size());
    r.check.note = "the last step, against the cache the run built";
  }

  std::vector<double> sorted = samples;
  std::sort(sorted.begin(), sorted.end());
  const double mean = samples.empty() ? 0 : std::accumulate(samples.begin(), samples.end(), 0.0) / samples.size();
  std::vector<int> final_lens(lens.begin(), lens.end());
  for (int& l : final_lens) l += d.S_new;  // after the last step's append
  res.sim = {{"prefill_kernel", fe->kernel + " forward"},
             {"prompt_lengths", P},
             {"steps", opt.steps},
             {"S_new", d.S_new},
             {"final_lengths", final_lens},
             {"ttft_ms", ttft.median_ms},
             {"ttft", {{"median_ms", ttft.median_ms}, {"min_ms", ttft.min_ms}, {"max_ms", ttft.max_ms},
                       {"repeat", ttft.samples_ms.size()}, {"l2_flush", ttft.l2_flush}, {"samples_ms", ttft.samples_ms}}},
             {"tbt_ms", {{"mean", mean}, {"p50", percentile(sorted, 0.5)}, {"p99", percentile(sorted, 0.99)},
                         {"min", sorted.empty() ? 0 : sorted.front()}, {"max", sorted.empty() ? 0 : sorted.back()}}},
             {"tbt_samples_ms", samples},
             {"kv_bytes_first", bytes.empty() ? 0 : bytes.front()},
             {"kv_bytes_last", bytes.empty() ? 0 : bytes.back()},
             {"splits_first", splits_first},
             {"splits_last", splits_last},
             {"paged", d.paged()},
             {"page_size", page},
             {"timed", "TTFT: forward + cache fill, events around both, median of the timing repetitions; "
                       "TBT: each step (update-cache kernel + attention) once, events around it, no L2 flush; "
                       "new tokens are generated outside the timed region"}};
  res.summary = fmt::format("{}: TTFT {:.3f} ms (prefill {} tokens), TBT mean {:.4f} ms p50 {:.4f} p99 {:.4f} over {} steps "
                            "(lengths {}..{}, splits {}..{})",
                            dec.kernel, ttft.median_ms, P_max, mean, percentile(sorted, 0.5), percentile(sorted, 0.99),
                            opt.steps, *std::min_element(P.begin(), P.end()), *std::max_element(final_lens.begin(), final_lens.end()),
                            splits_first, splits_last);
  return res;
}

}  // namespace flashattn

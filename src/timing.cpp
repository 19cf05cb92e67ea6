#include "timing.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <numeric>

#include "flashattn/check.h"
#include "nvtx.h"

namespace flashattn {

TimingStats summarize(std::vector<double> samples) {
  TimingStats t;
  t.samples_ms = samples;
  if (samples.empty()) return t;
  std::sort(samples.begin(), samples.end());
  const size_t n = samples.size();
  t.min_ms = samples.front();
  t.max_ms = samples.back();
  t.median_ms = n % 2 ? samples[n / 2] : 0.5 * (samples[n / 2 - 1] + samples[n / 2]);
  t.mean_ms = std::accumulate(samples.begin(), samples.end(), 0.0) / double(n);
  if (n > 1 && t.mean_ms > 0) {
    double ss = 0;
    for (double s : samples) ss += (s - t.mean_ms) * (s - t.mean_ms);
    t.rel_stddev = std::sqrt(ss / double(n - 1)) / t.mean_ms;
  }
  return t;
}

L2Flusher::L2Flusher(size_t l2_bytes) : bytes_(std::max<size_t>(2 * l2_bytes, 1 << 20)) {
  CUDA_CHECK(cudaMalloc(&buf_, bytes_));
}

L2Flusher::~L2Flusher() {
  if (buf_) cudaFree(buf_);
}

void L2Flusher::flush(cudaStream_t stream) { CUDA_CHECK(cudaMemsetAsync(buf_, 0, bytes_, stream)); }

std::string stop_reason(const TimingOptions& opt, int n, double total_ms, double noise, double wall_s) {
  if (n >= opt.max_repeat) return "max_samples";
  if (n < opt.repeat || total_ms < opt.min_time_ms) return "";
  if (opt.max_noise <= 0) return "min_samples";
  if (n >= 2 && noise <= opt.max_noise) return "noise";
  if (wall_s >= opt.max_time_s) return "max_time";
  return "";
}

namespace {

// Start/stop events for a batch of repetitions, destroyed however the loop ends.
struct EventPool {
  std::vector<cudaEvent_t> ev;
  explicit EventPool(int n) : ev(static_cast<size_t>(n), nullptr) {
    for (cudaEvent_t& e : ev) CUDA_CHECK(cudaEventCreate(&e));
  }
  ~EventPool() {
    for (cudaEvent_t e : ev)
      if (e) cudaEventDestroy(e);
  }
};

// Running mean and sum of squared deviations (Welford): the rule is checked after every batch
// without rescanning all samples.
struct Running {
  int n = 0;
  double mean = 0, m2 = 0;
  void add(double x) {
    ++n;
    const double d = x - mean;
    mean += d / n;
    m2 += d * (x - mean);
  }
  double rel_stddev() const {
    if (n < 2 || mean <= 0) return std::numeric_limits<double>::infinity();
    return std::sqrt(m2 / (n - 1)) / mean;
  }
};

void add_clock_reading(const ClockProbe& probe, ClockStats& c, double& sum) {
  if (probe.sm_clock_mhz) {
    const int mhz = probe.sm_clock_mhz();
    if (mhz > 0) {
      if (c.samples == 0) c.start_mhz = c.min_mhz = c.max_mhz = mhz;
      c.min_mhz = std::min(c.min_mhz, mhz);
      c.max_mhz = std::max(c.max_mhz, mhz);
      sum += mhz;
      ++c.samples;
    }
  }
  if (probe.throttle_reasons) c.reasons |= probe.throttle_reasons();
}

}  // namespace

TimingStats time_gpu(const std::function<void()>& launch, cudaStream_t stream, const TimingOptions& opt,
                     L2Flusher* flusher, const ClockProbe* probe) {
  const bool flush = flusher && opt.flush_l2;
  {
    NvtxRange range("warmup");
    for (int i = 0; i < opt.warmup; ++i) {
      if (flush) flusher->flush(stream);
      launch();
    }
    CUDA_CHECK(cudaStreamSynchronize(stream));
  }

  // Batches hold up to kMaxBatch repetitions, sized to about kBatchMs of GPU time: long enough
  // that the GPU never waits for the host between repetitions, short enough that the rule is
  // checked often.
  constexpr int kMaxBatch = 32;
  constexpr double kBatchMs = 2.0;
  EventPool events(2 * kMaxBatch);
  std::vector<double> samples;
  Running run;
  double total = 0, clock_sum = 0;
  ClockStats clock;
  std::string reason;
  int batch = 1;
  const auto t0 = std::chrono::steady_clock::now();
  double wall = 0;
  {
    NvtxRange range("timed");
    while (reason.empty()) {
      const int n = static_cast<int>(samples.size());
      int b = std::min(batch, opt.max_repeat - n);
      if (n < opt.repeat) b = std::min(b, opt.repeat - n);  // an exact --repeat when the rule is off
      b = std::max(b, 1);
      for (int i = 0; i < b; ++i) {
        if (flush) flusher->flush(stream);  // outside the events
        CUDA_CHECK(cudaEventRecord(events.ev[2 * i], stream));
        launch();
        CUDA_CHECK(cudaEventRecord(events.ev[2 * i + 1], stream));
      }
      if (probe) add_clock_reading(*probe, clock, clock_sum);  // while the batch runs
      CUDA_CHECK(cudaEventSynchronize(events.ev[2 * b - 1]));
      for (int i = 0; i < b; ++i) {
        float ms = 0;
        CUDA_CHECK(cudaEventElapsedTime(&ms, events.ev[2 * i], events.ev[2 * i + 1]));
        samples.push_back(ms);
        run.add(ms);
        total += ms;
      }
      wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      reason = stop_reason(opt, static_cast<int>(samples.size()), total, run.rel_stddev(), wall);
      batch = std::clamp(static_cast<int>(kBatchMs / std::max(run.mean, 1e-3)), 1, kMaxBatch);
    }
  }
  TimingStats t = summarize(samples);
  t.warmup = opt.warmup;
  t.l2_flush = flush;
  t.device_events = true;
  t.min_samples = opt.repeat;
  t.max_noise = opt.max_noise;
  t.max_time_s = opt.max_time_s;
  t.noise_rule = opt.max_noise > 0 ? (t.rel_stddev <= opt.max_noise && samples.size() >= 2) : -1;
  t.stop_reason = reason;
  t.wall_s = wall;
  if (clock.samples > 0) clock.mean_mhz = clock_sum / clock.samples;
  clock.throttled = (clock.samples > 0 && clock.min_mhz < 0.9 * clock.start_mhz) || clock.reasons != 0;
  t.clock = clock;
  return t;
}

TimingStats time_cpu(const std::function<void()>& fn, const TimingOptions& opt) {
  for (int i = 0; i < opt.warmup; ++i) fn();
  std::vector<double> samples;
  double total = 0;
  const auto t0 = std::chrono::steady_clock::now();
  while ((int)samples.size() < opt.repeat || (total < opt.min_time_ms && (int)samples.size() < opt.max_repeat)) {
    auto t1 = std::chrono::steady_clock::now();
    fn();
    auto t2 = std::chrono::steady_clock::now();
    double ms = std::chrono::duration<double, std::milli>(t2 - t1).count();
    samples.push_back(ms);
    total += ms;
  }
  TimingStats t = summarize(samples);
  t.warmup = opt.warmup;
  t.min_samples = opt.repeat;
  t.stop_reason = "min_samples";  // host kernels: a fixed count, no noise rule
  t.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return t;
}

}  // namespace flashattn

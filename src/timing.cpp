#include "timing.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <numeric>

#include "flashattn/check.h"
#include "flashattn/timing_kernels.h"
#include "nvtx.h"
#include "stopwatch.h"

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
  CUDA_CHECK(cudaMalloc(&write_buf_, bytes_));
  CUDA_CHECK(cudaMalloc(&read_buf_, bytes_));
  CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&sink_), sizeof(unsigned int)));
  // Defined contents for the read pass (compute-sanitizer's initcheck), zero so `sink_` is never
  // written.
  CUDA_CHECK(cudaMemset(read_buf_, 0, bytes_));
  CUDA_CHECK(cudaMemset(sink_, 0, sizeof(unsigned int)));
}

L2Flusher::~L2Flusher() {
  if (write_buf_) cudaFree(write_buf_);
  if (read_buf_) cudaFree(read_buf_);
  if (sink_) cudaFree(sink_);
}

void L2Flusher::flush(cudaStream_t stream) {
  CUDA_CHECK(cudaMemsetAsync(write_buf_, 0, bytes_, stream));
  launch_l2_read(read_buf_, bytes_, sink_, stream);
}

StreamHold::StreamHold() {
  void* p = nullptr;
  CUDA_CHECK(cudaHostAlloc(&p, 2 * sizeof(unsigned long long), cudaHostAllocMapped));
  released_ = static_cast<unsigned long long*>(p);
  released_[0] = released_[1] = 0;
  void* d = nullptr;
  CUDA_CHECK(cudaHostGetDevicePointer(&d, p, 0));
  released_dev_ = static_cast<unsigned long long*>(d);
}

StreamHold::~StreamHold() {
  if (!released_) return;
  release();                // a hold still pending lets go...
  cudaFreeHost(released_);  // ...before the memory it reads goes (cudaFreeHost waits for the device)
}

void StreamHold::hold(cudaStream_t stream, double timeout_s) {
  ++ticket_;
  const auto timeout_ns = static_cast<unsigned long long>(std::max(timeout_s, 0.0) * 1e9);
  launch_stream_hold(released_dev_, ticket_, timeout_ns,
                     reinterpret_cast<volatile unsigned int*>(released_dev_ + 1), stream);
}

void StreamHold::release() {
  std::atomic_thread_fence(std::memory_order_seq_cst);
  *static_cast<volatile unsigned long long*>(released_) = ticket_;
  std::atomic_thread_fence(std::memory_order_seq_cst);
}

unsigned long long StreamHold::timeouts() const {
  return *reinterpret_cast<const volatile unsigned int*>(released_ + 1);
}

std::string stop_reason(const TimingOptions& opt, int n, double total_ms, double noise, double wall_s) {
  if (n >= opt.max_repeat) return "max_samples";
  if (n < opt.repeat || total_ms < opt.min_time_ms) return "";
  if (opt.max_noise <= 0) return "min_samples";
  if (n >= 2 && noise <= opt.max_noise) return "noise";
  if (wall_s >= opt.max_time_s) return "max_time";
  return "";
}

namespace {

// Debug builds synchronise after every launch (check.h), which would wait on a held stream until
// the hold's timeout: they time without the hold (and say so: timing.method "events"). So do runs
// with FLASHATTN_TIMING_HOLD=0, which the profiling and sanitizer scripts set (Nsight Compute
// serialises every launch, so a held stream would only wait for its timeout).
#ifdef FLASHATTN_SYNC_LAUNCHES
constexpr bool kHoldBuild = false;
#else
constexpr bool kHoldBuild = true;
#endif

bool hold_wanted() {
  if (!kHoldBuild) return false;
  const char* v = std::getenv("FLASHATTN_TIMING_HOLD");
  return !(v && std::string(v) == "0");
}

const bool kHold = hold_wanted();

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

GpuTimer::GpuTimer(size_t l2_bytes) : flusher_(l2_bytes) {}

bool GpuTimer::holds_stream() { return kHold; }

TimingStats GpuTimer::time(const std::function<void()>& launch, cudaStream_t stream, const TimingOptions& opt,
                           const ClockProbe* probe) {
  const bool flush = opt.flush_l2;
  {
    NvtxRange range("warmup");
    for (int i = 0; i < opt.warmup; ++i) {
      if (flush) flusher_.flush(stream);
      launch();
    }
    CUDA_CHECK(cudaStreamSynchronize(stream));
  }

  // Batches hold up to kMaxBatch repetitions, sized to about kBatchMs of GPU time: long enough
  // that the GPU never waits for the host between repetitions, short enough that the rule is
  // checked often. A batch whose hold timed out (the host could not enqueue it in time: its
  // events may hold host time) is thrown away and the batches are halved; after kMaxReruns the
  // loop gives up with stop reason "hold_timeout".
  constexpr int kMaxBatch = 32, kMaxReruns = 8;
  constexpr double kBatchMs = 2.0;
  EventPool events(2 * kMaxBatch);
  std::vector<double> samples;
  Running run;
  double total = 0, clock_sum = 0;
  ClockStats clock;
  std::string reason;
  int batch = 1, max_batch = kMaxBatch, reruns = 0;
  const unsigned long long timeouts0 = hold_.timeouts();
  const Stopwatch since_start;
  double wall = 0;
  {
    NvtxRange range("timed");
    while (reason.empty()) {
      const int n = static_cast<int>(samples.size());
      int b = std::min({batch, max_batch, opt.max_repeat - n});
      if (n < opt.repeat) b = std::min(b, opt.repeat - n);  // an exact --repeat when the rule is off
      b = std::max(b, 1);
      const unsigned long long before = hold_.timeouts();
      if (kHold) hold_.hold(stream, kHoldTimeoutS);
      for (int i = 0; i < b; ++i) {
        if (flush) flusher_.flush(stream);  // outside the events
        CUDA_CHECK(cudaEventRecord(events.ev[2 * i], stream));
        launch();
        CUDA_CHECK(cudaEventRecord(events.ev[2 * i + 1], stream));
      }
      if (kHold) hold_.release();
      if (probe) add_clock_reading(*probe, clock, clock_sum);  // while the batch runs
      CUDA_CHECK(cudaEventSynchronize(events.ev[2 * b - 1]));
      wall = since_start.seconds();
      if (hold_.timeouts() != before) {
        max_batch = std::max(1, max_batch / 2);
        if (++reruns >= kMaxReruns) reason = "hold_timeout";
        continue;
      }
      for (int i = 0; i < b; ++i) {
        float ms = 0;
        CUDA_CHECK(cudaEventElapsedTime(&ms, events.ev[2 * i], events.ev[2 * i + 1]));
        samples.push_back(ms);
        run.add(ms);
        total += ms;
      }
      reason = stop_reason(opt, static_cast<int>(samples.size()), total, run.rel_stddev(), wall);
      batch = std::clamp(static_cast<int>(kBatchMs / std::max(run.mean, 1e-3)), 1, kMaxBatch);
    }
  }
  TimingStats t = summarize(samples);
  t.warmup = opt.warmup;
  t.l2_flush = flush;
  t.device_events = true;
  t.held = kHold;
  t.hold_timeouts = hold_.timeouts() - timeouts0;
  t.batches_rerun = reruns;
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

double GpuTimer::time_once(const std::function<void()>& launch, cudaStream_t stream) {
  EventPool events(2);
  if (kHold) hold_.hold(stream, kHoldTimeoutS);
  CUDA_CHECK(cudaEventRecord(events.ev[0], stream));
  launch();
  CUDA_CHECK(cudaEventRecord(events.ev[1], stream));
  if (kHold) hold_.release();
  CUDA_CHECK(cudaEventSynchronize(events.ev[1]));
  float ms = 0;
  CUDA_CHECK(cudaEventElapsedTime(&ms, events.ev[0], events.ev[1]));
  return ms;
}

TimingStats time_cpu(const std::function<void()>& fn, const TimingOptions& opt) {
  for (int i = 0; i < opt.warmup; ++i) fn();
  std::vector<double> samples;
  double total = 0;
  const Stopwatch since_start;
  while ((int)samples.size() < opt.repeat || (total < opt.min_time_ms && (int)samples.size() < opt.max_repeat)) {
    const Stopwatch one;
    fn();
    const double ms = 1e3 * one.seconds();
    samples.push_back(ms);
    total += ms;
  }
  TimingStats t = summarize(samples);
  t.warmup = opt.warmup;
  t.min_samples = opt.repeat;
  t.stop_reason = "min_samples";  // host kernels: a fixed count, no noise rule
  t.wall_s = since_start.seconds();
  return t;
}

}  // namespace flashattn

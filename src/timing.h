// Timing: CUDA events around each repetition after warm-up, L2 flushed between repetitions,
// statistics over the samples (median first).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <functional>
#include <vector>

namespace flashattn {

struct TimingOptions {
  int warmup = 3;
  int repeat = 20;           // at least this many timed repetitions
  double min_time_ms = 0.0;  // ...and keep going until the timed total reaches this
  int max_repeat = 10000;    // hard cap for the min-time rule
  bool flush_l2 = true;
};

struct TimingStats {
  std::vector<double> samples_ms;
  double median_ms = 0, min_ms = 0, max_ms = 0, mean_ms = 0;
  double rel_stddev = 0;  // sample standard deviation / mean
  int warmup = 0;
  bool l2_flush = false;
  bool device_events = false;  // CUDA events (GPU) or host clock (cpu kernel)
};

TimingStats summarize(std::vector<double> samples_ms);

// Evicts the L2 cache by writing a buffer twice its size.
class L2Flusher {
 public:
  explicit L2Flusher(size_t l2_bytes);
  ~L2Flusher();
  L2Flusher(const L2Flusher&) = delete;
  L2Flusher& operator=(const L2Flusher&) = delete;
  void flush(cudaStream_t stream);
  size_t bytes() const { return bytes_; }

 private:
  void* buf_ = nullptr;
  size_t bytes_ = 0;
};

// Times `launch` (which enqueues work on `stream`). `before_each` (may be empty) runs untimed
// before every repetition, e.g. to reset accumulators.
TimingStats time_gpu(const std::function<void()>& launch, cudaStream_t stream, const TimingOptions& opt,
                     L2Flusher* flusher);
// Times a host function with std::chrono::steady_clock.
TimingStats time_cpu(const std::function<void()>& fn, const TimingOptions& opt);

}  // namespace flashattn

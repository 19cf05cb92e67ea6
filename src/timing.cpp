#include "timing.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "flashattn/check.h"

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

TimingStats time_gpu(const std::function<void()>& launch, cudaStream_t stream, const TimingOptions& opt,
                     L2Flusher* flusher) {
  for (int i = 0; i < opt.warmup; ++i) {
    if (flusher && opt.flush_l2) flusher->flush(stream);
    launch();
  }
  CUDA_CHECK(cudaStreamSynchronize(stream));

  cudaEvent_t start = nullptr, stop = nullptr;
  CUDA_CHECK(cudaEventCreate(&start));
  CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<double> samples;
  double total = 0;
  try {
    // One repetition at a time: each sample is read back before the next is enqueued so the
    // min-time rule can stop; the flush between repetitions stays outside the events.
    while ((int)samples.size() < opt.repeat ||
           (total < opt.min_time_ms && (int)samples.size() < opt.max_repeat)) {
      if (flusher && opt.flush_l2) flusher->flush(stream);
      CUDA_CHECK(cudaEventRecord(start, stream));
      launch();
      CUDA_CHECK(cudaEventRecord(stop, stream));
      CUDA_CHECK(cudaEventSynchronize(stop));
      float ms = 0;
      CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      samples.push_back(ms);
      total += ms;
    }
  } catch (...) {
    cudaEventDestroy(start);
    cudaEventDestroy(stop);
    throw;
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  TimingStats t = summarize(samples);
  t.warmup = opt.warmup;
  t.l2_flush = flusher && opt.flush_l2;
  t.device_events = true;
  return t;
}

TimingStats time_cpu(const std::function<void()>& fn, const TimingOptions& opt) {
  for (int i = 0; i < opt.warmup; ++i) fn();
  std::vector<double> samples;
  double total = 0;
  while ((int)samples.size() < opt.repeat || (total < opt.min_time_ms && (int)samples.size() < opt.max_repeat)) {
    auto t0 = std::chrono::steady_clock::now();
    fn();
    auto t1 = std::chrono::steady_clock::now();
    double ms = std::chrono::duration<double, std::milli>(t1 - t0).count();
    samples.push_back(ms);
    total += ms;
  }
  TimingStats t = summarize(samples);
  t.warmup = opt.warmup;
  return t;
}

}  // namespace flashattn

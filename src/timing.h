// Timing: CUDA events around each repetition after warm-up, the repetitions of a batch enqueued
// behind a stream hold so that the events measure GPU time only, L2 flushed (left clean) between
// repetitions (cold) or not (hot), statistics over the samples (median first), and a stopping rule
// like nvbench's: at least `min_samples` repetitions, then more until the relative standard
// deviation of the samples is at most `max_noise` or `max_time_s` of wall time was spent.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace flashattn {

struct TimingOptions {
  int warmup = 3;
  int repeat = 20;           // at least this many timed repetitions (--repeat / --min-samples)
  double min_time_ms = 0.0;  // ...and keep going until the timed total reaches this
  int max_repeat = 10000;    // hard cap on the number of samples
  bool flush_l2 = true;      // cold (flushed) by default; false: hot, back-to-back
  // Noise rule: after `repeat` samples (and `min_time_ms`), continue until rel. stddev <=
  // max_noise, or until max_time_s of wall time has passed in the timed loop. <= 0: no rule, so
  // library users (the GPU tests) get exactly `repeat` samples; the command line's default is
  // 0.5% (TimingChoice::max_noise_pct).
  double max_noise = 0;
  double max_time_s = 1.0;
};

// Reads the GPU's state while the timed loop runs (NVML). Empty members are not sampled.
struct ClockProbe {
  std::function<int()> sm_clock_mhz;                    // -1 when unavailable
  std::function<unsigned long long()> throttle_reasons;  // slowdown reasons bitmask, 0 when none
};

// SM clock seen during the timed loop (one reading per batch of repetitions, taken while the
// GPU is busy with that batch).
struct ClockStats {
  int samples = 0;  // 0: not sampled (no probe or NVML unavailable)
  int start_mhz = -1, min_mhz = -1, max_mhz = -1;
  double mean_mhz = -1;
  unsigned long long reasons = 0;  // OR of the slowdown reasons reported
  bool throttled = false;          // min < 0.9 x start, or a slowdown reason was reported
};

struct TimingStats {
  std::vector<double> samples_ms;
  double median_ms = 0, min_ms = 0, max_ms = 0, mean_ms = 0;
  double rel_stddev = 0;  // sample standard deviation / mean: the "noise" of the stopping rule
  int warmup = 0;
  bool l2_flush = false;
  bool device_events = false;  // CUDA events (GPU) or host clock (cpu kernel)
  bool held = false;           // events of repetitions enqueued behind a stream hold
  unsigned long long hold_timeouts = 0;  // holds that ended by their timeout
  int batches_rerun = 0;       // batches discarded because their hold timed out
  // Stopping rule: what was asked and why the loop stopped.
  int min_samples = 0;
  double max_noise = 0;   // <= 0: rule off
  double max_time_s = 0;
  int noise_rule = -1;    // 1 met, 0 not met, -1 rule off
  std::string stop_reason;  // "noise", "max_time", "max_samples", "min_samples" (rule off)
  double wall_s = 0;      // wall time of the timed loop
  ClockStats clock;
};

TimingStats summarize(std::vector<double> samples_ms);

// Why the timed loop stops now, or "" to go on. `n` samples so far, `total_ms` their sum,
// `noise` their relative stddev, `wall_s` time spent in the loop.
std::string stop_reason(const TimingOptions& opt, int n, double total_ms, double noise, double wall_s);

// Leaves L2 cold and clean: writes one buffer and then reads another, each twice the L2 size. The
// write alone evicts everything but leaves dirty lines that the next kernel pays to write back (and
// kernels with evict-first loads pay less of that than others); after the read pass L2 holds only
// clean lines of the second buffer.
class L2Flusher {
 public:
  explicit L2Flusher(size_t l2_bytes);
  ~L2Flusher();
  L2Flusher(const L2Flusher&) = delete;
  L2Flusher& operator=(const L2Flusher&) = delete;
  void flush(cudaStream_t stream);
  size_t bytes() const { return bytes_; }  // of each buffer
  static constexpr const char* kMethod = "write_then_read";

 private:
  void* write_buf_ = nullptr;
  void* read_buf_ = nullptr;
  unsigned int* sink_ = nullptr;
  size_t bytes_ = 0;
};

// Holds a stream with a spinning kernel (timing_kernels.h) until release(): the repetitions
// enqueued behind a hold start only once all of them are queued, so no host time can fall between
// their events. A hold that waits longer than its timeout lets the stream go and counts itself.
class StreamHold {
 public:
  StreamHold();
  ~StreamHold();
  StreamHold(const StreamHold&) = delete;
  StreamHold& operator=(const StreamHold&) = delete;
  void hold(cudaStream_t stream, double timeout_s);
  void release();
  unsigned long long timeouts() const;

 private:
  unsigned long long* released_ = nullptr;  // host-mapped: [0] released ticket, [1] timeouts (low 32 bits)
  unsigned long long* released_dev_ = nullptr;
  unsigned long long ticket_ = 0;
};

// Times `launch` (which enqueues work on `stream`). Repetitions are enqueued in batches behind a
// stream hold (each with its own pair of events, and the flush before it when cold), released
// once the whole batch is queued, so the GPU runs them back to back and the events hold GPU time
// only; a batch whose hold timed out is discarded and run again smaller. The stopping rule is
// evaluated after every batch. `probe` (may be null) is read once per batch while the batch runs.
class GpuTimer {
 public:
  explicit GpuTimer(size_t l2_bytes);
  TimingStats time(const std::function<void()>& launch, cudaStream_t stream, const TimingOptions& opt,
                   const ClockProbe* probe = nullptr);
  // One held repetition (no flush): milliseconds between its events.
  double time_once(const std::function<void()>& launch, cudaStream_t stream);
  L2Flusher& flusher() { return flusher_; }
  // False only in Debug builds, which synchronise after every launch and so cannot hold a stream.
  static bool holds_stream();

 private:
  L2Flusher flusher_;
  StreamHold hold_;
};

// How GPU repetitions are timed, as the JSON's timing.method says it.
constexpr const char* kHeldStreamMethod = "held_stream";
constexpr double kHoldTimeoutS = 2.0;

// Times a host function with std::chrono::steady_clock.
TimingStats time_cpu(const std::function<void()>& fn, const TimingOptions& opt);

}  // namespace flashattn

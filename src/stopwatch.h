// Host wall time since a start (std::chrono::steady_clock): a check's, a sweep's, a host timing
// loop's.
#pragma once

#include <chrono>

namespace flashattn {

class Stopwatch {
 public:
  double seconds() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }

 private:
  std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
};

}  // namespace flashattn

// Scanning arrays for NaN and infinity. Inputs are scanned before any kernel runs: one NaN in Q
// spreads to every output row that reads it, and --check can then tell nothing about the kernel.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "array.h"

namespace flashattn {

struct NonFiniteCount {
  int64_t nan = 0;
  int64_t inf = 0;     // +inf and -inf
  int64_t first = -1;  // flat index of the first non-finite element, -1 if none
  int64_t total() const { return nan + inf; }
};

// Counts NaN and infinite elements of a float array by their bit patterns (one pass, no
// conversion); integer arrays have none.
NonFiniteCount scan_nonfinite(const HostArray& a);

// "[0, 1, 5, 2]": the C-order multi-index of element `flat` of an array of shape `shape`.
std::string index_str(const std::vector<int64_t>& shape, int64_t flat);

// "3 NaN and 1 Inf values (first at [0, 1, 5, 2])".
std::string describe_nonfinite(const NonFiniteCount& c, const std::vector<int64_t>& shape);

}  // namespace flashattn

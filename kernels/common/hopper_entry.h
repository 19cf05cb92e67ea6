// What the hopper kernels' registry entries share (host side): the rung, the one GPU they run on,
// their dtypes and features, and the head dims they hand to the mma kernel.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "flashattn/registry.h"

namespace flashattn {
namespace sm90 {

// An entry for `mode` with `own` head dims and `fallback` ones run by the mma kernel (--list and
// the run's notes name it); the caller sets the summary, the entry points and what else differs.
inline KernelMode hopper_entry(Mode mode, std::vector<int> own, std::vector<int> fallback) {
  KernelMode m;
  m.kernel = "hopper";
  m.mode = mode;
  m.rung = 8;
  m.gpu = true;
  m.min_sm = 90;
  m.max_sm = 90;  // sm_90a code runs on compute capability 9.0 only
  m.partial_outputs = true;  // a ring over several GPUs may merge its blocks (registry.h)
  m.dtypes = dtype_bit(DType::F16) | dtype_bit(DType::BF16);
  m.head_dims = std::move(own);
  m.fallback_head_dims = std::move(fallback);
  m.head_dims.insert(m.head_dims.end(), m.fallback_head_dims.begin(), m.fallback_head_dims.end());
  std::sort(m.head_dims.begin(), m.head_dims.end());
  m.fallback_kernel = "mma";
  m.features = kAllFeatures & ~kFeatMask;  // the additive mask is declared unsupported
  return m;
}

}  // namespace sm90
}  // namespace flashattn

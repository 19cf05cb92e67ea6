// Named NVTX ranges, so Nsight Systems and Nsight Compute sessions show which kernel, mode and
// shape each launch belongs to (and `ncu --nvtx --nvtx-include "timed/"` selects the timed
// repetitions). NVTX is header-only and costs next to nothing when no profiler is attached.
#pragma once

#include <nvtx3/nvToolsExt.h>

#include <string>

namespace flashattn {

class NvtxRange {
 public:
  explicit NvtxRange(const std::string& name) { nvtxRangePushA(name.c_str()); }
  ~NvtxRange() { nvtxRangePop(); }
  NvtxRange(const NvtxRange&) = delete;
  NvtxRange& operator=(const NvtxRange&) = delete;
};

}  // namespace flashattn

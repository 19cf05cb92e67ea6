// Helpers of the hopper GPU tests that call the kernel entries directly (test_hopper_merge.cpp,
// test_hopper_fp32_grads.cpp): inputs from the tool's generator uploaded, outputs downloaded as
// floats, and the reason a test skips where there is no sm_90 GPU.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "array.h"
#include "device_buffer.h"
#include "device_info.h"
#include "flashattn/check.h"
#include "flashattn/device_fill.h"
#include "gpu_context.h"

namespace flashattn {

// n elements of dtype t from the generator's normal(0, 1) (seed, stream), on the device.
inline DeviceBuffer upload_normal(DType t, int64_t n, uint64_t seed, uint64_t stream) {
  std::vector<uint8_t> host(n * dtype_size(t));
  fill_normal_host(host.data(), t, n, seed, stream);
  DeviceBuffer d(host.size());
  CUDA_CHECK(cudaMemcpy(d.get(), host.data(), host.size(), cudaMemcpyHostToDevice));
  return d;
}

inline DeviceBuffer upload_i32(const std::vector<int32_t>& v) {
  DeviceBuffer d(v.size() * 4);
  CUDA_CHECK(cudaMemcpy(d.get(), v.data(), v.size() * 4, cudaMemcpyHostToDevice));
  return d;
}

// The first n elements (n < 0: all) of a bf16 or fp32 buffer, as floats.
inline std::vector<float> download_bf16(const DeviceBuffer& b, int64_t n = -1) {
  if (n < 0) n = static_cast<int64_t>(b.bytes() / 2);
  std::vector<uint16_t> h(n);
  CUDA_CHECK(cudaMemcpy(h.data(), b.get(), n * 2, cudaMemcpyDeviceToHost));
  std::vector<float> out(n);
  for (int64_t i = 0; i < n; ++i) out[i] = bf16_bits_to_float(h[i]);
  return out;
}
inline std::vector<float> download_f32(const DeviceBuffer& b, int64_t n = -1) {
  if (n < 0) n = static_cast<int64_t>(b.bytes() / 4);
  std::vector<float> out(n);
  CUDA_CHECK(cudaMemcpy(out.data(), b.get(), n * 4, cudaMemcpyDeviceToHost));
  return out;
}

// Why hopper's kernels cannot run here (no CUDA device, or device 0 is not sm_90), or "".
inline std::string why_no_hopper_gpu() {
  std::string why;
  if (cuda_device_count(&why) == 0) return why;
  const int sm = query_device(0).sm();
  if (sm != 90) return "hopper runs on sm_90 only; this GPU is sm_" + std::to_string(sm);
  return "";
}

}  // namespace flashattn

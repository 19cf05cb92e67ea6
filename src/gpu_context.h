// What every workload's GPU runs share: the launch context a kernel gets (stream, device facts),
// and the cuBLAS handle of the kernels that declare uses_cublas (bound to the stream, with its own
// workspace), created on first use.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

#include "device_buffer.h"
#include "device_info.h"
#include "flashattn/registry.h"

namespace flashattn {

// cuBLAS's workspace, as sized for the cublas kernels (counted in their memory requirement).
constexpr size_t kCublasWorkspaceBytes = size_t(32) << 20;

// A GPU launch context for `device` and `stream`.
LaunchContext gpu_launch_context(const DeviceInfo& dev, int device, cudaStream_t stream, int cpu_threads = 0);

// Free memory on the current device, bytes.
size_t device_free_bytes();
// InputError naming the kernel when `needed` bytes (plus 64 MiB of headroom for the runtime and
// libraries) are not free on the current device, `device`.
void require_device_memory(const std::string& kernel, size_t needed, int device);

class CublasHandle {
 public:
  explicit CublasHandle(cudaStream_t stream) : stream_(stream) {}
  ~CublasHandle();
  CublasHandle(const CublasHandle&) = delete;
  CublasHandle& operator=(const CublasHandle&) = delete;
  // The handle (cublasHandle_t) bound to the stream, created with its workspace on first call;
  // RuntimeError when cuBLAS cannot be set up.
  void* get();

 private:
  cudaStream_t stream_;
  void* handle_ = nullptr;
  DeviceBuffer workspace_;
};

}  // namespace flashattn

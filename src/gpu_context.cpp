#include "gpu_context.h"

#include <cublas_v2.h>

#include "flashattn/check.h"
#include "flashattn/error.h"
#include "report.h"

namespace flashattn {

LaunchContext gpu_launch_context(const DeviceInfo& dev, int device, cudaStream_t stream, int cpu_threads) {
  LaunchContext ctx;
  ctx.stream = stream;
  ctx.device = device;
  ctx.sm = dev.sm();
  ctx.sm_count = dev.sm_count;
  ctx.smem_optin = dev.smem_per_block_optin;
  ctx.l2_bytes = dev.l2_bytes;
  ctx.cpu_threads = cpu_threads;
  return ctx;
}

size_t device_free_bytes() {
  size_t free = 0, total = 0;
  CUDA_CHECK(cudaMemGetInfo(&free, &total));
  return free;
}

void require_device_memory(const std::string& kernel, size_t needed, int device) {
  const size_t free = device_free_bytes();
  const size_t headroom = size_t(64) << 20;
  if (needed + headroom > free)
    throw InputError("kernel '" + kernel + "' needs " + human_bytes(double(needed)) + " of GPU memory, " +
                     human_bytes(double(free)) + " free on device " + std::to_string(device));
}

CublasHandle::~CublasHandle() {
  if (handle_) cublasDestroy(static_cast<cublasHandle_t>(handle_));
}

void* CublasHandle::get() {
  if (handle_) return handle_;
  cublasHandle_t h = nullptr;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) throw RuntimeError("cublasCreate failed");
  handle_ = h;
  workspace_ = DeviceBuffer(kCublasWorkspaceBytes);
  if (cublasSetStream(h, stream_) != CUBLAS_STATUS_SUCCESS ||
      cublasSetWorkspace(h, workspace_.get(), workspace_.bytes()) != CUBLAS_STATUS_SUCCESS)
    throw RuntimeError("cuBLAS handle setup failed");
  return handle_;
}

}  // namespace flashattn

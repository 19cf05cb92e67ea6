// CUDA_CHECK / CHECK_LAUNCH: every CUDA call and every kernel launch is checked, and a failure
// throws flashattn::RuntimeError carrying the file, the line and the failing expression.
// In Debug builds (FLASHATTN_SYNC_LAUNCHES defined) each launch is followed by a synchronize so an
// asynchronous fault is reported at the launch that caused it.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "flashattn/error.h"

namespace flashattn {

// Archs this translation unit was compiled for, as nvcc lists them in __CUDA_ARCH_LIST__, e.g.
// "800,900" (sm_80 and sm_90/90a).
#if defined(__CUDA_ARCH_LIST__)
#define FLASHATTN_STR2(...) #__VA_ARGS__
#define FLASHATTN_STR(...) FLASHATTN_STR2(__VA_ARGS__)
#define FLASHATTN_COMPILED_ARCHS FLASHATTN_STR(__CUDA_ARCH_LIST__)
#else
#define FLASHATTN_COMPILED_ARCHS ""
#endif

[[noreturn]] inline void throw_cuda_error(cudaError_t err, const char* what, const char* file, int line) {
  std::string msg = std::string(file) + ":" + std::to_string(line) + ": " + what + " failed: " +
                    cudaGetErrorName(err) + " (" + cudaGetErrorString(err) + ")";
  if (err == cudaErrorNoKernelImageForDevice || err == cudaErrorInvalidDeviceFunction) {
    int dev = 0, major = 0, minor = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
    msg += "; this binary has no code for sm_" + std::to_string(major * 10 + minor) +
           " (rebuild with -DFLASHATTN_CUDA_ARCHS=" + std::to_string(major * 10 + minor) + ")";
  }
  throw RuntimeError(msg);
}

inline void cuda_check(cudaError_t err, const char* what, const char* file, int line) {
  if (err != cudaSuccess) throw_cuda_error(err, what, file, line);
}

inline void cuda_launch_check(const char* what, const char* file, int line) {
  cudaError_t err = cudaPeekAtLastError();
  if (err == cudaSuccess) {
#ifdef FLASHATTN_SYNC_LAUNCHES
    err = cudaDeviceSynchronize();
#endif
    if (err == cudaSuccess) return;
  }
  cudaGetLastError();  // clear the sticky-free error state before reporting
  throw_cuda_error(err, what, file, line);
}

}  // namespace flashattn

#define CUDA_CHECK(expr) ::flashattn::cuda_check((expr), #expr, __FILE__, __LINE__)
// Call right after a <<<...>>> launch; `name` is the kernel's name for the message.
#define CHECK_LAUNCH(name) ::flashattn::cuda_launch_check("launch of " name, __FILE__, __LINE__)

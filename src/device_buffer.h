// An owning device allocation and the host <-> device copies of HostArrays, for the decode run
// loop, its simulation and the ring (whose transfer buffers come from NCCL's allocator).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <functional>
#include <utility>
#include <vector>

#include "array.h"
#include "flashattn/check.h"

namespace flashattn {

class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  explicit DeviceBuffer(size_t bytes) : bytes_(bytes) {
    if (bytes) CUDA_CHECK(cudaMalloc(&ptr_, bytes));
  }
  // Memory from another allocator (the ring's NCCL-registered buffers), given back by `release`.
  DeviceBuffer(void* ptr, size_t bytes, std::function<void(void*)> release)
      : ptr_(ptr), bytes_(bytes), release_(std::move(release)) {}
  ~DeviceBuffer() {
    if (!ptr_) return;
    if (release_)
      release_(ptr_);
    else
      cudaFree(ptr_);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept
      : ptr_(o.ptr_), bytes_(o.bytes_), release_(std::move(o.release_)) {
    o.ptr_ = nullptr, o.bytes_ = 0, o.release_ = nullptr;
  }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    std::swap(release_, o.release_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
  std::function<void(void*)> release_;  // empty: cudaFree
};

inline DeviceBuffer upload_array(const HostArray& a) {
  DeviceBuffer d(a.nbytes());
  if (a.nbytes()) CUDA_CHECK(cudaMemcpy(d.get(), a.bytes.data(), a.nbytes(), cudaMemcpyHostToDevice));
  return d;
}

inline HostArray download_array(const DeviceBuffer& d, DType t, std::vector<int64_t> shape) {
  HostArray a(t, std::move(shape));
  if (a.nbytes()) CUDA_CHECK(cudaMemcpy(a.bytes.data(), d.get(), a.nbytes(), cudaMemcpyDeviceToHost));
  return a;
}

}  // namespace flashattn

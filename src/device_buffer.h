// An owning device allocation and the host <-> device copies of HostArrays, for the decode run
// loop and its simulation.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
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
  ~DeviceBuffer() {
    if (ptr_) cudaFree(ptr_);
  }
  DeviceBuffer(DeviceBuffer&& o) noexcept : ptr_(o.ptr_), bytes_(o.bytes_) { o.ptr_ = nullptr, o.bytes_ = 0; }
  DeviceBuffer& operator=(DeviceBuffer&& o) noexcept {
    std::swap(ptr_, o.ptr_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return ptr_; }
  size_t bytes() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
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

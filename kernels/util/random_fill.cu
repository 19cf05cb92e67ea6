// Counter-based N(0,1) generator for inputs made on the device (benchmark sweeps): element pair
// p of tensor `stream` takes two 64-bit words from SplitMix64 evaluated at counters 2p and 2p+1
// of a key derived from (seed, stream), and turns them into two normals by Box-Muller. No state
// is carried between elements, so any thread computes any element, and the host computes the
// same values for machines without a GPU.
#include <cmath>
#include <cstdint>

#include "common/dtype.cuh"
#include "flashattn/device_fill.h"
#include "flashattn/check.h"
#include "flashattn/error.h"

namespace flashattn {
namespace {

FLASHATTN_HD inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The n-th output of a SplitMix64 stream started at `key`: finalizer of key + (n + 1) * golden.
FLASHATTN_HD inline uint64_t splitmix_at(uint64_t key, uint64_t n) {
  return mix64(key + (n + 1) * 0x9e3779b97f4a7c15ull);
}

FLASHATTN_HD inline uint64_t stream_key(uint64_t seed, uint64_t stream) {
  return mix64(seed ^ mix64(stream + 0x6a09e667f3bcc909ull));
}

// Elements 2p and 2p+1. Double precision so host and device agree after rounding to the dtype.
FLASHATTN_HD inline void normal_pair(uint64_t key, uint64_t p, double* z0, double* z1) {
  const uint64_t a = splitmix_at(key, 2 * p), b = splitmix_at(key, 2 * p + 1);
  const double u1 = (double((a >> 11) + 1)) * 0x1.0p-53;  // (0, 1]: log is finite
  const double u2 = double(b >> 11) * 0x1.0p-53;          // [0, 1)
  const double r = sqrt(-2.0 * log(u1));
  const double t = 6.283185307179586476925 * u2;
  *z0 = r * cos(t);
  *z1 = r * sin(t);
}

template <class T>
FLASHATTN_HD inline void store_pair(T* dst, int64_t n, uint64_t key, int64_t p) {
  double z0, z1;
  normal_pair(key, static_cast<uint64_t>(p), &z0, &z1);
  dst[2 * p] = from_float<T>(static_cast<float>(z0));
  if (2 * p + 1 < n) dst[2 * p + 1] = from_float<T>(static_cast<float>(z1));
}

template <class T>
__global__ void fill_normal_kernel(T* dst, int64_t n, uint64_t key) {
  const int64_t pairs = (n + 1) / 2;
  for (int64_t p = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; p < pairs; p += int64_t(gridDim.x) * blockDim.x)
    store_pair(dst, n, key, p);
}

template <class T>
void launch_fill(void* dst, int64_t n, uint64_t key, cudaStream_t s) {
  constexpr int kThreads = 256;
  const int64_t pairs = (n + 1) / 2;
  // A grid-stride loop over enough blocks to fill any GPU; the fill is memory-bound.
  const int blocks = static_cast<int>(std::min<int64_t>((pairs + kThreads - 1) / kThreads, 65536));
  fill_normal_kernel<T><<<blocks, kThreads, 0, s>>>(static_cast<T*>(dst), n, key);
  CHECK_LAUNCH("fill_normal_kernel");
}

template <class T>
void host_fill(void* dst, int64_t n, uint64_t key) {
  for (int64_t p = 0; p < (n + 1) / 2; ++p) store_pair(static_cast<T*>(dst), n, key, p);
}

}  // namespace

void fill_normal_device(void* dst, DType dtype, int64_t n, uint64_t seed, uint64_t stream, cudaStream_t s) {
  if (n <= 0) return;
  const uint64_t key = stream_key(seed, stream);
  switch (dtype) {
    case DType::F32: return launch_fill<float>(dst, n, key, s);
    case DType::F16: return launch_fill<__half>(dst, n, key, s);
    case DType::BF16: return launch_fill<__nv_bfloat16>(dst, n, key, s);
    default: throw InputError(std::string("fill_normal_device: unsupported dtype ") + dtype_name(dtype));
  }
}

void fill_normal_host(void* dst, DType dtype, int64_t n, uint64_t seed, uint64_t stream) {
  if (n <= 0) return;
  const uint64_t key = stream_key(seed, stream);
  switch (dtype) {
    case DType::F32: return host_fill<float>(dst, n, key);
    case DType::F16: return host_fill<__half>(dst, n, key);
    case DType::BF16: return host_fill<__nv_bfloat16>(dst, n, key);
    default: throw InputError(std::string("fill_normal_host: unsupported dtype ") + dtype_name(dtype));
  }
}

}  // namespace flashattn

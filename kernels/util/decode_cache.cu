// The update-cache kernel of a decode step (flashattn/decode_cache.h): k_new/v_new rows go to cache
// positions cache_seqlens[b] + i, contiguous or through the block table. One thread per 16-byte
// chunk of a row (whole rows are 16-byte multiples for every supported head dim), one per element
// when a stride or pointer is not 16-byte aligned. The rows it writes are a few kilobytes per step:
// the launch, not the bandwidth, is its cost.
#include <cuda_runtime.h>

#include <cstdint>

#include "common/decode.cuh"
#include "flashattn/decode_cache.h"
#include "flashattn/check.h"
#include "flashattn/error.h"

namespace flashattn {
namespace {

struct AppendArgs {
  const char* k_new = nullptr;
  const char* v_new = nullptr;
  char* k_cache = nullptr;
  char* v_cache = nullptr;
  Strides kn_st, vn_st;  // in elements
  decode::CacheAddr k_addr, v_addr;
  const int32_t* cache_seqlens = nullptr;
  int H_kv = 0, S_new = 0, S_max = 0;
  int chunks = 0;   // vectors per row
  int vec_elems = 0;  // elements per vector
  int elem_bytes = 0;
};

// Item e over [2 (K, V), B, H_kv, S_new, chunks], chunks fastest so a warp writes whole rows.
template <class Vec>
__global__ void append_kernel(const AppendArgs a, int64_t n) {
  for (int64_t e = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; e < n;
       e += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    int64_t rest = e;
    const int c = static_cast<int>(rest % a.chunks);
    rest /= a.chunks;
    const int i = static_cast<int>(rest % a.S_new);
    rest /= a.S_new;
    const int g = static_cast<int>(rest % a.H_kv);
    rest /= a.H_kv;
    const int half = static_cast<int>(rest & 1);  // 0: K, 1: V
    const int b = static_cast<int>(rest >> 1);
    const int j = a.cache_seqlens[b] + i;
    if (j < 0 || j >= a.S_max) continue;  // refused by the driver; never write past the cache
    const Strides& src_st = half ? a.vn_st : a.kn_st;
    const char* src = (half ? a.v_new : a.k_new) +
                      (b * src_st.batch + g * src_st.head + i * src_st.row + static_cast<int64_t>(c) * a.vec_elems) *
                          a.elem_bytes;
    const decode::CacheAddr& addr = half ? a.v_addr : a.k_addr;
    char* dst = (half ? a.v_cache : a.k_cache) +
                (addr.offset(b, g, j) + static_cast<int64_t>(c) * a.vec_elems) * a.elem_bytes;
    *reinterpret_cast<Vec*>(dst) = *reinterpret_cast<const Vec*>(src);
  }
}

bool aligned(const void* p, int bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }
bool strides_aligned(const Strides& s, int64_t elems) {
  return s.batch % elems == 0 && s.head % elems == 0 && s.row % elems == 0;
}

}  // namespace

void decode_append_kv(const DecodeParams& p, cudaStream_t stream) {
  if (static_cast<int64_t>(p.B) * p.H_kv * p.S_new * p.D == 0) return;
  if (p.block_table && (p.page_size < 1 || (p.page_size & (p.page_size - 1)) != 0))
    throw RuntimeError("decode update-cache: page size must be a power of two");
  AppendArgs a;
  a.k_new = static_cast<const char*>(p.k_new);
  a.v_new = static_cast<const char*>(p.v_new);
  a.k_cache = static_cast<char*>(p.k_cache);
  a.v_cache = static_cast<char*>(p.v_cache);
  a.kn_st = p.k_new_st, a.vn_st = p.v_new_st;
  a.k_addr = decode::cache_addr(p, p.k_cache_st);
  a.v_addr = decode::cache_addr(p, p.v_cache_st);
  a.cache_seqlens = p.cache_seqlens;
  a.H_kv = p.H_kv, a.S_new = p.S_new, a.S_max = p.S_max;
  a.elem_bytes = static_cast<int>(dtype_size(p.dtype));
  const int per16 = 16 / a.elem_bytes;
  const bool vec = p.D % per16 == 0 && aligned(p.k_new, 16) && aligned(p.v_new, 16) && aligned(p.k_cache, 16) &&
                   aligned(p.v_cache, 16) && strides_aligned(p.k_new_st, per16) && strides_aligned(p.v_new_st, per16) &&
                   strides_aligned(p.k_cache_st, per16) && strides_aligned(p.v_cache_st, per16);
  a.vec_elems = vec ? per16 : 1;
  a.chunks = p.D / a.vec_elems;
  const int64_t n = 2LL * p.B * p.H_kv * p.S_new * a.chunks;
  constexpr int kThreads = 256;
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  const unsigned grid = static_cast<unsigned>(blocks < (1 << 20) ? blocks : (1 << 20));
  if (vec) {
    append_kernel<uint4><<<grid, kThreads, 0, stream>>>(a, n);
  } else if (a.elem_bytes == 2) {
    append_kernel<uint16_t><<<grid, kThreads, 0, stream>>>(a, n);
  } else if (a.elem_bytes == 4) {
    append_kernel<uint32_t><<<grid, kThreads, 0, stream>>>(a, n);
  } else {
    throw RuntimeError(std::string("decode update-cache: unsupported dtype ") + dtype_name(p.dtype));
  }
  CHECK_LAUNCH("decode append_kernel");
}

}  // namespace flashattn

// The element-wise steps of ring attention (include/flashattn/ring_ops.h). Memory-bound: each
// thread moves kVec = 4 consecutive elements of one row (16-byte fp32 and 8-byte 16-bit accesses;
// one element where D is not a multiple of 4 or a pointer is not aligned for it), the row's
// (batch, head) from the grid's y, its row from one 32-bit division, and a merge's weights (two
// exponentials) once per thread rather than per element.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "common/dtype.cuh"
#include "common/lse_merge.cuh"
#include "common/switch.h"
#include "flashattn/check.h"
#include "flashattn/error.h"
#include "flashattn/ring_ops.h"

namespace flashattn {
namespace {

constexpr int kThreads = 256;
constexpr int kVec = 4;
constexpr int kMaxGridY = 65535;

unsigned blocks_for(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

// V consecutive elements, loaded and stored as one access.
template <class T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

template <int V, class T>
__device__ __forceinline__ Pack<T, V> load(const T* p) {
  return *reinterpret_cast<const Pack<T, V>*>(p);
}
template <int V, class T>
__device__ __forceinline__ void store(T* p, const Pack<T, V>& x) {
  *reinterpret_cast<Pack<T, V>*>(p) = x;
}

// The row kernels' threads: x covers the `rows` x D / V vectors of one (batch, head), y the B x H
// pairs (looping past the grid's limit). Thread (idx, bh) holds row i = idx / (D / V) of pair bh,
// elements d .. d + V - 1.
struct RowThread {
  int i = 0, d = 0;
  bool valid = false;
};
template <int V>
__device__ __forceinline__ RowThread row_thread(int rows, int D) {
  const int per_row = D / V, idx = blockIdx.x * kThreads + threadIdx.x;
  RowThread t;
  t.valid = idx < rows * per_row;
  t.i = idx / per_row;
  t.d = (idx - t.i * per_row) * V;
  return t;
}
dim3 row_grid(int rows, int D, int V, int64_t pairs) {
  return dim3(blocks_for(int64_t(rows) * (D / V)), static_cast<unsigned>(std::min<int64_t>(pairs, kMaxGridY)));
}

// V elements of a row of the running result take in the block's (at `part`, by the rows' lse).
template <int V, class T>
__device__ __forceinline__ void merge_into(Pack<float, V>& a, const T* part, float lse_acc, float lse_part) {
  float lse, wa, wp;
  lse_merge_weights(lse_acc, lse_part, &lse, &wa, &wp);
  if (wp == 0.f) {  // an empty block's O is not read
#pragma unroll
    for (int k = 0; k < V; ++k) a.v[k] *= wa;
    return;
  }
  const Pack<T, V> p = load<V>(part);
#pragma unroll
  for (int k = 0; k < V; ++k) a.v[k] = wa * a.v[k] + wp * to_float(p.v[k]);
}

// V elements as floats, and back to the accumulator's type A (fp32, or the dtype in place).
template <int V, class A>
__device__ __forceinline__ Pack<float, V> load_floats(const A* p) {
  const Pack<A, V> x = load<V>(p);
  Pack<float, V> y;
#pragma unroll
  for (int k = 0; k < V; ++k) y.v[k] = to_float(x.v[k]);
  return y;
}
template <int V, class A>
__device__ __forceinline__ void store_floats(A* p, const Pack<float, V>& x) {
  Pack<A, V> y;
#pragma unroll
  for (int k = 0; k < V; ++k) y.v[k] = from_float<A>(x.v[k]);
  store<V>(p, y);
}

template <class T, class A, int V>
__global__ void merge_kernel(const T* o_part, const float* lse_part, A* o_acc, const float* lse_acc, int rows,
                             int row0, int S_loc, int D, int64_t pairs) {
  const RowThread t = row_thread<V>(rows, D);
  if (!t.valid) return;
  for (int64_t bh = blockIdx.y; bh < pairs; bh += gridDim.y) {
    const int64_t prow = bh * rows + t.i, arow = bh * S_loc + row0 + t.i;
    Pack<float, V> a = load_floats<V>(o_acc + arow * D + t.d);
    merge_into(a, o_part + prow * D + t.d, lse_acc[arow], lse_part[prow]);
    store_floats<V>(o_acc + arow * D + t.d, a);
  }
}

// After merge_kernel (every element of a row reads the row's old lse_acc there).
__global__ void merge_lse_kernel(const float* lse_part, float* lse_acc, int rows, int row0, int S_loc, int64_t n) {
  const int64_t r = blockIdx.x * int64_t(kThreads) + threadIdx.x;
  if (r >= n) return;
  const int64_t acc_row = (r / rows) * S_loc + row0 + r % rows;
  float lse, wa, wp;
  lse_merge_weights(lse_acc[acc_row], lse_part[r], &lse, &wa, &wp);
  lse_acc[acc_row] = lse;
}

// Every element of the shard: merged with the block (its rows) or passed through, rounded to T.
template <class T, int V>
__global__ void merge_last_kernel(const T* o_part, const float* lse_part, const float* o_acc, const float* lse_acc,
                                  T* o, int rows, int row0, int S_loc, int D, int64_t pairs) {
  const RowThread t = row_thread<V>(S_loc, D);
  if (!t.valid) return;
  const int bi = t.i - row0;  // the block's row, when in [0, rows)
  for (int64_t bh = blockIdx.y; bh < pairs; bh += gridDim.y) {
    const int64_t arow = bh * S_loc + t.i;
    Pack<float, V> a = load<V>(o_acc + arow * D + t.d);
    if (bi >= 0 && bi < rows) {
      const int64_t prow = bh * rows + bi;
      merge_into(a, o_part + prow * D + t.d, lse_acc[arow], lse_part[prow]);
    }
    Pack<T, V> out;
#pragma unroll
    for (int k = 0; k < V; ++k) out.v[k] = from_float<T>(a.v[k]);
    store<V>(o + arow * D + t.d, out);
  }
}

template <class T, int V>
__global__ void accumulate_kernel(const T* part, float* acc, int rows, int row0, int S_loc, int D, int64_t pairs) {
  const RowThread t = row_thread<V>(rows, D);
  if (!t.valid) return;
  for (int64_t bh = blockIdx.y; bh < pairs; bh += gridDim.y) {
    const Pack<T, V> p = load<V>(part + (bh * rows + t.i) * D + t.d);
    float* dst = acc + (bh * S_loc + row0 + t.i) * D + t.d;
    Pack<float, V> a = load<V>(dst);
#pragma unroll
    for (int k = 0; k < V; ++k) a.v[k] += to_float(p.v[k]);
    store<V>(dst, a);
  }
}

// Flat element-wise kernels over n elements, V at a time (n a multiple of V).
template <class From, class To, int V>
__global__ void convert_kernel(const From* src, To* dst, int64_t n) {
  const int64_t e = (blockIdx.x * int64_t(kThreads) + threadIdx.x) * V;
  if (e >= n) return;
  const Pack<From, V> x = load<V>(src + e);
  Pack<To, V> y;
#pragma unroll
  for (int k = 0; k < V; ++k) y.v[k] = from_float<To>(to_float(x.v[k]));
  store<V>(dst + e, y);
}

template <class T, int V>
__global__ void add_round_kernel(const float* a, const float* b, T* dst, int64_t n) {
  const int64_t e = (blockIdx.x * int64_t(kThreads) + threadIdx.x) * V;
  if (e >= n) return;
  const Pack<float, V> x = load<V>(a + e), y = load<V>(b + e);
  Pack<T, V> z;
#pragma unroll
  for (int k = 0; k < V; ++k) z.v[k] = from_float<T>(x.v[k] + y.v[k]);
  store<V>(dst + e, z);
}

template <int V>
__global__ void fill_kernel(float* dst, float value, int64_t n) {
  const int64_t e = (blockIdx.x * int64_t(kThreads) + threadIdx.x) * V;
  if (e >= n) return;
  Pack<float, V> y;
#pragma unroll
  for (int k = 0; k < V; ++k) y.v[k] = value;
  store<V>(dst + e, y);
}

// kVec at a time where every pointer is aligned for it and `width` (D, or a flat count) divides
// by it; else one element at a time.
bool aligned(const void* p, size_t bytes) { return reinterpret_cast<uintptr_t>(p) % bytes == 0; }
template <class F>
void with_vec(bool vec, F f) {
  if (vec)
    f(std::integral_constant<int, kVec>{});
  else
    f(std::integral_constant<int, 1>{});
}

__global__ void lse_rows_kernel(const float* lse, float* dst, int rows, int row0, int S_loc, int64_t n) {
  const int64_t r = blockIdx.x * int64_t(kThreads) + threadIdx.x;
  if (r < n) dst[r] = lse[(r / rows) * S_loc + row0 + r % rows];
}

}  // namespace

namespace {

// Rows [row0, row0 + rows) of (o_acc, lse_acc) take in the block; o_acc's elements are A.
template <class A>
void merge_rows(DType t, const void* o_part, const float* lse_part, void* o_acc, float* lse_acc, int B, int H,
                int rows, int row0, int S_loc, int D, cudaStream_t stream) {
  const int64_t pairs = int64_t(B) * H, n_rows = pairs * rows;
  if (n_rows * D == 0) return;
  DTYPE_SWITCH(t, T, [&] {
    using Acc = std::conditional_t<std::is_same_v<A, void>, T, A>;  // void: the dtype itself
    const bool vec = D % kVec == 0 && aligned(o_part, kVec * sizeof(T)) && aligned(o_acc, kVec * sizeof(Acc));
    with_vec(vec, [&](auto v) {
      merge_kernel<T, Acc, v.value><<<row_grid(rows, D, v.value, pairs), kThreads, 0, stream>>>(
          static_cast<const T*>(o_part), lse_part, static_cast<Acc*>(o_acc), lse_acc, rows, row0, S_loc, D, pairs);
      CHECK_LAUNCH("ring merge_kernel");
    });
  });
  merge_lse_kernel<<<blocks_for(n_rows), kThreads, 0, stream>>>(lse_part, lse_acc, rows, row0, S_loc, n_rows);
  CHECK_LAUNCH("ring merge_lse_kernel");
}

}  // namespace

void ring_merge_block(DType t, const void* o_part, const float* lse_part, float* o_acc, float* lse_acc, int B, int H,
                      int rows, int row0, int S_loc, int D, cudaStream_t stream) {
  merge_rows<float>(t, o_part, lse_part, o_acc, lse_acc, B, H, rows, row0, S_loc, D, stream);
}

void ring_merge_in_place(DType t, const void* o_part, const float* lse_part, void* o, float* lse, int B, int H,
                         int rows, int row0, int S_loc, int D, cudaStream_t stream) {
  merge_rows<void>(t, o_part, lse_part, o, lse, B, H, rows, row0, S_loc, D, stream);
}

void ring_merge_first(DType t, const void* o_part, const float* lse_part, float* o_acc, float* lse_acc,
                      int64_t n_rows, int D, cudaStream_t stream) {
  const int64_t n = n_rows * D;
  if (n == 0) return;
  DTYPE_SWITCH(t, T, [&] {
    const bool vec = n % kVec == 0 && aligned(o_part, kVec * sizeof(T)) && aligned(o_acc, kVec * sizeof(float));
    with_vec(vec, [&](auto v) {
      convert_kernel<T, float, v.value><<<blocks_for(n / v.value), kThreads, 0, stream>>>(
          static_cast<const T*>(o_part), o_acc, n);
      CHECK_LAUNCH("ring convert_kernel (first block)");
    });
  });
  if (lse_acc != lse_part)
    CUDA_CHECK(cudaMemcpyAsync(lse_acc, lse_part, size_t(n_rows) * sizeof(float), cudaMemcpyDeviceToDevice, stream));
}

void ring_merge_last(DType t, const void* o_part, const float* lse_part, const float* o_acc, float* lse_acc,
                     void* o, int B, int H, int rows, int row0, int S_loc, int D, cudaStream_t stream) {
  const int64_t pairs = int64_t(B) * H, n_rows = pairs * rows;
  if (pairs * S_loc * D == 0) return;
  DTYPE_SWITCH(t, T, [&] {
    const bool vec = D % kVec == 0 && aligned(o_part, kVec * sizeof(T)) && aligned(o_acc, kVec * sizeof(float)) &&
                     aligned(o, kVec * sizeof(T));
    with_vec(vec, [&](auto v) {
      merge_last_kernel<T, v.value><<<row_grid(S_loc, D, v.value, pairs), kThreads, 0, stream>>>(
          static_cast<const T*>(o_part), lse_part, o_acc, lse_acc, static_cast<T*>(o), rows, row0, S_loc, D, pairs);
      CHECK_LAUNCH("ring merge_last_kernel");
    });
  });
  if (n_rows == 0) return;
  merge_lse_kernel<<<blocks_for(n_rows), kThreads, 0, stream>>>(lse_part, lse_acc, rows, row0, S_loc, n_rows);
  CHECK_LAUNCH("ring merge_lse_kernel");
}

void ring_accumulate(DType t, const void* part, float* acc, int B, int H, int rows, int row0, int S_loc, int D,
                     cudaStream_t stream) {
  const int64_t pairs = int64_t(B) * H;
  if (pairs * rows * D == 0) return;
  DTYPE_SWITCH(t, T, [&] {
    const bool vec = D % kVec == 0 && aligned(part, kVec * sizeof(T)) && aligned(acc, kVec * sizeof(float));
    with_vec(vec, [&](auto v) {
      accumulate_kernel<T, v.value><<<row_grid(rows, D, v.value, pairs), kThreads, 0, stream>>>(
          static_cast<const T*>(part), acc, rows, row0, S_loc, D, pairs);
      CHECK_LAUNCH("ring accumulate_kernel");
    });
  });
}

void ring_round(DType t, const float* src, void* dst, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  DTYPE_SWITCH(t, T, [&] {
    const bool vec = n % kVec == 0 && aligned(src, kVec * sizeof(float)) && aligned(dst, kVec * sizeof(T));
    with_vec(vec, [&](auto v) {
      convert_kernel<float, T, v.value><<<blocks_for(n / v.value), kThreads, 0, stream>>>(src, static_cast<T*>(dst), n);
      CHECK_LAUNCH("ring convert_kernel (rounding)");
    });
  });
}

void ring_add_round(DType t, const float* a, const float* b, void* dst, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  DTYPE_SWITCH(t, T, [&] {
    const bool vec = n % kVec == 0 && aligned(a, kVec * sizeof(float)) && aligned(b, kVec * sizeof(float)) &&
                     aligned(dst, kVec * sizeof(T));
    with_vec(vec, [&](auto v) {
      add_round_kernel<T, v.value><<<blocks_for(n / v.value), kThreads, 0, stream>>>(a, b, static_cast<T*>(dst), n);
      CHECK_LAUNCH("ring add_round_kernel");
    });
  });
}

void ring_lse_rows(const float* lse, float* dst, int B, int H, int rows, int row0, int S_loc, cudaStream_t stream) {
  const int64_t n = int64_t(B) * H * rows;
  if (n == 0) return;
  lse_rows_kernel<<<blocks_for(n), kThreads, 0, stream>>>(lse, dst, rows, row0, S_loc, n);
  CHECK_LAUNCH("ring lse_rows_kernel");
}

void ring_fill(float* dst, float value, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  with_vec(n % kVec == 0 && aligned(dst, kVec * sizeof(float)), [&](auto v) {
    fill_kernel<v.value><<<blocks_for(n / v.value), kThreads, 0, stream>>>(dst, value, n);
    CHECK_LAUNCH("ring fill_kernel");
  });
}

}  // namespace flashattn

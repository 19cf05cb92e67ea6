// The element-wise steps of ring attention (include/flashattn/ring_ops.h). Memory-bound and small
// beside a ring step's attention block: one thread per element, the row's weights recomputed by
// each of its D threads (two exponentials) rather than staged.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "common/dtype.cuh"
#include "common/switch.h"
#include "flashattn/check.h"
#include "flashattn/error.h"
#include "flashattn/ring_ops.h"

namespace flashattn {
namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n) { return static_cast<unsigned>((n + kThreads - 1) / kThreads); }

// Element e of a [B, H, rows, D] block -> its place in the [B, H, S_loc, D] shard.
__device__ __forceinline__ int64_t shard_index(int64_t e, int rows, int row0, int S_loc, int D) {
  const int64_t d = e % D, row = (e / D) % rows, bh = e / (int64_t(D) * rows);
  return (bh * S_loc + row0 + row) * D + d;
}

// The merge weights of a row: w_acc = exp(lse_acc - lse), w_part = exp(lse_part - lse).
__device__ __forceinline__ void merge_weights(float lse_acc, float lse_part, float* lse, float* w_acc, float* w_part) {
  const float m = fmaxf(lse_acc, lse_part);
  if (m == -INFINITY) {  // neither saw a key
    *lse = -INFINITY, *w_acc = 1.f, *w_part = 0.f;
    return;
  }
  const float a = __expf(lse_acc - m), p = __expf(lse_part - m);
  *lse = m + __logf(a + p);
  *w_acc = a / (a + p), *w_part = p / (a + p);
}

template <class T>
__global__ void merge_kernel(const T* o_part, const float* lse_part, float* o_acc, float* lse_acc, int rows, int row0,
                             int S_loc, int D, int64_t n) {
  const int64_t e = blockIdx.x * int64_t(kThreads) + threadIdx.x;
  if (e >= n) return;
  const int64_t r = e / D;  // row of the block, over (b, h)
  const int64_t acc_row = (r / rows) * S_loc + row0 + r % rows;
  float lse, wa, wp;
  merge_weights(lse_acc[acc_row], lse_part[r], &lse, &wa, &wp);
  const int64_t a = shard_index(e, rows, row0, S_loc, D);
  o_acc[a] = wa * o_acc[a] + (wp == 0.f ? 0.f : wp * to_float(o_part[e]));  // an empty block's O is not read
}

// After merge_kernel (every element of a row reads the row's old lse_acc there).

__global__ void merge_lse_kernel(const float* lse_part, float* lse_acc, int rows, int row0, int S_loc, int64_t n) {
  const int64_t r = blockIdx.x * int64_t(kThreads) + threadIdx.x;
  if (r >= n) return;
  const int64_t acc_row = (r / rows) * S_loc + row0 + r % rows;
  float lse, wa, wp;
  merge_weights(lse_acc[acc_row], lse_part[r], &lse, &wa, &wp);
  lse_acc[acc_row] = lse;
}

template <class T>
__global__ void merge_first_kernel(const T* o_part, float* o_acc, int64_t n) {
  const int64_t e = blockIdx.x * int64_t(kThreads) + threadIdx.x;
  if (e < n) o_acc[e] = to_float(o_part[e]);
}

// Every element of the shard: merged with the block (its rows) or passed through, rounded to T.
template <class T>
__global__ void merge_last_kernel(const T* o_part, const float* lse_part, const float* o_acc, const float* lse_acc,
                                  T* o, int rows, int row0, int S_loc, int D, int64_t n) {
  const int64_t e = blockIdx.x * int64_t(kThreads) + threadIdx.x;
  if (e >= n) return;
  const int64_t shard_row = e / D;  // over (b, h)
  const int i = static_cast<int>(shard_row % S_loc) - row0;
  float out = o_acc[e];
  if (i >= 0 && i < rows) {
    const int64_t r = (shard_row / S_loc) * rows + i;  // the block's row
    float lse, wa, wp;
    merge_weights(lse_acc[shard_row], lse_part[r], &lse, &wa, &wp);
    out = wa * out + (wp == 0.f ? 0.f : wp * to_float(o_part[r * D + e % D]));
  }
  o[e] = from_float<T>(out);
}

template <class T>
__global__ void accumulate_kernel(const T* part, float* acc, int rows, int row0, int S_loc, int D, int64_t n) {
  const int64_t e = blockIdx.x * int64_t(kThreads) + threadIdx.x;
  if (e >= n) return;
  acc[shard_index(e, rows, row0, S_loc, D)] += to_float(part[e]);
}

template <class T>
__global__ void round_kernel(const float* src, T* dst, int64_t n) {
  const int64_t e = blockIdx.x * int64_t(kThreads) + threadIdx.x;
  if (e < n) dst[e] = from_float<T>(src[e]);
}

__global__ void lse_rows_kernel(const float* lse, float* dst, int rows, int row0, int S_loc, int64_t n) {
  const int64_t r = blockIdx.x * int64_t(kThreads) + threadIdx.x;
  if (r < n) dst[r] = lse[(r / rows) * S_loc + row0 + r % rows];
}

__global__ void fill_kernel(float* dst, float value, int64_t n) {
  const int64_t e = blockIdx.x * int64_t(kThreads) + threadIdx.x;
  if (e < n) dst[e] = value;
}

}  // namespace

void ring_merge_block(DType t, const void* o_part, const float* lse_part, float* o_acc, float* lse_acc, int B, int H,
                      int rows, int row0, int S_loc, int D, cudaStream_t stream) {
  const int64_t n_rows = int64_t(B) * H * rows, n = n_rows * D;
  if (n == 0) return;
  DTYPE_SWITCH(t, T, [&] {
    merge_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const T*>(o_part), lse_part, o_acc, lse_acc,
                                                            rows, row0, S_loc, D, n);
    CHECK_LAUNCH("ring merge_kernel");
  });
  merge_lse_kernel<<<blocks_for(n_rows), kThreads, 0, stream>>>(lse_part, lse_acc, rows, row0, S_loc, n_rows);
  CHECK_LAUNCH("ring merge_lse_kernel");
}

void ring_merge_first(DType t, const void* o_part, const float* lse_part, float* o_acc, float* lse_acc,
                      int64_t n_rows, int D, cudaStream_t stream) {
  const int64_t n = n_rows * D;
  if (n == 0) return;
  DTYPE_SWITCH(t, T, [&] {
    merge_first_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const T*>(o_part), o_acc, n);
    CHECK_LAUNCH("ring merge_first_kernel");
  });
  CUDA_CHECK(cudaMemcpyAsync(lse_acc, lse_part, size_t(n_rows) * sizeof(float), cudaMemcpyDeviceToDevice, stream));
}

void ring_merge_last(DType t, const void* o_part, const float* lse_part, const float* o_acc, float* lse_acc,
                     void* o, int B, int H, int rows, int row0, int S_loc, int D, cudaStream_t stream) {
  const int64_t n = int64_t(B) * H * S_loc * D, n_rows = int64_t(B) * H * rows;
  if (n == 0) return;
  DTYPE_SWITCH(t, T, [&] {
    merge_last_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const T*>(o_part), lse_part, o_acc,
                                                                 lse_acc, static_cast<T*>(o), rows, row0, S_loc, D, n);
    CHECK_LAUNCH("ring merge_last_kernel");
  });
  if (n_rows == 0) return;
  merge_lse_kernel<<<blocks_for(n_rows), kThreads, 0, stream>>>(lse_part, lse_acc, rows, row0, S_loc, n_rows);
  CHECK_LAUNCH("ring merge_lse_kernel");
}

void ring_accumulate(DType t, const void* part, float* acc, int B, int H, int rows, int row0, int S_loc, int D,
                     cudaStream_t stream) {
  const int64_t n = int64_t(B) * H * rows * D;
  if (n == 0) return;
  DTYPE_SWITCH(t, T, [&] {
    accumulate_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(static_cast<const T*>(part), acc, rows, row0, S_loc, D, n);
    CHECK_LAUNCH("ring accumulate_kernel");
  });
}

void ring_round(DType t, const float* src, void* dst, int64_t n, cudaStream_t stream) {
  if (n == 0) return;
  DTYPE_SWITCH(t, T, [&] {
    round_kernel<T><<<blocks_for(n), kThreads, 0, stream>>>(src, static_cast<T*>(dst), n);
    CHECK_LAUNCH("ring round_kernel");
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
  fill_kernel<<<blocks_for(n), kThreads, 0, stream>>>(dst, value, n);
  CHECK_LAUNCH("ring fill_kernel");
}

}  // namespace flashattn

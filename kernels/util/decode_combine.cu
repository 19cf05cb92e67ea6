// The combine step of split-K decode (flash-decoding): each split left O_s (normalised within the
// split) and lse_s for every row; the row's result weighs them by their share of the softmax mass:
//   lse = log sum_s exp(lse_s);   O = sum_s exp(lse_s - lse) O_s
// Empty pieces (lse_s = -inf) weigh 0; a row whose pieces are all empty gets O = 0, lse = -inf.
// One warp per (b, h, i) row, lanes across the head dim (coalesced fp32 reads of each split's O).
// The work is B * H * S_new * splits * D floats: kilobytes to a few megabytes per step.
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>

#include "common/decode.cuh"
#include "common/dtype.cuh"
#include "common/switch.h"
#include "common/warp_reduce.cuh"
#include "flashattn/check.h"
#include "flashattn/error.h"

namespace flashattn {
namespace decode {
namespace {

template <class T>
struct CombineArgs {
  SplitWorkspace ws;
  T* o = nullptr;
  Strides o_st;
  float* lse = nullptr;
  int H = 0, S_new = 0, D = 0, splits = 0;
  int64_t rows = 0;
};

template <class T>
__global__ void combine_kernel(const CombineArgs<T> a) {
  const int lane = threadIdx.x % 32;
  const int64_t row = (blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x) / 32;
  if (row >= a.rows) return;  // whole warps leave together: the row is warp-uniform
  // m = max_s lse_s
  float m = -INFINITY;
  for (int s = lane; s < a.splits; s += 32) m = fmaxf(m, a.ws.lse[s * a.rows + row]);
  m = warp_max(m);
  // sum_s exp(lse_s - m); 0 when every piece is empty (m = -inf)
  float sum = 0.f;
  if (m != -INFINITY)
    for (int s = lane; s < a.splits; s += 32) sum += expf(a.ws.lse[s * a.rows + row] - m);
  sum = warp_sum(sum);
  const bool empty = !(sum > 0.f);
  const float lse = empty ? -INFINITY : m + logf(sum);

  const int64_t i = row % a.S_new, bh = row / a.S_new;
  const int64_t h = bh % a.H, b = bh / a.H;
  T* out = a.o + b * a.o_st.batch + h * a.o_st.head + i * a.o_st.row;
  for (int d = lane; d < a.D; d += 32) {
    float acc = 0.f;
    if (!empty) {
      for (int s = 0; s < a.splits; ++s) {
        const float l = a.ws.lse[s * a.rows + row];
        if (l == -INFINITY) continue;
        acc += expf(l - lse) * a.ws.o[(s * a.rows + row) * a.D + d];
      }
    }
    out[d] = from_float<T>(acc);
  }
  if (lane == 0) a.lse[row] = lse;
}

}  // namespace

void launch_combine(const DecodeParams& p, int splits, cudaStream_t stream) {
  const int64_t rows = static_cast<int64_t>(p.B) * p.H * p.S_new;
  if (rows == 0 || splits <= 1) return;
  DTYPE_SWITCH(p.dtype, T, [&] {
    CombineArgs<T> a;
    a.ws = split_workspace(p, splits);
    a.o = static_cast<T*>(p.o);
    a.o_st = p.o_st;
    a.lse = static_cast<float*>(p.lse);
    a.H = p.H, a.S_new = p.S_new, a.D = p.D, a.splits = splits;
    a.rows = rows;
    constexpr int kThreads = 128;  // 4 rows per block
    const int64_t blocks = (rows * 32 + kThreads - 1) / kThreads;
    combine_kernel<T><<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(a);
    CHECK_LAUNCH("decode combine_kernel");
  });
}

}  // namespace decode
}  // namespace flashattn

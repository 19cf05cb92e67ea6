// Two normalised results of the same query row over disjoint key sets, combined by their
// logsumexps (the split-K combine's algebra): the ring's merge passes (kernels/util/ring_ops.cu)
// and a forward kernel that merges into its outputs (FwdParams::merge_output).
#pragma once

#include <cuda_runtime.h>

#include <cmath>

namespace flashattn {

// lse = ln(e^lse_a + e^lse_b), w_a = e^(lse_a - lse), w_b = e^(lse_b - lse): the combined row is
// w_a * O_a + w_b * O_b. Where neither saw a key (both -inf): lse = -inf, w_a = 1, w_b = 0.
__device__ __forceinline__ void lse_merge_weights(float lse_a, float lse_b, float* lse, float* w_a, float* w_b) {
  const float m = fmaxf(lse_a, lse_b);
  if (m == -INFINITY) {
    *lse = -INFINITY, *w_a = 1.f, *w_b = 0.f;
    return;
  }
  const float a = __expf(lse_a - m), b = __expf(lse_b - m);
  *lse = m + __logf(a + b);
  *w_a = a / (a + b), *w_b = b / (a + b);
}

}  // namespace flashattn

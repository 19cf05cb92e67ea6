// The per-row statistics every tensor-core backward reads (mma, hopper): D_i = rowsum(dO_i ∘ O_i)
// and the forward's lse in log2 units.
#pragma once

#include <vector_types.h>

#include <cmath>

#include "common/dtype.cuh"
#include "common/host_device.h"
#include "common/math_constants.h"

namespace flashattn {

// This lane's part of rowsum(dO ∘ O) for one row: 16-byte chunks part, part + kLanes, ... of the
// row's D elements (D a multiple of 8), added to acc. The caller adds the kLanes adjacent lanes'
// parts.
template <int kLanes, class T>
__device__ __forceinline__ void add_row_dot_part(float& acc, const T* o_row, const T* do_row, int D, int part) {
  for (int c = part; c < D / 8; c += kLanes) {
    const uint4 ov = *reinterpret_cast<const uint4*>(o_row + 8 * c);
    const uint4 dv = *reinterpret_cast<const uint4*>(do_row + 8 * c);
    const T* oe = reinterpret_cast<const T*>(&ov);
    const T* de = reinterpret_cast<const T*>(&dv);
#pragma unroll
    for (int e = 0; e < 8; ++e) acc += to_float(oe[e]) * to_float(de[e]);
  }
}

// lse_i·log2 e. An empty row's lse (-inf) becomes +inf: then P = exp2(s·c − lse·log2 e) is 0 for
// every score, masked ones (-inf) included, where (-inf) − (-inf) would be NaN.
FLASHATTN_HD inline float lse_log2_units(float lse) { return lse == -INFINITY ? INFINITY : lse * kLog2e; }

}  // namespace flashattn

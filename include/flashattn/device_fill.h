// Inputs generated from a seed where they are used: on the device for benchmark sweeps (no host
// copy, no files), or on the host where there is no GPU. Element i of tensor `stream` is a
// standard normal that depends only on (seed, stream, i), computed in double and rounded once to
// the dtype, so the host and the device agree (a last-bit libm difference in double disappears
// in that rounding).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "flashattn/types.h"

namespace flashattn {

// Fills `n` elements of `dtype` (fp32, fp16 or bf16) at device pointer `dst`, on `stream`.
void fill_normal_device(void* dst, DType dtype, int64_t n, uint64_t seed, uint64_t stream, cudaStream_t s);
// The same values at host pointer `dst`.
void fill_normal_host(void* dst, DType dtype, int64_t n, uint64_t seed, uint64_t stream);

}  // namespace flashattn

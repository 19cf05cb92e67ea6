// Element types of the GPU kernels and their conversions to and from float, the type every
// kernel accumulates in. Host and device: the same code rounds identically on both sides.
//   F32 <-> float   F16 <-> __half   BF16 <-> __nv_bfloat16
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "common/host_device.h"
#include "flashattn/types.h"


namespace flashattn {

template <class T> struct DTypeOf;
template <> struct DTypeOf<float> { static constexpr DType value = DType::F32; };
template <> struct DTypeOf<__half> { static constexpr DType value = DType::F16; };
template <> struct DTypeOf<__nv_bfloat16> { static constexpr DType value = DType::BF16; };

FLASHATTN_HD inline float to_float(float x) { return x; }
FLASHATTN_HD inline float to_float(__half x) { return __half2float(x); }
FLASHATTN_HD inline float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

// Round to nearest even, as a framework storing a float result in the dtype does.
template <class T> FLASHATTN_HD T from_float(float x);
template <> FLASHATTN_HD inline float from_float<float>(float x) { return x; }
template <> FLASHATTN_HD inline __half from_float<__half>(float x) { return __float2half_rn(x); }
template <> FLASHATTN_HD inline __nv_bfloat16 from_float<__nv_bfloat16>(float x) {
  return __float2bfloat16_rn(x);
}

// x rounded to T and back: the value a later stage reading a stored T sees.
template <class T> FLASHATTN_HD inline float round_to(float x) { return to_float(from_float<T>(x)); }

// sum_d a[d] * b[d] in float, in index order: a fixed order keeps a score computed by two kernels
// (forward, and the backward's recomputation) bitwise identical.
template <class T>
FLASHATTN_HD inline float dot_f32(const T* a, const T* b, int n) {
  float acc = 0.f;
  for (int d = 0; d < n; ++d) acc += to_float(a[d]) * to_float(b[d]);
  return acc;
}

}  // namespace flashattn

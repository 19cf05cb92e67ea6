// HostArray: an n-dimensional, C-ordered, typed buffer on the host, plus the float conversions the
// driver needs (fp16/bf16 are handled bit-exactly here, without CUDA headers).
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "flashattn/types.h"

namespace flashattn {

struct HostArray {
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::vector<uint8_t> bytes;  // numel() * dtype_size(dtype) bytes

  HostArray() = default;
  HostArray(DType t, std::vector<int64_t> s);  // zero-filled

  int64_t numel() const;
  size_t nbytes() const { return bytes.size(); }
  int rank() const { return static_cast<int>(shape.size()); }
  template <class T> T* data() { return reinterpret_cast<T*>(bytes.data()); }
  template <class T> const T* data() const { return reinterpret_cast<const T*>(bytes.data()); }
};

// "[2, 8, 512, 64]"
std::string shape_str(const std::vector<int64_t>& shape);
int64_t shape_numel(const std::vector<int64_t>& shape);

// Scalar conversions. Rounding is to nearest even; NaN stays NaN, overflow goes to inf.
uint16_t float_to_half_bits(float f);
float half_bits_to_float(uint16_t h);
uint16_t float_to_bf16_bits(float f);
float bf16_bits_to_float(uint16_t h);

// Element i of a float or integer array, as double.
double element_as_double(const HostArray& a, int64_t i);
// Every element as double (a float dtype or an integer one).
std::vector<double> to_f64(const HostArray& a);
// A copy converted to `to` (float dtypes only; F64 -> F32 -> F16/BF16 rounds once, to nearest).
HostArray convert(const HostArray& a, DType to);
// Rounds every element to `to` and back to double: what a kernel computing in `to` sees.
std::vector<double> rounded_to_f64(const HostArray& a, DType to);

// Counts NaN and +-Inf elements of a float array (0 for integer arrays).
int64_t count_nonfinite(const HostArray& a);

}  // namespace flashattn

// HostArray and the scalar float conversions. fp16/bf16 rounding is done on the bit patterns so the
// results are identical on every host and need no CUDA headers.
#include "array.h"

#include <cfloat>
#include <cmath>
#include <limits>
#include <sstream>

#include "flashattn/error.h"

namespace flashattn {

namespace {

uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

float bits_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

// Shifts `value` right by `shift` bits (1..31), rounding to nearest, ties to even.
uint32_t shift_right_rne(uint32_t value, int shift) {
  const uint32_t kept = value >> shift;
  const uint32_t rem = value & ((1u << shift) - 1u);
  const uint32_t half = 1u << (shift - 1);
  return kept + ((rem > half || (rem == half && (kept & 1u))) ? 1u : 0u);
}

// double -> float with round-to-nearest-even, overflow to inf (a plain cast is undefined for
// finite values beyond the float range).
float double_to_float(double x) {
  // FLT_MAX plus half an ulp: from here on the nearest-even result is infinity.
  constexpr double kOverflow = 0x1.ffffffp127;
  if (std::isfinite(x) && std::fabs(x) >= kOverflow) {
    return std::signbit(x) ? -std::numeric_limits<float>::infinity() : std::numeric_limits<float>::infinity();
  }
  return static_cast<float>(x);
}

// double -> float rounding toward zero, then setting the last bit if anything was lost ("round to
// odd"). A later round-to-nearest-even into fp16 or bf16 then gives exactly the single rounding of
// x, because float keeps at least two more significant bits than either target in every range.
float double_to_float_round_odd(double x) {
  if (!std::isfinite(x)) return static_cast<float>(x);
  if (std::fabs(x) > static_cast<double>(FLT_MAX)) return std::signbit(x) ? -FLT_MAX : FLT_MAX;  // FLT_MAX is odd
  float f = static_cast<float>(x);
  if (static_cast<double>(f) == x) return f;
  if (std::fabs(static_cast<double>(f)) > std::fabs(x)) f = std::nextafter(f, 0.0f);
  return bits_float(float_bits(f) | 1u);
}

uint16_t double_to_half_bits(double x) { return float_to_half_bits(double_to_float_round_odd(x)); }
uint16_t double_to_bf16_bits(double x) { return float_to_bf16_bits(double_to_float_round_odd(x)); }

void require_float(DType t, const char* what) {
  if (!dtype_is_float(t)) {
    throw RuntimeError(std::string(what) + ": " + dtype_name(t) + " is not a float dtype");
  }
}

}  // namespace

HostArray::HostArray(DType t, std::vector<int64_t> s) : dtype(t), shape(std::move(s)) {
  const int64_t n = shape_numel(shape);
  if (n < 0) throw RuntimeError("HostArray: invalid shape " + shape_str(shape));
  bytes.assign(static_cast<size_t>(n) * dtype_size(t), 0);
}

int64_t HostArray::numel() const { return shape_numel(shape); }

std::string shape_str(const std::vector<int64_t>& shape) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < shape.size(); ++i) os << (i ? ", " : "") << shape[i];
  os << ']';
  return os.str();
}

// -1 for a negative dimension or a product that overflows int64.
int64_t shape_numel(const std::vector<int64_t>& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) return -1;
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d) return -1;
    n *= d;
  }
  return n;
}

uint16_t float_to_half_bits(float f) {
  const uint32_t x = float_bits(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7fffffffu;
  if (ax > 0x7f800000u) {
    // NaN: keep the top payload bits and force the quiet bit so the payload never becomes inf.
    return static_cast<uint16_t>(sign | 0x7e00u | ((ax >> 13) & 0x3ffu));
  }
  if (ax == 0x7f800000u) return static_cast<uint16_t>(sign | 0x7c00u);
  const int e = static_cast<int>(ax >> 23) - 127;
  if (e > 15) return static_cast<uint16_t>(sign | 0x7c00u);
  if (e >= -14) {
    // Normal half. A rounding carry runs into the exponent, which is also how 65520 becomes inf.
    const uint32_t h = (static_cast<uint32_t>(e + 15) << 10) | ((ax >> 13) & 0x3ffu);
    const uint32_t rem = ax & 0x1fffu;
    const uint32_t rounded = h + ((rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ? 1u : 0u);
    return static_cast<uint16_t>(sign | (rounded >= 0x7c00u ? 0x7c00u : rounded));
  }
  // Subnormal half: the value in units of 2^-24 is mant * 2^(e + 1), with the implicit bit.
  const int shift = -1 - e;  // 14 for e = -15 ... 24 for e = -25
  if (shift > 24) return sign;
  const uint32_t mant = (ax & 0x7fffffu) | 0x800000u;
  return static_cast<uint16_t>(sign | shift_right_rne(mant, shift));
}

float half_bits_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    const float mag = std::ldexp(static_cast<float>(mant), -24);  // exact: mant < 2^10
    return sign ? -mag : mag;
  }
  if (exp == 31) return bits_float(sign | 0x7f800000u | (mant << 13));
  return bits_float(sign | ((exp + 112u) << 23) | (mant << 13));
}

uint16_t float_to_bf16_bits(float f) {
  const uint32_t x = float_bits(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  // Adding 0x7fff plus the kept LSB rounds to nearest even; overflow carries into inf naturally.
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

float bf16_bits_to_float(uint16_t h) { return bits_float(static_cast<uint32_t>(h) << 16); }

double element_as_double(const HostArray& a, int64_t i) {
  switch (a.dtype) {
    case DType::F32: return a.data<float>()[i];
    case DType::F16: return half_bits_to_float(a.data<uint16_t>()[i]);
    case DType::BF16: return bf16_bits_to_float(a.data<uint16_t>()[i]);
    case DType::F64: return a.data<double>()[i];
    case DType::I32: return a.data<int32_t>()[i];
    case DType::I64: return static_cast<double>(a.data<int64_t>()[i]);
  }
  return 0.0;
}

std::vector<double> to_f64(const HostArray& a) {
  const int64_t n = a.numel();
  std::vector<double> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = element_as_double(a, i);
  return out;
}

HostArray convert(const HostArray& a, DType to) {
  require_float(a.dtype, "convert");
  require_float(to, "convert");
  if (a.dtype == to) return a;
  HostArray out(to, a.shape);
  const int64_t n = a.numel();
  for (int64_t i = 0; i < n; ++i) {
    const double x = element_as_double(a, i);
    switch (to) {
      case DType::F32: out.data<float>()[i] = double_to_float(x); break;
      case DType::F64: out.data<double>()[i] = x; break;
      case DType::F16: out.data<uint16_t>()[i] = double_to_half_bits(x); break;
      case DType::BF16: out.data<uint16_t>()[i] = double_to_bf16_bits(x); break;
      default: break;
    }
  }
  return out;
}

std::vector<double> rounded_to_f64(const HostArray& a, DType to) {
  require_float(to, "rounded_to_f64");
  std::vector<double> v = to_f64(a);
  for (double& x : v) {
    switch (to) {
      case DType::F32: x = double_to_float(x); break;
      case DType::F16: x = half_bits_to_float(double_to_half_bits(x)); break;
      case DType::BF16: x = bf16_bits_to_float(double_to_bf16_bits(x)); break;
      default: break;  // F64: already exact
    }
  }
  return v;
}

int64_t count_nonfinite(const HostArray& a) {
  if (!dtype_is_float(a.dtype)) return 0;
  const int64_t n = a.numel();
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) count += std::isfinite(element_as_double(a, i)) ? 0 : 1;
  return count;
}

}  // namespace flashattn

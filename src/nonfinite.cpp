#include "nonfinite.h"

#include <cstring>

namespace flashattn {

namespace {

// IEEE formats differ only in where the exponent and mantissa bits sit: all exponent bits set
// means infinity (mantissa 0) or NaN (mantissa not 0).
template <class Bits>
void scan_bits(const HostArray& a, Bits exp_mask, Bits mant_mask, NonFiniteCount* c) {
  const int64_t n = a.numel();
  const uint8_t* p = a.bytes.data();
  for (int64_t i = 0; i < n; ++i) {
    Bits b;
    std::memcpy(&b, p + static_cast<size_t>(i) * sizeof(Bits), sizeof(Bits));
    if ((b & exp_mask) != exp_mask) continue;
    if (b & mant_mask) ++c->nan;
    else ++c->inf;
    if (c->first < 0) c->first = i;
  }
}

}  // namespace

NonFiniteCount scan_nonfinite(const HostArray& a) {
  NonFiniteCount c;
  switch (a.dtype) {
    case DType::F32: scan_bits<uint32_t>(a, 0x7f800000u, 0x007fffffu, &c); break;
    case DType::F16: scan_bits<uint16_t>(a, 0x7c00u, 0x03ffu, &c); break;
    case DType::BF16: scan_bits<uint16_t>(a, 0x7f80u, 0x007fu, &c); break;
    case DType::F64: scan_bits<uint64_t>(a, 0x7ff0000000000000ull, 0x000fffffffffffffull, &c); break;
    case DType::I32:
    case DType::I64: break;
  }
  return c;
}

std::string index_str(const std::vector<int64_t>& shape, int64_t flat) {
  std::vector<int64_t> idx(shape.size(), 0);
  for (size_t k = shape.size(); k-- > 0;) {
    if (shape[k] <= 0) continue;
    idx[k] = flat % shape[k];
    flat /= shape[k];
  }
  return shape_str(idx);
}

std::string describe_nonfinite(const NonFiniteCount& c, const std::vector<int64_t>& shape) {
  std::string s;
  if (c.nan) s += std::to_string(c.nan) + " NaN";
  if (c.inf) s += std::string(c.nan ? " and " : "") + std::to_string(c.inf) + " Inf";
  s += c.total() == 1 ? " value" : " values";
  if (c.first >= 0) s += " (first at " + index_str(shape, c.first) + ")";
  return s;
}

}  // namespace flashattn

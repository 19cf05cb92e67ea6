#include "flashattn/types.h"

#include <algorithm>
#include <cctype>

namespace flashattn {

const char* dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "fp32";
    case DType::F16: return "fp16";
    case DType::BF16: return "bf16";
    case DType::F64: return "fp64";
    case DType::I32: return "int32";
    case DType::I64: return "int64";
  }
  return "?";
}

bool parse_dtype(const std::string& s, DType* out) {
  std::string l = s;
  std::transform(l.begin(), l.end(), l.begin(), [](unsigned char c) { return std::tolower(c); });
  struct Alias { const char* name; DType t; };
  static const Alias kAliases[] = {
      {"fp32", DType::F32}, {"float32", DType::F32}, {"f32", DType::F32},
      {"fp16", DType::F16}, {"float16", DType::F16}, {"f16", DType::F16}, {"half", DType::F16},
      {"bf16", DType::BF16}, {"bfloat16", DType::BF16},
      {"fp64", DType::F64}, {"float64", DType::F64}, {"f64", DType::F64}, {"double", DType::F64},
      {"int32", DType::I32}, {"i32", DType::I32}, {"int64", DType::I64}, {"i64", DType::I64},
  };
  for (const Alias& a : kAliases) {
    if (l == a.name) {
      *out = a.t;
      return true;
    }
  }
  return false;
}

const char* mode_name(Mode m) {
  switch (m) {
    case Mode::Forward: return "forward";
    case Mode::Backward: return "backward";
    case Mode::Decode: return "decode";
  }
  return "?";
}

const char* layout_name(Layout l) { return l == Layout::BHSD ? "bhsd" : "bshd"; }

const char* feature_name(uint32_t bit) {
  switch (bit) {
    case kFeatCausal: return "causal";
    case kFeatWindow: return "window";
    case kFeatPadding: return "padding";
    case kFeatMask: return "mask";
    case kFeatGQA: return "gqa";
    case kFeatUnequalSeq: return "sq!=sk";
    case kFeatBSHD: return "bshd";
    case kFeatPaged: return "paged";
    default: return "?";
  }
}

}  // namespace flashattn

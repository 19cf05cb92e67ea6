// Basic vocabulary shared by the driver and the kernels: element types, modes, layouts and the
// feature bits a kernel declares. Plain C++ (no CUDA headers) so host code and tests include it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace flashattn {

// Element types. F32/F16/BF16 are the compute dtypes of the GPU kernels; F64 is a compute dtype of
// the cpu kernel only; I32/I64 only appear in files (seqlens_k, block tables).
enum class DType : uint8_t { F32 = 0, F16 = 1, BF16 = 2, F64 = 3, I32 = 4, I64 = 5 };
constexpr int kNumDTypes = 6;

constexpr size_t dtype_size(DType t) {
  switch (t) {
    case DType::F16:
    case DType::BF16: return 2;
    case DType::F32:
    case DType::I32: return 4;
    case DType::F64:
    case DType::I64: return 8;
  }
  return 0;
}
constexpr bool dtype_is_float(DType t) { return t == DType::F32 || t == DType::F16 || t == DType::BF16 || t == DType::F64; }
constexpr uint32_t dtype_bit(DType t) { return 1u << static_cast<unsigned>(t); }

// "fp32", "fp16", "bf16", "fp64", "int32", "int64".
const char* dtype_name(DType t);
// Parses the names above; also accepts float32/float16/bfloat16/float64/f32/f16/f64. False if unknown.
bool parse_dtype(const std::string& s, DType* out);

enum class Mode : uint8_t { Forward = 0, Backward = 1, Decode = 2 };
constexpr int kNumModes = 3;
const char* mode_name(Mode m);  // "forward", "backward", "decode"

// Memory layout of the Q/K/V/O/dO files and of the device tensors.
//   bhsd: [B, H, S, D] (heads outer)     bshd: [B, S, H, D] (tokens outer, as most frameworks store)
enum class Layout : uint8_t { BHSD = 0, BSHD = 1 };
const char* layout_name(Layout l);

// Features a kernel can declare per mode. A problem that needs a feature the kernel does not
// declare is refused before launch with an error that names the feature.
enum Feature : uint32_t {
  kFeatCausal = 1u << 0,       // bottom-right aligned causal mask
  kFeatWindow = 1u << 1,       // sliding window (left, right)
  kFeatPadding = 1u << 2,      // per-batch key lengths (seqlens_k)
  kFeatMask = 1u << 3,         // additive float mask broadcastable to [B, H, S_q, S_k]
  kFeatGQA = 1u << 4,          // H_kv < H (grouped / multi-query attention)
  kFeatUnequalSeq = 1u << 5,   // S_q != S_k
  kFeatBSHD = 1u << 6,         // bshd layout (bhsd is always supported)
  kFeatPaged = 1u << 7,        // decode: K/V cache in pages through a block table
};
// Every forward/backward feature (paged caches only exist in decode mode).
constexpr uint32_t kAllFeatures = kFeatCausal | kFeatWindow | kFeatPadding | kFeatMask | kFeatGQA |
                                  kFeatUnequalSeq | kFeatBSHD;
constexpr int kNumFeatures = 8;
const char* feature_name(uint32_t single_bit);  // "causal", "window", ...

}  // namespace flashattn

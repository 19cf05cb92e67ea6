// The constants the softmax kernels share: exp(x) = exp2(x * log2(e)), ln(x) = log2(x) * ln(2).
// Plain C++ (host and device).
#pragma once

namespace flashattn {

constexpr float kLog2e = 1.442695040888963407f;  // log2(e)
constexpr float kLn2 = 0.693147180559945309f;    // ln(2)

}  // namespace flashattn

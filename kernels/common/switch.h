// Compile-time dispatch from run-time values: each switch turns a value into a constant (or a type)
// visible inside the lambda it runs, so one call site instantiates every variant it may need.
//
//   BOOL_SWITCH(params.causal, kIsCausal, [&] { launch<kIsCausal>(params, ctx); });
//   DTYPE_SWITCH(params.dtype, T, [&] { launch<T>(params, ctx); });
//
// Head dims have their own helper, which the build trims and the registry entry reads from
// (common/head_dims.h).
//
// The lambda's return value is passed through. A value with no compiled variant throws
// RuntimeError: the registry refuses such problems before launch, so reaching it is a bug.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>

#include "flashattn/error.h"
#include "flashattn/types.h"

namespace flashattn {

[[noreturn]] inline void throw_unsupported_dtype(DType t, const char* where) {
  throw RuntimeError(std::string(where) + ": no variant compiled for dtype " + dtype_name(t) +
                     " (fp32, fp16 and bf16 are)");
}

}  // namespace flashattn

// `static constexpr` rather than a plain constexpr local: a nested lambda may then use the name
// without capturing it, which nvcc requires for template arguments in device lambdas.
#define BOOL_SWITCH(COND, CONST_NAME, ...)      \
  [&] {                                         \
    if (COND) {                                 \
      static constexpr bool CONST_NAME = true;  \
      return __VA_ARGS__();                     \
    } else {                                    \
      static constexpr bool CONST_NAME = false; \
      return __VA_ARGS__();                     \
    }                                           \
  }()

// F32 -> float, F16 -> __half, BF16 -> __nv_bfloat16.
#define DTYPE_SWITCH(DTYPE, TYPE_NAME, ...)                                 \
  [&] {                                                                     \
    switch (DTYPE) {                                                        \
      case ::flashattn::DType::F32: {                                       \
        using TYPE_NAME = float;                                            \
        return __VA_ARGS__();                                               \
      }                                                                     \
      case ::flashattn::DType::F16: {                                       \
        using TYPE_NAME = __half;                                           \
        return __VA_ARGS__();                                               \
      }                                                                     \
      case ::flashattn::DType::BF16: {                                      \
        using TYPE_NAME = __nv_bfloat16;                                    \
        return __VA_ARGS__();                                               \
      }                                                                     \
      default:                                                              \
        ::flashattn::throw_unsupported_dtype((DTYPE), "DTYPE_SWITCH");      \
    }                                                                       \
  }()

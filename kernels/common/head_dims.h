// The head dims a kernel compiles, declared once per kernel and trimmed by the build:
//
//   using KernelHeadDims = HeadDims<32, 64, 96, 128, 256>;   // what the kernel has variants for
//   KernelHeadDims::dispatch(p.D, "mma forward", [&](auto kD) { launch<T, decltype(kD)::value>(p, ctx); });
//   m.head_dims = KernelHeadDims::list();                      // the registry entry: --list, CLI errors, tests
//
// A head dim is compiled when the kernel declares it and the build enables it. CMake's
// FLASHATTN_HDIMS (default: all five) arrives as the bitmask FLASHATTN_HDIM_MASK over
// kHeadDimChoices; `-DFLASHATTN_HDIMS=128` builds one variant per kernel, for development.
// dispatch() instantiates its callback only for compiled head dims (`if constexpr`), so the
// others cost no compile time, and throws RuntimeError for any other D: the registry refuses such
// problems before launch (list() is what it checks against), so reaching the throw is a bug.
//
// list() of a kernel that declares all five is never empty (the build enables at least one). A
// kernel that declares fewer must not register with an empty list: the registry reads an empty
// head_dims as "any D".
#pragma once

#include <string>
#include <type_traits>
#include <vector>

#include "flashattn/error.h"

#ifndef FLASHATTN_HDIM_MASK
#define FLASHATTN_HDIM_MASK 0x1f  // all of kHeadDimChoices (a build without CMake's definition)
#endif

namespace flashattn {

// Every head dim a kernel may have a variant for; bit i of a head-dim mask stands for element i.
inline constexpr int kHeadDimChoices[] = {32, 64, 96, 128, 256};
inline constexpr int kNumHeadDimChoices = sizeof(kHeadDimChoices) / sizeof(kHeadDimChoices[0]);

// The head dims this build compiles (FLASHATTN_HDIMS).
inline constexpr unsigned kBuildHeadDimMask = FLASHATTN_HDIM_MASK;
static_assert(kBuildHeadDimMask != 0 && (kBuildHeadDimMask >> kNumHeadDimChoices) == 0,
              "FLASHATTN_HDIM_MASK must enable at least one of kHeadDimChoices and nothing else");

// The mask bit of head dim d, 0 when d is none of kHeadDimChoices.
constexpr unsigned head_dim_bit(int d) {
  for (int i = 0; i < kNumHeadDimChoices; ++i)
    if (kHeadDimChoices[i] == d) return 1u << i;
  return 0u;
}

// "32, 64, 128" for the error messages.
inline std::string join_head_dims(const std::vector<int>& dims) {
  std::string s;
  for (int d : dims) s += (s.empty() ? "" : ", ") + std::to_string(d);
  return s;
}

// The head dims kDims... (declared by a kernel) under the mask kMask (enabled by a build).
// Kernels use HeadDims below, with the build's mask; tests name a mask of their own.
template <unsigned kMask, int... kDims>
struct HeadDimSet {
  static_assert(sizeof...(kDims) > 0, "a kernel with head-dim templates declares at least one");
  static_assert(((head_dim_bit(kDims) != 0) && ...), "declared head dims must be among kHeadDimChoices");

  static constexpr bool declares(int d) { return ((d == kDims) || ...); }
  static constexpr bool compiles(int d) { return ((d == kDims && (head_dim_bit(kDims) & kMask) != 0) || ...); }

  // Declared and enabled, in declaration order: the registry entry's head_dims.
  static std::vector<int> list() {
    std::vector<int> dims;
    ((((head_dim_bit(kDims) & kMask) != 0) ? dims.push_back(kDims) : void()), ...);
    return dims;
  }

  // Calls f(std::integral_constant<int, D>{}) for D == d, a compiled head dim; throws
  // RuntimeError("<who>: no variant compiled for head dim d (...)") for any other d.
  template <class F>
  static void dispatch(int d, const char* who, F&& f) {
    if (!(dispatch_one<kDims>(d, f) || ...))
      throw RuntimeError(std::string(who) + ": no variant compiled for head dim " + std::to_string(d) +
                         " (this build compiles " + join_head_dims(list()) + ")");
  }

 private:
  template <int kD, class F>
  static bool dispatch_one([[maybe_unused]] int d, [[maybe_unused]] F& f) {
    if constexpr ((head_dim_bit(kD) & kMask) != 0) {
      if (d == kD) {
        f(std::integral_constant<int, kD>{});
        return true;
      }
    }
    return false;
  }
};

template <int... kDims>
using HeadDims = HeadDimSet<kBuildHeadDimMask, kDims...>;

}  // namespace flashattn

// Host-side checks of the kernels that move whole 16-byte chunks (cp.async, vector loads and
// stores): tensor addresses and element strides.
#pragma once

#include <cstdint>

#include "flashattn/params.h"

namespace flashattn {

inline bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

// Batch, head and row strides all multiples of `elems` elements.
inline bool strides_multiple_of(const Strides& s, int elems) {
  return s.batch % elems == 0 && s.head % elems == 0 && s.row % elems == 0;
}

}  // namespace flashattn

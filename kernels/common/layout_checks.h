// Host-side checks of the kernels that move whole 16-byte chunks (cp.async, vector loads and
// stores): tensor addresses and element strides.
#pragma once

#include <cstdint>
#include <string>

#include "flashattn/error.h"
#include "flashattn/params.h"

namespace flashattn {

inline bool aligned16(const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; }

// Batch, head and row strides all multiples of `elems` elements.
inline bool strides_multiple_of(const Strides& s, int elems) {
  return s.batch % elems == 0 && s.head % elems == 0 && s.row % elems == 0;
}

// What a tiled forward kernel that moves 16-byte chunks of Q/K/V/O and launches one CTA per
// (row block, head, batch) needs of a problem: H a multiple of H_kv, B and H within grid y/z,
// sequence lengths below 2^28 (row arithmetic in int), 16-byte aligned tensors with strides a
// multiple of 8 elements. RuntimeError starting with `who` otherwise.
inline void check_tiled_forward(const FwdParams& p, const std::string& who) {
  if (p.H_kv <= 0 || p.H % p.H_kv != 0) throw RuntimeError(who + ": H must be a multiple of H_kv");
  if (p.H > 65535 || p.B > 65535) throw RuntimeError(who + ": B and H must be at most 65535 (grid y/z)");
  if (p.S_q >= (1 << 28) || p.S_k >= (1 << 28)) throw RuntimeError(who + ": S_q and S_k must be below 2^28");
  if (!aligned16(p.q) || !aligned16(p.k) || !aligned16(p.v) || !aligned16(p.o) || !strides_multiple_of(p.q_st, 8) ||
      !strides_multiple_of(p.k_st, 8) || !strides_multiple_of(p.v_st, 8) || !strides_multiple_of(p.o_st, 8))
    throw RuntimeError(who + ": tensors must be 16-byte aligned with strides a multiple of 8 elements");
}

}  // namespace flashattn

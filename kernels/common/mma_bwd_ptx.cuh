// The few PTX wrappers the backward kernels need beyond common/mma_sm80.cuh: ldmatrix and 32-bit
// stores on 32-bit shared-memory addresses (so a lane keeps one 32-bit register per operand
// rather than a 64-bit generic pointer per address) and an optimisation barrier for address
// registers.
#pragma once

#include <cstdint>

namespace flashattn {
namespace mma_bwd {
namespace ptx {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

__device__ __forceinline__ void sts_u32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}

// Returns x, but the compiler may not assume so: values derived from the result are computed
// where they are used instead of being hoisted (and kept live) across a loop.
__device__ __forceinline__ uint32_t opaque(uint32_t x) {
  asm volatile("" : "+r"(x));
  return x;
}

}  // namespace ptx
}  // namespace mma_bwd
}  // namespace flashattn

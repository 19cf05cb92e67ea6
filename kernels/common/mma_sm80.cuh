// Warp-level tensor-core primitives for sm_80+ (Ampere, Ada, Hopper's legacy path): thin, named
// wrappers over the PTX instructions the mma.sync kernels use, so kernel code reads as tile
// algebra rather than inline assembly.
//
//   cp.async        global -> shared copies that bypass registers (16 B, zero-fill past the tail)
//   ldmatrix        shared -> register fragments in the exact layout mma.sync expects
//   mma.sync        m16n8k16, fp16/bf16 operands, fp32 accumulators
//
// Fragment layouts (PTX ISA, "Matrix Fragments for mma.m16n8k16"), lane = 4*group + tid_in_group:
//   A (16x16, row-major):  a[0..3] are four .b32 registers, each two 16-bit values:
//       a0: (row g,   cols 2t..2t+1)      a1: (row g+8, cols 2t..2t+1)
//       a2: (row g,   cols 2t+8..2t+9)    a3: (row g+8, cols 2t+8..2t+9)
//   B (16x8, "col-major" i.e. B^T row-major 8x16): b0: (k 2t..2t+1, col g)  b1: (k 2t+8..2t+9, col g)
//   C/D (16x8 fp32):  c0,c1: (row g, cols 2t, 2t+1)   c2,c3: (row g+8, cols 2t, 2t+1)
// with g = lane / 4 and t = lane % 4. The C layout of two adjacent n8 tiles, packed to 16 bits, is
// exactly the A layout of a 16x16 tile: that is how P stays in registers between Q·Kᵀ and P·V.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <cstring>

namespace flashattn {
namespace mma {

// ---- cp.async -----------------------------------------------------------------------------------

// Copies 16 bytes global -> shared; when `valid` is false the 16 shared bytes are zero-filled
// (src-size 0), so tails need no separate clearing pass. The source must still be a mapped
// address: callers pass a clamped pointer for invalid rows.
__device__ __forceinline__ void cp_async_16(void* smem, const void* gmem, bool valid) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
  const int src_size = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(s), "l"(gmem), "r"(src_size));
}

__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }

// Waits until at most N committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

// ---- ldmatrix -----------------------------------------------------------------------------------
// Each lane passes the shared address of one 16-byte row: lanes 0-7 address matrix 0's rows,
// 8-15 matrix 1's, 16-23 matrix 2's, 24-31 matrix 3's (x4). The .trans variants transpose each
// 8x8 matrix on the way (used for V in P·V and for the transposed operands of the backward pass).

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* smem_row) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem_row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}

__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* smem_row) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem_row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(s));
}

__device__ __forceinline__ void ldmatrix_x2(uint32_t (&r)[2], const void* smem_row) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem_row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(s));
}

__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t (&r)[2], const void* smem_row) {
  const uint32_t s = static_cast<uint32_t>(__cvta_generic_to_shared(smem_row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(s));
}

// ---- mma.sync m16n8k16 --------------------------------------------------------------------------

template <class T> struct MmaType;
template <> struct MmaType<__half> { static constexpr const char* name = "f16"; };
template <> struct MmaType<__nv_bfloat16> { static constexpr const char* name = "bf16"; };

// D = A·B + C with fp32 accumulation; C and D may alias.
template <class T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                          const float (&c)[4]);

template <>
__device__ __forceinline__ void mma_16816<__half>(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2],
                                                  const float (&c)[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%11,%12,%13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
        "f"(c[3]));
}

template <>
__device__ __forceinline__ void mma_16816<__nv_bfloat16>(float (&d)[4], const uint32_t (&a)[4],
                                                         const uint32_t (&b)[2], const float (&c)[4]) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%10,%11,%12,%13};\n"
      : "=f"(d[0]), "=f"(d[1]), "=f"(d[2]), "=f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]), "f"(c[0]), "f"(c[1]), "f"(c[2]),
        "f"(c[3]));
}

// ---- packing --------------------------------------------------------------------------------------

// Two floats -> one .b32 register of two 16-bit values (lo in the low half), round to nearest.
template <class T> __device__ __forceinline__ uint32_t pack2(float lo, float hi);
template <>
__device__ __forceinline__ uint32_t pack2<__half>(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}
template <>
__device__ __forceinline__ uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

// Two 16-bit values of a .b32 register (lo first) as floats.
template <class T> __device__ __forceinline__ float2 unpack2(uint32_t u);
template <>
__device__ __forceinline__ float2 unpack2<__half>(uint32_t u) {
  __half2 h;
  memcpy(&h, &u, sizeof(h));
  return __half22float2(h);
}
template <>
__device__ __forceinline__ float2 unpack2<__nv_bfloat16>(uint32_t u) {
  __nv_bfloat162 h;
  memcpy(&h, &u, sizeof(h));
  return __bfloat1622float2(h);
}

// ---- math -----------------------------------------------------------------------------------------

// 2^x with the hardware approximation (MUFU.EX2, ~2 ulp); ex2(-inf) = 0.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

// ---- shared-memory swizzle -----------------------------------------------------------------------
// Rows of 64 bytes or more read by ldmatrix (8 rows x 16 B per 8x8 matrix) collide on banks when
// the row pitch is a multiple of 128 B. XOR-ing the 16-byte chunk index with the row index (mod 8)
// spreads the 8 rows of every 8x8 matrix over all 32 banks, for reads and cp.async writes alike.
// `chunk` counts 16-byte chunks within a row of `chunks_per_row` chunks (a power of two >= 8, or
// the swizzle is restricted to the low bits that exist).
template <int kChunksPerRow>
__device__ __forceinline__ int swizzle_chunk(int row, int chunk) {
  constexpr int kMask = kChunksPerRow >= 8 ? 7 : kChunksPerRow - 1;
  return chunk ^ (row & kMask);
}

}  // namespace mma
}  // namespace flashattn

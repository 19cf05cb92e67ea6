// Hopper (sm_90a) primitives for the hopper kernels: thin, named wrappers over the PTX, so the
// kernels read as a pipeline of copies and matrix products rather than inline assembly.
//
//   mbarrier   shared-memory barriers with a transaction count: the copy engine "arrives" with
//              bytes, consumers arrive by thread; waiters spin on the phase parity
//   TMA        cp.async.bulk.tensor: tiles global <-> shared through a tensor map (CUtensorMap,
//              encoded on the host, passed as a __grid_constant__ kernel parameter)
//   wgmma      warpgroup (4 warps) matrix products: fence / commit / wait, and the shared-memory
//              matrix descriptors (the products themselves are in sm90_wgmma_ops.cuh)
//   setmaxnreg registers moved from the producer warpgroup to the consumers
//
// Shared-memory tiles use the 128-byte swizzle of both TMA (CU_TENSOR_MAP_SWIZZLE_128B) and wgmma
// (descriptor layout 1): a tile of R rows x 64 16-bit elements is R rows of 128 bytes where the
// 16-byte chunk c of row r sits at chunk c ^ (r % 8); tiles start on 1024-byte boundaries so the
// pattern (a function of address bits 4-9) is the same for every tile. A head dim of 128 or 256 is
// stored as D/64 such "panels", one after the other.
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

namespace flashattn {
namespace sm90 {

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- mbarrier -----------------------------------------------------------------------------------

__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t arrivals) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(arrivals));
}

// Makes the initialised barriers visible to the copy engine (the async proxy) as well.
__device__ __forceinline__ void fence_barrier_init() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}

// One arrival that also announces `bytes` the copy engine will deliver before the phase completes.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}

// Waits until the phase of parity `parity` has completed. A fresh barrier is in phase 0, so a wait
// on parity 1 returns at once: a producer waiting for "slot empty" starts with parity 1.
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n.reg .pred p;\n"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        "selp.u32 %0, 1, 0, p;\n}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
}

// ---- named barriers (a subset of the CTA's warps) -------------------------------------------------

__device__ __forceinline__ void named_sync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void named_arrive(int id, int threads) {
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// ---- TMA ------------------------------------------------------------------------------------------

__device__ __forceinline__ void prefetch_tensor_map(const CUtensorMap* map) {
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// Loads the box at coordinates (c0 innermost .. c3) into shared memory at dst; completion is
// counted in bytes on `bar`. Rows outside the tensor arrive as zeros.
__device__ __forceinline__ void tma_load_4d(uint32_t dst, const CUtensorMap* map, uint32_t bar, int c0, int c1, int c2,
                                            int c3) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(
          dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}

// Stores the box at (c0 .. c3) from shared memory; parts outside the tensor are not written.
__device__ __forceinline__ void tma_store_4d(const CUtensorMap* map, uint32_t src, int c0, int c1, int c2, int c3) {
  asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%1, %2, %3, %4}], [%5];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(src)
               : "memory");
}
__device__ __forceinline__ void tma_store_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// Waits until the committed stores have finished reading shared memory.
__device__ __forceinline__ void tma_store_wait_read() {
  asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory");
}

// Waits until the committed stores (and reductions) have completed: their writes are performed
// in global memory, not just read out of shared memory.
__device__ __forceinline__ void tma_store_wait_all() { asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory"); }

// Plain (non-tensor) bulk copy of `bytes` contiguous bytes (a multiple of 16, both addresses
// 16-byte aligned) from global to shared memory, counted on `bar` like a tensor load.
__device__ __forceinline__ void bulk_load(uint32_t dst, const void* src, uint32_t bytes, uint32_t bar) {
  asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(dst),
               "l"(reinterpret_cast<uint64_t>(src)), "r"(bytes), "r"(bar)
               : "memory");
}

// Adds `bytes` of fp32 values in shared memory element by element into global memory (the copy
// engine performs the reductions at L2, each element atomically); completion in the bulk group.
__device__ __forceinline__ void bulk_reduce_add_f32(float* dst, uint32_t src, uint32_t bytes) {
  asm volatile("cp.reduce.async.bulk.global.shared::cta.bulk_group.add.f32 [%0], [%1], %2;\n" ::"l"(
                   reinterpret_cast<uint64_t>(dst)),
               "r"(src), "r"(bytes)
               : "memory");
}

// Orders this thread's earlier async-proxy accesses to global memory (completed bulk operations)
// before its later generic ones, e.g. a flag published after a bulk reduction.
__device__ __forceinline__ void fence_proxy_async_global() { asm volatile("fence.proxy.async.global;\n" ::: "memory"); }

// Relaxed loads and stores at GPU scope: a hint shared between CTAs, ordered with nothing else.
__device__ __forceinline__ int ld_relaxed_gpu(const int* p) {
  int v;
  asm volatile("ld.relaxed.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void st_relaxed_gpu(int* p, int v) {
  asm volatile("st.relaxed.gpu.global.b32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

__device__ __forceinline__ int ld_acquire_gpu(const int* p) {
  int v;
  asm volatile("ld.acquire.gpu.global.b32 %0, [%1];\n" : "=r"(v) : "l"(p) : "memory");
  return v;
}
__device__ __forceinline__ void red_release_gpu_add(int* p, int v) {
  asm volatile("red.release.gpu.global.add.s32 [%0], %1;\n" ::"l"(p), "r"(v) : "memory");
}

// Ordinary shared-memory stores that the copy engine or the tensor cores read next must be made
// visible to the async proxy first (each writing thread, before the barrier that publishes them).
__device__ __forceinline__ void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

// Byte offset, inside a 128-byte-swizzled panel (see the top of this file), of 32-bit word `word`
// of 16-byte chunk `chunk` of row `row`: what a thread writing its accumulator pair (columns
// 8·chunk + 2·word, + 1) into a tile that TMA or wgmma reads next stores to.
__device__ __forceinline__ uint32_t swizzled_offset(int row, int chunk, int word) {
  return row * 128 + ((chunk ^ (row % 8)) << 4) + 4 * word;
}

// ---- wgmma ----------------------------------------------------------------------------------------

// Orders earlier register writes (accumulators, A fragments) before the wgmma that reads them.
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
// Waits until at most N committed wgmma groups of this warpgroup are pending.
template <int N>
__device__ __forceinline__ void wgmma_wait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}

// The compiler sees a wgmma's accumulators as written when it is issued; these empty statements
// pin them (and register A operands) in place until the wait, so no read or reuse of the
// registers moves across it.
template <class T, int R, int C>
__device__ __forceinline__ void fence_regs(T (&r)[R][C]) {
  static_assert(std::is_same_v<T, float> || std::is_same_v<T, uint32_t>, "fp32 accumulators or .b32 fragments");
#pragma unroll
  for (int i = 0; i < R; ++i)
#pragma unroll
    for (int j = 0; j < C; ++j) {
      if constexpr (std::is_same_v<T, float>)
        asm volatile("" : "+f"(r[i][j])::"memory");
      else
        asm volatile("" : "+r"(r[i][j])::"memory");
    }
}

// Shared-memory matrix descriptor for a 128-byte-swizzled operand (PTX ISA, "Matrix Descriptor
// Format"): start address, leading and stride byte offsets (all >> 4), layout 1 = 128B swizzle.
//   K-major (rows of 64 elements along K, e.g. Q or K for Q·K^T): SBO = 1024 between 8-row
//     groups; LBO unused (1). A k16 step inside the 64-element panel moves the start by 32 bytes.
//   MN-major (V for P·V: rows are keys = the K dimension, 64 head-dim elements per row): SBO =
//     1024 between 8-key groups, LBO = the byte distance between 64-wide head-dim panels.
// Built once per operand tile and advanced per k16 step by at(bytes): the start address is the low
// 14 bits of the low word, and a CTA's shared-memory addresses stay below 2^18 bytes, so adding
// bytes >> 4 to the low word never carries into the LBO field. One integer add per descriptor
// instead of masking, shifting and or-ing every one anew.
struct Desc {
  uint32_t lo, hi;
  __device__ __forceinline__ Desc(uint32_t smem_addr, uint32_t lbo_bytes, uint32_t sbo_bytes)
      : lo(((smem_addr & 0x3FFFF) >> 4) | (((lbo_bytes >> 4) & 0x3FFF) << 16)),
        hi(((sbo_bytes >> 4) & 0x3FFF) | (1u << 30)) {}  // bit 62: 128-byte swizzle
  __device__ __forceinline__ uint64_t at(uint32_t offset_bytes) const {
    return (static_cast<uint64_t>(hi) << 32) | (lo + (offset_bytes >> 4));
  }
};

// ---- registers ------------------------------------------------------------------------------------

// Each branch of the producer/consumer split calls one of these once, warpgroup-uniformly.
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_dec() {
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}
template <int kRegs>
__device__ __forceinline__ void setmaxnreg_inc() {
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
}

__device__ __forceinline__ void st_shared_32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ float2 ld_shared_f32x2(uint32_t addr) {
  float2 v;
  asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(addr) : "memory");
  return v;
}
__device__ __forceinline__ void st_shared_f32x4(uint32_t addr, float a, float b, float c, float d) {
  asm volatile("st.shared.v4.f32 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "f"(a), "f"(b), "f"(c), "f"(d) : "memory");
}
// Four 8 x 8 16-bit matrices, each held as the mma.sync fragment (lane l: row l / 4, columns
// 2·(l % 4), + 1 in register m for matrix m), stored transposed: lane 8m + i gives the address of
// row i of matrix m's transpose (16 contiguous bytes: column i of the fragment).
__device__ __forceinline__ void stmatrix_x4_trans(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
  asm volatile("stmatrix.sync.aligned.m8n8.x4.trans.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0), "r"(r1),
               "r"(r2), "r"(r3)
               : "memory");
}
__device__ __forceinline__ uint32_t ld_shared_32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.b32 %0, [%1];\n" : "=r"(v) : "r"(addr) : "memory");
  return v;
}

}  // namespace sm90
}  // namespace flashattn

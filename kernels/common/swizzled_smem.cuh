// Shared-memory tiles of 16-bit elements laid out for ldmatrix without bank conflicts, and the
// cp.async loader / vectorised storer that move them to and from global memory.
//
// Layout. A (kRows, kCols) tile is split along its columns into panels of 64 columns (128-byte
// rows) when kCols is a multiple of 64, else of 32 columns (64-byte rows), so head dims 32, 64,
// 96, 128 and 256 all tile exactly. Each panel is stored row after row; within a row, the 16-byte
// chunk index is XOR-ed with bits of the row index:
//   128-byte panel rows: chunk ^ (row & 7)         8 consecutive rows -> 8 distinct chunk slots
//   64-byte panel rows:  chunk ^ ((row >> 1) & 3)   row pairs share a 128-byte line, so rows
//                                                   (2r, 2r+1) take the two halves and the XOR
//                                                   spreads the 4 pairs over the 4 chunk slots
// Either way the 8 rows an 8x8 ldmatrix reads (8 consecutive rows, same logical chunk, first row a
// multiple of 8) cover all 32 banks once, and the 16-byte cp.async writes of a warp (consecutive
// chunks of consecutive rows) fill whole 128-byte lines. Addresses are 32-bit shared-window
// offsets so every access compiles to one LDSM/LDGSTS/STS with an immediate offset.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "common/host_device.h"

namespace flashattn {
namespace mma {

template <int kRows_, int kCols_>
struct SwizzledTile {
  static constexpr int kRows = kRows_;
  static constexpr int kCols = kCols_;
  static_assert(kCols % 32 == 0, "tiles are built from 32- or 64-column panels");
  static_assert(kRows % 8 == 0, "ldmatrix reads 8-row groups");
  static constexpr int kChunks = kCols / 8;  // 16-byte chunks per row
  static constexpr int kPanelChunks = kCols % 64 == 0 ? 8 : 4;
  static constexpr int kBytes = kRows * kCols * 2;

  // Byte offset of 16-byte chunk `chunk` (logical, 0 <= chunk < kChunks) of row `row`.
  FLASHATTN_HD static constexpr uint32_t offset(int row, int chunk) {
    const int panel = chunk / kPanelChunks;
    const int c = chunk % kPanelChunks;
    return static_cast<uint32_t>(((panel * kRows + row) * kPanelChunks + (c ^ swizzle(row))) * 16);
  }

  FLASHATTN_HD static constexpr int swizzle(int row) { return kPanelChunks == 8 ? (row & 7) : ((row >> 1) & 3); }

  // The same offset split for unrolled loops, so the lane-dependent part is computed once and
  // each access costs at most one XOR: for row = R + lr and chunk = C + lc with R a multiple of 8
  // and C even (lc in {0, 1}; or any C with lc = 0), the swizzle depends on lr alone and
  // (C % P + lc) ^ sw = (C % P) ^ (lc ^ sw), hence
  //   offset(R + lr, C + lc) = lane_row(lr) + block(R, C) + (lane_xor(lr, lc) ^ chunk_xor(C)).
  // lane_row and block are multiples of P*16 bytes and lane_xor, chunk_xor are below it, so with
  // a tile base aligned to 128 bytes the XOR may be applied to the whole lane address:
  //   base + offset(R + lr, C + lc) = at(base + lane(lr, lc), R, C).
  // A per-lane register plus one LOP3 and an immediate per access, whatever R and C are.
  FLASHATTN_HD static constexpr uint32_t lane_row(int lr) { return static_cast<uint32_t>(lr * kPanelChunks * 16); }
  FLASHATTN_HD static constexpr uint32_t lane_xor(int lr, int lc) {
    return static_cast<uint32_t>((lc ^ swizzle(lr)) * 16);
  }
  FLASHATTN_HD static constexpr uint32_t lane(int lr, int lc) { return lane_row(lr) + lane_xor(lr, lc); }
  FLASHATTN_HD static constexpr uint32_t block(int R, int C) {
    return static_cast<uint32_t>(((C / kPanelChunks) * kRows + R) * kPanelChunks * 16);
  }
  FLASHATTN_HD static constexpr uint32_t chunk_xor(int C) { return static_cast<uint32_t>((C % kPanelChunks) * 16); }
  // lane_addr = (128-byte aligned base) + lane(lr, lc) (+ a byte offset below 16).
  FLASHATTN_HD static constexpr uint32_t at(uint32_t lane_addr, int R, int C) {
    return (lane_addr ^ chunk_xor(C)) + block(R, C);
  }
};

#if defined(__CUDACC__)

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// ---- shared-window (32-bit address) forms of the warp primitives -------------------------------

__device__ __forceinline__ void cp_async_16_u32(uint32_t smem, const void* gmem, bool valid) {
  const int src_size = valid ? 16 : 0;  // 0: no global read, 16 zero bytes written
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem), "l"(gmem), "r"(src_size));
}

// L2 eviction policies for cp_async_16_u32_hint. Evict-first: the lines a load brings in are the
// first to be replaced, for data read exactly once (a decode step's K/V stream), so the stream
// recycles its own lines instead of evicting (and, for dirty lines, writing back) what else L2
// holds. Evict-unchanged: the access leaves the lines' priorities as they were.
__device__ __forceinline__ uint64_t l2_evict_first_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

__device__ __forceinline__ uint64_t l2_evict_unchanged_policy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_unchanged.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

// cp_async_16_u32 under an L2 eviction policy (l2_evict_first_policy).
__device__ __forceinline__ void cp_async_16_u32_hint(uint32_t smem, const void* gmem, bool valid, uint64_t policy) {
  const int src_size = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;\n" ::"r"(smem), "l"(gmem),
               "r"(src_size), "l"(policy));
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem));
}

__device__ __forceinline__ void ldsm_x4_trans(uint32_t (&r)[4], uint32_t smem) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem));
}

__device__ __forceinline__ void sts_32(uint32_t smem, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(smem), "r"(v));
}

__device__ __forceinline__ uint4 lds_128(uint32_t smem) {
  uint4 v;
  asm volatile("ld.shared.v4.b32 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "r"(smem));
  return v;
}

// ---- tile movers -------------------------------------------------------------------------------

// Moves (Tile::kRows, Tile::kCols) tiles of a global row-major matrix (rows 16-byte aligned, row
// stride `row_stride` elements) into shared memory with cp.async. Panel by panel, consecutive
// threads take consecutive chunks of a panel row (64 or 128 contiguous bytes: whole sectors);
// each thread keeps one chunk column and steps down the rows by kThreads / P, a multiple of 8, so
// its swizzle is fixed and every shared offset is one register plus an immediate. The per-thread
// part of the global address is folded into one pointer at construction.
template <class Tile, int kThreads, class T>
struct TileLoader {
  static constexpr int P = Tile::kPanelChunks;
  static constexpr int kRowStep = kThreads / P;
  static_assert(kThreads % P == 0 && kRowStep % 8 == 0 && Tile::kRows % kRowStep == 0, "loader mapping");

  const T* g;  // this thread's chunk in row r0 of the matrix
  int64_t row_stride;
  int r0;          // this thread's first row within a tile
  uint32_t s_off;  // this thread's first chunk within a tile

  __device__ __forceinline__ TileLoader(const T* matrix, int64_t row_stride_, int tid)
      : row_stride(row_stride_), r0(tid / P), s_off(Tile::offset(tid / P, tid % P)) {
    g = matrix + r0 * row_stride + (tid % P) * 8;
  }

  // Starts copying rows [row, row + kRows) into the tile at `s`. With kCheckRows, tile rows >=
  // valid_rows are zero-filled without reading global memory (`mapped`, any mapped address, stands
  // in as their source); without, the caller guarantees the whole tile is in bounds.
  // Asynchronous: commit and wait with cp_async_*.
  template <bool kCheckRows>
  __device__ __forceinline__ void load(uint32_t s, int64_t row, int valid_rows, const T* mapped) const {
    const T* src0 = g + row * row_stride;
#pragma unroll
    for (int panel = 0; panel < Tile::kChunks / P; ++panel)
#pragma unroll
      for (int it = 0; it < Tile::kRows / kRowStep; ++it) {
        const bool valid = !kCheckRows || r0 + it * kRowStep < valid_rows;
        const T* src = valid ? src0 + it * kRowStep * row_stride + panel * P * 8 : mapped;
        cp_async_16_u32(s + s_off + Tile::block(it * kRowStep, panel * P), src, valid);
      }
  }
};

// Writes rows [0, valid_rows) of the tile at `s` to global memory with 16-byte stores, the
// mirror of load_tile_async. The caller synchronises the block between filling the tile and this.
template <class Tile, int kThreads, class T>
__device__ __forceinline__ void store_tile(T* g, int64_t row_stride, int valid_rows, uint32_t s, int tid) {
  constexpr int P = Tile::kPanelChunks;
  constexpr int kRowStep = kThreads / P;
  static_assert(kThreads % P == 0 && kRowStep % 8 == 0 && Tile::kRows % kRowStep == 0, "storer mapping");
  const int r0 = tid / P, c0 = tid % P;
  const uint32_t s0 = s + Tile::offset(r0, c0);
  T* g0 = g + r0 * row_stride + c0 * 8;
#pragma unroll
  for (int panel = 0; panel < Tile::kChunks / P; ++panel)
#pragma unroll
    for (int it = 0; it < Tile::kRows / kRowStep; ++it)
      if (r0 + it * kRowStep < valid_rows)
        *reinterpret_cast<uint4*>(g0 + it * kRowStep * row_stride + panel * P * 8) =
            lds_128(s0 + Tile::block(it * kRowStep, panel * P));
}

#endif  // __CUDACC__

}  // namespace mma
}  // namespace flashattn

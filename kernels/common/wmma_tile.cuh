// Shared-memory tiles for the wmma kernels (rung 6): padded 16-bit tiles filled by cp.async, and
// the one fact about wmma accumulator fragments the forward pass needs but the API does not give.
//
// Padding. nvcuda::wmma reads and writes shared memory in 8-row groups of 16-byte segments (fp16:
// ldmatrix; bf16: 32-bit loads of the same 16-byte rows), and so do the ldmatrix fragment loaders
// of common/wmma_frag.cuh. A row pitch of 16 * odd bytes puts the 8
// segments in 8 different 16-byte bank slots, so every fragment load is conflict-free: 16-bit tiles
// of kCols columns (kCols % 16 == 0) use a pitch of kCols + 8 elements. wmma also wants every
// fragment pointer 32-byte aligned and ldm a multiple of 16 bytes; both hold for 16-row, 16-column
// steps inside such tiles when the tile itself starts on a 128-byte boundary.
//
// Accumulator rows. To rescale O by a per-row factor without a round trip through shared memory, a
// thread must know the row of each element of its accumulator fragment. wmma leaves that layout
// unspecified, so it is measured rather than assumed: a warp loads a 16x16 matrix whose entries
// are their own row index into an accumulator fragment; element e then holds its row. The result
// is exact for whatever layout the compiler uses, at the cost of one 1 KB load at kernel start.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>

#include <cstdint>

#include "common/mma_sm80.cuh"

namespace flashattn {
namespace wmma_tile {

namespace wmma = nvcuda::wmma;

// Pitch (elements) of a 16-bit tile row of kCols columns: 16 * odd bytes, see above.
template <int kCols>
constexpr int pitch16() {
  static_assert(kCols % 16 == 0, "16-bit tiles hold whole 16x16 fragments");
  return kCols + 8;
}

// Pitch (floats) of an fp32 score tile of kCols columns. kCols + 8 is 8 (mod 32) words when kCols is a
// multiple of 32: the accumulator stores (8-byte pieces of 4 rows per half-warp) and the softmax's
// 16-byte row reads (see the forward kernel) both fall on distinct banks.
template <int kCols>
constexpr int pitch32() {
  static_assert(kCols % 32 == 0, "score tiles are a multiple of 32 columns wide");
  return kCols + 8;
}

using AccFrag = wmma::fragment<wmma::accumulator, 16, 16, 16, float>;
template <class T> using FragA = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major>;
template <class T> using FragAT = wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::col_major>;
template <class T> using FragBT = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major>;
template <class T> using FragB = wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::row_major>;

// Copies rows [0, kRows) x [0, kCols) of a row-major global tile (row stride `row_stride` elements)
// into a padded shared tile with 16-byte cp.async; rows >= valid_rows are zero-filled. `fallback`
// is any mapped address (the head's first row): an invalid row reads nothing but still needs one.
// Each thread owns one 16-byte column chunk and steps down the rows, so its addresses are one
// pointer plus a stride (the loads sit in the main loop, beside the O accumulators, and must not
// pin a register per chunk).
template <int kRows, int kCols, int kThreads, class T>
__device__ __forceinline__ void load_tile_async(T* smem, const T* gmem, int64_t row_stride, int valid_rows,
                                                const T* fallback, int tid) {
  constexpr int kChunksPerRow = kCols / 8;                  // 16-byte chunks
  constexpr int kRowsPerStep = kThreads / kChunksPerRow;    // D = 96: 10 rows, 8 threads idle
  static_assert(kRowsPerStep > 0, "a row has more chunks than the CTA has threads");
  const int row0 = tid / kChunksPerRow, col = (tid % kChunksPerRow) * 8;
  if (row0 >= kRowsPerStep) return;
  const T* src = gmem + row0 * row_stride + col;
  T* dst = smem + row0 * pitch16<kCols>() + col;
#pragma unroll
  for (int r = 0; r < kRows; r += kRowsPerStep) {
    if (kRows % kRowsPerStep == 0 || row0 + r < kRows) {
      const bool valid = row0 + r < valid_rows;
      mma::cp_async_16(dst + r * pitch16<kCols>(), valid ? src : fallback, valid);
    }
    src += kRowsPerStep * row_stride;
  }
}

// load_tile_async for the common case of a tile whose rows all exist (valid_rows >= kRows): no
// per-row predicate, clamp or fallback select, so a 16-byte chunk costs one 64-bit add and one
// LDGSTS (about 3 instructions against 10 above; at D = 128 a K or V tile is 8 chunks per thread,
// loaded every key block). Tail tiles take the predicated path.
template <int kRows, int kCols, int kThreads, class T>
__device__ __forceinline__ void load_tile_async_lean(T* smem, const T* gmem, int64_t row_stride, int valid_rows,
                                                     const T* fallback, int tid) {
  constexpr int kChunksPerRow = kCols / 8;
  constexpr int kRowsPerStep = kThreads / kChunksPerRow;
  if (valid_rows < kRows) {
    load_tile_async<kRows, kCols, kThreads>(smem, gmem, row_stride, valid_rows, fallback, tid);
    return;
  }
  const int row0 = tid / kChunksPerRow, col = (tid % kChunksPerRow) * 8;
  if (row0 >= kRowsPerStep) return;
  const T* src = gmem + row0 * row_stride + col;
  const uint32_t dst = static_cast<uint32_t>(__cvta_generic_to_shared(smem + row0 * pitch16<kCols>() + col));
  const int64_t step = kRowsPerStep * row_stride;
#pragma unroll
  for (int r = 0; r < kRows; r += kRowsPerStep) {
    if (kRows % kRowsPerStep == 0 || row0 + r < kRows)
      asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(dst + r * pitch16<kCols>() * 2), "l"(src));
    src += step;
  }
}

// Row (0..15) of each element of an accumulator fragment, 4 bits per element (element e in bits
// 4e..4e+3). `scratch` is 256 floats of warp-private, 32-byte aligned shared memory; the whole
// warp calls this.
__device__ __forceinline__ uint32_t probe_acc_rows(float* scratch, int lane) {
  static_assert(AccFrag::num_elements * 4 <= 32, "one 4-bit row index per element must fit 32 bits");
#pragma unroll
  for (int e = lane; e < 256; e += 32) scratch[e] = static_cast<float>(e / 16);
  __syncwarp();
  AccFrag rows;
  wmma::load_matrix_sync(rows, scratch, 16, wmma::mem_row_major);
  __syncwarp();  // the caller reuses scratch
  uint32_t packed = 0;
#pragma unroll
  for (int e = 0; e < AccFrag::num_elements; ++e) packed |= static_cast<uint32_t>(rows.x[e]) << (4 * e);
  return packed;
}

__device__ __forceinline__ int acc_row(uint32_t packed, int e) { return (packed >> (4 * e)) & 15; }

// Four floats -> four 16-bit values in one 8-byte shared store (addr 8-byte aligned).
template <class T>
__device__ __forceinline__ void store4(T* dst, float x0, float x1, float x2, float x3) {
  uint2 v;
  v.x = mma::pack2<T>(x0, x1);
  v.y = mma::pack2<T>(x2, x3);
  *reinterpret_cast<uint2*>(dst) = v;
}

// Eight floats -> eight 16-bit values in one 16-byte store (addr 16-byte aligned; global or shared).
template <class T>
__device__ __forceinline__ void store8(T* dst, const float (&x)[8]) {
  uint4 v;
  v.x = mma::pack2<T>(x[0], x[1]);
  v.y = mma::pack2<T>(x[2], x[3]);
  v.z = mma::pack2<T>(x[4], x[5]);
  v.w = mma::pack2<T>(x[6], x[7]);
  *reinterpret_cast<uint4*>(dst) = v;
}

}  // namespace wmma_tile
}  // namespace flashattn

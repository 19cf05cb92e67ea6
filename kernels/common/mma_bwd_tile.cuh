// Shared-memory tiles and warp-level GEMMs for the mma.sync backward kernels: swizzled 16-bit
// tiles filled by cp.async, fragments fetched with ldmatrix (plain or .trans, so every operand of
// the five backward products is read from the one row-major copy of its tile), m16n8k16 products
// with fp32 accumulators, and the accumulator -> 16-bit -> smem -> 16-byte global store path.
//
// Conventions. A warp computes acc[MT][NT] = MT x NT tiles of 16 x 8; tile (mt, nt) covers rows
// m_base + 16 mt .. + 16 and columns n_base + 8 nt .. + 8. A tile stored with the product's
// reduction index (k) along its rows is read with ldmatrix.trans ("rows are k"); otherwise with
// plain ldmatrix. Every m_base, n_base and k offset is a multiple of 8, so the 8 row addresses of
// one 8x8 matrix are 8 consecutive rows starting at a multiple of 8 — what the swizzle assumes.
#pragma once

#include <vector_types.h>

#include <cstdint>

#include "common/mma_bwd_ptx.cuh"
#include "common/mma_sm80.cuh"

namespace flashattn {
namespace mma_bwd {

// A kRows x kCols tile of 16-bit elements, row-major, its 16-byte chunks permuted within each
// row so that the 8 rows an ldmatrix reads (or a warp-wide store of accumulator pairs writes) at
// one logical chunk fall into 8 distinct 16-byte bank groups:
//   chunks per row = 8k:      chunk ^ (row % 8)        every row starts a 128-byte line
//   chunks per row = 8k + 4:  chunk ^ ((row / 2) % 4)  two rows per line: the row's parity picks
//                                                      the half, (row / 2) % 4 the chunk in it
// Both stay inside the row (the XOR touches only bits the chunk count leaves free), so the
// tile needs no padding.
template <int kRows_, int kCols_>
struct SmemTile {
  static constexpr int kRows = kRows_;
  static constexpr int kCols = kCols_;
  static constexpr int kChunks = kCols / 8;  // 16-byte chunks per row
  static constexpr int kElems = kRows * kCols;
  static constexpr int kBytes = kElems * 2;
  static_assert(kCols % 32 == 0, "rows are a multiple of four 16-byte chunks");
  static_assert(kRows % 16 == 0, "rows come in whole m16 / k16 steps");

  __host__ __device__ __forceinline__ static int swizzle(int row, int chunk) {
    if constexpr (kChunks % 8 == 0) {
      return chunk ^ (row & 7);
    } else {
      return chunk ^ ((row >> 1) & 3);
    }
  }
  // Element offset of (row, col).
  __host__ __device__ __forceinline__ static int at(int row, int col) {
    return row * kCols + (swizzle(row, col >> 3) << 3) + (col & 7);
  }
};

// ---- global <-> shared --------------------------------------------------------------------------

// Rows [0, Tile::kRows) of a global matrix (row stride `ld` elements, rows 16-byte aligned) into
// `s` with cp.async; rows >= n_valid are zero-filled. Their source address is clamped to row 0,
// which the caller guarantees is mapped (it is the first row of a block that exists).
// When the threads cover whole rows per pass, a thread's chunk column and swizzle stay fixed and
// its rows advance by a constant: one running pointer, immediate shared-memory offsets.
template <class Tile, int kThreads, class T>
__device__ __forceinline__ void copy_tile_async(T* s, const T* g, int64_t ld, int n_valid, int tid) {
  constexpr int kTotal = Tile::kRows * Tile::kChunks;
  static_assert(kTotal % kThreads == 0, "every thread copies the same number of chunks");
  if constexpr (kThreads % Tile::kChunks == 0 && (kThreads / Tile::kChunks) % 8 == 0) {
    constexpr int kRowStep = kThreads / Tile::kChunks;
    const int row0 = tid / Tile::kChunks, col = (tid % Tile::kChunks) * 8;
    const T* src = g + row0 * ld + col;
    T* dst = s + Tile::at(row0, col);
#pragma unroll
    for (int it = 0; it < kTotal / kThreads; ++it) {
      const bool valid = row0 + it * kRowStep < n_valid;
      mma::cp_async_16(dst + it * kRowStep * Tile::kCols, valid ? src : g, valid);
      src += kRowStep * ld;
    }
  } else {
#pragma unroll
    for (int it = 0; it < kTotal / kThreads; ++it) {
      const int c = it * kThreads + tid;
      const int row = c / Tile::kChunks, chunk = c % Tile::kChunks;
      const bool valid = row < n_valid;
      mma::cp_async_16(s + Tile::at(row, chunk * 8), g + (valid ? row * ld : 0) + chunk * 8, valid);
    }
  }
}

// Rows [0, min(n_valid, kRows)) of tile `s` to global memory, one 16-byte store per chunk: a
// warp writes whole row segments, so stores coalesce whatever the row stride.
template <class Tile, int kThreads, class T>
__device__ __forceinline__ void store_tile(T* g, int64_t ld, const T* s, int n_valid, int tid) {
  constexpr int kTotal = Tile::kRows * Tile::kChunks;
  static_assert(kTotal % kThreads == 0, "every thread stores the same number of chunks");
#pragma unroll
  for (int it = 0; it < kTotal / kThreads; ++it) {
    const int c = it * kThreads + tid;
    const int row = c / Tile::kChunks, chunk = c % Tile::kChunks;
    if (row < n_valid) {
      const uint4 x = *reinterpret_cast<const uint4*>(s + Tile::at(row, chunk * 8));
      *reinterpret_cast<uint4*>(g + row * ld + chunk * 8) = x;
    }
  }
}

// ---- fragments ----------------------------------------------------------------------------------
// Lane l = 8q + r addresses row r of 8x8 matrix q; the matrix order is the register order of the
// fragment (A: a0..a3 = (m lo, k lo), (m hi, k lo), (m lo, k hi), (m hi, k hi); B of two n8
// tiles: (n lo, k lo), (n lo, k hi), (n hi, k lo), (n hi, k hi)). A lane's ldmatrix addresses in
// one product differ from its first by a compile-time row offset (a multiple of 8, so the row's
// swizzle key is unchanged) and a compile-time chunk offset c. When the chunk count is a power of
// two and c shares no bit with the lane's own chunk index, the swizzled address is
//   (base ^ (c << 4)) + row_offset · row_bytes
// — one LOP3 and an immediate offset per ldmatrix, and one live register per operand. Other
// tiles (96 columns) recompute the swizzle per address.
template <class Tile, bool kPow2 = (Tile::kChunks & (Tile::kChunks - 1)) == 0>
struct LaneAddr;

template <class Tile>
struct LaneAddr<Tile, true> {
  static constexpr bool kXor = true;
  uint32_t base;  // shared address of (row, chunk), swizzled, plus `elem` 16-bit elements
  __device__ __forceinline__ LaneAddr(uint32_t tile, int row, int chunk, int elem = 0)
      : base(tile + row * Tile::kCols * 2 + (Tile::swizzle(row, chunk) << 4) + 2 * elem) {}
  __device__ __forceinline__ uint32_t operator()(int row_offset, int chunk_offset) const {
    return (base ^ (chunk_offset << 4)) + row_offset * Tile::kCols * 2;
  }
  // The same lane position in a tile `bytes` further on (a double buffer's other half).
  __device__ __forceinline__ LaneAddr shifted(uint32_t bytes) const { return LaneAddr(base + bytes); }
  // Keeps the compiler from hoisting the per-address XORs out of the main loop (they would take
  // a register each); called once per product.
  __device__ __forceinline__ LaneAddr pinned() const { return LaneAddr(ptx::opaque(base)); }

 private:
  __device__ __forceinline__ explicit LaneAddr(uint32_t b) : base(b) {}
};

template <class Tile>
struct LaneAddr<Tile, false> {
  static constexpr bool kXor = false;
  // The swizzle permutes chunks only within aligned groups of kGroup, so a chunk kGroup·m further
  // on is kGroup·m further on after swizzling too: one base per residue of the chunk offset
  // modulo kGroup, and every address is a base plus an immediate. Chunk offsets are even (whole
  // k16 steps, m16 tiles, n16 pairs: 2 chunks each), so kGroup / 2 bases (2 at 96 columns).
  static constexpr int kGroup = Tile::kChunks % 8 == 0 ? 8 : 4;
  uint32_t base[kGroup / 2];  // shared address of (row, chunk + 2j), swizzled, plus `elem`
  __device__ __forceinline__ LaneAddr(uint32_t tile, int row, int chunk, int elem = 0) {
#pragma unroll
    for (int j = 0; j < kGroup / 2; ++j)
      base[j] = tile + row * Tile::kCols * 2 + (Tile::swizzle(row, chunk + 2 * j) << 4) + 2 * elem;
  }
  __device__ __forceinline__ uint32_t operator()(int row_offset, int chunk_offset) const {
    return base[(chunk_offset % kGroup) / 2] + ((chunk_offset / kGroup * kGroup) << 4) + row_offset * Tile::kCols * 2;
  }
  __device__ __forceinline__ LaneAddr shifted(uint32_t bytes) const {
    LaneAddr r = *this;
#pragma unroll
    for (int j = 0; j < kGroup / 2; ++j) r.base[j] += bytes;
    return r;
  }
  __device__ __forceinline__ LaneAddr pinned() const {
    LaneAddr r = *this;
#pragma unroll
    for (int j = 0; j < kGroup / 2; ++j) r.base[j] = ptx::opaque(base[j]);
    return r;
  }
};

// Lane addresses of the four operand roles, for a warp whose tiles start at m_base / n_base.
// A from a tile stored (m, k): rows m_base + 16 mt + (l % 16), chunks 2 kk + l / 16.
template <class Tile>
__device__ __forceinline__ LaneAddr<Tile> lane_a(uint32_t tile, int m_base, int lane) {
  return LaneAddr<Tile>(tile, m_base + (lane & 15), lane >> 4);
}
// A from a tile stored (k, m) (ldmatrix.trans): rows 16 kk + 8 (q / 2) + r, chunks m_base/8 + 2 mt + q % 2.
template <class Tile>
__device__ __forceinline__ LaneAddr<Tile> lane_a_t(uint32_t tile, int m_base, int lane) {
  const int q = lane >> 3, r = lane & 7;
  return LaneAddr<Tile>(tile, ((q >> 1) << 3) + r, (m_base >> 3) + (q & 1));
}
// B from a tile stored (n, k): rows n_base + 16 p + 8 (q / 2) + r, chunks 2 kk + q % 2.
template <class Tile>
__device__ __forceinline__ LaneAddr<Tile> lane_b(uint32_t tile, int n_base, int lane) {
  const int q = lane >> 3, r = lane & 7;
  return LaneAddr<Tile>(tile, n_base + ((q >> 1) << 3) + r, q & 1);
}
// B from a tile stored (k, n) (ldmatrix.trans): rows 16 kk + 8 (q % 2) + r, chunks n_base/8 + 2 p + q / 2.
template <class Tile>
__device__ __forceinline__ LaneAddr<Tile> lane_b_t(uint32_t tile, int n_base, int lane) {
  const int q = lane >> 3, r = lane & 7;
  return LaneAddr<Tile>(tile, ((q & 1) << 3) + r, (n_base >> 3) + (q >> 1));
}

template <int N>
constexpr bool is_pow2() {
  return N > 0 && (N & (N - 1)) == 0;
}

// B fragments of the n8 tiles 2p and 2p + 1 at k step kk (one ldmatrix.x4).
template <bool kRowsAreK, class Tile>
__device__ __forceinline__ void load_b_pair(uint32_t (&b0)[2], uint32_t (&b1)[2], const LaneAddr<Tile>& fb, int p,
                                            int kk) {
  uint32_t x[4];
  if constexpr (kRowsAreK) {
    ptx::ldsm_x4_trans(x, fb(16 * kk, 2 * p));
  } else {
    ptx::ldsm_x4(x, fb(16 * p, 2 * kk));
  }
  b0[0] = x[0], b0[1] = x[1], b1[0] = x[2], b1[1] = x[3];
}

// Accumulator tiles -> 16-bit elements of the tile at shared address `tile` (times `mul`). Lane
// (g, t) holds rows g and g + 8, columns 2t, 2t + 1 of each 16 x 8 tile: one 32-bit store per row,
// 8 rows x 16 B per warp-wide store, conflict-free under the swizzle.
template <class Tile, class T, int MT, int NT>
__device__ __forceinline__ void store_acc(uint32_t tile, const float (&acc)[MT][NT][4], int m_base, int n_base,
                                          int lane, float mul) {
  if constexpr (LaneAddr<Tile>::kXor) {
    static_assert(is_pow2<NT>(), "n tiles per warp a power of two");
    const LaneAddr<Tile> c = LaneAddr<Tile>(tile, m_base + (lane >> 2), n_base >> 3, 2 * (lane & 3)).pinned();
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        ptx::sts_u32(c(16 * mt, nt), mma::pack2<T>(mul * acc[mt][nt][0], mul * acc[mt][nt][1]));
        ptx::sts_u32(c(16 * mt + 8, nt), mma::pack2<T>(mul * acc[mt][nt][2], mul * acc[mt][nt][3]));
      }
  } else {
    // Odd chunk offsets here (one per n8 tile); only epilogues store to such tiles.
    const int row = m_base + (lane >> 2), col = n_base + 2 * (lane & 3);
#pragma unroll
    for (int mt = 0; mt < MT; ++mt)
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        ptx::sts_u32(tile + 2 * Tile::at(row + 16 * mt, col + 8 * nt),
                     mma::pack2<T>(mul * acc[mt][nt][0], mul * acc[mt][nt][1]));
        ptx::sts_u32(tile + 2 * Tile::at(row + 16 * mt + 8, col + 8 * nt),
                     mma::pack2<T>(mul * acc[mt][nt][2], mul * acc[mt][nt][3]));
      }
  }
}

// The same for accumulators already rounded to 16-bit pairs (r[..][0]: row g, r[..][1]: row g + 8).
template <class Tile, int MT, int NT>
__device__ __forceinline__ void store_pairs(uint32_t tile, const uint32_t (&r)[MT][NT][2], int m_base, int n_base,
                                            int lane) {
  static_assert(LaneAddr<Tile>::kXor && is_pow2<NT>(), "P tiles: power-of-two chunks and n tiles per warp");
  const LaneAddr<Tile> c = LaneAddr<Tile>(tile, m_base + (lane >> 2), n_base >> 3, 2 * (lane & 3)).pinned();
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      ptx::sts_u32(c(16 * mt, nt), r[mt][nt][0]);
      ptx::sts_u32(c(16 * mt + 8, nt), r[mt][nt][1]);
    }
}

// ---- products -----------------------------------------------------------------------------------

// acc += A · B over k in [0, kK), both operands in shared memory: A (rows of the warp's m tiles)
// from a tile stored (k, m) when kARowsAreK, else (m, k); B (the warp's n tiles) from a tile
// stored (k, n) when kBRowsAreK, else (n, k). Per k16 step: MT + NT/2 ldmatrix.x4, MT·NT mma.
template <int kK, bool kARowsAreK, bool kBRowsAreK, class T, class TileA, class TileB, int MT, int NT>
__device__ __forceinline__ void gemm_ss(float (&acc)[MT][NT][4], LaneAddr<TileA> fa, LaneAddr<TileB> fb) {
  static_assert(kK % 16 == 0, "whole k16 steps");
  static_assert(NT % 2 == 0, "B fragments load in n16 pairs");
  // Chunk offsets 2 mt / 2 p must not overlap the warp's own chunk offset (a multiple of 2·MT /
  // NT) for the XOR addressing to hold.
  static_assert(!kARowsAreK || is_pow2<MT>() || !LaneAddr<TileA>::kXor, "m tiles per warp a power of two");
  static_assert(!kBRowsAreK || is_pow2<NT>() || !LaneAddr<TileB>::kXor, "n tiles per warp a power of two");
  fa = fa.pinned();
  fb = fb.pinned();
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk) {
    uint32_t a[MT][4];
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
      if constexpr (kARowsAreK) {
        ptx::ldsm_x4_trans(a[mt], fa(16 * kk, 2 * mt));
      } else {
        ptx::ldsm_x4(a[mt], fa(16 * mt, 2 * kk));
      }
    }
    // B pair by pair, each used at once: the fragments of a wide warp tile are never all live.
#pragma unroll
    for (int p = 0; p < NT / 2; ++p) {
      uint32_t b0[2], b1[2];
      load_b_pair<kBRowsAreK>(b0, b1, fb, p, kk);
#pragma unroll
      for (int mt = 0; mt < MT; ++mt) {
        mma::mma_16816<T>(acc[mt][2 * p], a[mt], b0, acc[mt][2 * p]);
        mma::mma_16816<T>(acc[mt][2 * p + 1], a[mt], b1, acc[mt][2 * p + 1]);
      }
    }
  }
}

// acc (one m16 row of tiles) += A · B with A already in registers, one fragment per k16 step.
template <int kK, bool kBRowsAreK, class T, class TileB, int NT>
__device__ __forceinline__ void gemm_rs(float (&acc)[1][NT][4], const uint32_t (&a)[kK / 16][4], LaneAddr<TileB> fb) {
  static_assert(NT % 2 == 0, "B fragments load in n16 pairs");
  fb = fb.pinned();
#pragma unroll
  for (int kk = 0; kk < kK / 16; ++kk)
#pragma unroll
    for (int p = 0; p < NT / 2; ++p) {
      uint32_t b0[2], b1[2];
      load_b_pair<kBRowsAreK>(b0, b1, fb, p, kk);
      mma::mma_16816<T>(acc[0][2 * p], a[kk], b0, acc[0][2 * p]);
      mma::mma_16816<T>(acc[0][2 * p + 1], a[kk], b1, acc[0][2 * p + 1]);
    }
}

// The C layout of the n8 tiles 2kk and 2kk + 1, rounded to 16 bits, is the A layout of the k16
// step kk (rows g / g + 8, columns 2t.. and 2t + 8..): a row of accumulators becomes the A operand
// of the next product without leaving registers.
template <class T, int NT>
__device__ __forceinline__ void acc_to_a(uint32_t (&a)[NT / 2][4], const float (&acc)[1][NT][4]) {
#pragma unroll
  for (int kk = 0; kk < NT / 2; ++kk) {
    a[kk][0] = mma::pack2<T>(acc[0][2 * kk][0], acc[0][2 * kk][1]);
    a[kk][1] = mma::pack2<T>(acc[0][2 * kk][2], acc[0][2 * kk][3]);
    a[kk][2] = mma::pack2<T>(acc[0][2 * kk + 1][0], acc[0][2 * kk + 1][1]);
    a[kk][3] = mma::pack2<T>(acc[0][2 * kk + 1][2], acc[0][2 * kk + 1][3]);
  }
}

template <int MT, int NT>
__device__ __forceinline__ void zero(float (&acc)[MT][NT][4]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt)
#pragma unroll
    for (int nt = 0; nt < NT; ++nt)
#pragma unroll
      for (int r = 0; r < 4; ++r) acc[mt][nt][r] = 0.f;
}

}  // namespace mma_bwd
}  // namespace flashattn

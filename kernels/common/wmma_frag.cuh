// Loading nvcuda::wmma 16x16x16 operand fragments from padded shared tiles (common/wmma_tile.cuh),
// either through wmma::load_matrix_sync or with ldmatrix.
//
// In short: the ldmatrix loaders rely on an element mapping the CUDA documentation does not give.
// A start-up self-test (ldsm_fragments_verified) confirms it per device and dtype, and a kernel
// that uses them keeps a load_matrix_sync instantiation to fall back on when it does not hold.
//
// Why. For bf16, load_matrix_sync compiles to four generic 32-bit loads (LD.E, 64-bit addresses)
// per fragment, and a row-major B (V in P·V) adds four MOVM transposes: 8 instructions where
// ldmatrix needs 1, all in the shared-memory pipe. For fp16 it does use ldmatrix (LDSM.x4, .trans
// for a row-major B), but recomputes every fragment's address (an IADD3 and a move per LDSM in the
// P·V loop) where a per-lane offset plus an immediate would do. The bytes are the same; the issue
// slots, the MIO queue and the registers are not.
//
// What is assumed, and how it is checked. The CUDA documentation leaves the element -> (row,
// column) map of a wmma fragment unspecified. On sm_80 and sm_90, wmma m16n16k16 compiles to two
// mma.m16n8k16, and the SASS shows the fragment's registers used in the order of the mma.sync
// operand layout (PTX ISA, "Matrix Fragments for mma.m16n8k16"):
//   matrix_a (row-major):  r0 = A[0:8, 0:8]   r1 = A[8:16, 0:8]   r2 = A[0:8, 8:16]   r3 = A[8:16, 8:16]
//   matrix_b (either):     r0 = B[0:8, 0:8]   r1 = B[8:16, 0:8]   r2 = B[0:8, 8:16]   r3 = B[8:16, 8:16]
// with B indexed (k, n), each 8x8 block in ldmatrix's distribution (lane 4g + t holds row g,
// elements 2t and 2t+1; B's blocks transposed, i.e. column n = g, k = 2t, 2t+1). That is exactly
// what ldmatrix.x4 delivers (.trans for a row-major B), given the right row address per lane. A
// bf16 fragment is those four registers; an fp16 one declares eight (the sm_70 layout) of which
// the sm_80+ mma reads four; the loader fills the first four and copies them into the rest.
// Because all of this is an assumption, ldsm_fragments_verified() runs a one-warp self-test once
// per device and dtype: it loads the same tiles through load_matrix_sync and through ldmatrix and
// compares the products mma_sync computes from them (exact small integers, bit for bit), and for
// bf16 the registers too. Kernels instantiate both loaders (kLdsm = true / false) and the host
// launches the ldmatrix one only when the test passed.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <mma.h>

#include <cstdint>
#include <cstdio>
#include <type_traits>

#include "common/mma_sm80.cuh"
#include "common/wmma_tile.cuh"
#include "flashattn/check.h"

namespace flashattn {
namespace wmma_frag {

namespace wmma = nvcuda::wmma;
using wmma_tile::AccFrag;
using wmma_tile::FragA;
using wmma_tile::FragB;
using wmma_tile::FragBT;

template <class T>
constexpr bool kIsBf16 = std::is_same<T, __nv_bfloat16>::value;

// The first four 32-bit registers of an operand fragment: all of a bf16 one, the half of an fp16
// one that the sm_80+ mma reads (see above; the self-test checks it).
template <class Frag>
__device__ __forceinline__ uint32_t (&regs(Frag& f))[4] {
  static_assert(sizeof(f.x) == 16 || sizeof(f.x) == 32, "a 16x16x16 operand fragment of 16-bit elements");
  return *reinterpret_cast<uint32_t(*)[4]>(f.x);
}
// fp16: mirror the four registers into the upper four, so no register of the fragment is left
// undefined (dead code where the mma ignores them).
template <class Frag>
__device__ __forceinline__ void mirror_upper(Frag& f) {
  if constexpr (sizeof(f.x) == 32) {
    uint32_t* r = reinterpret_cast<uint32_t*>(f.x);
#pragma unroll
    for (int i = 0; i < 4; ++i) r[4 + i] = r[i];
  }
}

// Per-lane element offsets of the row each lane hands to ldmatrix.x4 (ldm: tile pitch, elements).
// Lanes 8q..8q+7 address the 8 rows of 8x8 block q of the register order above.
//   A (m, k) row-major and B (k, n) row-major (.trans): block q = (rows 8(q&1).., cols 8(q>>1)..)
//   B as K (n, k) row-major (col-major B):              block q = (rows 8(q>>1).., cols 8(q&1)..)
__device__ __forceinline__ int lane_offset_rows_first(int lane, int ldm) { return (lane & 15) * ldm + (lane >> 4) * 8; }
__device__ __forceinline__ int lane_offset_cols_first(int lane, int ldm) {
  return ((lane & 7) + ((lane >> 4) << 3)) * ldm + ((lane >> 3) & 1) * 8;
}

// A 16x16 row-major tile at p (pitch ldm) as matrix_a. `lane_off` = lane_offset_rows_first().
template <bool kLdsm, class T>
__device__ __forceinline__ void load_a(FragA<T>& f, const T* p, int ldm, int lane_off) {
  if constexpr (kLdsm) {
    mma::ldmatrix_x4(regs(f), p + lane_off);
    mirror_upper(f);
  } else {
    wmma::load_matrix_sync(f, p, ldm);
  }
}

// Rows n of a row-major (n, k) tile at p as the col-major matrix_b (K^T in Q·K^T).
// `lane_off` = lane_offset_cols_first().
template <bool kLdsm, class T>
__device__ __forceinline__ void load_bt(FragBT<T>& f, const T* p, int ldm, int lane_off) {
  if constexpr (kLdsm) {
    mma::ldmatrix_x4(regs(f), p + lane_off);
    mirror_upper(f);
  } else {
    wmma::load_matrix_sync(f, p, ldm);
  }
}

// A row-major (k, n) tile at p as the row-major matrix_b (V in P·V). `lane_off` = lane_offset_rows_first().
template <bool kLdsm, class T>
__device__ __forceinline__ void load_b(FragB<T>& f, const T* p, int ldm, int lane_off) {
  if constexpr (kLdsm) {
    mma::ldmatrix_x4_trans(regs(f), p + lane_off);
    mirror_upper(f);
  } else {
    wmma::load_matrix_sync(f, p, ldm);
  }
}

// Internal linkage: every translation unit that includes this gets its own test and cache.
namespace {

// Per dtype: 0 = ldmatrix and load_matrix_sync agree; otherwise a bit per fragment kind that differs.
__device__ int g_ldsm_mismatch[2];

template <class T>
__device__ __forceinline__ bool same(const AccFrag& x, const AccFrag& y) {
  bool ok = true;
#pragma unroll
  for (int i = 0; i < AccFrag::num_elements; ++i) ok = ok && __float_as_uint(x.x[i]) == __float_as_uint(y.x[i]);
  return ok;
}

// One warp. Two 16 x 24 tiles (pitch 24: padded like the kernels' tiles) of distinct small
// integers, exact in both 16-bit types and in every fp32 sum of products, so any permutation of
// elements changes a product. Each fragment kind is loaded both ways and multiplied by the other
// operand loaded the reference way; bf16 registers are compared too.
template <class T>
__global__ void ldsm_selftest_kernel(int slot) {
  constexpr int kPitch = 24;
  __shared__ __align__(128) T tile_x[16 * kPitch], tile_y[16 * kPitch];
  const int lane = threadIdx.x;
  for (int i = lane; i < 16 * kPitch; i += 32) {
    const int r = i / kPitch, c = i % kPitch % 16;
    tile_x[i] = static_cast<T>(static_cast<float>((r * 16 + c) % 61));
    tile_y[i] = static_cast<T>(static_cast<float>((r * 7 + c * 3) % 53));
  }
  __syncwarp();
  const int rows_first = lane_offset_rows_first(lane, kPitch), cols_first = lane_offset_cols_first(lane, kPitch);
  bool ok_a = true, ok_bt = true, ok_b = true;
  FragA<T> a_ref, a_got;
  FragBT<T> bt_ref, bt_got;
  FragB<T> b_ref, b_got;
  wmma::load_matrix_sync(a_ref, tile_x, kPitch);
  wmma::load_matrix_sync(bt_ref, tile_y, kPitch);
  wmma::load_matrix_sync(b_ref, tile_y, kPitch);
  load_a<true>(a_got, tile_x, kPitch, rows_first);
  load_bt<true>(bt_got, tile_y, kPitch, cols_first);
  load_b<true>(b_got, tile_y, kPitch, rows_first);
  AccFrag ref, got;
  wmma::fill_fragment(ref, 0.f);
  wmma::fill_fragment(got, 0.f);
  wmma::mma_sync(ref, a_ref, bt_ref, ref);
  wmma::mma_sync(got, a_got, bt_ref, got);  // A
  ok_a = same<T>(ref, got);
  wmma::fill_fragment(got, 0.f);
  wmma::mma_sync(got, a_ref, bt_got, got);  // K^T
  ok_bt = same<T>(ref, got);
  wmma::fill_fragment(ref, 0.f);
  wmma::fill_fragment(got, 0.f);
  wmma::mma_sync(ref, a_ref, b_ref, ref);
  wmma::mma_sync(got, a_ref, b_got, got);   // V
  ok_b = same<T>(ref, got);
  if constexpr (kIsBf16<T>) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      ok_a = ok_a && regs(a_ref)[i] == regs(a_got)[i];
      ok_bt = ok_bt && regs(bt_ref)[i] == regs(bt_got)[i];
      ok_b = ok_b && regs(b_ref)[i] == regs(b_got)[i];
    }
  }
  const int bad = (__all_sync(0xffffffffu, ok_a) ? 0 : 1) | (__all_sync(0xffffffffu, ok_bt) ? 0 : 2) |
                  (__all_sync(0xffffffffu, ok_b) ? 0 : 4);
  if (lane == 0) g_ldsm_mismatch[slot] = bad;
}

// Whether ldmatrix builds fragments of type T that mma_sync treats as load_matrix_sync's on
// `device` (sm_80+). Runs the self-test on `stream` the first time a device and dtype are asked
// (one tiny launch and a sync, during a kernel's first, untimed call); the answer is cached.
template <class T>
bool ldsm_fragments_verified(int device, cudaStream_t stream) {
  constexpr int kMaxDevices = 64;
  constexpr int kSlot = kIsBf16<T> ? 1 : 0;
  static signed char state[kMaxDevices] = {};  // 0: not tested, 1: verified, -1: refuted
  if (device < 0 || device >= kMaxDevices) return false;
  if (state[device] == 0) {
    ldsm_selftest_kernel<T><<<1, 32, 0, stream>>>(kSlot);
    CHECK_LAUNCH("wmma ldsm_selftest_kernel");
    int mismatch[2] = {-1, -1};
    CUDA_CHECK(cudaMemcpyFromSymbolAsync(mismatch, g_ldsm_mismatch, sizeof(mismatch), 0, cudaMemcpyDeviceToHost,
                                         stream));
    CUDA_CHECK(cudaStreamSynchronize(stream));
    state[device] = mismatch[kSlot] == 0 ? 1 : -1;
    // Correct either way, but slower: say so once, so a benchmark is not misread.
    if (mismatch[kSlot] != 0)
      std::fprintf(stderr,
                   "wmma: ldmatrix-built %s fragments differ from load_matrix_sync on device %d (kinds %d); "
                   "using load_matrix_sync\n",
                   kIsBf16<T> ? "bf16" : "fp16", device, mismatch[kSlot]);
  }
  return state[device] == 1;
}

}  // namespace

}  // namespace wmma_frag
}  // namespace flashattn

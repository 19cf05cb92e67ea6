// The shared-memory tiled fp32 GEMM of the `tiled` kernel (rung 3) and the attention pieces its
// forward and backward files share. One template serves all seven products of the two passes:
//
//   C (M x N) = sum over rounds r of op(A_r) (M x K) . op(B_r) (K x N)       for every (b, c)
//
// op(A) = A, or A^T when kTransA (the memory then holds a K x M matrix), likewise for B; "rounds"
// sum several query heads into one kv-head output (GQA dK/dV) inside the reduction, so no atomics.
// The epilogue is a `Stage`: a small struct that bounds the reduction and consumes the output,
//   IndexRange k_range(int64_t b, int c, int m0, int m_end, int n0, int n_end) const;
//     the reduction indices that can contribute to output tile [m0, m_end) x [n0, n_end); an
//     empty range skips the main loop (the tile is invisible) and hands the stage zeros;
//   void store(int64_t b, int c, int m, int n, float4 v) const;
//     C[m, n .. n+3] = v; n is a multiple of 4 and < N, columns >= N are the stage's to drop.
//
// Block: a (kBlockM, kBlockN) output tile; the reduction is staged through shared memory kBlockK =
// 8 at a time (double buffered, the next slice prefetched into registers while the current one is
// multiplied); each thread owns an 8x8 micro-tile, which is two 4x4 quadrants half a tile apart
// so that its shared-memory reads are float4 (LDS.128) and its output rows are written as
// 16-byte chunks that neighbouring threads continue (coalesced).
#pragma once

#include <cuda_runtime.h>

#include <climits>
#include <cmath>
#include <cstdint>
#include <string>

#include "common/mask.cuh"
#include "flashattn/check.h"
#include "flashattn/error.h"
#include "flashattn/params.h"

namespace flashattn {
namespace tiled {

template <int kBlockM_, int kBlockN_, int kMinBlocks_>
struct GemmTile {
  static constexpr int kBlockM = kBlockM_;
  static constexpr int kBlockN = kBlockN_;
  // 8 keeps the transposing smem stores conflict-free (see TileLoader) and a slice small enough
  // to double buffer in 17 KB.
  static constexpr int kBlockK = 8;
  static constexpr int kMicro = 8;  // 8x8 outputs per thread: 64 FFMA per 4 LDS.128
  static constexpr int kThreadsN = kBlockN / kMicro;
  static constexpr int kThreadsM = kBlockM / kMicro;
  static constexpr int kThreads = kThreadsM * kThreadsN;
  static constexpr int kMinBlocks = kMinBlocks_;  // __launch_bounds__: caps registers at 128
  // A row of kBlockX + 4 floats shifts each k-row by 4 banks: a warp's transposing stores (4 or 8
  // consecutive x at 8 different k) hit 32 distinct banks, and rows stay 16-byte aligned.
  static constexpr int kPad = 4;
  static_assert(kBlockM % 32 == 0 && kBlockN % 32 == 0, "the padding argument needs rows of 32k floats");
  static_assert(kThreads % 32 == 0 && kThreads % kBlockK == 0, "whole warps, whole k-slices");
  static_assert((kBlockM * kBlockK) % kThreads == 0 && (kBlockN * kBlockK) % kThreads == 0,
                "every thread loads the same number of elements");
};

// S-shaped products (M = S_q, N = S_k, K = D): 256 threads, two blocks per SM.
using ScoreTile = GemmTile<128, 128, 2>;
// Products into a head-dim wide output (N = D): one 64-wide column tile covers D <= 64, so P (or
// dS) is read from memory once; 128 threads, four blocks per SM.
using OutputTile = GemmTile<128, 64, 4>;

// One operand of the batched product: entry (b, c) in reduction round r starts at
//   ptr + b*batch + (c / head_div)*head + r*round
// (head_div = G maps a query head to its kv head), and its stored matrix has row stride ld.
struct Operand {
  const float* ptr = nullptr;
  int64_t batch = 0;
  int64_t head = 0;
  int64_t round = 0;
  int head_div = 1;
  int64_t ld = 0;
  __device__ const float* at(int64_t b, int c, int r) const {
    return ptr + b * batch + static_cast<int64_t>(c / head_div) * head + r * round;
  }
};

struct GemmProblem {
  int M = 0, N = 0, K = 0;
  int batch = 0;   // B
  int heads = 0;   // entries per batch index: c in [0, heads)
  int rounds = 1;  // reduction rounds summed into each output
  Operand a, b;
};

// Moves (kRows, kBlockK) slices of one operand from global memory through registers into the
// shared tile s[k][x], x the row (M or N) index. kKContiguous: the stored matrix has k fastest
// (element (x, k) at x*ld + k), else x fastest (k*ld + x). Each load instruction of a warp
// touches as few 128-byte lines as the layout allows, and each touched sector entirely:
//   k fastest: 4 rows x 8 k (four whole 32-byte sectors); a thread's elements are kRowStep rows
//     apart. The transposing smem stores are conflict-free thanks to the 4-float row padding.
//   x fastest: 32 consecutive x of one k-row (one line); a warp owns kLoads consecutive 32-wide
//     chunks of the slice, so a thread's elements lie in only kLoads / kChunks k-rows.
template <int kRows, int kThreads, int kBlockK, bool kKContiguous>
struct TileLoader {
  static constexpr int kLoads = kRows * kBlockK / kThreads;
  static constexpr int kRowStep = kThreads / kBlockK;  // k fastest: x between elements
  static constexpr int kChunks = kRows / 32;           // x fastest: 32-wide chunks per k-row
  static_assert(kRows % 32 == 0 && kThreads % kBlockK == 0, "whole chunks, whole rows");
  static_assert(kKContiguous || kLoads % kChunks == 0, "a warp's chunks cover whole k-rows");

  // Element p of this thread, relative to element 0.
  __device__ static constexpr int dx(int p) { return kKContiguous ? p * kRowStep : (p % kChunks) * 32; }
  __device__ static constexpr int dk(int p) { return kKContiguous ? 0 : p / kChunks; }

  const float* ptr;  // element 0 of this thread in the current slice
  int64_t ld;
  int x0_rel, k0_rel;  // element 0 within the slice
  int x_left;          // x_end - x0: rows (or columns) of the tile that exist

  __device__ TileLoader(const float* base, int64_t ld_, int x0, int x_end, int k_begin) : ld(ld_) {
    const int t = threadIdx.x;
    x0_rel = kKContiguous ? t / kBlockK : t % 32;
    k0_rel = kKContiguous ? t % kBlockK : (t / 32) * (kLoads / kChunks);
    const int64_t gx = x0 + x0_rel, gk = k_begin + k0_rel;
    ptr = base + (kKContiguous ? gx * ld + gk : gk * ld + gx);
    x_left = x_end - x0;
  }

  // Slice starting at reduction index k0; elements past x_end or k_end load as 0, so tails need
  // no special case.
  __device__ void load(int k0, int k_end, float (&r)[kLoads]) const {
#pragma unroll
    for (int p = 0; p < kLoads; ++p) {
      const bool ok = x0_rel + dx(p) < x_left && k0 + k0_rel + dk(p) < k_end;
      const int64_t offset = kKContiguous ? dx(p) * ld : dk(p) * ld + dx(p);
      r[p] = ok ? ptr[offset] : 0.f;
    }
  }
  __device__ int64_t advance() const { return kKContiguous ? kBlockK : kBlockK * ld; }
  __device__ void next() { ptr += advance(); }
  // From the last slice of a round to the first slice of the next one.
  __device__ void next_round(int k_tiles, int64_t round) { ptr += round - (k_tiles - 1) * advance(); }

  template <int kStride>
  __device__ void store(float (*s)[kStride], const float (&r)[kLoads]) const {
#pragma unroll
    for (int p = 0; p < kLoads; ++p) s[k0_rel + dk(p)][x0_rel + dx(p)] = r[p];
  }
};

template <class Tile, bool kTransA, bool kTransB, class Stage>
__global__ void __launch_bounds__(Tile::kThreads, Tile::kMinBlocks)
    gemm_kernel(const GemmProblem prob, const Stage stage) {
  constexpr int kBlockM = Tile::kBlockM, kBlockN = Tile::kBlockN, kBlockK = Tile::kBlockK;
  constexpr int kThreads = Tile::kThreads;
  using LoadA = TileLoader<kBlockM, kThreads, kBlockK, /*kKContiguous=*/!kTransA>;
  using LoadB = TileLoader<kBlockN, kThreads, kBlockK, /*kKContiguous=*/kTransB>;
  __shared__ __align__(16) float sA[2][kBlockK][kBlockM + Tile::kPad];  // (kBlockK, kBlockM) x 2
  __shared__ __align__(16) float sB[2][kBlockK][kBlockN + Tile::kPad];  // (kBlockK, kBlockN) x 2

  const int tiles_n = (prob.N + kBlockN - 1) / kBlockN;
  const int m0 = static_cast<int>(blockIdx.x / tiles_n) * kBlockM;  // n fastest: neighbours share A
  const int n0 = static_cast<int>(blockIdx.x % tiles_n) * kBlockN;
  const int m_end = min(m0 + kBlockM, prob.M), n_end = min(n0 + kBlockN, prob.N);
  const int c = blockIdx.y;
  const int64_t b = blockIdx.z;
  const int tx = threadIdx.x % Tile::kThreadsN, ty = threadIdx.x / Tile::kThreadsN;

  const IndexRange kr = stage.k_range(b, c, m0, m_end, n0, n_end);
  const int k_begin = static_cast<int>(kr.begin > 0 ? kr.begin : 0);
  const int k_end = static_cast<int>(kr.end < prob.K ? kr.end : prob.K);
  const int k_tiles = k_end > k_begin ? (k_end - k_begin + kBlockK - 1) / kBlockK : 0;

  float acc[8][8];  // (8, 8) micro-tile: rows ty*4 + {0..3} and +kBlockM/2, cols likewise
#pragma unroll
  for (int i = 0; i < 8; ++i)
#pragma unroll
    for (int j = 0; j < 8; ++j) acc[i][j] = 0.f;

  // The reduction is k_tiles slices in each of the rounds, one pipeline over all of them.
  const int total = k_tiles * prob.rounds;
  LoadA load_a(prob.a.at(b, c, 0), prob.a.ld, m0, m_end, k_begin);
  LoadB load_b(prob.b.at(b, c, 0), prob.b.ld, n0, n_end, k_begin);
  float rA[LoadA::kLoads], rB[LoadB::kLoads];
  if (total > 0) {
    load_a.load(k_begin, k_end, rA);
    load_b.load(k_begin, k_end, rB);
    load_a.store(sA[0], rA);
    load_b.store(sB[0], rB);
  }
  __syncthreads();
  int kt = 0;  // slice within the current round
  for (int t = 0; t < total; ++t) {
    const int buf = t & 1;
    const bool more = t + 1 < total;
    if (more) {  // global loads in flight during the FFMAs below
      if (++kt == k_tiles) {  // next round: the group's next query head
        kt = 0;
        load_a.next_round(k_tiles, prob.a.round);
        load_b.next_round(k_tiles, prob.b.round);
      } else {
        load_a.next();
        load_b.next();
      }
      load_a.load(k_begin + kt * kBlockK, k_end, rA);
      load_b.load(k_begin + kt * kBlockK, k_end, rB);
    }
#pragma unroll
    for (int kk = 0; kk < kBlockK; ++kk) {
      const float4 a_lo = *reinterpret_cast<const float4*>(&sA[buf][kk][ty * 4]);
      const float4 a_hi = *reinterpret_cast<const float4*>(&sA[buf][kk][kBlockM / 2 + ty * 4]);
      const float4 b_lo = *reinterpret_cast<const float4*>(&sB[buf][kk][tx * 4]);
      const float4 b_hi = *reinterpret_cast<const float4*>(&sB[buf][kk][kBlockN / 2 + tx * 4]);
      const float rAk[8] = {a_lo.x, a_lo.y, a_lo.z, a_lo.w, a_hi.x, a_hi.y, a_hi.z, a_hi.w};
      const float rBk[8] = {b_lo.x, b_lo.y, b_lo.z, b_lo.w, b_hi.x, b_hi.y, b_hi.z, b_hi.w};
#pragma unroll
      for (int i = 0; i < 8; ++i)
#pragma unroll
        for (int j = 0; j < 8; ++j) acc[i][j] = fmaf(rAk[i], rBk[j], acc[i][j]);  // C += a b^T
    }
    // The other buffer was last read in iteration t-1, which every thread has left.
    if (more) {
      load_a.store(sA[buf ^ 1], rA);
      load_b.store(sB[buf ^ 1], rB);
    }
    __syncthreads();
  }

#pragma unroll
  for (int i = 0; i < 8; ++i) {
    const int m = m0 + (i < 4 ? ty * 4 + i : kBlockM / 2 + ty * 4 + (i - 4));
    if (m >= m_end) continue;
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int n = n0 + half * (kBlockN / 2) + tx * 4;
      if (n >= n_end) continue;
      const float* v = acc[i] + 4 * half;
      stage.store(b, c, m, n, make_float4(v[0], v[1], v[2], v[3]));
    }
  }
}

// Launches one batched product; `what` names it in a launch failure ("launch of tiled ...").
template <class Tile, bool kTransA, bool kTransB, class Stage>
void launch_gemm(const GemmProblem& prob, const Stage& stage, cudaStream_t stream, const char* what) {
  if (prob.M <= 0 || prob.N <= 0 || prob.batch <= 0 || prob.heads <= 0) return;
  const int64_t tiles = static_cast<int64_t>((prob.M + Tile::kBlockM - 1) / Tile::kBlockM) *
                        ((prob.N + Tile::kBlockN - 1) / Tile::kBlockN);
  if (tiles > INT_MAX) throw RuntimeError(std::string(what) + ": " + std::to_string(tiles) + " output tiles");
  // Entries as (y, z) = (c, b): no realistic H or B reaches the 65535 limit, and blockIdx gives
  // (b, c) without a division.
  if (prob.heads > 65535 || prob.batch > 65535)
    throw RuntimeError(std::string(what) + ": more than 65535 heads or batches");
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(prob.heads),
                  static_cast<unsigned>(prob.batch));
  gemm_kernel<Tile, kTransA, kTransB, Stage><<<grid, Tile::kThreads, 0, stream>>>(prob, stage);
  cuda_launch_check(what, __FILE__, __LINE__);
}

// ----------------------------------------------------------------------------------------------
// Attention pieces shared by tiled_fwd.cu and tiled_bwd.cu.
// ----------------------------------------------------------------------------------------------

// The materialised [B, H, S_q, ld] fp32 score-shaped matrix (S, P or dS). ld = S_k rounded up to a
// multiple of 4 so every row is 16-byte aligned and chunks of 4 are float4 accesses; the padding
// columns hold -inf in S and 0 in P and dS, so row passes need no tail case.
struct ScoreMatrix {
  float* ptr = nullptr;
  int H = 0, S_q = 0;
  int64_t ld = 0;

  static int64_t ld_for(int S_k) { return (static_cast<int64_t>(S_k) + 3) / 4 * 4; }
  static size_t bytes(int B, int H, int S_q, int S_k) {
    return static_cast<size_t>(B) * H * S_q * ld_for(S_k) * sizeof(float);
  }
  FLASHATTN_HD int64_t row_index(int64_t b, int64_t h, int64_t i) const { return (b * H + h) * S_q + i; }
  FLASHATTN_HD float* row(int64_t b, int64_t h, int64_t i) const { return ptr + row_index(b, h, i) * ld; }
  // As a GEMM operand: per-query-head entries, `group` query heads per round step (rounds walk
  // the heads of one kv group: c*group + r).
  Operand operand(int group) const {
    Operand o;
    o.ptr = ptr;
    o.head = static_cast<int64_t>(group) * S_q * ld;
    o.batch = static_cast<int64_t>(H) * S_q * ld;
    o.round = static_cast<int64_t>(S_q) * ld;
    o.ld = ld;
    return o;
  }
};

inline ScoreMatrix score_matrix(void* base, const FwdParams& p) {
  ScoreMatrix s;
  s.ptr = static_cast<float*>(base);
  s.H = p.H;
  s.S_q = p.S_q;
  s.ld = ScoreMatrix::ld_for(p.S_k);
  return s;
}

// A Q/K/V/O-shaped tensor (params.h element strides) as a GEMM operand.
inline Operand tensor_operand(const void* ptr, const Strides& st, int head_div = 1, int64_t round = 0) {
  Operand o;
  o.ptr = static_cast<const float*>(ptr);
  o.batch = st.batch;
  o.head = st.head;
  o.round = round;
  o.head_div = head_div;
  o.ld = st.row;
  return o;
}

// The keys some query of rows [m0, m_end) sees. Both ends of a row's key range are non-decreasing
// in the row index (the window slides right with the diagonal), so the union is the first row's
// begin to the last row's end; rows whose own range is narrower multiply zeros of P.
__device__ inline IndexRange keys_of_rows(const Visibility& vis, int64_t b, int m0, int m_end) {
  const int seqlen = vis.seqlen_k(b);
  IndexRange r{vis.keys(m0, seqlen).begin, vis.keys(m_end - 1, seqlen).end};
  if (r.end > seqlen) r.end = seqlen;  // an empty last row may report end = begin > seqlen
  return r;
}

// The queries that see some key of [m0, m_end); keys at or past seqlen_k see none, which would
// break the monotonicity, so the last key is clamped first.
__device__ inline IndexRange queries_of_keys(const Visibility& vis, int64_t b, int m0, int m_end) {
  const int seqlen = vis.seqlen_k(b);
  const int last = (m_end < seqlen ? m_end : seqlen) - 1;
  if (last < m0) return IndexRange{0, 0};
  IndexRange r{vis.queries(m0, seqlen).begin, vis.queries(last, seqlen).end};
  if (r.end > vis.S_q) r.end = vis.S_q;
  return r;
}

__device__ inline bool overlaps(const IndexRange& r, int n0, int n_end) {
  return (r.begin > n0 ? r.begin : n0) < (r.end < n_end ? r.end : n_end);
}

// s_ij = scale * q_i.k_j + mask_ij, -inf for an invisible key: the S epilogue of the forward and of
// the backward's recomputation, one code path so both see the same scores.
struct ScoreRule {
  Visibility vis;
  float scale = 0.f;
  int D = 0;

  // Score tiles reduce over the head dim: all of it, or nothing when no key of the tile is seen.
  __device__ IndexRange k_range(int64_t b, int m0, int m_end, int n0, int n_end) const {
    return overlaps(keys_of_rows(vis, b, m0, m_end), n0, n_end) ? IndexRange{0, D} : IndexRange{0, 0};
  }
  __device__ float4 scores(int64_t b, int h, int i, int j, float4 qk) const {
    const IndexRange keys = vis.keys(i, vis.seqlen_k(b));
    const float in[4] = {qk.x, qk.y, qk.z, qk.w};
    float s[4];
#pragma unroll
    for (int q = 0; q < 4; ++q) {
      const int64_t jj = j + q;
      s[q] = (jj >= keys.begin && jj < keys.end) ? scale * in[q] + vis.bias(b, h, i, jj) : -INFINITY;
    }
    return make_float4(s[0], s[1], s[2], s[3]);
  }
};

// C -> out[b, c, m, n] * alpha for head-dim-wide outputs (O, dQ, dK, dV) with params.h strides.
// The reduction runs over keys (rows are queries: O, dQ) or over queries (rows are keys: dK, dV)
// and is cut to the visible ones: P and dS are zero elsewhere, and padded keys' V rows stay out.
struct OutputStage {
  float* out = nullptr;
  Strides st;
  int N = 0;
  float alpha = 1.f;
  Visibility vis;
  bool rows_are_keys = false;

  __device__ IndexRange k_range(int64_t b, int, int m0, int m_end, int, int) const {
    return rows_are_keys ? queries_of_keys(vis, b, m0, m_end) : keys_of_rows(vis, b, m0, m_end);
  }
  __device__ void store(int64_t b, int c, int m, int n, float4 v) const {
    float* dst = out + b * st.batch + c * st.head + m * st.row + n;
    const float x[4] = {alpha * v.x, alpha * v.y, alpha * v.z, alpha * v.w};
    // Strides are the caller's: vectorise only where the chunk is whole and aligned.
    if (n + 3 < N && reinterpret_cast<uintptr_t>(dst) % 16 == 0) {
      *reinterpret_cast<float4*>(dst) = make_float4(x[0], x[1], x[2], x[3]);
    } else {
#pragma unroll
      for (int q = 0; q < 4; ++q)
        if (n + q < N) dst[q] = x[q];
    }
  }
};

}  // namespace tiled
}  // namespace flashattn

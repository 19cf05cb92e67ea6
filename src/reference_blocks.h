// The reference's inner loops in blocks (reference.cpp): a block of key rows' dot products with
// query-side rows side by side, and a row's terms added with one load and store per chunk. Every
// sum runs in exactly the order the one-pair-at-a-time definition takes, so the blocks change
// only the time, never a bit of the result.
//
// reference.cpp is compiled once for the target's baseline and, on x86-64, once more with AVX2
// (and without FMA: every product is rounded before its addition, as in the baseline copy); each
// copy includes this header inside its own namespace (FLASHATTN_REFERENCE_COPY), so the two
// sets of blocks, 16-byte vectors and 32-byte ones, never meet. Lanes are independent sums, so
// the width changes the time only.
#pragma once

#ifndef FLASHATTN_REFERENCE_COPY
#error "reference_blocks.h belongs to reference.cpp, which names the copy"
#endif

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

namespace flashattn::reference_copy::FLASHATTN_REFERENCE_COPY::blocks {

// Dot products in blocks: the rows of a block of up to kKeyBlock key (or value) rows, transposed
// into the accumulation type once (bt[d * kKeyBlock + u] = row u's element d; missing rows zero),
// against one query-side row `a` in the same type. Each of the block's sums runs in exactly the
// order of reference.cpp's dot() on that pair alone (fp64: dot_f64's four partial sums; fp32:
// one running sum in element order), so no result depends on the block; but the sums run side by
// side, where one at a time each addition waits for the one before it.
constexpr int kKeyBlock = 8;

template <class Acc>
void transpose_block(const double* const* rows, int count, int n, Acc* bt) {
  for (int d = 0; d < n; ++d)
    for (int u = 0; u < kKeyBlock; ++u) bt[d * kKeyBlock + u] = u < count ? static_cast<Acc>(rows[u][d]) : Acc(0);
}

// The block's sums side by side in vectors (GCC/Clang vector extensions) of the widest width the
// copy is built for: lane u of a vector holds key row u's sum, and each lane's arithmetic is the
// scalar code's (a product, then an addition; no fused multiply-add under ISO C++ without FMA
// enabled). `rows` query-side rows a[r] at once, out[r].
#if defined(__AVX__)
#define FLASHATTN_REFERENCE_VECTOR_BYTES 32
#else
#define FLASHATTN_REFERENCE_VECTOR_BYTES 16
#endif
using f32v = float __attribute__((vector_size(FLASHATTN_REFERENCE_VECTOR_BYTES)));
using f64v = double __attribute__((vector_size(FLASHATTN_REFERENCE_VECTOR_BYTES)));
constexpr int kF32Lanes = sizeof(f32v) / sizeof(float), kF64Lanes = sizeof(f64v) / sizeof(double);
template <class V, class T>
V load_vec(const T* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// fp32: one running sum per pair; R rows share each load of the block (R x kKeyBlock / lanes
// independent chains).
template <int R>
void block_dots_fixed(const float* const* a, const float* bt, int n, float (*out)[kKeyBlock]) {
  constexpr int NV = kKeyBlock / kF32Lanes;  // vectors per row
  static_assert(NV * kF32Lanes == kKeyBlock, "a block is whole vectors");
  f32v s[R][NV] = {};
  for (int d = 0; d < n; ++d) {
    f32v b[NV];
    for (int c = 0; c < NV; ++c) b[c] = load_vec<f32v>(bt + d * kKeyBlock + c * kF32Lanes);
    for (int r = 0; r < R; ++r) {
      const float x = a[r][d];
      for (int c = 0; c < NV; ++c) s[r][c] = s[r][c] + x * b[c];
    }
  }
  for (int r = 0; r < R; ++r) std::memcpy(out[r], s[r], sizeof s[r]);
}
inline void block_dots(const float* const* a, int rows, const float* bt, int n, float (*out)[kKeyBlock]) {
  int r = 0;
  for (; r + 4 <= rows; r += 4) block_dots_fixed<4>(a + r, bt, n, out + r);
  for (; r + 2 <= rows; r += 2) block_dots_fixed<2>(a + r, bt, n, out + r);
  for (; r < rows; ++r) block_dots_fixed<1>(a + r, bt, n, out + r);
}

// fp64: dot_f64's four partial sums (element d into sum d mod 4, the remainder into the first,
// then (s0 + s1) + (s2 + s3)), per half block of four keys: 4 x (4 / lanes) independent chains.
inline void block_dots(const double* const* a, int rows, const double* bt, int n, double (*out)[kKeyBlock]) {
  constexpr int NV = 4 / kF64Lanes;  // vectors per half block
  static_assert(kKeyBlock == 8 && NV * kF64Lanes == 4, "two halves of whole vectors");
  for (int r = 0; r < rows; ++r)
    for (int half = 0; half < 2; ++half) {
      const double* b = bt + half * 4;
      f64v s[4][NV] = {};
      int d = 0;
      for (; d + 4 <= n; d += 4)
        for (int p = 0; p < 4; ++p) {
          const double x = a[r][d + p];
          for (int c = 0; c < NV; ++c) s[p][c] = s[p][c] + x * load_vec<f64v>(b + (d + p) * kKeyBlock + c * kF64Lanes);
        }
      for (; d < n; ++d) {
        const double x = a[r][d];
        for (int c = 0; c < NV; ++c) s[0][c] = s[0][c] + x * load_vec<f64v>(b + d * kKeyBlock + c * kF64Lanes);
      }
      for (int c = 0; c < NV; ++c) {
        const f64v sum = (s[0][c] + s[1][c]) + (s[2][c] + s[3][c]);
        std::memcpy(out[r] + half * 4 + c * kF64Lanes, &sum, sizeof sum);
      }
    }
}

// A row in the accumulation type: fp64 rows are used in place, fp32 ones converted into `buf`.
inline const double* row_in(const double* x, int, std::vector<double>&) { return x; }
inline const float* row_in(const double* x, int n, std::vector<float>& buf) {
  buf.resize(n);
  for (int d = 0; d < n; ++d) buf[d] = static_cast<float>(x[d]);
  return buf.data();
}

// y += alpha[e] * x[e] for e = 0 .. terms-1, with y and the x[e] in the accumulation type: each
// element gets the terms in e order, one product and one addition each (the same arithmetic as
// one axpy per term, in that order), but y is loaded and stored once per chunk, not once per term.
template <class Acc>
void axpy_terms(const Acc* alpha, const Acc* const* x, int terms, Acc* y, int n) {
  using V = std::conditional_t<std::is_same_v<Acc, float>, f32v, f64v>;
  constexpr int L = sizeof(V) / sizeof(Acc), C = 4;  // lanes per vector, vectors per chunk
  int d = 0;
  for (; d + C * L <= n; d += C * L) {
    V acc[C];
    for (int c = 0; c < C; ++c) acc[c] = load_vec<V>(y + d + c * L);
    for (int e = 0; e < terms; ++e) {
      const Acc a = alpha[e];
      for (int c = 0; c < C; ++c) acc[c] = acc[c] + a * load_vec<V>(x[e] + d + c * L);
    }
    std::memcpy(y + d, acc, sizeof acc);
  }
  for (; d < n; ++d) {
    Acc acc = y[d];
    for (int e = 0; e < terms; ++e) acc = acc + alpha[e] * x[e][d];
    y[d] = acc;
  }
}

}  // namespace flashattn::reference_copy::FLASHATTN_REFERENCE_COPY::blocks

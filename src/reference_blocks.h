// The reference's inner loops in blocks (reference.cpp): a block of key rows' dot products with
// query-side rows side by side, and a row's terms added with one load and store per chunk. Every
// sum runs in exactly the order the one-pair-at-a-time definition takes, so the blocks change
// only the time, never a bit of the result.
#pragma once

#include <cstdint>
#include <cstring>
#include <type_traits>
#include <vector>

namespace flashattn::reference_blocks {

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

// The block's sums side by side in 16-byte vectors (GCC/Clang vector extensions): lane u of a
// vector holds key row u's sum, and each lane's arithmetic is the scalar code's (a product, then
// an addition; no fused multiply-add under ISO C++). `rows` query-side rows a[r] at once, out[r].
using f32x4 = float __attribute__((vector_size(16)));
using f64x2 = double __attribute__((vector_size(16)));
template <class V, class T>
V load_vec(const T* p) {
  V v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// fp32: one running sum per pair; R rows share each load of the block (R x 2 independent chains).
template <int R>
void block_dots_fixed(const float* const* a, const float* bt, int n, float (*out)[kKeyBlock]) {
  static_assert(kKeyBlock == 8, "two vectors of four lanes");
  f32x4 s[R][2] = {};
  for (int d = 0; d < n; ++d) {
    const f32x4 lo = load_vec<f32x4>(bt + d * kKeyBlock), hi = load_vec<f32x4>(bt + d * kKeyBlock + 4);
    for (int r = 0; r < R; ++r) {
      const float x = a[r][d];
      s[r][0] = s[r][0] + x * lo;
      s[r][1] = s[r][1] + x * hi;
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
// then (s0 + s1) + (s2 + s3)), per half block of four keys: 4 x 2 independent chains.
inline void block_dots(const double* const* a, int rows, const double* bt, int n, double (*out)[kKeyBlock]) {
  static_assert(kKeyBlock == 8, "two halves of two vectors of two lanes");
  for (int r = 0; r < rows; ++r)
    for (int half = 0; half < 2; ++half) {
      const double* b = bt + half * 4;
      f64x2 s[4][2] = {};
      int d = 0;
      for (; d + 4 <= n; d += 4)
        for (int p = 0; p < 4; ++p) {
          const double x = a[r][d + p];
          s[p][0] = s[p][0] + x * load_vec<f64x2>(b + (d + p) * kKeyBlock);
          s[p][1] = s[p][1] + x * load_vec<f64x2>(b + (d + p) * kKeyBlock + 2);
        }
      for (; d < n; ++d) {
        const double x = a[r][d];
        s[0][0] = s[0][0] + x * load_vec<f64x2>(b + d * kKeyBlock);
        s[0][1] = s[0][1] + x * load_vec<f64x2>(b + d * kKeyBlock + 2);
      }
      for (int c = 0; c < 2; ++c) {
        const f64x2 sum = (s[0][c] + s[1][c]) + (s[2][c] + s[3][c]);
        std::memcpy(out[r] + half * 4 + 2 * c, &sum, sizeof sum);
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
  using V = std::conditional_t<std::is_same_v<Acc, float>, f32x4, f64x2>;
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

}  // namespace flashattn::reference_blocks

// Which keys a query sees, and the additive mask, as params.h defines them (host and device).
//
//   key j visible to query i of batch b:
//     j < seqlen_k(b)
//     j >= i + (S_k - S_q) - window_left    when window_left  >= 0
//     j <= i + (S_k - S_q) + window_right   when window_right >= 0
//
// Tiled kernels use the ranges below to skip whole blocks and key_visible() inside the blocks that
// straddle a boundary; every kernel therefore agrees on the boundary to the element.
#pragma once

#include <cstdint>

#include "common/host_device.h"
#include "flashattn/params.h"


namespace flashattn {

// The driver already folds causal into window_right; folding again costs nothing and keeps a
// kernel correct if handed unfolded params. Causal is min(window_right, 0) with -1 read as +inf,
// which is 0 whatever window_right was.
FLASHATTN_HD inline int effective_window_right(bool causal, int window_right) {
  return causal ? 0 : window_right;
}

// 64-bit on purpose: i + (S_k - S_q) - window_left overflows int for large windows.
FLASHATTN_HD inline bool key_visible(int64_t i, int64_t j, int S_q, int S_k, int seqlen_k,
                                     int window_left, int window_right) {
  if (j < 0 || j >= seqlen_k) return false;
  const int64_t diag = i + (static_cast<int64_t>(S_k) - S_q);  // key aligned with query i
  if (window_left >= 0 && j < diag - window_left) return false;
  if (window_right >= 0 && j > diag + window_right) return false;
  return true;
}

// Half-open [begin, end); empty when end <= begin.
struct IndexRange {
  int64_t begin = 0;
  int64_t end = 0;
  FLASHATTN_HD bool empty() const { return end <= begin; }
  FLASHATTN_HD int64_t size() const { return end > begin ? end - begin : 0; }
};

// The keys query i sees: exactly the j with key_visible(i, j, ...).
FLASHATTN_HD inline IndexRange visible_keys(int64_t i, int S_q, int S_k, int seqlen_k,
                                            int window_left, int window_right) {
  const int64_t diag = i + (static_cast<int64_t>(S_k) - S_q);
  IndexRange r{0, seqlen_k};
  if (window_left >= 0 && diag - window_left > r.begin) r.begin = diag - window_left;
  if (window_right >= 0 && diag + window_right + 1 < r.end) r.end = diag + window_right + 1;
  if (r.end < r.begin) r.end = r.begin;
  return r;
}

// The queries that see key j: exactly the i in [0, S_q) with key_visible(i, j, ...).
FLASHATTN_HD inline IndexRange visible_queries(int64_t j, int S_q, int S_k, int seqlen_k,
                                               int window_left, int window_right) {
  IndexRange r{0, S_q};
  if (j < 0 || j >= seqlen_k) return IndexRange{0, 0};
  const int64_t shift = j - (static_cast<int64_t>(S_k) - S_q);  // query aligned with key j
  // j <= i + (S_k - S_q) + window_right  <=>  i >= shift - window_right
  if (window_right >= 0 && shift - window_right > r.begin) r.begin = shift - window_right;
  // j >= i + (S_k - S_q) - window_left   <=>  i <= shift + window_left
  if (window_left >= 0 && shift + window_left + 1 < r.end) r.end = shift + window_left + 1;
  if (r.end < r.begin) r.end = r.begin;
  return r;
}

FLASHATTN_HD inline float mask_value(const MaskView& m, int64_t b, int64_t h, int64_t i, int64_t j) {
  return m.ptr[b * m.batch + h * m.head + i * m.row + j * m.col];
}

// Everything the predicates need for one problem, gathered once on the host and passed to the
// kernels by value. seqlens_k and mask.ptr are wherever the kernel runs (device pointers for GPU
// kernels).
struct Visibility {
  int S_q = 0, S_k = 0;
  int window_left = -1, window_right = -1;  // window_right with causal folded in
  const int32_t* seqlens_k = nullptr;
  MaskView mask;

  FLASHATTN_HD int seqlen_k(int64_t b) const {
    if (seqlens_k == nullptr) return S_k;
    // The driver validates [0, S_k]; the clamp only keeps a bad value from reading past S_k.
    const int n = seqlens_k[b];
    return n < 0 ? 0 : (n < S_k ? n : S_k);
  }
  FLASHATTN_HD bool visible(int64_t i, int64_t j, int seqlen) const {
    return key_visible(i, j, S_q, S_k, seqlen, window_left, window_right);
  }
  FLASHATTN_HD IndexRange keys(int64_t i, int seqlen) const {
    return visible_keys(i, S_q, S_k, seqlen, window_left, window_right);
  }
  FLASHATTN_HD IndexRange queries(int64_t j, int seqlen) const {
    return visible_queries(j, S_q, S_k, seqlen, window_left, window_right);
  }
  // The additive mask term of s_ij (0 without a mask).
  FLASHATTN_HD float bias(int64_t b, int64_t h, int64_t i, int64_t j) const {
    return mask.ptr ? mask_value(mask, b, h, i, j) : 0.f;
  }
};

inline Visibility make_visibility(const FwdParams& p) {
  Visibility v;
  v.S_q = p.S_q;
  v.S_k = p.S_k;
  v.window_left = p.window_left;
  v.window_right = effective_window_right(p.causal, p.window_right);
  v.seqlens_k = p.seqlens_k;
  v.mask = p.mask;
  return v;
}

}  // namespace flashattn

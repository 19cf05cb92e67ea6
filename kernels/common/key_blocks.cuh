// Block-level visibility for kernels that tile queries by kBlockM and keys by kBlockN: which key
// blocks a query block must visit at all, and which of those need no per-element masking.
// Both follow params.h's rule (see common/mask.cuh for the per-element predicate):
//   key j visible to query i:  j < seqlen_k,  j >= i + (S_k - S_q) - window_left  (window_left >= 0),
//                              j <= i + (S_k - S_q) + window_right (window_right >= 0).
// The visible interval of row i slides right by one key per row and is at least one key wide
// before clipping, so the union over rows [i_first, i_last] is the single interval
// [i_first + off - window_left, i_last + off + window_right] clipped to [0, seqlen_k).
#pragma once

#include <cstdint>

#include "common/host_device.h"
#include "common/mask.cuh"

namespace flashattn {

// Half-open range of key-block indices [begin, end); empty when end <= begin.
struct BlockRange {
  int begin = 0;
  int end = 0;
  FLASHATTN_HD int size() const { return end > begin ? end - begin : 0; }
};

// The keys query i sees, as [i + lo, i + hi) within [0, seqlen_k): the window (causal folded
// in) as two shifts, so a row's bounds cost two adds. A window reaching past both sequences
// excludes nothing and is unbounded (+-2^30), which keeps every sum in int for S < 2^28.
struct KeyShifts {
  int lo = 0, hi = 0;
};
FLASHATTN_HD inline KeyShifts key_shifts(const Visibility& vis) {
  const int64_t reach = static_cast<int64_t>(vis.S_q) + vis.S_k;
  const int64_t off = static_cast<int64_t>(vis.S_k) - vis.S_q;
  KeyShifts k;
  k.lo = vis.window_left >= 0 && vis.window_left < reach ? static_cast<int>(off - vis.window_left) : -(1 << 30);
  k.hi = vis.window_right >= 0 && vis.window_right < reach ? static_cast<int>(off + vis.window_right + 1) : (1 << 30);
  return k;
}

// Key blocks of kBlockN keys holding at least one key visible to some query in [i_first, i_last].
template <int kBlockN>
FLASHATTN_HD inline BlockRange key_blocks(const Visibility& vis, int64_t i_first, int64_t i_last, int seqlen_k) {
  const int64_t off = static_cast<int64_t>(vis.S_k) - vis.S_q;
  int64_t lo = 0, hi = seqlen_k;
  if (vis.window_left >= 0 && i_first + off - vis.window_left > lo) lo = i_first + off - vis.window_left;
  if (vis.window_right >= 0 && i_last + off + vis.window_right + 1 < hi) hi = i_last + off + vis.window_right + 1;
  if (hi <= lo) return BlockRange{0, 0};
  return BlockRange{static_cast<int>(lo / kBlockN), static_cast<int>((hi + kBlockN - 1) / kBlockN)};
}

// Key blocks in which every key is visible to every query of [i_first, i_last]: they need no
// per-element masking. A contiguous sub-range of key_blocks() (empty: begin = end = 0).
template <int kBlockN>
FLASHATTN_HD inline BlockRange full_key_blocks(const Visibility& vis, int64_t i_first, int64_t i_last,
                                               int seqlen_k) {
  const int64_t off = static_cast<int64_t>(vis.S_k) - vis.S_q;
  // Block n is full iff n*kBlockN >= lo and (n+1)*kBlockN <= hi.
  int64_t lo = 0, hi = seqlen_k;
  if (vis.window_left >= 0 && i_last + off - vis.window_left > lo) lo = i_last + off - vis.window_left;
  if (vis.window_right >= 0 && i_first + off + vis.window_right + 1 < hi) hi = i_first + off + vis.window_right + 1;
  if (hi <= lo) return BlockRange{0, 0};
  const int64_t begin = (lo + kBlockN - 1) / kBlockN, end = hi / kBlockN;
  if (end <= begin) return BlockRange{0, 0};
  return BlockRange{static_cast<int>(begin), static_cast<int>(end)};
}

// The other direction, for kernels that walk the query blocks of one key block (backward).
// Q blocks (of block_m rows) holding a query that sees one of the keys [n0, n0 + n_keys), all
// below seqlen. The queries seeing key j form an interval whose ends grow with j, and consecutive
// keys' intervals overlap or touch, so the union is [first key's begin, last key's end).
FLASHATTN_HD inline BlockRange query_blocks(const Visibility& vis, int n0, int n_keys, int seqlen, int block_m) {
  if (n_keys <= 0) return {};
  const int64_t lo = vis.queries(n0, seqlen).begin;
  int64_t hi = vis.queries(n0 + n_keys - 1, seqlen).end;
  if (hi > vis.S_q) hi = vis.S_q;
  if (hi <= lo) return {};
  return {static_cast<int>(lo / block_m), static_cast<int>((hi + block_m - 1) / block_m)};
}

// Query rows [lo, hi) such that a block of rows [m0, m0 + n_rows) sees every key of
// [n0, n0 + n_keys) exactly when lo <= m0 and m0 + n_rows <= hi: the same answer as
// block_fully_visible, computed once per key block. The last key's queries start at lo and the
// first key's end at hi (both ends grow with the key); no full block when the last key is past
// seqlen.
FLASHATTN_HD inline IndexRange full_query_rows(const Visibility& vis, int n0, int n_keys, int seqlen) {
  const IndexRange last = vis.queries(n0 + n_keys - 1, seqlen);
  if (last.empty()) return IndexRange{INT32_MAX, 0};
  return IndexRange{last.begin, vis.queries(n0, seqlen).end};
}

}  // namespace flashattn

#include "problem.h"

#include <algorithm>
#include <cstdint>

namespace flashattn {

uint32_t Problem::required_features() const {
  uint32_t f = 0;
  if (causal) f |= kFeatCausal;
  if (window_left >= 0 || window_right >= 0) f |= kFeatWindow;
  if (has_padding) f |= kFeatPadding;
  if (has_mask) f |= kFeatMask;
  if (dims.H_kv != dims.H) f |= kFeatGQA;
  if (dims.S_q != dims.S_k) f |= kFeatUnequalSeq;
  if (layout == Layout::BSHD) f |= kFeatBSHD;
  return f;
}

int Problem::effective_window_right() const {
  if (!causal) return window_right;
  return window_right < 0 ? 0 : std::min(window_right, 0);
}

double count_visible_pairs(const Problem& p, const int32_t* seqlens_k) {
  const Dims& d = p.dims;
  const int64_t offset = int64_t(d.S_k) - d.S_q;  // bottom-right alignment
  const int wr = p.effective_window_right();
  const int wl = p.window_left;
  double total = 0.0;
  for (int b = 0; b < d.B; ++b) {
    const int64_t len = seqlens_k ? std::clamp<int64_t>(seqlens_k[b], 0, d.S_k) : d.S_k;
    int64_t per_head = 0;
    for (int64_t i = 0; i < d.S_q; ++i) {
      int64_t lo = 0, hi = len - 1;  // inclusive key range
      if (wl >= 0) lo = std::max(lo, i + offset - wl);
      if (wr >= 0) hi = std::min(hi, i + offset + wr);
      if (hi >= lo) per_head += hi - lo + 1;
    }
    total += double(per_head) * d.H;
  }
  return total;
}

double forward_flops(const Problem& p, const int32_t* seqlens_k) {
  return 4.0 * p.dims.D * count_visible_pairs(p, seqlens_k);
}

double backward_flops(const Problem& p, const int32_t* seqlens_k) {
  return 2.5 * forward_flops(p, seqlens_k);
}

Strides layout_strides(Layout layout, int H, int S, int D) {
  Strides s;
  if (layout == Layout::BHSD) {
    s.row = D;
    s.head = int64_t(S) * D;
    s.batch = int64_t(H) * S * D;
  } else {
    s.head = D;
    s.row = int64_t(H) * D;
    s.batch = int64_t(S) * H * D;
  }
  return s;
}

}  // namespace flashattn

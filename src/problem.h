// The attention problem apart from its data: sizes, dtype, layout and masking flags, with the
// exact count of visible (query, key) pairs that FLOP figures are based on.
#pragma once

#include <cstdint>
#include <string>

#include "flashattn/params.h"
#include "flashattn/types.h"

namespace flashattn {

struct Dims {
  int B = 0, H = 0, H_kv = 0, S_q = 0, S_k = 0, D = 0;
};

struct Problem {
  Dims dims;
  DType dtype = DType::F32;  // compute dtype
  Layout layout = Layout::BHSD;
  double scale = 0.0;        // softmax scale (default 1/sqrt(D))
  bool causal = false;
  int window_left = -1;      // -1: unbounded
  int window_right = -1;     // -1: unbounded
  bool has_padding = false;  // seqlens_k given
  bool has_mask = false;     // additive mask given

  // Feature bits a kernel must declare to run this problem.
  uint32_t required_features() const;
  // window_right with causal folded in (what kernels test).
  int effective_window_right() const;
};

// Number of visible (query, key) pairs summed over all B*H heads, counting causal, window and
// padding exactly (the additive mask is not counted). seqlens_k is a host array [B] or null.
double count_visible_pairs(const Problem& p, const int32_t* seqlens_k);

// FLOPs: forward 4 * D * visible pairs (two matmuls of 2 FLOPs per multiply-add);
// backward 2.5x forward (five matmuls instead of two), FlashAttention's convention.
double forward_flops(const Problem& p, const int32_t* seqlens_k);
double backward_flops(const Problem& p, const int32_t* seqlens_k);

// Element strides of a [B, H, S, D] tensor stored in `layout`.
Strides layout_strides(Layout layout, int H, int S, int D);

}  // namespace flashattn

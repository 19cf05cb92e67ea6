// The contract between the driver and every kernel: one plain struct per direction, holding raw
// pointers, element strides and sizes. Kernels read nothing else. GPU kernels get device pointers;
// the cpu kernel gets host pointers.
//
// Index convention (elements, not bytes; the last dimension is always contiguous):
//   Q[b, h, i, d]   = q + b*q_st.batch + h*q_st.head + i*q_st.row + d       (h < H,    i < S_q)
//   K[b, g, j, d]   = k + b*k_st.batch + g*k_st.head + j*k_st.row + d       (g < H_kv, j < S_k)
// Query head h reads key/value head g = h / (H / H_kv).
//
// Visibility of key j to query i of batch b (all conditions must hold):
//   j < seqlen_k(b)                      seqlen_k(b) = seqlens_k ? seqlens_k[b] : S_k
//   j >= i + (S_k - S_q) - window_left   when window_left  >= 0
//   j <= i + (S_k - S_q) + window_right  when window_right >= 0
// `causal` is folded into window_right (= min(window_right, 0)) by the driver, so kernels may test
// the window alone; the flag stays for compile-time dispatch and FLOP counting.
// A row with no visible key (or whose visible scores are all -inf) gives O = 0 and lse = -inf.
#pragma once

#include <cstddef>
#include <cstdint>

#include "flashattn/types.h"

namespace flashattn {

struct Strides {
  int64_t batch = 0;
  int64_t head = 0;
  int64_t row = 0;
};

// Additive float32 mask, broadcastable to [B, H, S_q, S_k]: a broadcast dimension has stride 0.
struct MaskView {
  const float* ptr = nullptr;  // null: no mask
  int64_t batch = 0, head = 0, row = 0, col = 0;
};

struct FwdParams {
  DType dtype = DType::F32;  // element type of q, k, v, o (and do, dq, dk, dv in backward)
  Layout layout = Layout::BHSD;
  int B = 0, H = 0, H_kv = 0, S_q = 0, S_k = 0, D = 0;

  float scale = 0.f;       // softmax scale, default 1/sqrt(D)
  float scale_log2 = 0.f;  // scale * log2(e), for exp2-based softmax
  double scale_f64 = 0.0;  // the scale before rounding to float (cpu kernel)

  bool causal = false;
  int window_left = -1;   // -1: unbounded
  int window_right = -1;  // -1: unbounded (0 when causal)

  const int32_t* seqlens_k = nullptr;  // [B] or null
  MaskView mask;

  const void* q = nullptr;
  const void* k = nullptr;
  const void* v = nullptr;
  Strides q_st, k_st, v_st;

  void* o = nullptr;
  Strides o_st;
  // Natural-log logsumexp of the scaled, masked scores, contiguous [B, H, S_q]. float32, except
  // for the cpu kernel computing in F64, where it is double.
  void* lse = nullptr;

  // Scratch memory sized by the kernel's workspace function, owned by the driver (counted as the
  // run's extra memory). Null when the kernel asked for none.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;

  int num_sms = 0;  // multiprocessors of the device (0 for the cpu kernel)
  bool deterministic = false;  // ask for the bitwise-reproducible path where the kernel has one
};

// Backward: the forward fields are inputs (o and lse come from the same kernel's forward pass).
struct BwdParams : FwdParams {
  const void* dout = nullptr;
  Strides do_st;
  void* dq = nullptr;
  void* dk = nullptr;
  void* dv = nullptr;
  Strides dq_st, dk_st, dv_st;
};

}  // namespace flashattn

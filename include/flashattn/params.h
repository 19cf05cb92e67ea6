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
  // Merging into the outputs (a ring's last block; only for a kernel whose entry's merges_output
  // holds for these params): o and lse already hold, for the same query rows, the normalised O
  // and the lse over other keys; the kernel combines them with its own by the two lse and writes
  // the combined O and lse in their place. lse_stride: floats from one (batch, head)'s lse row to
  // the next (0: S_q, contiguous), so that lse may be a row range of a longer one.
  bool merge_output = false;
  int64_t lse_stride = 0;

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
  // fp32 gradients (a ring's blocks; only for a kernel whose entry declares fp32_gradients): dq,
  // dk and dv are float32 with their strides in floats; dK and dV are stored unrounded, dQ is
  // added into what dq already holds.
  bool grads_f32 = false;
  // With grads_f32, for a kernel whose entry has dq_finish: dQ is added, unscaled, into the
  // caller's accumulator in the kernel's own layout instead of into dq (which is then unused):
  // dq_accum holds, per (batch, head), dq_accum_rows rows, and the call's query row 0 is its row
  // dq_accum_row0 (both multiples of kDqAccumRows), with kDqAccumSpare rows of room past the
  // call's S_q (dq_accum_row0 + S_q + kDqAccumSpare <= dq_accum_rows): the kernel adds whole steps
  // of rows, zeros past S_q, which may fall on another call's rows. The caller zeroes it once; the
  // entry's dq_finish writes the sum out.
  float* dq_accum = nullptr;
  int dq_accum_rows = 0, dq_accum_row0 = 0;
  // A part of the work (a ring lending part of a block to another GPU; only for a kernel whose
  // entry's key_tile is non-zero for these params): the key tiles [tiles_begin, tiles_end) of the
  // (batch, kv head, key tile) order, key_tile(p) keys per tile (the last of each (batch, kv head)
  // may be short). dK and dV are written for those keys only; dQ gets their terms only. Both 0:
  // all the work.
  int tiles_begin = 0, tiles_end = 0;
};

constexpr int kDqAccumRows = 16;    // rows of a layout group of the dQ accumulator
constexpr int kDqAccumSpare = 128;  // the longest step of rows a kernel adds at once

// Decode: one step of autoregressive attention against a KV cache (data/README.md, "Decode").
// Batch element b holds cache_seqlens[b] tokens. The step appends S_new tokens (k_new, v_new) at
// cache positions [cache_seqlens[b], L_b), L_b = cache_seqlens[b] + S_new <= S_max; then query i
// of the step (at position cache_seqlens[b] + i) sees the keys j <= cache_seqlens[b] + i: causal,
// aligned at the bottom right of its own batch element's length L_b.
//   Q[b, h, i, d]    = q + b*q_st.batch + h*q_st.head + i*q_st.row + d              (i < S_new)
//   Knew[b, g, i, d] = k_new + b*k_new_st.batch + g*k_new_st.head + i*k_new_st.row + d
//   cache row j of kv head g of batch b (K; V alike with v_cache, v_cache_st):
//     contiguous (block_table null): k_cache + b*k_cache_st.batch + g*k_cache_st.head + j*k_cache_st.row
//     paged: k_cache + page*k_cache_st.batch + g*k_cache_st.head + (j % page_size)*k_cache_st.row,
//            page = block_table[b*block_table_stride + j / page_size]; the pool is
//            [num_blocks, H_kv, page_size, D], so `batch` is the stride between pages.
// Decode entry points (KernelMode::dec) attend only: the driver runs the update-cache kernel
// first, so a kernel reads keys [0, L_b) from the cache. Outputs O [B, H, S_new, D] (o_st) in the
// dtype and lse float32 contiguous [B, H, S_new], natural log.
struct DecodeParams {
  DType dtype = DType::F32;  // element type of q, k_new, v_new, the caches and o
  int B = 0, H = 0, H_kv = 0, S_new = 0, S_max = 0, D = 0;

  float scale = 0.f;       // softmax scale, default 1/sqrt(D)
  float scale_log2 = 0.f;  // scale * log2(e)
  double scale_f64 = 0.0;

  const void* q = nullptr;
  Strides q_st;
  const void* k_new = nullptr;
  const void* v_new = nullptr;
  Strides k_new_st, v_new_st;
  void* k_cache = nullptr;  // written by the update-cache kernel, read by the attention
  void* v_cache = nullptr;
  Strides k_cache_st, v_cache_st;

  const int32_t* cache_seqlens = nullptr;  // [B], tokens in the cache before this step
  const int32_t* block_table = nullptr;    // [B, block_table_stride] page indices; null: contiguous
  int block_table_stride = 0;              // max blocks per batch element
  int page_size = 0;                       // keys per page (a power of two >= 16) when paged
  int num_blocks = 0;                      // pages in the pool

  // max_b L_b, known on the host (cache_seqlens lives on the device): sizes split plans and
  // workspaces without a device read.
  int max_seqlen = 0;
  // >= 0 when every cache_seqlens[b] equals it (known on the host): a kernel may take it by value
  // instead of reading cache_seqlens first (a cold DRAM read ahead of every cache read). -1: read.
  int uniform_seqlen = -1;
  int num_splits = 0;  // split-K pieces per (batch, kv head); 0: the kernel chooses

  void* o = nullptr;
  Strides o_st;
  void* lse = nullptr;

  // Sized by the kernel's decode workspace function and zero-filled by the driver when it is
  // allocated; a kernel that keeps counters there (a split-K merge done by the last CTA of a
  // group) leaves them at zero again when it returns, so the same workspace serves every call.
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  int num_sms = 0;
};

}  // namespace flashattn

// The kernel parameters of one ring block (ring_plan.h's RingCall), from the shard buffers that
// hold it: the one place the ring turns a block into FwdParams / BwdParams, so that the host test
// (tests/cpu/test_ring_block.cpp) runs a whole ring with the cpu kernel through the same code.
//
// Buffers (contiguous, BHSD, elements of the compute dtype unless said otherwise):
//   q, o, dout   the rank's shard [B, H, len, D] (o: the merged forward output, backward only)
//   kv           the source's shard, K then V, each [B, H_kv, len_src, D]
//   o_part       the block's O [B, H, q_rows, D]; lse_part its lse, float [B, H, q_rows]
//   lse          the merged lse of the block's rows, float, contiguous [B, H, q_rows]
//   dq_part      the block's dQ [B, H, q_rows, D]; dkv_part its dK then dV, [B, H_kv, k_rows, D]
#pragma once

#include <cstddef>
#include <cstdint>

#include "flashattn/params.h"
#include "params_build.h"
#include "problem.h"
#include "ring_plan.h"

namespace flashattn {

struct RingBlockBuffers {
  const void* q = nullptr;
  const void* kv = nullptr;
  void* o_part = nullptr;
  void* lse_part = nullptr;
  const int32_t* seqlens = nullptr;  // [B] keys of the block below each length, or null
  void* workspace = nullptr;
  size_t workspace_bytes = 0;
  // Backward only.
  const void* o = nullptr;
  const void* lse = nullptr;
  const void* dout = nullptr;
  void* dq_part = nullptr;
  void* dkv_part = nullptr;
};

// Contiguous [B, heads, rows, D] strides.
inline Strides ring_packed(int heads, int rows, int D) { return {int64_t(heads) * rows * D, int64_t(rows) * D, D}; }

inline const char* ring_offset(const void* p, int64_t elems, size_t es) {
  return static_cast<const char*>(p) + elems * int64_t(es);
}

// `len`: rows of the rank's shard; `len_src`: rows of the source's shard.
inline FwdParams ring_block_fwd(const Problem& prob, int len, int len_src, const RingCall& c, const RingBlockBuffers& b) {
  const Dims& d = prob.dims;
  const size_t es = dtype_size(prob.dtype);
  FwdParams f = forward_params(prob);
  f.layout = Layout::BHSD;
  f.S_q = c.q_rows, f.S_k = c.k_rows;
  f.causal = c.causal;
  f.window_left = -1;
  f.window_right = c.causal ? 0 : -1;  // a causal block is square: the plain diagonal
  f.mask = MaskView{};
  f.seqlens_k = b.seqlens;
  f.q = ring_offset(b.q, int64_t(c.q_row0) * d.D, es);
  f.q_st = ring_packed(d.H, len, d.D);
  f.k = ring_offset(b.kv, int64_t(c.k_row0) * d.D, es);
  f.v = ring_offset(b.kv, int64_t(d.B) * d.H_kv * len_src * d.D + int64_t(c.k_row0) * d.D, es);
  f.k_st = f.v_st = ring_packed(d.H_kv, len_src, d.D);
  f.o = b.o_part;
  f.o_st = ring_packed(d.H, c.q_rows, d.D);
  f.lse = b.lse_part;
  f.workspace = b.workspace;
  f.workspace_bytes = b.workspace_bytes;
  return f;
}

// A forward block that merges into the rank's outputs itself (FwdParams::merge_output): o and lse
// ([B, H, len, D] and float [B, H, len], the own block's result) at the block's rows in place of
// its partial buffers.
inline void ring_block_merge_into(const Problem& prob, int len, const RingCall& c, void* o, void* lse, FwdParams* f) {
  const Dims& d = prob.dims;
  f->o = const_cast<char*>(ring_offset(o, int64_t(c.q_row0) * d.D, dtype_size(prob.dtype)));
  f->o_st = ring_packed(d.H, len, d.D);
  f->lse = static_cast<float*>(lse) + c.q_row0;
  f->lse_stride = len;
  f->merge_output = true;
}

inline BwdParams ring_block_bwd(const Problem& prob, int len, int len_src, const RingCall& c, const RingBlockBuffers& b) {
  const Dims& d = prob.dims;
  const size_t es = dtype_size(prob.dtype);
  BwdParams p;
  static_cast<FwdParams&>(p) = ring_block_fwd(prob, len, len_src, c, b);
  p.o = const_cast<char*>(ring_offset(b.o, int64_t(c.q_row0) * d.D, es));  // an input here
  p.o_st = p.q_st;
  p.lse = const_cast<void*>(b.lse);  // an input here
  p.dout = ring_offset(b.dout, int64_t(c.q_row0) * d.D, es);
  p.do_st = p.q_st;
  p.dq = b.dq_part;
  p.dq_st = ring_packed(d.H, c.q_rows, d.D);
  p.dk = b.dkv_part;
  p.dv = static_cast<char*>(b.dkv_part) + int64_t(d.B) * d.H_kv * c.k_rows * d.D * int64_t(es);
  p.dk_st = p.dv_st = ring_packed(d.H_kv, c.k_rows, d.D);
  return p;
}

// The backward's fp32 gradients (BwdParams::grads_f32, for a kernel whose fp32_gradients holds):
// dQ added into the rank's fp32 accumulator dq_acc ([B, H, len, D]) at the block's rows; dK and
// dV stored into `dkv`, dK then dV: laid out over the source's whole shard ([B, H_kv, len_src,
// D] each, at the block's key rows) when `whole_shard` (the travelling accumulator itself, or the
// own block's buffer where it runs on its own stream), else a partial [B, H_kv, k_rows, D] each.
inline void ring_block_grads_f32(const Problem& prob, int len, int len_src, const RingCall& c, float* dq_acc,
                                 float* dkv, bool whole_shard, BwdParams* p) {
  const Dims& d = prob.dims;
  const int rows = whole_shard ? len_src : c.k_rows, row0 = whole_shard ? c.k_row0 : 0;
  p->grads_f32 = true;
  p->dq = dq_acc + int64_t(c.q_row0) * d.D;
  p->dq_st = ring_packed(d.H, len, d.D);
  p->dk = dkv + int64_t(row0) * d.D;
  p->dv = dkv + int64_t(d.B) * d.H_kv * rows * d.D + int64_t(row0) * d.D;
  p->dk_st = p->dv_st = ring_packed(d.H_kv, rows, d.D);
}

}  // namespace flashattn

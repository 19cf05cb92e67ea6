// The element-wise steps of context-parallel (ring) attention around the kernels' own calls
// (src/ring.cpp drives them). Every tensor here is contiguous [B, heads, rows, D] (or [B, heads,
// rows] for lse) on the device; `row0` places a block's rows inside a shard of `S_loc` rows.
//
// Forward: each ring step gives a block's partial O_p (normalised within the block, in the
// dtype) and its lse_p; the running result (fp32 O_acc, lse_acc) takes it in by the same algebra
// as the split-K decode combine:
//   lse = log(exp(lse_acc) + exp(lse_p));   O = exp(lse_acc - lse) O_acc + exp(lse_p - lse) O_p
// an empty block (lse_p = -inf) weighs nothing; a row no block reached keeps O = 0, lse = -inf.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "flashattn/types.h"

namespace flashattn {

// Rows [row0, row0 + rows) of (o_acc, lse_acc) take in the block (o_part, lse_part), whose rows
// are contiguous [B, H, rows, D] and [B, H, rows].
void ring_merge_block(DType t, const void* o_part, const float* lse_part, float* o_acc, float* lse_acc, int B, int H,
                      int rows, int row0, int S_loc, int D, cudaStream_t stream);

// The same, in place in the dtype: rows [row0, row0 + rows) of `o` ([B, H, S_loc, D], the dtype)
// and `lse` take in the block, the other rows are left as they are. For a ring whose shard sees
// one block after the own one: the own block's output is the running result, no fp32 copy.
void ring_merge_in_place(DType t, const void* o_part, const float* lse_part, void* o, float* lse, int B, int H,
                         int rows, int row0, int S_loc, int D, cudaStream_t stream);

// The first block of a shard (all its rows): o_acc = O_p in fp32, lse_acc = lse_p (no fill and
// merge before it; lse_acc may be lse_part itself).
void ring_merge_first(DType t, const void* o_part, const float* lse_part, float* o_acc, float* lse_acc,
                      int64_t n_rows, int D, cudaStream_t stream);

// The last block: rows [row0, row0 + rows) merged as ring_merge_block does, and every row of the
// shard written to `o` in the dtype ([B, H, S_loc, D]) in the same pass (the other rows are
// o_acc rounded); lse_acc takes the block's rows in.
void ring_merge_last(DType t, const void* o_part, const float* lse_part, const float* o_acc, float* lse_acc,
                     void* o, int B, int H, int rows, int row0, int S_loc, int D, cudaStream_t stream);

// Rows [row0, row0 + rows) of the fp32 accumulator `acc` ([B, H, S_loc, D]) += the block `part`
// ([B, H, rows, D], in the dtype): dQ over the ring steps, dK/dV over the ranks.
void ring_accumulate(DType t, const void* part, float* acc, int B, int H, int rows, int row0, int S_loc, int D,
                     cudaStream_t stream);

// dst[i] = src[i] rounded to the dtype, n elements (fp32 accumulators to the outputs).
void ring_round(DType t, const float* src, void* dst, int64_t n, cudaStream_t stream);

// dst[i] = (a[i] + b[i]) rounded to the dtype, n elements (an fp32 partial and accumulator to
// the output).
void ring_add_round(DType t, const float* a, const float* b, void* dst, int64_t n, cudaStream_t stream);

// Rows [row0, row0 + rows) of lse ([B, H, S_loc]) into a contiguous [B, H, rows] (a kernel reads
// lse contiguous over its own rows).
void ring_lse_rows(const float* lse, float* dst, int B, int H, int rows, int row0, int S_loc, cudaStream_t stream);

// acc[i] = -inf (lse) or 0 (O) before the first block.
void ring_fill(float* dst, float value, int64_t n, cudaStream_t stream);

}  // namespace flashattn

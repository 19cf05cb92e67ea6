// The decode oracle: one decode step in fp64, multi-threaded, written from the definition in
// params.h (DecodeParams) and sharing nothing with the kernels or with the forward reference
// (whose causal alignment is global, S_k - S_q, where decode aligns each batch element on its own
// length).
//
// Definitions (query head h reads kv head g = h / (H / H_kv); c_b = cache_seqlens[b]):
//   key row j of (b, g) after the step:  j <  c_b: the cache's row j (contiguous, or through the
//                                                  block table when paged)
//                                        j >= c_b: row j - c_b of k_new / v_new   (j < c_b + S_new)
//   query i of batch b sees keys j <= c_b + i         (causal, bottom-right in its own length)
//   s_ij = scale * <q_i, k_j>;  lse_i = log sum_j exp(s_ij);  O_i = sum_j exp(s_ij - lse_i) v_j
// Every query sees at least key 0, so no row is empty; a NaN score (NaN/Inf inputs) makes the
// row NaN, as it does in the kernels.
#pragma once

#include <cstdint>
#include <vector>

#include "array.h"

namespace flashattn {

struct DecodeRefInputs {
  int B = 0, H = 0, H_kv = 0, S_new = 0, D = 0;
  double scale = 0.0;
  const HostArray* q = nullptr;      // [B, H, S_new, D], any float dtype
  const HostArray* k_new = nullptr;  // [B, H_kv, S_new, D]
  const HostArray* v_new = nullptr;
  // Contiguous: [B, H_kv, S_max, D]. Paged: the pool [num_blocks, H_kv, page_size, D].
  const HostArray* k_cache = nullptr;
  const HostArray* v_cache = nullptr;
  const int32_t* cache_seqlens = nullptr;  // [B]
  const int32_t* block_table = nullptr;    // [B, block_table_stride] or null (contiguous)
  int block_table_stride = 0;
  int page_size = 0;
  int threads = 0;  // 0: std::thread::hardware_concurrency()
};

struct DecodeRowId {
  int b = 0, h = 0, i = 0;  // batch, query head, new-token index
};

// O and lse of the selected rows: o is rows.size() x D, lse rows.size(). Rows are computed per
// (batch, kv head) group, each key row converted once; results do not depend on `threads`.
void decode_reference_rows(const DecodeRefInputs& in, const std::vector<DecodeRowId>& rows, double* o,
                           double* lse);
// Every row: o [B, H, S_new, D], lse [B, H, S_new].
void decode_reference(const DecodeRefInputs& in, double* o, double* lse);

// The same-dtype baseline of the fp16/bf16 check rule (reference.h, baseline_forward_rows) at the
// selected rows: each batch element's step is forward attention of its S_new queries over its L_b
// keys, causal bottom-right, so the rows of element b are computed as a forward problem over the
// keys after the append. Not the oracle (which shares nothing with the forward code): the model
// the tolerance is derived from.
void decode_baseline_rows(const DecodeRefInputs& in, DType dtype, const std::vector<DecodeRowId>& rows, double* o,
                          double* lse);

// Element offset of key row j of (b, g) in a cache (contiguous when block_table is null).
int64_t decode_cache_offset(const DecodeRefInputs& in, const HostArray& cache, int b, int g, int j);

}  // namespace flashattn

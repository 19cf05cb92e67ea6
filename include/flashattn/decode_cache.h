// The update-cache kernel of a decode step (kernels/util/decode_cache.cu): writes k_new and v_new
// into the caches at positions [cache_seqlens[b], cache_seqlens[b] + S_new), contiguous or
// through the block table. The driver runs it before a kernel's attention, and with a prompt's
// K/V (cache_seqlens all 0) to fill the cache after a prefill. Writing the same rows again gives
// the same cache, so timed repetitions of a step need no reset.
#pragma once

#include <cuda_runtime_api.h>

#include "flashattn/params.h"

namespace flashattn {

// Uses q-independent fields only: dtype, B, H_kv, S_new, D, k_new/v_new (+ strides), k_cache/
// v_cache (+ strides), cache_seqlens, block_table, block_table_stride, page_size, S_max. Rows
// beyond a batch element's capacity are skipped (the driver refuses such inputs beforehand).
void decode_append_kv(const DecodeParams& p, cudaStream_t stream);

}  // namespace flashattn

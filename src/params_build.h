// Kernel params built in one place per workload (as FlashAttention's set_params_fprop does): the
// sizes, dtype, layout and strides, the scale in the three forms kernels take, and the mask
// flags. Callers add the device pointers, the workspace and the device's facts (SM count), which
// only they know.
#pragma once

#include "decode_data.h"
#include "flashattn/params.h"
#include "problem.h"

namespace flashattn {

// A forward (and, through BwdParams' forward part, backward) problem; the window with causal
// folded in, as kernels test it.
FwdParams forward_params(const Problem& p);

// One decode step over `d`: q, k_new, v_new and o contiguous [B, H or H_kv, S_new, D]; the caches
// contiguous [B, H_kv, S_max, D] or paged [num_blocks, H_kv, page_size, D] with a [B, max_blocks]
// block table.
DecodeParams decode_params(const DecodeDims& d, DType t, double scale);

}  // namespace flashattn

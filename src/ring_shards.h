// The rows of a whole [B, heads, S, width] tensor that a ring shard holds (ring_plan.h), copied
// to a contiguous [B, heads, len, width] and back: how the ring hands each GPU its part of the
// inputs and gathers the outputs. Host memory; `st` are the whole tensor's element strides
// (width contiguous), `es` the element size.
#pragma once

#include <cstddef>

#include "flashattn/params.h"
#include "ring_plan.h"

namespace flashattn {

void ring_gather_rows(const void* whole, const Strides& st, size_t es, int B, int heads, int width,
                      const RingShard& shard, void* rows);
void ring_scatter_rows(const void* rows, size_t es, int B, int heads, int width, const RingShard& shard,
                       const Strides& st, void* whole);

}  // namespace flashattn

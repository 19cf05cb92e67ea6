// Shared pieces of the decode kernels (params.h, DecodeParams): where cache row j of (b, g) lives
// (contiguous or paged), how a batch element's keys are cut into split-K pieces, the layout of the
// split workspace, the choice of the number of splits, and the combine step that merges the
// pieces. Host and device; the host parts are plain C++.
#pragma once

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>

#include "common/host_device.h"
#include "flashattn/params.h"

namespace flashattn {
namespace decode {

// log2 of a power of two (page sizes are validated as powers of two by the loader).
inline int log2_exact(int v) {
  int s = 0;
  while ((1 << s) < v) ++s;
  return s;
}

// Element offset of cache row j of kv head g of batch b: contiguous when `table` is null, else
// through the block table (page = table[b][j / page], row j % page within it).
struct CacheAddr {
  int64_t batch = 0, head = 0, row = 0;  // element strides (batch = page stride when paged)
  const int32_t* table = nullptr;
  int table_stride = 0;
  int log2_page = 0;

  FLASHATTN_HD int64_t offset(int b, int g, int j) const {
    if (table == nullptr) return b * batch + g * head + static_cast<int64_t>(j) * row;
    const int64_t page = table[static_cast<int64_t>(b) * table_stride + (j >> log2_page)];
    return page * batch + g * head + static_cast<int64_t>(j & ((1 << log2_page) - 1)) * row;
  }
};

inline CacheAddr cache_addr(const DecodeParams& p, const Strides& st) {
  CacheAddr a;
  a.batch = st.batch, a.head = st.head, a.row = st.row;
  a.table = p.block_table;
  a.table_stride = p.block_table_stride;
  a.log2_page = p.block_table ? log2_exact(p.page_size) : 0;
  return a;
}

// Split `split` of `splits` of a batch element with `n_units` units of work (key blocks, or keys):
// consecutive pieces of ceil(n_units / splits) units, the last ones possibly short or empty.
struct Range {
  int begin = 0, end = 0;
};
FLASHATTN_HD inline Range split_range(int n_units, int splits, int split) {
  const int64_t per = (static_cast<int64_t>(n_units) + splits - 1) / splits;
  const int64_t begin = split * per, end = begin + per;  // 64-bit: may pass INT_MAX
  Range r;
  r.begin = begin < n_units ? static_cast<int>(begin) : n_units;
  r.end = end < n_units ? static_cast<int>(end) : n_units;
  return r;
}

// Partial results of the splits (fp32): O of row (b, h, i) in split s at
// o[(s * rows + row) * D], its lse (natural log) at lse[s * rows + row], rows = B * H * S_new in
// (b, h, i) order. Split pieces that saw no visible key hold lse = -inf and O = 0. A kernel that
// merges the pieces itself (the last CTA of a group to finish) keeps one arrival counter per
// group at the start of the workspace, where no split count moves them: the driver zero-fills the
// workspace when it allocates it, and such a kernel leaves every counter at zero when it returns.
struct SplitWorkspace {
  float* o = nullptr;
  float* lse = nullptr;
  int* counters = nullptr;  // `groups` arrival counters (kernels that merge in place)
};

inline size_t align256(size_t n) { return (n + 255) / 256 * 256; }

inline size_t split_workspace_bytes(const DecodeParams& p, int splits, int64_t counter_groups = 0) {
  if (splits <= 1) return 0;
  const size_t rows = static_cast<size_t>(p.B) * p.H * p.S_new;
  return align256(static_cast<size_t>(splits) * rows * p.D * sizeof(float)) +
         align256(static_cast<size_t>(splits) * rows * sizeof(float)) +
         align256(static_cast<size_t>(counter_groups) * sizeof(int));
}

inline SplitWorkspace split_workspace(const DecodeParams& p, int splits, int64_t counter_groups = 0) {
  const size_t rows = static_cast<size_t>(p.B) * p.H * p.S_new;
  SplitWorkspace w;
  char* base = static_cast<char*>(p.workspace);
  const size_t counter_bytes = align256(static_cast<size_t>(counter_groups) * sizeof(int));
  const size_t o_bytes = align256(static_cast<size_t>(splits) * rows * p.D * sizeof(float));
  w.counters = reinterpret_cast<int*>(base);
  w.o = reinterpret_cast<float*>(base + counter_bytes);
  w.lse = reinterpret_cast<float*>(base + counter_bytes + o_bytes);
  return w;
}

// How many split-K pieces a decode kernel cuts each (batch, kv head, row tile) into, the
// flash-decoding rule: split only while the grid does not already fill the GPU, never below
// `min_units` units per piece, and among the counts that fill the CTA slots (sm_count x
// ctas_per_sm) about equally well, the smallest (each split adds partial results to merge).
//   tiles      independent CTAs without splitting (B * H_kv * row tiles)
//   n_units    work units of the longest batch element (key blocks)
inline int choose_splits(int64_t tiles, int n_units, int sm_count, int ctas_per_sm, int min_units,
                         int max_splits) {
  const int64_t slots = static_cast<int64_t>(std::max(sm_count, 1)) * std::max(ctas_per_sm, 1);
  if (tiles * 5 >= slots * 4) return 1;  // >= 80% of the slots busy already
  const int limit = std::min(max_splits, std::max(1, n_units / std::max(min_units, 1)));
  if (limit <= 1) return 1;
  // A count s really gives ceil(n_units / ceil(n_units / s)) non-empty pieces.
  auto effective = [&](int s) {
    const int per = (n_units + s - 1) / s;
    return (n_units + per - 1) / per;
  };
  auto efficiency = [&](int s) {
    const int64_t ctas = tiles * effective(s);
    const int64_t waves = (ctas + slots - 1) / slots;
    return static_cast<double>(ctas) / static_cast<double>(waves * slots);
  };
  double best = 0;
  for (int s = 1; s <= limit; ++s) best = std::max(best, efficiency(s));
  for (int s = 1; s <= limit; ++s)
    if (efficiency(s) >= 0.85 * best) return effective(s);
  return 1;
}

// Merges the split pieces in the workspace into O (dtype) and lse (launch in decode_combine.cu):
//   lse = log sum_s exp(lse_s);  O = sum_s exp(lse_s - lse) O_s
void launch_combine(const DecodeParams& p, int splits, cudaStream_t stream);

}  // namespace decode
}  // namespace flashattn

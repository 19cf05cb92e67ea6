// Decode data directories (data/README.md, "Decode directories"): a KV cache and one step's new
// tokens.
//
//   q              [B, H, S_new, D]       queries of the new tokens
//   k_new, v_new   [B, H_kv, S_new, D]    keys and values of the new tokens
//   K_cache, V_cache                      contiguous: [B, H_kv, S_max, D]
//                                         paged:      [num_blocks, H_kv, page_size, D] (a page pool)
//   cache_seqlens  int32 [B]              tokens already in the cache (int64 is converted)
//   block_table    int32 [B, max_blocks]  paged only: page of each page-sized span of positions
//
// Each as NAME.npy, or NAME.bin described by meta.json's "files" entry ({"dtype", "shape"}).
// q, k_new, v_new and the caches share one float dtype. A directory is a decode directory when it
// holds K_cache. Every error is an InputError naming the file and the problem in one line.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "array.h"
#include "dataset.h"

namespace flashattn {

struct DecodeDims {
  int B = 0, H = 0, H_kv = 0, S_new = 0, D = 0;
  int S_max = 0;           // positions per batch element: contiguous S_max, or max_blocks * page_size
  int page_size = 0;       // 0: contiguous
  int num_blocks = 0;      // pages in the pool (paged)
  int max_blocks = 0;      // block_table columns (paged)
  bool paged() const { return page_size > 0; }
};

struct DecodeDataset {
  std::string dir;
  FileFormat format = FileFormat::Npy;
  DecodeDims dims;
  DType dtype = DType::F32;           // of q, k_new, v_new and the caches, as stored
  HostArray q, k_new, v_new, k_cache, v_cache;
  HostArray cache_seqlens;            // int32 [B]
  std::optional<HostArray> block_table;  // int32 [B, max_blocks]
  std::vector<std::string> input_paths;
  std::vector<std::string> notices;
};

// True when `dir` holds K_cache.npy or K_cache.bin.
bool is_decode_dir(const std::string& dir);

// Loads and validates a decode directory: shapes agree, H % H_kv == 0, cache_seqlens[b] >= 0 and
// cache_seqlens[b] + S_new <= S_max, page size a power of two in [16, 65536], every block-table
// entry a step reads or writes in [0, num_blocks), and no page written by one batch element's
// append read or written by another's.
DecodeDataset load_decode_dataset(const std::string& dir);

// L_b = cache_seqlens[b] + S_new, the keys batch element b attends to.
std::vector<int> decode_lengths(const HostArray& cache_seqlens, int S_new);

// The caches after the step: a copy of `cache` with k_new (or v_new) written at positions
// [cache_seqlens[b], cache_seqlens[b] + S_new) (through the block table when paged). What the
// update-cache kernel must produce, bit for bit.
HostArray append_on_host(const HostArray& cache, const HostArray& fresh, const HostArray& cache_seqlens,
                         const HostArray* block_table, int page_size);

}  // namespace flashattn

// flashattn-gen --decode: writes a decode data directory (data/README.md, "Decode directories").
#pragma once

#include <cstdint>
#include <string>

namespace flashattn_gen {

struct DecodeGenOptions {
  std::string out;
  int64_t B = 0, H = 0, H_kv = 0, D = 0;
  int64_t S_max = 0;
  int64_t S_new = 1;
  std::string cache_seqlens;  // "N", "N0,N1,...", or "random"
  int64_t page_size = 0;      // 0: contiguous cache
  std::string dtype = "fp32", format = "npy", init = "randn";
  uint64_t seed = 0;
  bool force = false;
};

// Validates the options (InputError naming the option) and writes the directory; returns 0.
int write_decode_dir(const DecodeGenOptions& o);

}  // namespace flashattn_gen

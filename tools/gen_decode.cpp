// flashattn-gen --decode: a deterministic decode data directory. Every tensor draws from its own
// random stream (seed, tensor id), in logical order: cache row j of (b, g) has the same value in a
// contiguous cache and in a paged one (where it sits in a shuffled page), so the two forms of one
// seed describe the same problem and must give the same outputs.
#include "gen_decode.h"

#include <fmt/core.h>

#include <algorithm>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <numeric>
#include <vector>

#include "array.h"
#include "flashattn/error.h"
#include "npy.h"
#include "random.h"
#include "staged_dir.h"

namespace fa = flashattn;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace flashattn_gen {
namespace {

enum Stream : uint64_t { kQ = 11, kKNew = 12, kVNew = 13, kKCache = 14, kVCache = 15, kSeqlens = 16, kTable = 17 };

[[noreturn]] void usage(const std::string& msg) { throw fa::InputError(msg); }

double value(const std::string& init, fa::Rng& rng, int64_t pos, int64_t d, int64_t S, int64_t D) {
  if (init == "randn") return rng.normal();
  if (init == "uniform") return 2.0 * rng.uniform() - 1.0;
  if (init == "ones") return 1.0;
  if (init == "rowidx") return 2.0 * static_cast<double>(pos) / S - 1.0 + static_cast<double>(d) / (16.0 * D);
  return 2.0 * static_cast<double>(d) / D - 1.0;  // colidx
}

std::vector<int32_t> cache_lengths(const DecodeGenOptions& o) {
  std::vector<int32_t> c(static_cast<size_t>(o.B));
  const int64_t most = o.S_max - o.S_new;  // cache_seqlens[b] + S_new <= S_max
  if (o.cache_seqlens == "random") {
    fa::Rng rng(o.seed, kSeqlens);
    for (auto& v : c) v = static_cast<int32_t>(rng.below(most + 1));
    return c;
  }
  std::vector<int64_t> values;
  size_t start = 0;
  while (start <= o.cache_seqlens.size()) {
    const size_t comma = std::min(o.cache_seqlens.find(',', start), o.cache_seqlens.size());
    const std::string item = o.cache_seqlens.substr(start, comma - start);
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size())
      usage("--cache-seqlens: '" + item + "' is not an integer (expected N, B comma-separated lengths, or 'random')");
    if (v < 0 || v > most)
      usage("--cache-seqlens: length " + item + " is outside [0, S_max - S_new] = [0, " + std::to_string(most) + "]");
    values.push_back(v);
    start = comma + 1;
  }
  if (values.size() == 1) values.assign(static_cast<size_t>(o.B), values[0]);
  if (static_cast<int64_t>(values.size()) != o.B)
    usage("--cache-seqlens: got " + std::to_string(values.size()) + " lengths, expected 1 or B = " + std::to_string(o.B));
  for (size_t b = 0; b < c.size(); ++b) c[b] = static_cast<int32_t>(values[b]);
  return c;
}

void check(const DecodeGenOptions& o) {
  const std::pair<const char*, int64_t> sizes[] = {{"--B", o.B}, {"--H", o.H}, {"--H-kv", o.H_kv}, {"--D", o.D},
                                                   {"--S-max", o.S_max}, {"--S-new", o.S_new}};
  for (const auto& s : sizes)
    if (s.second < 1 || s.second > std::numeric_limits<int32_t>::max())
      usage(std::string(s.first) + ": " + std::to_string(s.second) + " is out of range (1 .. 2^31-1)");
  if (o.H % o.H_kv != 0) usage("--H-kv: H=" + std::to_string(o.H) + " is not a multiple of H_kv=" + std::to_string(o.H_kv));
  if (o.S_new > o.S_max) usage("--S-new: " + std::to_string(o.S_new) + " exceeds --S-max " + std::to_string(o.S_max));
  if (o.page_size != 0 && (o.page_size < 16 || o.page_size > 65536 || (o.page_size & (o.page_size - 1)) != 0))
    usage("--page-size: " + std::to_string(o.page_size) + " is not a power of two in [16, 65536] (0: contiguous)");
  if (o.cache_seqlens.empty()) usage("--cache-seqlens: required with --decode (N, a comma list, or random)");
  if (fa::shape_numel({o.B, o.H_kv, o.S_max + o.page_size, o.D, 16}) < 0 || fa::shape_numel({o.B, o.H, o.S_new, o.D, 16}) < 0)
    usage("--B/--H/--S-max/--D: the tensors would be absurdly large");
}

// A logical [B, heads, S, D] tensor from stream `stream`; row i of batch b sits at position
// pos0[b] + i for the rowidx style (the cache's own positions, or those of the new tokens).
fa::HostArray logical(const DecodeGenOptions& o, uint64_t stream, int64_t heads, int64_t S, const std::vector<int32_t>* pos0,
                      int64_t S_ref, fa::DType dtype) {
  fa::HostArray a(fa::DType::F64, {o.B, heads, S, o.D});
  double* p = a.data<double>();
  fa::Rng rng(o.seed, stream);
  for (int64_t b = 0; b < o.B; ++b)
    for (int64_t h = 0; h < heads; ++h)
      for (int64_t i = 0; i < S; ++i) {
        const int64_t pos = (pos0 ? (*pos0)[static_cast<size_t>(b)] : 0) + i;
        for (int64_t d = 0; d < o.D; ++d) *p++ = value(o.init, rng, pos, d, S_ref, o.D);
      }
  return fa::convert(a, dtype);
}

// Scatters a logical [B, H_kv, max_blocks * page, D] cache into a pool [B * max_blocks, H_kv,
// page, D] through the block table.
fa::HostArray to_pool(const fa::HostArray& cache, const std::vector<int32_t>& table, int64_t max_blocks, int64_t page) {
  const int64_t B = cache.shape[0], H_kv = cache.shape[1], D = cache.shape[3];
  fa::HostArray pool(cache.dtype, {B * max_blocks, H_kv, page, D});
  const size_t row_bytes = static_cast<size_t>(D) * fa::dtype_size(cache.dtype);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t g = 0; g < H_kv; ++g)
      for (int64_t j = 0; j < max_blocks * page; ++j) {
        const int64_t pg = table[static_cast<size_t>(b * max_blocks + j / page)];
        const int64_t src = (b * H_kv + g) * max_blocks * page + j;
        const int64_t dst = (pg * H_kv + g) * page + j % page;
        std::copy_n(cache.bytes.data() + src * row_bytes, row_bytes, pool.bytes.data() + dst * row_bytes);
      }
  return pool;
}

const char* const kDataFiles[] = {"q", "k_new", "v_new", "K_cache", "V_cache", "cache_seqlens", "block_table",
                                  "Q", "K", "V", "dO", "seqlens_k", "mask"};

}  // namespace

int write_decode_dir(const DecodeGenOptions& o) {
  check(o);
  fa::DType dtype;
  if (!fa::parse_dtype(o.dtype, &dtype) || !fa::dtype_is_float(dtype)) usage("--dtype: unknown dtype '" + o.dtype + "'");
  const std::vector<int32_t> c = cache_lengths(o);
  StagedDir staged(o.out, o.force, usage);  // nothing appears at --out until every file is written

  const bool bin = o.format == "bin";
  const std::string ext = bin ? ".bin" : ".npy";
  std::vector<std::string> written;
  json files = json::object();
  auto write = [&](const std::string& name, const fa::HostArray& a) {
    const std::string path = staged.path(name + ext);
    if (bin) fa::write_raw(path, a);
    else fa::write_npy(path, a);
    written.push_back(name + ext);
    files[name] = {{"dtype", fa::dtype_name(a.dtype)}, {"shape", a.shape}};
  };

  const bool paged = o.page_size > 0;
  const int64_t max_blocks = paged ? (o.S_max + o.page_size - 1) / o.page_size : 0;
  const int64_t S_cap = paged ? max_blocks * o.page_size : o.S_max;  // positions per batch element
  write("q", logical(o, kQ, o.H, o.S_new, &c, S_cap, dtype));
  write("k_new", logical(o, kKNew, o.H_kv, o.S_new, &c, S_cap, dtype));
  write("v_new", logical(o, kVNew, o.H_kv, o.S_new, &c, S_cap, dtype));
  fa::HostArray k_cache = logical(o, kKCache, o.H_kv, S_cap, nullptr, S_cap, dtype);
  fa::HostArray v_cache = logical(o, kVCache, o.H_kv, S_cap, nullptr, S_cap, dtype);
  fa::HostArray lens(fa::DType::I32, {o.B});
  std::copy(c.begin(), c.end(), lens.data<int32_t>());
  if (paged) {
    // Each batch element owns max_blocks pages of a shuffled pool: logical block k of element b
    // is page table[b][k].
    std::vector<int32_t> table(static_cast<size_t>(o.B * max_blocks));
    std::iota(table.begin(), table.end(), 0);
    fa::Rng rng(o.seed, kTable);
    for (int64_t k = static_cast<int64_t>(table.size()) - 1; k > 0; --k)
      std::swap(table[static_cast<size_t>(k)], table[static_cast<size_t>(rng.below(k + 1))]);
    fa::HostArray t(fa::DType::I32, {o.B, max_blocks});
    std::copy(table.begin(), table.end(), t.data<int32_t>());
    write("K_cache", to_pool(k_cache, table, max_blocks, o.page_size));
    write("V_cache", to_pool(v_cache, table, max_blocks, o.page_size));
    write("block_table", t);
  } else {
    write("K_cache", k_cache);
    write("V_cache", v_cache);
  }
  write("cache_seqlens", lens);

  json meta = {{"format_version", 1}, {"layout", "bhsd"}, {"kind", "decode"}};
  meta["decode"] = {{"B", o.B}, {"H", o.H}, {"H_kv", o.H_kv}, {"D", o.D}, {"S_new", o.S_new}, {"S_max", S_cap},
                    {"page_size", o.page_size}};
  if (bin) meta["files"] = files;
  meta["generator"] = {{"seed", o.seed}, {"init", o.init}, {"cache_seqlens", o.cache_seqlens}};
  const std::string text = meta.dump(2) + "\n";
  fa::write_file_atomic(staged.path("meta.json"), text.data(), text.size());
  written.push_back("meta.json");
  std::vector<std::string> stale;
  for (const char* f : kDataFiles)
    for (const char* e : {".npy", ".bin"}) stale.push_back(std::string(f) + e);
  staged.commit(stale);
  int32_t lo = *std::min_element(c.begin(), c.end()), hi = *std::max_element(c.begin(), c.end());
  fmt::print("flashattn-gen: wrote decode {} ({}, {}): q [{}, {}, {}, {}], cache {} positions{}, cache_seqlens {}..{}; "
             "seed {}, init {}\n",
             o.out, o.format, fa::dtype_name(dtype), o.B, o.H, o.S_new, o.D, S_cap,
             paged ? fmt::format(" in {} pages of {}", o.B * max_blocks, o.page_size) : std::string(), lo, hi, o.seed, o.init);
  return fa::kExitOk;
}

}  // namespace flashattn_gen

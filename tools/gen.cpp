// flashattn-gen: writes a data directory (see data/README.md) with deterministic contents.
//
// Every tensor draws from its own random stream (seed, tensor id), so adding dO or a mask never
// changes Q, K or V. Values are produced in double at their logical [b, h, s, d] position, so the
// same seed describes the same problem in either layout, and are rounded once to the dtype.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fmt/core.h>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "array.h"
#include "dataset.h"
#include "gen_decode.h"
#include "flashattn/error.h"
#include "npy.h"
#include "random.h"
#include "staged_dir.h"

namespace fa = flashattn;
namespace fs = std::filesystem;
using json = nlohmann::json;

using flashattn::Rng;

namespace {

enum Stream : uint64_t { kStreamQ = 1, kStreamK = 2, kStreamV = 3, kStreamDO = 4, kStreamSeqlens = 5, kStreamMask = 6 };

struct Options {
  std::string out;
  int64_t B = 0, H = 0, H_kv = 0, S = 0, S_q = 0, S_k = 0, D = 0;
  std::string dtype = "fp32", format = "npy", layout = "bhsd", init = "randn";
  uint64_t seed = 0;
  bool with_dO = false;
  std::string seqlens_k;
  std::string mask = "none", mask_shape = "full";
  int64_t mask_empty_rows = 0;
  bool no_meta = false, force = false;
};

[[noreturn]] void usage(const std::string& msg) { throw fa::InputError(msg); }

// Value of element (b, h, i, d) of a [B, H, S, D] tensor for the deterministic init styles.
double init_value(const std::string& init, Rng& rng, int64_t i, int64_t d, int64_t S, int64_t D) {
  if (init == "randn") return rng.normal();
  if (init == "uniform") return 2.0 * rng.uniform() - 1.0;
  if (init == "ones") return 1.0;
  if (init == "rowidx") return 2.0 * static_cast<double>(i) / S - 1.0 + static_cast<double>(d) / (16.0 * D);
  return 2.0 * static_cast<double>(d) / D - 1.0;  // colidx
}

// A [B, H, S, D] tensor stored in `layout`, generated in logical order and rounded once to `dtype`.
fa::HostArray make_tensor(const std::string& init, uint64_t seed, uint64_t stream, fa::Layout layout, int64_t B,
                          int64_t H, int64_t S, int64_t D, fa::DType dtype) {
  const bool bshd = layout == fa::Layout::BSHD;
  fa::HostArray a(fa::DType::F64, bshd ? std::vector<int64_t>{B, S, H, D} : std::vector<int64_t>{B, H, S, D});
  double* p = a.data<double>();
  Rng rng(seed, stream);
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t i = 0; i < S; ++i) {
        const int64_t row = bshd ? (b * S + i) * H + h : (b * H + h) * S + i;
        for (int64_t d = 0; d < D; ++d) p[row * D + d] = init_value(init, rng, i, d, S, D);
      }
  return fa::convert(a, dtype);
}

fa::HostArray make_seqlens(const Options& o) {
  fa::HostArray s(fa::DType::I32, {o.B});
  int32_t* p = s.data<int32_t>();
  if (o.seqlens_k == "random") {
    Rng rng(o.seed, kStreamSeqlens);
    for (int64_t b = 0; b < o.B; ++b) p[b] = static_cast<int32_t>(1 + rng.below(o.S_k));
    p[rng.below(o.B)] = static_cast<int32_t>(o.S_k);  // one full-length batch, as real batches have
    return s;
  }
  std::vector<int64_t> values;
  size_t start = 0;
  while (start <= o.seqlens_k.size()) {
    const size_t comma = std::min(o.seqlens_k.find(',', start), o.seqlens_k.size());
    const std::string item = o.seqlens_k.substr(start, comma - start);
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size()) usage("--seqlens-k: '" + item + "' is not an integer (expected B comma-separated lengths or 'random')");
    if (v < 0 || v > o.S_k) usage("--seqlens-k: length " + item + " is outside [0, S_k] = [0, " + std::to_string(o.S_k) + "]");
    values.push_back(v);
    start = comma + 1;
  }
  if (static_cast<int64_t>(values.size()) != o.B) {
    usage("--seqlens-k: got " + std::to_string(values.size()) + " lengths, expected B = " + std::to_string(o.B));
  }
  for (int64_t b = 0; b < o.B; ++b) p[b] = static_cast<int32_t>(values[static_cast<size_t>(b)]);
  return s;
}

std::vector<int64_t> mask_shape(const Options& o) {
  if (o.mask_shape == "batch") return {o.B, 1, o.S_q, o.S_k};
  if (o.mask_shape == "head") return {1, o.H, o.S_q, o.S_k};
  if (o.mask_shape == "shared") return {o.S_q, o.S_k};
  return {o.B, o.H, o.S_q, o.S_k};
}

fa::HostArray make_mask(const Options& o) {
  fa::HostArray m(fa::DType::F32, mask_shape(o));
  float* p = m.data<float>();
  const int64_t rows = m.numel() / o.S_k;
  const float neg_inf = -std::numeric_limits<float>::infinity();
  if (o.mask == "causal-bias") {
    for (int64_t r = 0; r < rows; ++r) {
      const int64_t i = r % o.S_q;
      for (int64_t j = 0; j < o.S_k; ++j) p[r * o.S_k + j] = j <= i + o.S_k - o.S_q ? 0.0f : neg_inf;
    }
    return m;
  }
  Rng rng(o.seed, kStreamMask);
  for (int64_t e = 0; e < m.numel(); ++e) {
    const double u = rng.uniform();
    const double z = rng.normal();
    p[e] = u < 0.1 ? neg_inf : static_cast<float>(z);
  }
  // Fully masked rows: a partial Fisher-Yates shuffle picks distinct rows.
  std::vector<int64_t> order(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) order[static_cast<size_t>(r)] = r;
  for (int64_t k = 0; k < o.mask_empty_rows; ++k) {
    std::swap(order[static_cast<size_t>(k)], order[static_cast<size_t>(k + rng.below(rows - k))]);
    float* row = p + order[static_cast<size_t>(k)] * o.S_k;
    std::fill(row, row + o.S_k, neg_inf);
  }
  return m;
}

void check_options(Options& o, bool S_given, bool S_q_given, bool S_k_given, bool H_kv_given) {
  if (!S_q_given && S_given) o.S_q = o.S;
  if (!S_k_given && S_given) o.S_k = o.S;
  if (!H_kv_given) o.H_kv = o.H;
  if (!S_q_given && !S_given) usage("--S: give --S, or both --S-q and --S-k");
  if (!S_k_given && !S_given) usage("--S: give --S, or both --S-q and --S-k");
  const std::pair<const char*, int64_t> sizes[] = {{"--B", o.B},     {"--H", o.H},     {"--H-kv", o.H_kv},
                                                   {"--S-q", o.S_q}, {"--S-k", o.S_k}, {"--D", o.D}};
  for (const auto& s : sizes) {
    if (s.second < 1 || s.second > std::numeric_limits<int32_t>::max()) {
      usage(std::string(s.first) + ": " + std::to_string(s.second) + " is out of range (1 .. 2^31-1)");
    }
  }
  if (o.H % o.H_kv != 0) {
    usage("--H-kv: H=" + std::to_string(o.H) + " is not a multiple of H_kv=" + std::to_string(o.H_kv));
  }
  if (fa::shape_numel({o.B, o.H, std::max(o.S_q, o.S_k), o.D, 8}) < 0 || fa::shape_numel({o.B, o.H, o.S_q, o.S_k, 4}) < 0) {
    usage("--B/--H/--S/--D: the tensors would be absurdly large");
  }
  if (o.mask_empty_rows < 0) usage("--mask-empty-rows: must be >= 0");
  if (o.mask_empty_rows > 0 && o.mask != "random") usage("--mask-empty-rows: needs --mask random");
  if (o.mask_empty_rows > 0 && o.mask_empty_rows > fa::shape_numel(mask_shape(o)) / o.S_k) {
    usage("--mask-empty-rows: " + std::to_string(o.mask_empty_rows) + " is more than the mask's " +
          std::to_string(fa::shape_numel(mask_shape(o)) / o.S_k) + " rows");
  }
  if (o.no_meta) {
    const std::string want = "B" + std::to_string(o.B) + "_H" + std::to_string(o.H) + "_S" + std::to_string(o.S_q) +
                             "_D" + std::to_string(o.D);
    fs::path p = fs::path(o.out).lexically_normal();
    if (!p.has_filename()) p = p.parent_path();
    if (o.format != "bin") usage("--no-meta: only for --format bin");
    if (o.H_kv != o.H || o.S_q != o.S_k || o.dtype != "fp32" || o.layout != "bhsd") {
      usage("--no-meta: the directory-name convention means H_kv = H, S_q = S_k, fp32 and bhsd");
    }
    if (o.mask != "none" && o.mask_shape != "full") usage("--no-meta: the mask must be --mask-shape full");
    if (p.filename().string() != want) usage("--no-meta: --out must be a directory named " + want);
  }
}

// The data files a directory may hold; with --force those this run does not write are removed,
// so the directory describes exactly one problem (StagedDir::commit).
const char* const kDataFiles[] = {"Q.npy",         "K.npy",         "V.npy",    "dO.npy",   "seqlens_k.npy",
                                  "mask.npy",      "Q.bin",         "K.bin",    "V.bin",    "dO.bin",
                                  "seqlens_k.bin", "mask.bin",      "meta.json"};

int run(Options& o, bool S_given, bool S_q_given, bool S_k_given, bool H_kv_given) {
  check_options(o, S_given, S_q_given, S_k_given, H_kv_given);
  fa::DType dtype;
  if (!fa::parse_dtype(o.dtype, &dtype)) usage("--dtype: unknown dtype '" + o.dtype + "'");
  const fa::Layout layout = o.layout == "bshd" ? fa::Layout::BSHD : fa::Layout::BHSD;
  const bool bin = o.format == "bin";
  const std::string ext = bin ? ".bin" : ".npy";
  flashattn_gen::StagedDir staged(o.out, o.force, usage);  // nothing appears at --out until every file is written

  std::vector<std::string> written;
  json files = json::object();
  auto write = [&](const std::string& name, const fa::HostArray& a) {
    const std::string path = staged.path(name + ext);
    if (bin) fa::write_raw(path, a);
    else fa::write_npy(path, a);
    written.push_back(name + ext);
    files[name] = {{"dtype", fa::dtype_name(a.dtype)}, {"shape", a.shape}};
  };
  const fa::HostArray q = make_tensor(o.init, o.seed, kStreamQ, layout, o.B, o.H, o.S_q, o.D, dtype);
  write("Q", q);
  write("K", make_tensor(o.init, o.seed, kStreamK, layout, o.B, o.H_kv, o.S_k, o.D, dtype));
  write("V", make_tensor(o.init, o.seed, kStreamV, layout, o.B, o.H_kv, o.S_k, o.D, dtype));
  if (o.with_dO) write("dO", make_tensor("randn", o.seed, kStreamDO, layout, o.B, o.H, o.S_q, o.D, dtype));
  std::string extras;
  if (!o.seqlens_k.empty()) {
    const fa::HostArray s = make_seqlens(o);
    write("seqlens_k", s);
    extras += ", seqlens_k [";
    for (int64_t b = 0; b < o.B; ++b) extras += (b ? "," : "") + std::to_string(s.data<int32_t>()[b]);
    extras += "]";
  }
  if (o.mask != "none") {
    const fa::HostArray m = make_mask(o);
    write("mask", m);
    extras += ", mask " + fa::shape_str(m.shape) + " " + o.mask;
  }

  if (!o.no_meta) {
    // npy files describe themselves; their meta.json only records the layout (and provenance).
    json meta = {{"format_version", 1}, {"layout", o.layout}};
    if (bin) {
      meta["dtype"] = fa::dtype_name(dtype);
      const std::pair<const char*, int64_t> dims[] = {{"B", o.B},     {"H", o.H},     {"H_kv", o.H_kv},
                                                      {"S_q", o.S_q}, {"S_k", o.S_k}, {"D", o.D}};
      for (const auto& [key, value] : dims) meta[key] = value;
      meta["files"] = files;
    }
    meta["generator"] = {{"seed", o.seed}, {"init", o.init}, {"mask", o.mask}};
    const std::string text = meta.dump(2) + "\n";
    fa::write_file_atomic(staged.path("meta.json"), text.data(), text.size());
    written.push_back("meta.json");
  }
  staged.commit(std::vector<std::string>(std::begin(kDataFiles), std::end(kDataFiles)));
  fmt::print("flashattn-gen: wrote {} ({}, {}, {}{}): Q {}, K/V {}{}{}; seed {}, init {}\n", o.out, o.format,
             o.layout, fa::dtype_name(dtype), o.no_meta ? ", no meta.json" : "", fa::shape_str(q.shape),
             fa::shape_str(layout == fa::Layout::BSHD ? std::vector<int64_t>{o.B, o.S_k, o.H_kv, o.D}
                                                      : std::vector<int64_t>{o.B, o.H_kv, o.S_k, o.D}),
             o.with_dO ? ", dO" : "", extras, o.seed, o.init);
  return fa::kExitOk;
}

constexpr const char* kFooter = R"(Init styles (Q, K and V; dO is always randn from its own stream):
  randn    N(0, 1)
  uniform  U(-1, 1)
  ones     1
  rowidx   2*i/S - 1 + d/(16*D)   (i: position in the sequence, d: index in the head dim)
  colidx   2*d/D - 1              (depends on d only)
Masks (float32, added to the scaled scores):
  random       N(0, 1) with about 10% -inf; --mask-empty-rows N makes N rows entirely -inf
  causal-bias  0 where key j <= i + S_k - S_q, else -inf (the bottom-right causal mask)
Mask shapes: full [B,H,S_q,S_k]  batch [B,1,S_q,S_k]  head [1,H,S_q,S_k]  shared [S_q,S_k]
Decode (--decode --S-max N --cache-seqlens N|LIST|random [--S-new N] [--page-size P]): q, k_new, v_new,
  K_cache, V_cache, cache_seqlens (+ block_table with a shuffled page assignment when paged); rowidx
  uses each row's position in the cache.
Exit codes: 0 ok, 1 runtime failure, 2 usage or input error.)";

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"flashattn-gen: write a deterministic attention data directory (see data/README.md)"};
  app.footer(kFooter);
  Options o;
  app.add_option("--out", o.out, "output directory")->required();
  app.add_option("--B", o.B, "batch size")->required();
  app.add_option("--H", o.H, "query heads")->required();
  auto* h_kv = app.add_option("--H-kv", o.H_kv, "key/value heads (default H; H must be a multiple)");
  auto* s = app.add_option("--S", o.S, "sequence length of queries and keys");
  auto* s_q = app.add_option("--S-q", o.S_q, "query sequence length (overrides --S)");
  auto* s_k = app.add_option("--S-k", o.S_k, "key sequence length (overrides --S)");
  app.add_option("--D", o.D, "head dim")->required();
  app.add_option("--dtype", o.dtype, "fp32 | fp16 | bf16 | fp64")->check(CLI::IsMember({"fp32", "fp16", "bf16", "fp64"}));
  app.add_option("--format", o.format, "npy | bin")->check(CLI::IsMember({"npy", "bin"}));
  app.add_option("--layout", o.layout, "bhsd | bshd")->check(CLI::IsMember({"bhsd", "bshd"}));
  app.add_option("--seed", o.seed, "random seed (default 0)");
  app.add_option("--init", o.init, "randn | uniform | ones | rowidx | colidx")
      ->check(CLI::IsMember({"randn", "uniform", "ones", "rowidx", "colidx"}));
  app.add_flag("--with-dO", o.with_dO, "also write dO (randn, own stream)");
  app.add_option("--seqlens-k", o.seqlens_k, "B comma-separated key lengths in [0, S_k], or 'random' ([1, S_k], one = S_k)");
  app.add_option("--mask", o.mask, "none | random | causal-bias")->check(CLI::IsMember({"none", "random", "causal-bias"}));
  app.add_option("--mask-shape", o.mask_shape, "full | batch | head | shared")
      ->check(CLI::IsMember({"full", "batch", "head", "shared"}));
  app.add_option("--mask-empty-rows", o.mask_empty_rows, "with --mask random: this many fully -inf rows");
  app.add_flag("--no-meta", o.no_meta, "bin only: no meta.json; --out must be named B{b}_H{h}_S{s}_D{d}");
  app.add_flag("--force", o.force, "write into a non-empty directory, replacing its data files");
  flashattn_gen::DecodeGenOptions dec;
  bool decode = false;
  app.add_flag("--decode", decode, "write a decode directory (KV cache + new tokens; data/README.md)");
  auto* s_max = app.add_option("--S-max", dec.S_max, "decode: cache positions per batch element");
  auto* cache_seqlens = app.add_option("--cache-seqlens", dec.cache_seqlens,
                                       "decode: tokens already cached: N, B comma-separated lengths, or 'random'");
  auto* s_new = app.add_option("--S-new", dec.S_new, "decode: new tokens per step (default 1)");
  auto* page = app.add_option("--page-size", dec.page_size,
                              "decode: paged cache with this page size (power of two >= 16; 0: contiguous)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    fmt::print(stderr, "flashattn-gen: {} (see --help)\n", e.what());
    return fa::kExitInput;
  }
  try {
    if (decode) {
      for (const char* forward_only : {"--S", "--S-q", "--S-k", "--layout", "--with-dO", "--seqlens-k", "--mask",
                                       "--mask-shape", "--mask-empty-rows", "--no-meta"})
        if (app.count(forward_only) > 0)
          throw fa::InputError(std::string(forward_only) + ": not used with --decode (see --S-max, --cache-seqlens, --S-new)");
      if (s_max->count() == 0) throw fa::InputError("--S-max: required with --decode");
      dec.out = o.out, dec.B = o.B, dec.H = o.H, dec.H_kv = h_kv->count() > 0 ? o.H_kv : o.H, dec.D = o.D;
      dec.dtype = o.dtype, dec.format = o.format, dec.init = o.init, dec.seed = o.seed, dec.force = o.force;
      return flashattn_gen::write_decode_dir(dec);
    }
    for (const CLI::Option* decode_only : {s_max, cache_seqlens, s_new, page})
      if (decode_only->count() > 0) throw fa::InputError(decode_only->get_name() + ": only with --decode");
    return run(o, s->count() > 0, s_q->count() > 0, s_k->count() > 0, h_kv->count() > 0);
  } catch (const fa::Error& e) {
    fmt::print(stderr, "{}\n", e.what());  // already one line starting with the path or option
    return e.exit_code();
  } catch (const std::bad_alloc&) {
    fmt::print(stderr, "flashattn-gen: out of memory\n");
    return fa::kExitRuntime;
  } catch (const std::exception& e) {
    fmt::print(stderr, "flashattn-gen: {}\n", e.what());
    return fa::kExitRuntime;
  }
}

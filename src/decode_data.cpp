// Loading a decode data directory; the contract is data/README.md ("Decode directories"). The
// loader only reads.
#include "decode_data.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "flashattn/error.h"
#include "meta.h"
#include "npy.h"

namespace flashattn {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

std::string join(const std::string& dir, const std::string& file) { return (fs::path(dir) / file).string(); }

std::string str(int64_t v) { return std::to_string(v); }

class Reader {
 public:
  explicit Reader(DecodeDataset* ds) : ds_(ds) {
    std::error_code ec;
    const std::string meta_path = join(ds->dir, "meta.json");
    if (fs::exists(meta_path, ec)) {
      const std::vector<uint8_t> bytes = read_file(meta_path);
      meta_ = parse_meta_json(bytes.data(), bytes.size(), meta_path);
      meta_path_ = meta_path;
      ds->input_paths.push_back(meta_path);
      if (meta_->contains("layout") && (*meta_)["layout"] != "bhsd")
        throw InputError(meta_path + ": decode directories are bhsd (field 'layout' is " + (*meta_)["layout"].dump() + ")");
    }
  }

  // Which file holds NAME (npy or bin), or nullopt when neither exists.
  std::optional<std::string> find(const std::string& name) const {
    std::error_code ec;
    const std::string npy = join(ds_->dir, name + ".npy"), bin = join(ds_->dir, name + ".bin");
    const bool has_npy = fs::exists(npy, ec), has_bin = fs::exists(bin, ec);
    if (has_npy && has_bin) throw InputError(ds_->dir + ": both " + name + ".npy and " + name + ".bin exist; keep one");
    if (!has_npy && !has_bin) return std::nullopt;
    return has_npy ? npy : bin;
  }

  HostArray load(const std::string& name, bool required, std::string* path_out) {
    const std::optional<std::string> path = find(name);
    if (!path) {
      if (required) throw InputError(ds_->dir + ": missing " + name + " (expected " + name + ".npy or " + name + ".bin)");
      return HostArray();
    }
    *path_out = *path;
    ds_->input_paths.push_back(*path);
    if (path->size() > 4 && path->compare(path->size() - 4, 4, ".npy") == 0) {
      ds_->format = FileFormat::Npy;
      return read_npy(*path);
    }
    ds_->format = FileFormat::Bin;
    return read_raw(*path, bin_dtype(name, *path), bin_shape(name, *path));
  }

 private:
  const json& entry(const std::string& name, const std::string& path) const {
    if (!meta_ || !meta_->contains("files") || !(*meta_)["files"].is_object() || !(*meta_)["files"].contains(name))
      throw InputError(path + ": a decode .bin file needs a meta.json \"files\" entry {\"dtype\", \"shape\"}");
    return (*meta_)["files"][name];
  }
  DType bin_dtype(const std::string& name, const std::string& path) const {
    const json& e = entry(name, path);
    DType t;
    if (!e.contains("dtype") || !e["dtype"].is_string() || !parse_dtype(e["dtype"].get<std::string>(), &t))
      throw InputError(meta_path_ + ": field 'files." + name + ".dtype' must be a dtype name");
    return t;
  }
  std::vector<int64_t> bin_shape(const std::string& name, const std::string& path) const {
    const json& e = entry(name, path);
    std::vector<int64_t> shape;
    bool ok = e.contains("shape") && e["shape"].is_array();
    if (ok) {
      for (const json& v : e["shape"]) {
        if (!v.is_number_integer() || v.get<int64_t>() < 0) ok = false;
        else shape.push_back(v.get<int64_t>());
      }
    }
    if (!ok) throw InputError(meta_path_ + ": field 'files." + name + ".shape' must be a list of non-negative integers");
    return shape;
  }

  DecodeDataset* ds_;
  std::optional<json> meta_;
  std::string meta_path_;
};

void require_rank4_float(const HostArray& a, const std::string& path, const char* dims) {
  if (a.rank() != 4) throw InputError(path + ": expected rank 4 " + dims + ", got shape " + shape_str(a.shape));
  if (!dtype_is_float(a.dtype))
    throw InputError(path + ": dtype " + dtype_name(a.dtype) + " is not supported (fp32, fp16, bf16 or fp64)");
  for (int64_t s : a.shape) {
    if (s < 1) throw InputError(path + ": shape " + shape_str(a.shape) + " has an empty dimension");
    if (s > std::numeric_limits<int>::max()) throw InputError(path + ": shape " + shape_str(a.shape) + " is too large");
  }
}

HostArray to_int32(const HostArray& a, const std::string& path, const std::vector<int64_t>& shape, const char* what,
                   std::vector<std::string>* notices) {
  if (a.dtype != DType::I32 && a.dtype != DType::I64)
    throw InputError(path + ": dtype " + dtype_name(a.dtype) + " is not supported (int32, or int64 converted)");
  if (a.shape != shape) throw InputError(path + ": expected shape " + what + " = " + shape_str(shape) + ", got " + shape_str(a.shape));
  HostArray out(DType::I32, shape);
  for (int64_t i = 0; i < a.numel(); ++i) {
    const int64_t v = a.dtype == DType::I32 ? a.data<int32_t>()[i] : a.data<int64_t>()[i];
    if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max())
      throw InputError(path + ": value " + str(v) + " at flat index " + str(i) + " does not fit int32");
    out.data<int32_t>()[i] = static_cast<int32_t>(v);
  }
  if (a.dtype == DType::I64) notices->push_back(path + ": converted int64 to int32");
  return out;
}

bool power_of_two(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

}  // namespace

bool is_decode_dir(const std::string& dir) {
  std::error_code ec;
  return fs::exists(join(dir, "K_cache.npy"), ec) || fs::exists(join(dir, "K_cache.bin"), ec);
}

std::vector<int> decode_lengths(const HostArray& cache_seqlens, int S_new) {
  std::vector<int> L(static_cast<size_t>(cache_seqlens.numel()));
  for (size_t b = 0; b < L.size(); ++b) L[b] = cache_seqlens.data<int32_t>()[b] + S_new;
  return L;
}

DecodeDataset load_decode_dataset(const std::string& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) throw InputError(dir + ": no such directory");
  if (!fs::is_directory(dir, ec)) throw InputError(dir + ": not a directory");
  DecodeDataset ds;
  ds.dir = dir;
  Reader rd(&ds);
  std::string pq, pkn, pvn, pkc, pvc, pcs, pbt;
  ds.q = rd.load("q", true, &pq);
  ds.k_new = rd.load("k_new", true, &pkn);
  ds.v_new = rd.load("v_new", true, &pvn);
  ds.k_cache = rd.load("K_cache", true, &pkc);
  ds.v_cache = rd.load("V_cache", true, &pvc);
  const HostArray seqlens = rd.load("cache_seqlens", true, &pcs);
  const HostArray table = rd.load("block_table", false, &pbt);
  const bool paged = !pbt.empty();

  require_rank4_float(ds.q, pq, "[B, H, S_new, D]");
  require_rank4_float(ds.k_new, pkn, "[B, H_kv, S_new, D]");
  require_rank4_float(ds.v_new, pvn, "[B, H_kv, S_new, D]");
  const char* cache_dims = paged ? "[num_blocks, H_kv, page_size, D]" : "[B, H_kv, S_max, D]";
  require_rank4_float(ds.k_cache, pkc, cache_dims);
  require_rank4_float(ds.v_cache, pvc, cache_dims);

  const std::pair<const HostArray*, const std::string*> tensors[] = {
      {&ds.k_new, &pkn}, {&ds.v_new, &pvn}, {&ds.k_cache, &pkc}, {&ds.v_cache, &pvc}};
  for (const auto& t : tensors) {
    if (t.first->dtype != ds.q.dtype)
      throw InputError(*t.second + ": dtype " + dtype_name(t.first->dtype) + " differs from " + pq + "'s " +
                       dtype_name(ds.q.dtype) + "; q, k_new, v_new and the caches must share one dtype");
  }
  ds.dtype = ds.q.dtype;
  DecodeDims& d = ds.dims;
  d.B = static_cast<int>(ds.q.shape[0]);
  d.H = static_cast<int>(ds.q.shape[1]);
  d.S_new = static_cast<int>(ds.q.shape[2]);
  d.D = static_cast<int>(ds.q.shape[3]);
  d.H_kv = static_cast<int>(ds.k_new.shape[1]);
  const std::vector<int64_t> new_shape = {d.B, d.H_kv, d.S_new, d.D};
  if (ds.k_new.shape != new_shape)
    throw InputError(pkn + ": shape " + shape_str(ds.k_new.shape) + " does not match q's B, S_new and D (expected " +
                     shape_str(new_shape) + ")");
  if (ds.v_new.shape != new_shape)
    throw InputError(pvn + ": shape " + shape_str(ds.v_new.shape) + " differs from k_new's " + shape_str(new_shape));
  if (d.H % d.H_kv != 0)
    throw InputError(pkn + ": H_kv = " + str(d.H_kv) + " does not divide q's H = " + str(d.H));
  if (ds.v_cache.shape != ds.k_cache.shape)
    throw InputError(pvc + ": shape " + shape_str(ds.v_cache.shape) + " differs from K_cache's " + shape_str(ds.k_cache.shape));
  if (ds.k_cache.shape[1] != d.H_kv || ds.k_cache.shape[3] != d.D)
    throw InputError(pkc + ": shape " + shape_str(ds.k_cache.shape) + " does not match H_kv = " + str(d.H_kv) +
                     " and D = " + str(d.D) + " (expected " + cache_dims + ")");

  ds.cache_seqlens = to_int32(seqlens, pcs, {d.B}, "[B]", &ds.notices);
  if (paged) {
    d.page_size = static_cast<int>(ds.k_cache.shape[2]);
    d.num_blocks = static_cast<int>(ds.k_cache.shape[0]);
    if (!power_of_two(d.page_size) || d.page_size < 16 || d.page_size > 65536)
      throw InputError(pkc + ": page size " + str(d.page_size) + " (dimension 2) must be a power of two in [16, 65536]");
    if (table.rank() != 2 || table.shape[0] != d.B)
      throw InputError(pbt + ": expected shape [B, max_blocks] with B = " + str(d.B) + ", got " + shape_str(table.shape));
    ds.block_table = to_int32(table, pbt, table.shape, "[B, max_blocks]", &ds.notices);
    d.max_blocks = static_cast<int>(table.shape[1]);
    if (static_cast<int64_t>(d.max_blocks) * d.page_size > std::numeric_limits<int>::max())
      throw InputError(pbt + ": max_blocks x page_size overflows int");
    d.S_max = d.max_blocks * d.page_size;
  } else {
    if (ds.k_cache.shape[0] != d.B)
      throw InputError(pkc + ": batch " + str(ds.k_cache.shape[0]) + " differs from q's B = " + str(d.B));
    d.S_max = static_cast<int>(ds.k_cache.shape[2]);
  }

  const int32_t* c = ds.cache_seqlens.data<int32_t>();
  for (int b = 0; b < d.B; ++b) {
    if (c[b] < 0) throw InputError(pcs + ": cache_seqlens[" + str(b) + "] = " + str(c[b]) + " is negative");
    if (static_cast<int64_t>(c[b]) + d.S_new > d.S_max)
      throw InputError(pcs + ": cache_seqlens[" + str(b) + "] = " + str(c[b]) + " plus S_new = " + str(d.S_new) +
                       " exceeds the cache's " + str(d.S_max) + " positions" +
                       (paged ? " (max_blocks x page_size)" : " (S_max)"));
  }
  if (paged) {
    // Every page a step touches must exist; a page that one batch element appends into must not
    // be read or written by another (shared prefix pages that nobody appends into are fine).
    const int32_t* t = ds.block_table->data<int32_t>();
    std::vector<int> appender(static_cast<size_t>(d.num_blocks), -1);
    for (int b = 0; b < d.B; ++b) {
      const int L = c[b] + d.S_new;
      for (int blk = 0; blk * d.page_size < L; ++blk) {
        const int page = t[static_cast<int64_t>(b) * d.max_blocks + blk];
        if (page < 0 || page >= d.num_blocks)
          throw InputError(pbt + ": block_table[" + str(b) + ", " + str(blk) + "] = " + str(page) +
                           " is outside the pool's [0, " + str(d.num_blocks) + ")");
        const bool appends = static_cast<int64_t>(blk + 1) * d.page_size > c[b];
        if (appends) {
          if (appender[page] >= 0 && appender[page] != b)
            throw InputError(pbt + ": page " + str(page) + " receives new tokens of batch elements " +
                             str(appender[page]) + " and " + str(b));
          appender[page] = b;
        }
      }
    }
    // Within one element two blocks on one page would make two positions one slot: always wrong.
    std::vector<int> owner_block(static_cast<size_t>(d.num_blocks), -1);
    for (int b = 0; b < d.B; ++b) {
      const int L = c[b] + d.S_new;
      std::fill(owner_block.begin(), owner_block.end(), -1);
      for (int blk = 0; blk * d.page_size < L; ++blk) {
        const int page = t[static_cast<int64_t>(b) * d.max_blocks + blk];
        if (owner_block[page] >= 0)
          throw InputError(pbt + ": block_table[" + str(b) + ", " + str(owner_block[page]) + "] and [" + str(b) + ", " +
                           str(blk) + "] are both page " + str(page));
        owner_block[page] = blk;
        if (appender[page] >= 0 && appender[page] != b)
          throw InputError(pbt + ": page " + str(page) + " is read by batch element " + str(b) +
                           " but receives new tokens of batch element " + str(appender[page]));
      }
    }
  }
  return ds;
}

HostArray append_on_host(const HostArray& cache, const HostArray& fresh, const HostArray& cache_seqlens,
                         const HostArray* block_table, int page_size) {
  HostArray out = cache;
  const int64_t B = fresh.shape[0], H_kv = fresh.shape[1], S_new = fresh.shape[2], D = fresh.shape[3];
  const int64_t S = cache.shape[2];
  const size_t es = dtype_size(cache.dtype);
  for (int64_t b = 0; b < B; ++b) {
    const int64_t c = cache_seqlens.data<int32_t>()[b];
    for (int64_t g = 0; g < H_kv; ++g)
      for (int64_t i = 0; i < S_new; ++i) {
        const int64_t j = c + i;
        int64_t outer = b, r = j;
        if (block_table) {
          outer = block_table->data<int32_t>()[b * block_table->shape[1] + j / page_size];
          r = j % page_size;
        }
        const int64_t dst = ((outer * H_kv + g) * S + r) * D;
        const int64_t src = ((b * H_kv + g) * S_new + i) * D;
        std::memcpy(out.bytes.data() + dst * es, fresh.bytes.data() + src * es, D * es);
      }
  }
  return out;
}

}  // namespace flashattn

// Loading a data directory and writing an output directory; the contract is data/README.md.
// The loader only reads: it never creates, renames or removes anything.
#include "dataset.h"

#include <cmath>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "flashattn/error.h"
#include "npy.h"

namespace flashattn {

namespace fs = std::filesystem;
using json = nlohmann::json;

const char* format_name(FileFormat f) { return f == FileFormat::Npy ? "npy" : "bin"; }

namespace {

const char* ext_of(FileFormat f) { return f == FileFormat::Npy ? ".npy" : ".bin"; }

std::string join(const std::string& dir, const std::string& file) { return (fs::path(dir) / file).string(); }

bool parse_layout_name(const std::string& s, Layout* out) {
  if (s == "bhsd") *out = Layout::BHSD;
  else if (s == "bshd") *out = Layout::BSHD;
  else return false;
  return true;
}

bool json_int(const json& v, int64_t* out) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return false;
    *out = static_cast<int64_t>(u);
    return true;
  }
  if (v.is_number_integer()) {
    *out = v.get<int64_t>();
    return true;
  }
  return false;
}

// Logical [B, H, S, D] in the file order of `layout`.
std::vector<int64_t> layout_shape(Layout layout, int64_t B, int64_t H, int64_t S, int64_t D) {
  if (layout == Layout::BSHD) return {B, S, H, D};
  return {B, H, S, D};
}

// Where the shapes and dtypes of .bin files come from.
class BinShapes {
 public:
  BinShapes(const std::string& dir, const json* meta, Layout layout) : dir_(dir), meta_(meta), layout_(layout) {
    meta_path_ = join(dir, "meta.json");
    if (!meta_) parse_dirname();
  }

  bool from_meta() const { return meta_ != nullptr; }

  // dtype and shape of NAME.bin: the meta.json "files" entry, else the defaults from the sizes.
  std::pair<DType, std::vector<int64_t>> spec(const std::string& name) const {
    std::optional<DType> dtype;
    std::optional<std::vector<int64_t>> shape;
    if (meta_ && meta_->contains("files")) {
      const json& files = (*meta_)["files"];
      if (!files.is_object()) fail("field 'files' must be an object");
      if (files.contains(name)) read_entry(name, files[name], &dtype, &shape);
    }
    if (!dtype) dtype = name == "seqlens_k" ? DType::I32 : name == "mask" ? DType::F32 : top_dtype();
    if (!shape) {
      const std::string need = "the shape of " + name + ".bin";
      if (name == "Q" || name == "dO") {
        shape = layout_shape(layout_, dim("B", need), dim("H", need), seq("S_q", need), dim("D", need));
      } else if (name == "K" || name == "V") {
        shape = layout_shape(layout_, dim("B", need), dim("H_kv", need), seq("S_k", need), dim("D", need));
      } else if (name == "seqlens_k") {
        shape = std::vector<int64_t>{dim("B", need)};
      } else {
        shape = std::vector<int64_t>{dim("B", need), dim("H", need), seq("S_q", need), seq("S_k", need)};
      }
    }
    return {*dtype, *shape};
  }

 private:
  [[noreturn]] void fail(const std::string& what) const { throw InputError(meta_path_ + ": " + what); }

  void parse_dirname() {
    fs::path p = fs::absolute(fs::path(dir_)).lexically_normal();
    if (!p.has_filename()) p = p.parent_path();
    if (!parse_dims_name(p.filename().string(), dirname_dims_)) {
      throw InputError(dir_ + ": .bin inputs need meta.json or a directory named B{b}_H{h}_S{s}_D{d}");
    }
    if (layout_ != Layout::BHSD) {
      throw InputError(dir_ + ": a directory named B{b}_H{h}_S{s}_D{d} holds bhsd data; bshd needs a meta.json");
    }
  }

  // Exactly B{b}_H{h}_S{s}_D{d} with positive decimal sizes and no leading zeros.
  static bool parse_dims_name(const std::string& name, int64_t out[4]) {
    const char tags[4] = {'B', 'H', 'S', 'D'};
    size_t pos = 0;
    for (int k = 0; k < 4; ++k) {
      if (k > 0 && (pos >= name.size() || name[pos++] != '_')) return false;
      if (pos >= name.size() || name[pos++] != tags[k]) return false;
      const size_t start = pos;
      while (pos < name.size() && pos - start < 10 && name[pos] >= '0' && name[pos] <= '9') ++pos;
      if (pos == start || name[start] == '0' || pos - start > 9) return false;
      out[k] = std::stoll(name.substr(start, pos - start));
    }
    return pos == name.size();
  }

  DType top_dtype() const {
    if (!meta_ || !meta_->contains("dtype")) return DType::F32;
    const json& v = (*meta_)["dtype"];
    DType t;
    if (!v.is_string() || !parse_dtype(v.get<std::string>(), &t) || !dtype_is_float(t)) {
      fail("field 'dtype' must be one of \"fp32\", \"fp16\", \"bf16\", \"fp64\"");
    }
    return t;
  }

  int64_t dim(const std::string& field, const std::string& need) const {
    if (!meta_) {
      if (field == "B") return dirname_dims_[0];
      if (field == "H" || field == "H_kv") return dirname_dims_[1];
      return dirname_dims_[3];  // D
    }
    if (field == "H_kv" && !meta_->contains("H_kv")) return dim("H", need);
    if (!meta_->contains(field)) fail("missing field '" + field + "', needed for " + need);
    int64_t v = 0;
    if (!json_int((*meta_)[field], &v) || v < 1) fail("field '" + field + "' must be a positive integer");
    return v;
  }

  // S_q / S_k, falling back to S.
  int64_t seq(const std::string& field, const std::string& need) const {
    if (!meta_) return dirname_dims_[2];
    if (!meta_->contains(field) && meta_->contains("S")) return dim("S", need);
    if (!meta_->contains(field)) fail("missing field '" + field + "' (or 'S'), needed for " + need);
    return dim(field, need);
  }

  void read_entry(const std::string& name, const json& e, std::optional<DType>* dtype,
                  std::optional<std::vector<int64_t>>* shape) const {
    const std::string field = "files." + name;
    if (!e.is_object()) fail("field '" + field + "' must be an object with \"dtype\" and \"shape\"");
    if (e.contains("dtype")) {
      DType t;
      if (!e["dtype"].is_string() || !parse_dtype(e["dtype"].get<std::string>(), &t)) {
        fail("field '" + field + ".dtype' must be a dtype name (fp32, fp16, bf16, fp64, int32, int64)");
      }
      *dtype = t;
    }
    if (e.contains("shape")) {
      const json& s = e["shape"];
      if (!s.is_array()) fail("field '" + field + ".shape' must be a list of non-negative integers");
      std::vector<int64_t> dims;
      for (const json& d : s) {
        int64_t v = 0;
        if (!json_int(d, &v) || v < 0) fail("field '" + field + ".shape' must be a list of non-negative integers");
        dims.push_back(v);
      }
      *shape = dims;
    }
  }

  std::string dir_;
  std::string meta_path_;
  const json* meta_;
  Layout layout_;
  int64_t dirname_dims_[4] = {0, 0, 0, 0};  // B, H, S, D
};

std::optional<json> read_meta(const std::string& dir, Dataset* ds) {
  const std::string path = join(dir, "meta.json");
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::nullopt;
  const std::vector<uint8_t> bytes = read_file(path);
  ds->input_paths.push_back(path);
  json j;
  try {
    j = json::parse(bytes.begin(), bytes.end());
  } catch (const json::exception& e) {
    std::string why = e.what();
    for (char& c : why) c = c == '\n' ? ' ' : c;
    throw InputError(path + ": invalid JSON (" + why + ")");
  }
  if (!j.is_object()) throw InputError(path + ": expected a JSON object");
  if (j.contains("format_version")) {
    int64_t v = 0;
    if (!json_int(j["format_version"], &v) || v != 1) {
      throw InputError(path + ": field 'format_version' must be 1 (the only version this build reads)");
    }
  }
  return j;
}

Layout resolve_layout(const std::string& dir, const std::optional<json>& meta, const LoadOptions& opt) {
  if (!meta || !meta->contains("layout")) return opt.layout.value_or(Layout::BHSD);
  const std::string path = join(dir, "meta.json");
  const json& v = (*meta)["layout"];
  Layout l;
  if (!v.is_string() || !parse_layout_name(v.get<std::string>(), &l)) {
    throw InputError(path + ": field 'layout' must be \"bhsd\" or \"bshd\"");
  }
  if (opt.layout && *opt.layout != l) {
    throw InputError(path + ": layout '" + layout_name(l) + "' conflicts with --layout " + layout_name(*opt.layout));
  }
  return l;
}

std::string dims_template(const std::string& name, Layout layout) {
  const bool q = name == "Q" || name == "dO";
  const std::string h = q ? "H" : "H_kv", s = q ? "S_q" : "S_k";
  return layout == Layout::BSHD ? "[B, " + s + ", " + h + ", D]" : "[B, " + h + ", " + s + ", D]";
}

}  // namespace

Dataset load_dataset(const std::string& dir, const LoadOptions& opt) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) throw InputError(dir + ": no such directory");
  if (!fs::is_directory(dir, ec)) throw InputError(dir + ": not a directory");

  Dataset ds;
  ds.dir = dir;
  // Which files exist, and in which format.
  auto find = [&](const std::string& name, bool required) -> std::optional<FileFormat> {
    const bool npy = fs::exists(join(dir, name + ".npy"), ec);
    const bool bin = fs::exists(join(dir, name + ".bin"), ec);
    if (npy && bin) throw InputError(dir + ": both " + name + ".npy and " + name + ".bin exist; keep one");
    if (!npy && !bin) {
      if (required) throw InputError(dir + ": missing " + name + " (expected " + name + ".npy or " + name + ".bin)");
      return std::nullopt;
    }
    return npy ? FileFormat::Npy : FileFormat::Bin;
  };
  const FileFormat fq = *find("Q", true), fk = *find("K", true), fv = *find("V", true);
  if (fk != fq || fv != fq) {
    throw InputError(dir + ": Q" + ext_of(fq) + ", K" + ext_of(fk) + " and V" + ext_of(fv) +
                     " mix formats; Q, K and V must all be .npy or all be .bin");
  }
  ds.format = fq;
  const std::optional<json> meta = read_meta(dir, &ds);
  ds.layout = resolve_layout(dir, meta, opt);

  // Built on first use: an npy directory never needs .bin shapes (unless an optional file is .bin).
  std::optional<BinShapes> bin_shapes;
  auto load = [&](const std::string& name, FileFormat f) -> HostArray {
    const std::string path = join(dir, name + ext_of(f));
    HostArray a;
    if (f == FileFormat::Npy) {
      a = read_npy(path);
    } else {
      if (!bin_shapes) bin_shapes.emplace(dir, meta ? &*meta : nullptr, ds.layout);
      const auto spec = bin_shapes->spec(name);
      a = read_raw(path, spec.first, spec.second);
    }
    ds.input_paths.push_back(path);
    return a;
  };
  ds.q = load("Q", fq);
  ds.k = load("K", fk);
  ds.v = load("V", fv);
  if (ds.format == FileFormat::Npy) ds.source = "npy";
  else ds.source = bin_shapes->from_meta() ? "bin+meta.json" : "bin+dirname";

  const std::string ext = ext_of(ds.format);
  auto file = [&](const std::string& name) { return join(dir, name + ext); };
  for (const char* name : {"Q", "K", "V"}) {
    const HostArray& a = name[0] == 'Q' ? ds.q : name[0] == 'K' ? ds.k : ds.v;
    if (a.rank() != 4) {
      throw InputError(file(name) + ": expected rank 4 " + dims_template(name, ds.layout) + " (" +
                       layout_name(ds.layout) + "), got shape " + shape_str(a.shape));
    }
    if (!dtype_is_float(a.dtype)) {
      throw InputError(file(name) + ": dtype " + dtype_name(a.dtype) + " is not supported for " + name +
                       " (fp32, fp16, bf16 or fp64)");
    }
  }
  if (ds.k.dtype != ds.q.dtype || ds.v.dtype != ds.q.dtype) {
    throw InputError(dir + ": Q" + ext + " is " + dtype_name(ds.q.dtype) + ", K" + ext + " is " +
                     dtype_name(ds.k.dtype) + ", V" + ext + " is " + dtype_name(ds.v.dtype) +
                     ": Q, K and V must have the same dtype");
  }
  if (ds.k.shape != ds.v.shape) {
    throw InputError(dir + ": K" + ext + " has shape " + shape_str(ds.k.shape) + " but V" + ext + " has " +
                     shape_str(ds.v.shape) + ": K and V must have the same shape");
  }
  ds.dtype = ds.q.dtype;
  const int hi = ds.layout == Layout::BSHD ? 2 : 1, si = ds.layout == Layout::BSHD ? 1 : 2;
  const int64_t B = ds.q.shape[0], H = ds.q.shape[hi], S_q = ds.q.shape[si], D = ds.q.shape[3];
  const int64_t H_kv = ds.k.shape[hi], S_k = ds.k.shape[si];
  const std::pair<const char*, int64_t> sizes[] = {{"B", B}, {"H", H}, {"S_q", S_q}, {"D", D},
                                                   {"H_kv", H_kv}, {"S_k", S_k}};
  for (const auto& s : sizes) {
    const std::string owner = (s.first == std::string("H_kv") || s.first == std::string("S_k")) ? "K" : "Q";
    if (s.second < 1) {
      throw InputError(file(owner) + ": " + s.first + " = " + std::to_string(s.second) + "; every size must be >= 1");
    }
    if (s.second > std::numeric_limits<int>::max()) {
      throw InputError(file(owner) + ": " + s.first + " = " + std::to_string(s.second) + " is too large");
    }
  }
  if (ds.k.shape[0] != B) {
    throw InputError(dir + ": Q" + ext + " has B=" + std::to_string(B) + ", K" + ext + " has B=" +
                     std::to_string(ds.k.shape[0]) + ": batch sizes must agree");
  }
  if (ds.k.shape[3] != D) {
    throw InputError(dir + ": Q" + ext + " has D=" + std::to_string(D) + ", K" + ext + " has D=" +
                     std::to_string(ds.k.shape[3]) + ": head dims must agree");
  }
  if (H % H_kv != 0) {
    throw InputError(dir + ": Q" + ext + " has H=" + std::to_string(H) + " heads, K" + ext + " has H_kv=" +
                     std::to_string(H_kv) + ": H must be a multiple of H_kv");
  }
  ds.dims = Dims{static_cast<int>(B), static_cast<int>(H), static_cast<int>(H_kv),
                 static_cast<int>(S_q), static_cast<int>(S_k), static_cast<int>(D)};

  if (const auto f = find("dO", false)) {
    HostArray d = load("dO", *f);
    const std::string path = join(dir, std::string("dO") + ext_of(*f));
    if (d.shape != ds.q.shape) {
      throw InputError(path + ": shape " + shape_str(d.shape) + " differs from Q's " + shape_str(ds.q.shape) +
                       "; dO must have the shape of Q");
    }
    if (!dtype_is_float(d.dtype)) throw InputError(path + ": dtype " + dtype_name(d.dtype) + " is not a float dtype");
    if (d.dtype != ds.dtype) {
      ds.notices.push_back(path + ": converted " + dtype_name(d.dtype) + " to " + dtype_name(ds.dtype) + " to match Q");
      d = convert(d, ds.dtype);
    }
    ds.dout = std::move(d);
  }

  if (const auto f = find("seqlens_k", false)) {
    HostArray s = load("seqlens_k", *f);
    const std::string path = join(dir, std::string("seqlens_k") + ext_of(*f));
    if (s.dtype != DType::I32 && s.dtype != DType::I64) {
      throw InputError(path + ": dtype " + dtype_name(s.dtype) + " is not supported (int32, or int64 converted)");
    }
    if (s.shape != std::vector<int64_t>{B}) {
      throw InputError(path + ": expected shape [B] = [" + std::to_string(B) + "], got " + shape_str(s.shape));
    }
    HostArray s32(DType::I32, s.shape);
    for (int64_t b = 0; b < B; ++b) {
      const int64_t len = s.dtype == DType::I32 ? s.data<int32_t>()[b] : s.data<int64_t>()[b];
      if (len < 0 || len > S_k) {
        throw InputError(path + ": seqlens_k[" + std::to_string(b) + "] = " + std::to_string(len) +
                         " is outside [0, S_k] = [0, " + std::to_string(S_k) + "]");
      }
      s32.data<int32_t>()[b] = static_cast<int32_t>(len);
    }
    if (s.dtype == DType::I64) ds.notices.push_back(path + ": converted int64 to int32");
    ds.seqlens_k = std::move(s32);
  }

  if (const auto f = find("mask", false)) {
    HostArray m = load("mask", *f);
    const std::string path = join(dir, std::string("mask") + ext_of(*f));
    if (!dtype_is_float(m.dtype)) {
      throw InputError(path + ": dtype " + dtype_name(m.dtype) + " is not supported (a float dtype, used as fp32)");
    }
    (void)mask_view(m.shape, ds.dims, nullptr, path);  // shape check before the conversion pass
    if (m.dtype != DType::F32) {
      ds.notices.push_back(path + ": converted " + dtype_name(m.dtype) + " to fp32");
      m = convert(m, DType::F32);
    }
    const float* p = m.data<float>();
    for (int64_t i = 0, n = m.numel(); i < n; ++i) {
      // -inf masks a key out; NaN and +inf have no meaning as an additive score term.
      if (std::isnan(p[i]) || p[i] == std::numeric_limits<float>::infinity()) {
        throw InputError(path + ": " + (std::isnan(p[i]) ? "NaN" : "+inf") + " at flat index " + std::to_string(i) +
                         " (use -inf to mask a key out)");
      }
    }
    ds.mask = std::move(m);
  }
  return ds;
}

MaskView mask_view(const std::vector<int64_t>& mask_shape, const Dims& dims, const float* ptr,
                   const std::string& origin) {
  const std::vector<int64_t> target = {dims.B, dims.H, dims.S_q, dims.S_k};
  const std::string expected = "[B, H, S_q, S_k] = " + shape_str(target);
  const int r = static_cast<int>(mask_shape.size());
  if (r < 1 || r > 4) {
    throw InputError(origin + ": mask has rank " + std::to_string(r) + " (shape " + shape_str(mask_shape) +
                     "); it must have rank 1 to 4 and broadcast to " + expected);
  }
  int64_t strides[4] = {0, 0, 0, 0};
  int64_t stride = 1;
  // Right-aligned like numpy broadcasting: the mask's last dimension matches S_k.
  for (int k = r - 1; k >= 0; --k) {
    const int t = 4 - r + k;
    const int64_t m = mask_shape[static_cast<size_t>(k)];
    if (m != 1 && m != target[static_cast<size_t>(t)]) {
      throw InputError(origin + ": mask shape " + shape_str(mask_shape) + " does not broadcast to " + expected);
    }
    strides[t] = m == 1 ? 0 : stride;
    stride *= m;
  }
  MaskView v;
  v.ptr = ptr;
  v.batch = strides[0];
  v.head = strides[1];
  v.row = strides[2];
  v.col = strides[3];
  return v;
}

namespace {

std::string canonical_path(const std::string& p) {
  std::error_code ec;
  fs::path c = fs::weakly_canonical(fs::path(p), ec);
  if (ec) c = fs::absolute(fs::path(p), ec).lexically_normal();
  return c.string();
}

}  // namespace

OutputWriter::OutputWriter(std::string dir, FileFormat format, Layout layout, std::vector<std::string> protect)
    : dir_(std::move(dir)), format_(format), layout_(layout) {
  for (const std::string& p : protect) protect_.push_back(canonical_path(p));
  // Checked up front so a bin run into its own input directory fails before writing any output.
  if (format_ == FileFormat::Bin) {
    const std::string meta = join(dir_, "meta.json");
    for (const std::string& p : protect_) {
      if (canonical_path(meta) == p) throw InputError(meta + ": refusing to overwrite an input file");
    }
  }
}

namespace {

void check_target(const std::string& path, const std::vector<std::string>& protect) {
  const std::string c = canonical_path(path);
  for (const std::string& p : protect) {
    if (c == p) throw InputError(path + ": refusing to overwrite an input file");
  }
}

void ensure_dir(const std::string& dir) {
  std::error_code ec;
  if (fs::exists(dir, ec) && !fs::is_directory(dir, ec)) {
    throw InputError(dir + ": exists and is not a directory");
  }
  fs::create_directories(dir, ec);
  if (ec) throw RuntimeError(dir + ": cannot create directory (" + ec.message() + ")");
}

}  // namespace

void OutputWriter::add(const std::string& name, const HostArray& a) {
  const std::string path = join(dir_, name + ext_of(format_));
  check_target(path, protect_);
  ensure_dir(dir_);
  if (format_ == FileFormat::Npy) write_npy(path, a);
  else write_raw(path, a);
  HostArray shape_only;  // dtype and shape, no data: the meta.json entry
  shape_only.dtype = a.dtype;
  shape_only.shape = a.shape;
  for (auto& entry : written_meta_) {
    if (entry.first == name) {
      entry.second = std::move(shape_only);
      return;
    }
  }
  written_meta_.emplace_back(name, std::move(shape_only));
}

void OutputWriter::finish() {
  if (format_ != FileFormat::Bin) return;
  const std::string path = join(dir_, "meta.json");
  check_target(path, protect_);
  ensure_dir(dir_);
  json files = json::object();
  for (const auto& entry : written_meta_) {
    files[entry.first] = {{"dtype", dtype_name(entry.second.dtype)}, {"shape", entry.second.shape}};
  }
  const json meta = {{"format_version", 1}, {"layout", layout_name(layout_)}, {"files", files}};
  const std::string text = meta.dump(2) + "\n";
  write_file_atomic(path, text.data(), text.size());
}

}  // namespace flashattn

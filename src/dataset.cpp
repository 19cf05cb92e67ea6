// Loading a data directory and writing an output directory; the contract is data/README.md.
// The loader only reads: it never creates, renames or removes anything. The writer creates and
// renames only inside the output directory.
#include "dataset.h"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "flashattn/error.h"
#include "io_guard.h"
#include "meta.h"
#include "npy.h"

namespace flashattn {

namespace fs = std::filesystem;
using json = nlohmann::json;

const char* format_name(FileFormat f) { return f == FileFormat::Npy ? "npy" : "bin"; }

namespace {

const char* ext_of(FileFormat f) { return f == FileFormat::Npy ? ".npy" : ".bin"; }

std::string join(const std::string& dir, const std::string& file) { return (fs::path(dir) / file).string(); }

std::optional<json> read_meta(const std::string& dir, Dataset* ds) {
  const std::string path = join(dir, "meta.json");
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::nullopt;
  const std::vector<uint8_t> bytes = read_file(path);
  ds->input_paths.push_back(path);
  return parse_meta_json(bytes.data(), bytes.size(), path);
}

std::string dims_template(const std::string& name, Layout layout) {
  const bool q = name == "Q" || name == "dO";
  const std::string h = q ? "H" : "H_kv", s = q ? "S_q" : "S_k";
  return layout == Layout::BSHD ? "[B, " + s + ", " + h + ", D]" : "[B, " + h + ", " + s + ", D]";
}

}  // namespace

namespace {

// Q, K and V: rank 4 in the layout, one float dtype, shapes that agree; sets ds->dims.
void check_qkv(Dataset* ds, const std::string& dir) {
  const std::string ext = ext_of(ds->format);
  auto file = [&](const std::string& name) { return join(dir, name + ext); };
  for (const char* name : {"Q", "K", "V"}) {
    const HostArray& a = name[0] == 'Q' ? ds->q : name[0] == 'K' ? ds->k : ds->v;
    if (a.rank() != 4) {
      throw InputError(file(name) + ": expected rank 4 " + dims_template(name, ds->layout) + " (" +
                       layout_name(ds->layout) + "), got shape " + shape_str(a.shape));
    }
    if (!dtype_is_float(a.dtype)) {
      throw InputError(file(name) + ": dtype " + dtype_name(a.dtype) + " is not supported for " + name +
                       " (fp32, fp16, bf16 or fp64)");
    }
  }
  if (ds->k.dtype != ds->q.dtype || ds->v.dtype != ds->q.dtype) {
    throw InputError(dir + ": Q" + ext + " is " + dtype_name(ds->q.dtype) + ", K" + ext + " is " +
                     dtype_name(ds->k.dtype) + ", V" + ext + " is " + dtype_name(ds->v.dtype) +
                     ": Q, K and V must have the same dtype");
  }
  if (ds->k.shape != ds->v.shape) {
    throw InputError(dir + ": K" + ext + " has shape " + shape_str(ds->k.shape) + " but V" + ext + " has " +
                     shape_str(ds->v.shape) + ": K and V must have the same shape");
  }
  ds->dtype = ds->q.dtype;
  const int hi = ds->layout == Layout::BSHD ? 2 : 1, si = ds->layout == Layout::BSHD ? 1 : 2;
  const int64_t B = ds->q.shape[0], H = ds->q.shape[hi], S_q = ds->q.shape[si], D = ds->q.shape[3];
  const int64_t H_kv = ds->k.shape[hi], S_k = ds->k.shape[si];
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
  if (ds->k.shape[0] != B) {
    throw InputError(dir + ": Q" + ext + " has B=" + std::to_string(B) + ", K" + ext + " has B=" +
                     std::to_string(ds->k.shape[0]) + ": batch sizes must agree");
  }
  if (ds->k.shape[3] != D) {
    throw InputError(dir + ": Q" + ext + " has D=" + std::to_string(D) + ", K" + ext + " has D=" +
                     std::to_string(ds->k.shape[3]) + ": head dims must agree");
  }
  if (H % H_kv != 0) {
    throw InputError(dir + ": Q" + ext + " has H=" + std::to_string(H) + " heads, K" + ext + " has H_kv=" +
                     std::to_string(H_kv) + ": H must be a multiple of H_kv");
  }
  ds->dims = Dims{static_cast<int>(B), static_cast<int>(H), static_cast<int>(H_kv),
                  static_cast<int>(S_q), static_cast<int>(S_k), static_cast<int>(D)};
}

// dO: Q's shape, a float dtype (converted to Q's).
HostArray checked_dout(HostArray d, const Dataset& ds, const std::string& path, std::vector<std::string>* notices) {
  if (d.shape != ds.q.shape) {
    throw InputError(path + ": shape " + shape_str(d.shape) + " differs from Q's " + shape_str(ds.q.shape) +
                     "; dO must have the shape of Q");
  }
  if (!dtype_is_float(d.dtype)) throw InputError(path + ": dtype " + dtype_name(d.dtype) + " is not a float dtype");
  if (d.dtype != ds.dtype) {
    notices->push_back(path + ": converted " + dtype_name(d.dtype) + " to " + dtype_name(ds.dtype) + " to match Q");
    d = convert(d, ds.dtype);
  }
  return d;
}

// seqlens_k: int32 (int64 converted) [B], each in [0, S_k].
HostArray checked_seqlens(const HostArray& s, const Dims& dims, const std::string& path,
                          std::vector<std::string>* notices) {
  if (s.dtype != DType::I32 && s.dtype != DType::I64) {
    throw InputError(path + ": dtype " + dtype_name(s.dtype) + " is not supported (int32, or int64 converted)");
  }
  if (s.shape != std::vector<int64_t>{dims.B}) {
    throw InputError(path + ": expected shape [B] = [" + std::to_string(dims.B) + "], got " + shape_str(s.shape));
  }
  HostArray s32(DType::I32, s.shape);
  for (int64_t b = 0; b < dims.B; ++b) {
    const int64_t len = s.dtype == DType::I32 ? s.data<int32_t>()[b] : s.data<int64_t>()[b];
    if (len < 0 || len > dims.S_k) {
      throw InputError(path + ": seqlens_k[" + std::to_string(b) + "] = " + std::to_string(len) +
                       " is outside [0, S_k] = [0, " + std::to_string(dims.S_k) + "]");
    }
    s32.data<int32_t>()[b] = static_cast<int32_t>(len);
  }
  if (s.dtype == DType::I64) notices->push_back(path + ": converted int64 to int32");
  return s32;
}

// mask: a float dtype (used as fp32), broadcastable to [B, H, S_q, S_k], no NaN or +inf.
HostArray checked_mask(HostArray m, const Dims& dims, const std::string& path, std::vector<std::string>* notices) {
  if (!dtype_is_float(m.dtype)) {
    throw InputError(path + ": dtype " + dtype_name(m.dtype) + " is not supported (a float dtype, used as fp32)");
  }
  (void)mask_view(m.shape, dims, nullptr, path);  // shape check before the conversion pass
  if (m.dtype != DType::F32) {
    notices->push_back(path + ": converted " + dtype_name(m.dtype) + " to fp32");
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
  return m;
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
  ds.layout = meta_layout(meta ? &*meta : nullptr, opt.layout, join(dir, "meta.json"));

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
  check_qkv(&ds, dir);

  auto path_of = [&](const char* name, FileFormat f) { return join(dir, std::string(name) + ext_of(f)); };
  if (const auto f = find("dO", false)) ds.dout = checked_dout(load("dO", *f), ds, path_of("dO", *f), &ds.notices);
  if (const auto f = find("seqlens_k", false))
    ds.seqlens_k = checked_seqlens(load("seqlens_k", *f), ds.dims, path_of("seqlens_k", *f), &ds.notices);
  if (const auto f = find("mask", false)) ds.mask = checked_mask(load("mask", *f), ds.dims, path_of("mask", *f), &ds.notices);
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
  // By identity too: another spelling of an input (a symlink, a bind mount) is still the input.
  if (input_files_protected() && is_input_file(path)) throw InputError(path + ": refusing to overwrite an input file");
}

// Where a file is staged until finish(): the same directory, so the rename cannot cross devices.
std::string staged_path(const std::string& path) {
  return path + ".staged.tmp." + std::to_string(static_cast<long>(::getpid()));
}

}  // namespace

OutputWriter::~OutputWriter() {
  std::error_code ec;
  for (const auto& s : staged_) fs::remove(s.first, ec);
  // Only removes directories that are still empty (fs::remove refuses the others).
  if (!staged_.empty()) {
    for (const std::string& d : created_dirs_) fs::remove(d, ec);
  }
}

void OutputWriter::check_writable(const std::string& dir) {
  std::error_code ec;
  fs::path p = fs::absolute(fs::path(dir), ec).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();
  // The first ancestor that exists must be a directory we may create entries in.
  fs::file_status st = fs::status(p, ec);
  while (!fs::exists(st) && p.has_relative_path()) {
    p = p.parent_path();
    st = fs::status(p, ec);
  }
  if (!fs::is_directory(st)) throw InputError(dir + ": cannot write outputs here (" + p.string() + " is not a directory)");
  if (::access(p.c_str(), W_OK | X_OK) != 0) {
    throw InputError(dir + ": cannot write outputs here (" + p.string() + ": " + std::strerror(errno) + ")");
  }
  // A directory where an output file goes would fail the set after the kernels ran: refused now.
  for (const char* name : {"O", "lse", "dQ", "dK", "dV", "dO", "K_cache", "V_cache"})
    for (const char* ext : {".npy", ".bin"}) {
      const fs::path f = fs::path(dir) / (std::string(name) + ext);
      if (fs::is_directory(fs::symlink_status(f, ec)))
        throw InputError(dir + ": cannot write outputs here (" + f.filename().string() + " is a directory)");
    }
  for (const char* name : {"timing.json", "meta.json"})
    if (fs::is_directory(fs::symlink_status(fs::path(dir) / name, ec)))
      throw InputError(dir + ": cannot write outputs here (" + std::string(name) + " is a directory)");
}

void OutputWriter::ensure_dir() {
  std::error_code ec;
  if (fs::is_directory(dir_, ec)) return;
  if (fs::exists(dir_, ec)) throw InputError(dir_ + ": exists and is not a directory");
  std::vector<std::string> missing;
  fs::path p = fs::absolute(fs::path(dir_), ec).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();
  for (; p.has_relative_path() && !fs::exists(p, ec); p = p.parent_path()) missing.push_back(p.string());
  fs::create_directories(dir_, ec);
  if (ec) throw RuntimeError(dir_ + ": cannot create directory (" + ec.message() + ")");
  created_dirs_.insert(created_dirs_.end(), missing.begin(), missing.end());
}

std::string OutputWriter::stage(const std::string& path) {
  check_target(path, protect_);
  ensure_dir();
  const std::string tmp = staged_path(path);
  const bool known = std::any_of(staged_.begin(), staged_.end(), [&](const auto& s) { return s.second == path; });
  if (!known) staged_.emplace_back(tmp, path);
  return tmp;
}

namespace {

// Runs `write` on the staged path; a failure is reported under the output's final name.
template <class Write>
void write_staged(const std::string& tmp, const std::string& path, Write write) {
  try {
    write(tmp);
  } catch (const RuntimeError& e) {
    std::string what = e.what();
    if (what.compare(0, tmp.size(), tmp) == 0) what = path + what.substr(tmp.size());
    throw RuntimeError(what);
  }
}

}  // namespace

void OutputWriter::add(const std::string& name, const HostArray& a) {
  const std::string path = join(dir_, name + ext_of(format_));
  write_staged(stage(path), path, [&](const std::string& tmp) {
    if (format_ == FileFormat::Npy) write_npy(tmp, a);
    else write_raw(tmp, a);
  });
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

void OutputWriter::add_file(const std::string& file_name, const std::string& bytes) {
  const std::string path = join(dir_, file_name);
  write_staged(stage(path), path,
               [&](const std::string& tmp) { write_file_atomic(tmp, bytes.data(), bytes.size()); });
}

void OutputWriter::finish() {
  if (format_ == FileFormat::Bin) {
    json files = json::object();
    for (const auto& entry : written_meta_) {
      files[entry.first] = {{"dtype", dtype_name(entry.second.dtype)}, {"shape", entry.second.shape}};
    }
    const json meta = {{"format_version", 1}, {"layout", layout_name(layout_)}, {"files", files}};
    add_file("meta.json", meta.dump(2) + "\n");
  }
  // All or nothing. Nothing can be in the way of a file (a directory there fails the set before any
  // file moves); the files being replaced are set aside first and put back if any later rename
  // fails, so a failure leaves the previous set, and success leaves only the new one.
  std::error_code ec;
  for (const auto& st : staged_) {
    if (fs::is_directory(fs::symlink_status(st.second, ec)))
      throw RuntimeError(st.second + ": cannot replace file (a directory is in the way)");
  }
  std::vector<std::pair<std::string, std::string>> set_aside;  // (final, backup)
  std::vector<std::string> placed;
  auto roll_back = [&] {
    for (const std::string& f : placed) ::unlink(f.c_str());
    for (const auto& b : set_aside) std::rename(b.second.c_str(), b.first.c_str());
  };
  for (const auto& st : staged_) {
    if (!fs::exists(fs::symlink_status(st.second, ec))) continue;
    const std::string backup = st.second + ".previous.tmp." + std::to_string(static_cast<long>(::getpid()));
    if (std::rename(st.second.c_str(), backup.c_str()) != 0) {
      const std::string why = std::strerror(errno);
      roll_back();
      throw RuntimeError(st.second + ": cannot replace file (" + why + ")");
    }
    set_aside.emplace_back(st.second, backup);
  }
  for (const auto& st : staged_) {
    if (std::rename(st.first.c_str(), st.second.c_str()) != 0) {
      const std::string why = std::strerror(errno);
      roll_back();
      throw RuntimeError(st.second + ": cannot replace file (" + why + ")");
    }
    placed.push_back(st.second);
  }
  staged_.clear();
  for (const auto& b : set_aside) ::unlink(b.second.c_str());
}

}  // namespace flashattn

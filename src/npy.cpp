// .npy and raw .bin I/O. The header parser reads a small subset of Python literal syntax (a dict
// of strings, booleans, integers, tuples and lists) and must survive arbitrary bytes: every read is
// bounds-checked, nesting is capped, and nothing is allocated from a size in the file before that
// size has been checked against the real file size.
#include "npy.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>

#include "flashattn/error.h"
#include "io_guard.h"

namespace fs = std::filesystem;

namespace flashattn {

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;
constexpr int kMaxDepth = 8;    // dict > tuple/list > ...: real headers need 3
constexpr size_t kMaxRank = 64;  // numpy's own limit
constexpr uint64_t kMaxHeaderLen = 65536;  // bytes of header dict; numpy's default cap is 10000
constexpr size_t kMaxDictKeys = 64;        // real headers have 3 keys
constexpr const char* kSupported = "supported: <f2 <f4 <f8 <i4 <i8 <V2 (bfloat16)";

// Text taken from a file, made safe to quote in a one-line message: control characters and
// non-ASCII bytes are written as \xNN so a hostile header cannot break the line or the terminal.
std::string printable(const std::string& s) {
  static const char kHex[] = "0123456789abcdef";
  std::string out;
  for (const char ch : s) {
    const unsigned char c = static_cast<unsigned char>(ch);
    if (c >= 0x20 && c < 0x7f && c != '\\') {
      out.push_back(ch);
    } else {
      out += "\\x";
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

bool host_is_little_endian() {
  const uint16_t one = 1;
  uint8_t first;
  std::memcpy(&first, &one, 1);
  return first == 1;
}

// A parsed Python literal. Only what .npy headers contain.
struct Value {
  enum Kind { Str, Bool, Int, Tuple, List, Dict } kind = Str;
  std::string str;
  bool b = false;
  int64_t i = 0;
  bool int_overflow = false;
  std::vector<Value> items;                          // tuple / list
  std::vector<std::pair<std::string, Value>> dict;  // dict, in order
};

class LiteralParser {
 public:
  LiteralParser(const char* p, size_t n, const std::string& origin) : p_(p), n_(n), origin_(origin) {}

  Value parse_document() {
    skip_space();
    Value v = parse_value(0);
    if (v.kind != Value::Dict) fail("header is not a dict");
    skip_space();
    if (pos_ != n_) fail("unexpected text after the header dict");
    return v;
  }

 private:
  [[noreturn]] void fail(const std::string& what) const {
    throw InputError(origin_ + ": malformed .npy header (" + what + ")");
  }
  bool at_end() const { return pos_ >= n_; }
  char peek() const { return at_end() ? '\0' : p_[pos_]; }
  void skip_space() {
    while (!at_end() && (p_[pos_] == ' ' || p_[pos_] == '\t' || p_[pos_] == '\n' || p_[pos_] == '\r')) ++pos_;
  }
  void expect(char c) {
    skip_space();
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++pos_;
  }
  bool starts_with(const char* word) const {
    const size_t len = std::strlen(word);
    return n_ - pos_ >= len && std::memcmp(p_ + pos_, word, len) == 0;
  }

  Value parse_value(int depth) {
    if (depth > kMaxDepth) fail("nested too deeply");
    skip_space();
    const char c = peek();
    if (c == '\'' || c == '"') return parse_string();
    if (c == '{') return parse_dict(depth);
    if (c == '(') return parse_sequence(depth, Value::Tuple, ')');
    if (c == '[') return parse_sequence(depth, Value::List, ']');
    if (c == '-' || c == '+' || (c >= '0' && c <= '9')) return parse_int();
    Value v;
    v.kind = Value::Bool;
    if (starts_with("True")) {
      v.b = true;
      pos_ += 4;
      return v;
    }
    if (starts_with("False")) {
      pos_ += 5;
      return v;
    }
    fail(at_end() ? "unexpected end" : "unexpected character");
  }

  Value parse_string() {
    const char quote = p_[pos_++];
    Value v;
    while (!at_end() && p_[pos_] != quote) {
      if (p_[pos_] == '\\') fail("escape sequences are not supported");
      v.str.push_back(p_[pos_++]);
    }
    if (at_end()) fail("unterminated string");
    ++pos_;
    return v;
  }

  Value parse_int() {
    Value v;
    v.kind = Value::Int;
    bool negative = false;
    if (peek() == '-' || peek() == '+') negative = p_[pos_++] == '-';
    if (!(peek() >= '0' && peek() <= '9')) fail("bad number");
    uint64_t mag = 0;
    while (peek() >= '0' && peek() <= '9') {
      const int digit = p_[pos_++] - '0';
      if (mag > (static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) - digit) / 10) {
        v.int_overflow = true;
      } else {
        mag = mag * 10 + digit;
      }
    }
    if (peek() == 'L') ++pos_;  // Python 2 long suffix, seen in old files
    v.i = negative ? -static_cast<int64_t>(mag) : static_cast<int64_t>(mag);
    return v;
  }

  Value parse_sequence(int depth, Value::Kind kind, char close) {
    ++pos_;
    Value v;
    v.kind = kind;
    skip_space();
    while (peek() != close) {
      if (v.items.size() >= kMaxRank) fail("too many elements");
      v.items.push_back(parse_value(depth + 1));
      skip_space();
      if (peek() == ',') {
        ++pos_;
        skip_space();
      } else if (peek() != close) {
        fail(std::string("expected ',' or '") + close + "'");
      }
    }
    ++pos_;
    return v;
  }

  Value parse_dict(int depth) {
    ++pos_;
    Value v;
    v.kind = Value::Dict;
    skip_space();
    while (peek() != '}') {
      if (v.dict.size() >= kMaxDictKeys) fail("more than " + std::to_string(kMaxDictKeys) + " keys");
      if (peek() != '\'' && peek() != '"') fail("dict key is not a string");
      std::string key = parse_string().str;
      for (const auto& kv : v.dict) {
        if (kv.first == key) fail("duplicate key '" + printable(key) + "'");
      }
      expect(':');
      v.dict.emplace_back(std::move(key), parse_value(depth + 1));
      skip_space();
      if (peek() == ',') {
        ++pos_;
        skip_space();
      } else if (peek() != '}') {
        fail("expected ',' or '}'");
      }
    }
    ++pos_;
    return v;
  }

  const char* p_;
  size_t n_;
  size_t pos_ = 0;
  const std::string& origin_;
};

// descr string -> dtype, or an InputError saying why not.
DType parse_descr(const std::string& descr, const std::string& origin) {
  auto refuse = [&](const std::string& why) -> DType {
    throw InputError(origin + ": unsupported dtype '" + printable(descr) + "'" + why + "; " + kSupported);
  };
  std::string code = descr;
  char order = '=';
  if (!code.empty() && (code[0] == '<' || code[0] == '>' || code[0] == '|' || code[0] == '=')) {
    order = code[0];
    code.erase(0, 1);
  }
  if (code == "O") return refuse(" (object arrays)");
  if (code != "f2" && code != "f4" && code != "f8" && code != "i4" && code != "i8" && code != "V2") {
    return refuse("");
  }
  // On a little-endian host '=' (native), '|' (not applicable) and no prefix all mean little.
  if (order == '>' || (order != '<' && !host_is_little_endian())) return refuse(" (big-endian)");
  if (code == "f2") return DType::F16;
  if (code == "f4") return DType::F32;
  if (code == "f8") return DType::F64;
  if (code == "i4") return DType::I32;
  if (code == "i8") return DType::I64;
  return DType::BF16;  // V2: two opaque bytes, which is how ml_dtypes stores bfloat16
}

std::string errno_text() { return std::strerror(errno); }

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using FilePtr = std::unique_ptr<std::FILE, FileCloser>;

// Opens a regular file for reading and returns its size; InputError naming the path otherwise.
FilePtr open_for_read(const std::string& path, uint64_t* size) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) throw InputError(path + ": cannot read (" + errno_text() + ")");
  if (S_ISDIR(st.st_mode)) throw InputError(path + ": is a directory, expected a file");
  if (!S_ISREG(st.st_mode)) throw InputError(path + ": not a regular file");
  FilePtr f(std::fopen(path.c_str(), "rb"));
  if (!f) throw InputError(path + ": cannot open (" + errno_text() + ")");
  note_input_file(path);  // no output of this run may replace it
  *size = static_cast<uint64_t>(st.st_size);
  return f;
}

void read_exact(std::FILE* f, void* dst, size_t n, const std::string& path) {
  if (n != 0 && std::fread(dst, 1, n, f) != n) throw InputError(path + ": read failed (file changed or I/O error)");
}

// The bytes after the header must hold exactly the array the header describes.
void check_data_size(const NpyHeader& h, uint64_t have, const std::string& origin) {
  const uint64_t expected = static_cast<uint64_t>(shape_numel(h.shape)) * dtype_size(h.dtype);
  const std::string what = shape_str(h.shape) + " " + dtype_name(h.dtype) + " = " + std::to_string(expected) + " bytes";
  if (have < expected) {
    throw InputError(origin + ": truncated data (header says " + what + ", file has " + std::to_string(have) + ")");
  }
  if (have > expected) {
    throw InputError(origin + ": " + std::to_string(have - expected) + " trailing bytes after the data (header says " +
                     what + ")");
  }
}

// Validates `shape` for raw data of `dtype` and returns its size in bytes.
uint64_t raw_nbytes(DType dtype, const std::vector<int64_t>& shape, const std::string& origin) {
  const int64_t n = shape_numel(shape);
  const uint64_t itemsize = dtype_size(dtype);
  if (n < 0 || (n != 0 && static_cast<uint64_t>(n) > std::numeric_limits<uint64_t>::max() / 2 / itemsize)) {
    throw InputError(origin + ": invalid shape " + shape_str(shape));
  }
  return static_cast<uint64_t>(n) * itemsize;
}

void check_raw_size(uint64_t size, uint64_t expected, DType dtype, const std::vector<int64_t>& shape,
                    const std::string& origin) {
  if (size != expected) {
    throw InputError(origin + ": file has " + std::to_string(size) + " bytes, expected " + shape_str(shape) + " " +
                     dtype_name(dtype) + " = " + std::to_string(expected) + " bytes");
  }
}

std::string descr_of(DType t) {
  switch (t) {
    case DType::F16: return "<f2";
    case DType::F32: return "<f4";
    case DType::F64: return "<f8";
    case DType::I32: return "<i4";
    case DType::I64: return "<i8";
    case DType::BF16: return "<V2";
  }
  return "";
}

}  // namespace

namespace {

// The fixed part before the header dict: magic, version and header length.
struct NpyPrefix {
  int major = 1;
  size_t length = 10;      // bytes of the fixed part: 10 (v1) or 12 (v2, v3)
  uint64_t header_len = 0;
};

// Parses the fixed part from the first `size` bytes (12 suffice) of a file of `file_size` bytes
// and checks that the header fits in the file.
NpyPrefix parse_prefix(const uint8_t* bytes, size_t size, uint64_t file_size, const std::string& origin) {
  const size_t magic_seen = size < kMagicLen ? size : kMagicLen;
  if (magic_seen > 0 && std::memcmp(bytes, kMagic, magic_seen) != 0) throw InputError(origin + ": not a .npy file (bad magic)");
  if (size < 10) throw InputError(origin + ": truncated .npy header (" + std::to_string(size) + " bytes)");
  NpyPrefix p;
  const int major = bytes[6], minor = bytes[7];
  if ((major != 1 && major != 2 && major != 3) || minor != 0) {
    throw InputError(origin + ": unsupported .npy version " + std::to_string(major) + "." + std::to_string(minor) +
                     " (supported: 1.0, 2.0, 3.0)");
  }
  p.major = major;
  p.header_len = bytes[8] | (static_cast<uint64_t>(bytes[9]) << 8);
  if (major >= 2) {
    if (size < 12) throw InputError(origin + ": truncated .npy header (" + std::to_string(size) + " bytes)");
    p.header_len |= (static_cast<uint64_t>(bytes[10]) << 16) | (static_cast<uint64_t>(bytes[11]) << 24);
    p.length = 12;
  }
  if (p.header_len > file_size - p.length) {
    throw InputError(origin + ": truncated .npy header (needs " + std::to_string(p.length + p.header_len) +
                     " bytes, have " + std::to_string(file_size) + ")");
  }
  // numpy itself refuses headers over 10000 bytes unless told otherwise; real ones take ~128.
  if (p.header_len > kMaxHeaderLen) {
    throw InputError(origin + ": .npy header of " + std::to_string(p.header_len) + " bytes (at most " +
                     std::to_string(kMaxHeaderLen) + " read)");
  }
  return p;
}

}  // namespace

NpyHeader parse_npy_header(const uint8_t* bytes, size_t size, const std::string& origin) {
  const NpyPrefix p = parse_prefix(bytes, size, size, origin);
  NpyHeader h;
  h.version_major = p.major;
  const size_t prefix = p.length;
  const uint64_t header_len = p.header_len;
  h.data_offset = prefix + static_cast<size_t>(header_len);

  // Version 3 headers are UTF-8 rather than latin-1; the keys and values we accept are ASCII in
  // both, and anything else only appears inside strings, so the bytes are parsed the same way.
  LiteralParser parser(reinterpret_cast<const char*>(bytes + prefix), static_cast<size_t>(header_len), origin);
  const Value dict = parser.parse_document();
  const Value* descr = nullptr;
  const Value* fortran = nullptr;
  const Value* shape = nullptr;
  for (const auto& kv : dict.dict) {
    if (kv.first == "descr") descr = &kv.second;
    else if (kv.first == "fortran_order") fortran = &kv.second;
    else if (kv.first == "shape") shape = &kv.second;
    else throw InputError(origin + ": malformed .npy header (unexpected key '" + printable(kv.first) + "')");
  }
  if (!descr || !fortran || !shape) {
    throw InputError(origin + ": malformed .npy header (needs 'descr', 'fortran_order' and 'shape')");
  }
  if (descr->kind == Value::List) throw InputError(origin + ": structured dtypes are not supported; " + kSupported);
  if (descr->kind != Value::Str) throw InputError(origin + ": malformed .npy header ('descr' is not a string)");
  h.dtype = parse_descr(descr->str, origin);
  if (fortran->kind != Value::Bool) throw InputError(origin + ": malformed .npy header ('fortran_order' is not a bool)");
  if (fortran->b) {
    throw InputError(origin + ": fortran_order=True is not supported (save a C-ordered array, e.g. np.ascontiguousarray)");
  }
  if (shape->kind != Value::Tuple) throw InputError(origin + ": malformed .npy header ('shape' is not a tuple)");
  int64_t bytes_total = static_cast<int64_t>(dtype_size(h.dtype));
  for (const Value& d : shape->items) {
    if (d.kind != Value::Int) throw InputError(origin + ": malformed .npy header (shape entry is not an integer)");
    if (d.int_overflow) throw InputError(origin + ": absurd shape (a dimension overflows int64)");
    if (d.i < 0) throw InputError(origin + ": negative dimension " + std::to_string(d.i) + " in shape");
    h.shape.push_back(d.i);
    if (d.i != 0 && bytes_total > std::numeric_limits<int64_t>::max() / d.i) {
      throw InputError(origin + ": absurd shape (element count times itemsize overflows int64)");
    }
    bytes_total *= d.i;
  }
  return h;
}

std::vector<uint8_t> read_file(const std::string& path) {
  uint64_t size = 0;
  FilePtr f = open_for_read(path, &size);
  std::vector<uint8_t> out(static_cast<size_t>(size));
  read_exact(f.get(), out.data(), out.size(), path);
  return out;
}

HostArray read_npy(const std::string& path) {
  uint64_t size = 0;
  FilePtr f = open_for_read(path, &size);
  // Read the fixed prefix, learn the header length, check it against the file size, then read the
  // header: a lying length field can never trigger a large allocation.
  uint8_t prefix[12] = {};
  const size_t prefix_len = size < sizeof prefix ? static_cast<size_t>(size) : sizeof prefix;
  read_exact(f.get(), prefix, prefix_len, path);
  const NpyPrefix p = parse_prefix(prefix, prefix_len, size, path);
  std::vector<uint8_t> header(static_cast<size_t>(p.length + p.header_len));
  std::memcpy(header.data(), prefix, prefix_len < header.size() ? prefix_len : header.size());
  if (header.size() > prefix_len) read_exact(f.get(), header.data() + prefix_len, header.size() - prefix_len, path);
  const NpyHeader h = parse_npy_header(header.data(), header.size(), path);
  check_data_size(h, size - h.data_offset, path);
  HostArray a(h.dtype, h.shape);
  if (std::fseek(f.get(), static_cast<long>(h.data_offset), SEEK_SET) != 0) {
    throw InputError(path + ": seek failed (" + errno_text() + ")");
  }
  read_exact(f.get(), a.bytes.data(), a.bytes.size(), path);
  return a;
}

HostArray parse_npy(const uint8_t* bytes, size_t size, const std::string& origin) {
  const NpyHeader h = parse_npy_header(bytes, size, origin);
  check_data_size(h, size - h.data_offset, origin);
  HostArray a(h.dtype, h.shape);
  if (a.nbytes() != 0) std::memcpy(a.bytes.data(), bytes + h.data_offset, a.nbytes());
  return a;
}

void write_npy(const std::string& path, const HostArray& a) {
  std::string dict = "{'descr': '" + descr_of(a.dtype) + "', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < a.shape.size(); ++i) dict += (i ? ", " : "") + std::to_string(a.shape[i]);
  dict += a.shape.size() == 1 ? ",), }" : "), }";
  // Pad with spaces and end with '\n' so the data starts on a 64-byte boundary (as numpy does).
  auto padded = [&](size_t prefix) {
    const size_t unpadded = prefix + dict.size() + 1;
    return dict + std::string((64 - unpadded % 64) % 64, ' ') + "\n";
  };
  int major = 1;
  std::string header = padded(10);
  if (header.size() > 65535) {
    major = 2;
    header = padded(12);
  }
  std::vector<uint8_t> out(kMagicLen);
  std::memcpy(out.data(), kMagic, kMagicLen);
  out.push_back(static_cast<uint8_t>(major));
  out.push_back(0);
  const size_t len = header.size();
  out.push_back(static_cast<uint8_t>(len & 0xff));
  out.push_back(static_cast<uint8_t>((len >> 8) & 0xff));
  if (major == 2) {
    out.push_back(static_cast<uint8_t>((len >> 16) & 0xff));
    out.push_back(static_cast<uint8_t>((len >> 24) & 0xff));
  }
  out.insert(out.end(), header.begin(), header.end());
  out.insert(out.end(), a.bytes.begin(), a.bytes.end());
  write_file_atomic(path, out.data(), out.size());
}

HostArray read_raw(const std::string& path, DType dtype, const std::vector<int64_t>& shape) {
  const uint64_t expected = raw_nbytes(dtype, shape, path);
  uint64_t size = 0;
  FilePtr f = open_for_read(path, &size);
  check_raw_size(size, expected, dtype, shape, path);
  HostArray a(dtype, shape);
  read_exact(f.get(), a.bytes.data(), a.bytes.size(), path);
  return a;
}

HostArray parse_raw(const uint8_t* bytes, size_t size, DType dtype, const std::vector<int64_t>& shape,
                    const std::string& origin) {
  check_raw_size(size, raw_nbytes(dtype, shape, origin), dtype, shape, origin);
  HostArray a(dtype, shape);
  if (a.nbytes() != 0) std::memcpy(a.bytes.data(), bytes, a.nbytes());
  return a;
}

void write_raw(const std::string& path, const HostArray& a) { write_file_atomic(path, a.bytes.data(), a.bytes.size()); }

void write_file_atomic(const std::string& path, const void* data, size_t size) {
  if (input_files_protected() && is_input_file(path))
    throw InputError(path + " is one of this run's inputs; refusing to overwrite it");
  // Device nodes, FIFOs and descriptor names are written in place, never replaced by a rename.
  const bool in_place = written_in_place(path);
  // A symlink to a regular file: the file it points to is replaced, the link stays.
  std::string target = path;
  if (!in_place) {
    std::error_code ec;
    if (fs::is_symlink(fs::symlink_status(path, ec))) {
      const fs::path resolved = fs::canonical(path, ec);
      if (!ec) target = resolved.string();
    }
  }
  const std::string tmp = in_place ? path : target + ".tmp." + std::to_string(static_cast<long>(::getpid()));
  // A descriptor name (/dev/stdout) is written through the descriptor, keeping its offset.
  const int named_fd = in_place ? descriptor_named(path) : -1;
  const int fd = named_fd >= 0 ? named_fd
                 : in_place    ? ::open(path.c_str(), O_WRONLY | O_CLOEXEC)
                               : ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw RuntimeError(path + ": cannot write (" + errno_text() + ")");
  auto fail = [&](const std::string& what) {
    const std::string msg = path + ": " + what;
    if (!in_place) ::unlink(tmp.c_str());
    throw RuntimeError(msg);
  };
  const uint8_t* p = static_cast<const uint8_t*>(data);
  size_t left = size;
  while (left > 0) {
    const ssize_t n = ::write(fd, p, left);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const std::string why = n < 0 ? errno_text() : "short write";
      if (named_fd < 0) ::close(fd);
      fail("write failed after " + std::to_string(size - left) + " of " + std::to_string(size) + " bytes (" + why + ")");
    }
    p += n;
    left -= static_cast<size_t>(n);
  }
  // close() can be the first to report a full disk on some file systems (a named descriptor is
  // not ours to close).
  if (named_fd < 0 && ::close(fd) != 0) fail("write failed (" + errno_text() + ")");
  if (!in_place && ::rename(tmp.c_str(), target.c_str()) != 0) fail("cannot replace file (" + errno_text() + ")");
}

}  // namespace flashattn

// io_guard.h: input identities and the output-path policy.
#include "io_guard.h"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <utility>
#include <vector>

#include "flashattn/error.h"

namespace fs = std::filesystem;

namespace flashattn {
namespace {

struct Identity {
  dev_t dev;
  ino_t ino;
};

std::mutex& inputs_mutex() {
  static std::mutex m;
  return m;
}
std::vector<Identity>& inputs() {
  static std::vector<Identity> v;
  return v;
}

bool identity_of(const std::string& path, Identity* id) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return false;
  *id = Identity{st.st_dev, st.st_ino};
  return true;
}

// Names that stand for an open file descriptor (/dev/stdout, /dev/fd/N, /proc/self/fd/N): the
// file behind them may be regular (a redirect), but replacing it would detach the descriptor.
bool names_a_descriptor(const std::string& path) {
  std::error_code ec;
  const std::string abs = fs::absolute(fs::path(path), ec).lexically_normal().string();
  return abs == "/dev/stdout" || abs == "/dev/stderr" || abs == "/dev/stdin" || abs.rfind("/dev/fd/", 0) == 0 ||
         abs.rfind("/proc/", 0) == 0;
}

}  // namespace

void note_input_file(const std::string& path) {
  Identity id{};
  if (!identity_of(path, &id)) return;
  std::lock_guard<std::mutex> lock(inputs_mutex());
  for (const Identity& k : inputs())
    if (k.dev == id.dev && k.ino == id.ino) return;
  inputs().push_back(id);
}

bool is_input_file(const std::string& path) {
  Identity id{};
  if (!identity_of(path, &id)) return false;
  std::lock_guard<std::mutex> lock(inputs_mutex());
  for (const Identity& k : inputs())
    if (k.dev == id.dev && k.ino == id.ino) return true;
  return false;
}

namespace {
std::atomic<bool> g_protect{false};
}  // namespace

void protect_input_files() { g_protect = true; }
bool input_files_protected() { return g_protect; }

void clear_input_files() {
  std::lock_guard<std::mutex> lock(inputs_mutex());
  inputs().clear();
}

bool written_in_place(const std::string& path) {
  if (names_a_descriptor(path)) return true;
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return false;  // new file: created by rename
  return !S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode);
}

int descriptor_named(const std::string& path) {
  std::error_code ec;
  const std::string abs = fs::absolute(fs::path(path), ec).lexically_normal().string();
  if (abs == "/dev/stdout") return 1;
  if (abs == "/dev/stderr") return 2;
  for (const char* prefix : {"/dev/fd/", "/proc/self/fd/"}) {
    const std::string pre = prefix;
    if (abs.rfind(pre, 0) != 0) continue;
    const std::string num = abs.substr(pre.size());
    if (num.empty() || num.size() > 9 || num.find_first_not_of("0123456789") != std::string::npos) return -1;
    return std::stoi(num);
  }
  return -1;
}

void check_output_file(const std::string& path, const std::string& what) {
  const std::string who = what.empty() ? path : what + ": " + path;
  std::error_code ec;
  if (fs::is_directory(path, ec)) throw InputError(who + " is a directory");
  if (is_input_file(path)) throw InputError(who + " is one of this run's inputs; refusing to overwrite it");
  if (written_in_place(path)) {
    if (::access(path.c_str(), W_OK) != 0)
      throw InputError(who + ": cannot write (" + std::string(std::strerror(errno)) + ")");
    return;
  }
  // A regular file (or a new one) is replaced by rename from a temp file in its directory, through
  // a symlink to where the link points.
  fs::path target = fs::path(path);
  if (fs::is_symlink(fs::symlink_status(target, ec))) target = fs::canonical(target, ec);
  const fs::path parent = fs::absolute(target, ec).parent_path();
  if (!fs::is_directory(parent, ec)) throw InputError(who + ": " + parent.string() + " is not a directory");
  if (::access(parent.c_str(), W_OK | X_OK) != 0)
    throw InputError(who + ": cannot write into " + parent.string() + " (" + std::strerror(errno) + ")");
}

bool valid_utf8(const std::string& s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  for (size_t i = 0; i < n;) {
    const unsigned char c = p[i];
    size_t len = 0;
    uint32_t cp = 0;
    if (c < 0x80) {
      ++i;
      continue;
    } else if ((c & 0xE0) == 0xC0) {
      len = 2, cp = c & 0x1F;
    } else if ((c & 0xF0) == 0xE0) {
      len = 3, cp = c & 0x0F;
    } else if ((c & 0xF8) == 0xF0) {
      len = 4, cp = c & 0x07;
    } else {
      return false;
    }
    if (i + len > n) return false;
    for (size_t k = 1; k < len; ++k) {
      if ((p[i + k] & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (p[i + k] & 0x3F);
    }
    // Overlong forms, surrogates and code points past U+10FFFF are not UTF-8.
    const uint32_t min_cp[5] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < min_cp[len] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += len;
  }
  return true;
}

void check_utf8_path(const std::string& path, const std::string& what) {
  if (!valid_utf8(path)) throw InputError(what + ": the path is not valid UTF-8 (the JSON reports hold UTF-8 only)");
}

bool same_file(const std::string& a, const std::string& b) {
  Identity x{}, y{};
  return identity_of(a, &x) && identity_of(b, &y) && x.dev == y.dev && x.ino == y.ino;
}

}  // namespace flashattn

// What a data directory says about its .bin files besides their bytes: meta.json, or a directory
// name B{b}_H{h}_S{s}_D{d} (data/README.md). Parsing works on text in memory, apart from any file
// access, so it is unit-tested and fuzzed (tests/fuzz) on exactly the code the loader runs.
// Every error is an InputError naming meta.json (or the directory) and the problem in one line.
#pragma once

#include <cstddef>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "flashattn/types.h"

namespace flashattn {

// Parses a JSON document read from a file (meta.json, a sweep preset) defensively: at most
// kMaxJsonBytes, nested at most kMaxJsonDepth levels, no key twice in one object. InputError
// naming `origin` otherwise, before any deep structure is built.
constexpr size_t kMaxJsonBytes = size_t(64) << 20;
constexpr int kMaxJsonDepth = 64;
nlohmann::json parse_json_file_text(const uint8_t* bytes, size_t size, const std::string& origin);

// Parses meta.json text: a JSON object whose "format_version", when present, is 1.
// `origin` (the file's path) starts every message.
nlohmann::json parse_meta_json(const uint8_t* bytes, size_t size, const std::string& origin);

// The layout of the data: meta.json's "layout" when `meta` has one (it must agree with
// `requested`, from --layout), else `requested`, else bhsd.
Layout meta_layout(const nlohmann::json* meta, std::optional<Layout> requested, const std::string& origin);

// dtype and shape of each NAME.bin of a directory.
class BinShapes {
 public:
  // From `meta` (parsed meta.json, which must outlive this object) when given, else from the name
  // of `dir`, which must then be B{b}_H{h}_S{s}_D{d} and the layout bhsd.
  BinShapes(const std::string& dir, const nlohmann::json* meta, Layout layout);

  bool from_meta() const { return meta_ != nullptr; }

  // NAME is Q, K, V, dO, seqlens_k or mask: the meta.json "files" entry, else the default shape
  // from the top-level sizes (data/README.md).
  std::pair<DType, std::vector<int64_t>> spec(const std::string& name) const;

  // Exactly B{b}_H{h}_S{s}_D{d} with positive decimal sizes and no leading zeros; out = B, H, S, D.
  static bool parse_dims_name(const std::string& name, int64_t out[4]);

 private:
  [[noreturn]] void fail(const std::string& what) const;
  DType top_dtype() const;
  int64_t dim(const std::string& field, const std::string& need) const;
  int64_t seq(const std::string& field, const std::string& need) const;
  void read_entry(const std::string& name, const nlohmann::json& e, std::optional<DType>* dtype,
                  std::optional<std::vector<int64_t>>* shape) const;

  std::string dir_;
  std::string meta_path_;
  const nlohmann::json* meta_;
  Layout layout_;
  int64_t dirname_dims_[4] = {0, 0, 0, 0};  // B, H, S, D
};

}  // namespace flashattn

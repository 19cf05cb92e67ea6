// meta.json and the directory-name convention; the contract is data/README.md.
#include "meta.h"

#include <filesystem>
#include <limits>
#include <set>
#include <vector>

#include "flashattn/error.h"

namespace flashattn {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

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

}  // namespace

json parse_json_file_text(const uint8_t* bytes, size_t size, const std::string& origin) {
  if (size > kMaxJsonBytes)
    throw InputError(origin + ": " + std::to_string(size) + " bytes of JSON (at most " + std::to_string(kMaxJsonBytes) +
                     " read)");
  // One set of keys per object being parsed: a key seen twice in the same object is refused (the
  // parser would silently keep the last).
  std::vector<std::set<std::string>> keys;
  const json::parser_callback_t check = [&](int depth, json::parse_event_t event, json& parsed) {
    if (depth > kMaxJsonDepth)
      throw InputError(origin + ": JSON nested deeper than " + std::to_string(kMaxJsonDepth) + " levels");
    if (event == json::parse_event_t::object_start) keys.emplace_back();
    if (event == json::parse_event_t::object_end && !keys.empty()) keys.pop_back();
    if (event == json::parse_event_t::key && !keys.empty() && !keys.back().insert(parsed.get<std::string>()).second)
      throw InputError(origin + ": key \"" + parsed.get<std::string>() + "\" appears twice in one object");
    return true;
  };
  try {
    return json::parse(bytes, bytes + size, check);
  } catch (const json::exception& e) {
    std::string why = e.what();
    // The parser quotes the text it stopped at: keep the message on one line and plain ASCII.
    for (char& c : why) {
      const unsigned char u = static_cast<unsigned char>(c);
      if (u < 0x20 || u == 0x7f) c = ' ';
      else if (u >= 0x80) c = '?';
    }
    throw InputError(origin + ": invalid JSON (" + why + ")");
  }
}

json parse_meta_json(const uint8_t* bytes, size_t size, const std::string& origin) {
  const json j = parse_json_file_text(bytes, size, origin);
  if (!j.is_object()) throw InputError(origin + ": expected a JSON object");
  if (j.contains("format_version")) {
    int64_t v = 0;
    if (!json_int(j["format_version"], &v) || v != 1) {
      throw InputError(origin + ": field 'format_version' must be 1 (the only version this build reads)");
    }
  }
  return j;
}

Layout meta_layout(const json* meta, std::optional<Layout> requested, const std::string& origin) {
  if (!meta || !meta->contains("layout")) return requested.value_or(Layout::BHSD);
  const json& v = (*meta)["layout"];
  Layout l;
  if (!v.is_string() || !parse_layout_name(v.get<std::string>(), &l)) {
    throw InputError(origin + ": field 'layout' must be \"bhsd\" or \"bshd\"");
  }
  if (requested && *requested != l) {
    throw InputError(origin + ": layout '" + layout_name(l) + "' conflicts with --layout " + layout_name(*requested));
  }
  return l;
}

BinShapes::BinShapes(const std::string& dir, const json* meta, Layout layout)
    : dir_(dir), meta_path_((fs::path(dir) / "meta.json").string()), meta_(meta), layout_(layout) {
  if (meta_) return;
  fs::path p = fs::absolute(fs::path(dir_)).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();
  if (!parse_dims_name(p.filename().string(), dirname_dims_)) {
    throw InputError(dir_ + ": .bin inputs need meta.json or a directory named B{b}_H{h}_S{s}_D{d}");
  }
  if (layout_ != Layout::BHSD) {
    throw InputError(dir_ + ": a directory named B{b}_H{h}_S{s}_D{d} holds bhsd data; bshd needs a meta.json");
  }
}

std::pair<DType, std::vector<int64_t>> BinShapes::spec(const std::string& name) const {
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

void BinShapes::fail(const std::string& what) const { throw InputError(meta_path_ + ": " + what); }

bool BinShapes::parse_dims_name(const std::string& name, int64_t out[4]) {
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

DType BinShapes::top_dtype() const {
  if (!meta_ || !meta_->contains("dtype")) return DType::F32;
  const json& v = (*meta_)["dtype"];
  DType t;
  if (!v.is_string() || !parse_dtype(v.get<std::string>(), &t) || !dtype_is_float(t)) {
    fail("field 'dtype' must be one of \"fp32\", \"fp16\", \"bf16\", \"fp64\"");
  }
  return t;
}

int64_t BinShapes::dim(const std::string& field, const std::string& need) const {
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
int64_t BinShapes::seq(const std::string& field, const std::string& need) const {
  if (!meta_) return dirname_dims_[2];
  if (!meta_->contains(field) && meta_->contains("S")) return dim("S", need);
  if (!meta_->contains(field)) fail("missing field '" + field + "' (or 'S'), needed for " + need);
  return dim(field, need);
}

void BinShapes::read_entry(const std::string& name, const json& e, std::optional<DType>* dtype,
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

}  // namespace flashattn

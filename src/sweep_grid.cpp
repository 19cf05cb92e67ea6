// The grids of --sweep: the built-in fa-grid and preset files (format in sweep.h).
#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <sstream>

#include "flashattn/error.h"
#include "meta.h"
#include "npy.h"
#include "sweep.h"

namespace flashattn {

using nlohmann::json;

namespace {

const std::set<std::string> kPointFields = {"B", "H", "H_kv", "S", "S_q", "S_k", "D", "dtype", "causal", "mode", "modes", "kernels"};

std::vector<Mode> parse_modes(const json& v, const std::string& where) {
  std::vector<std::string> names;
  if (v.is_string()) names.push_back(v.get<std::string>());
  else if (v.is_array())
    for (const json& x : v) names.push_back(x.is_string() ? x.get<std::string>() : x.dump());
  else throw InputError(where + ": mode must be \"forward\", \"backward\", \"both\" or a list of them");
  std::vector<Mode> modes;
  for (const std::string& n : names) {
    std::vector<Mode> add;
    if (n == "forward") add = {Mode::Forward};
    else if (n == "backward") add = {Mode::Backward};
    else if (n == "both") add = {Mode::Forward, Mode::Backward};
    else throw InputError(where + ": mode '" + n + "' is not forward, backward or both");
    for (Mode m : add)
      if (std::find(modes.begin(), modes.end(), m) == modes.end()) modes.push_back(m);
  }
  if (modes.empty()) throw InputError(where + ": empty mode list");
  return modes;
}

std::vector<std::string> parse_kernels(const json& v, const std::string& where) {
  std::vector<std::string> out;
  auto add_csv = [&](const std::string& s) {
    std::stringstream ss(s);
    std::string k;
    while (std::getline(ss, k, ','))
      if (!k.empty()) out.push_back(k);
  };
  if (v.is_string()) add_csv(v.get<std::string>());
  else if (v.is_array()) {
    for (const json& x : v) {
      if (!x.is_string()) throw InputError(where + ": kernels must be names");
      add_csv(x.get<std::string>());
    }
  } else throw InputError(where + ": kernels must be a list of names or a comma-separated string");
  return out;
}

int positive_int(const json& p, const char* key, const std::string& where) {
  const json& v = p.at(key);
  if (!v.is_number_integer() || v.get<long long>() < 1 || v.get<long long>() > (1 << 30))
    throw InputError(where + ": " + key + " must be a positive integer, got " + v.dump());
  return v.get<int>();
}

// Values of a field that may be a scalar or a list (each value makes its own point).
std::vector<json> values_of(const json& v) {
  if (v.is_array()) return std::vector<json>(v.begin(), v.end());
  return {v};
}

// Expands one point (its own fields over the file's defaults over the command line's) into
// SweepPoints, one per (dtype, causal) value.
void expand(const json& point, const json& file_defaults, const SweepDefaults& cli, const std::string& where,
            std::vector<SweepPoint>& out) {
  if (!point.is_object()) throw InputError(where + ": a point must be a JSON object");
  for (auto it = point.begin(); it != point.end(); ++it)
    if (!kPointFields.count(it.key())) throw InputError(where + ": unknown field '" + it.key() + "'");
  // Precedence: the point, then the command line, then the file's defaults, then built-ins.
  json f = file_defaults.is_object() ? file_defaults : json::object();
  if (!cli.dtype.empty()) f["dtype"] = cli.dtype;
  if (!cli.mode.empty()) f["mode"] = cli.mode, f.erase("modes");
  if (cli.causal) f["causal"] = true;
  if (!cli.kernels.empty()) f["kernels"] = cli.kernels;
  for (auto it = point.begin(); it != point.end(); ++it) f[it.key()] = it.value();
  if (point.contains("modes")) f.erase("mode");
  if (point.contains("mode")) f.erase("modes");

  for (const char* k : {"B", "H", "D"})
    if (!f.contains(k)) throw InputError(where + ": missing " + k);
  SweepPoint base;
  base.dims.B = positive_int(f, "B", where);
  base.dims.H = positive_int(f, "H", where);
  base.dims.H_kv = f.contains("H_kv") ? positive_int(f, "H_kv", where) : base.dims.H;
  base.dims.D = positive_int(f, "D", where);
  if (base.dims.H % base.dims.H_kv != 0)
    throw InputError(where + fmt::format(": H = {} is not a multiple of H_kv = {}", base.dims.H, base.dims.H_kv));
  if (f.contains("S_q") || f.contains("S_k")) {
    if (!f.contains("S_q") || !f.contains("S_k")) throw InputError(where + ": give both S_q and S_k (or S)");
    base.dims.S_q = positive_int(f, "S_q", where);
    base.dims.S_k = positive_int(f, "S_k", where);
  } else if (f.contains("S")) {
    base.dims.S_q = base.dims.S_k = positive_int(f, "S", where);
  } else {
    throw InputError(where + ": missing S (or S_q and S_k)");
  }
  // Size checks before any work: a point whose Q or K alone would hold more than 2^37 elements
  // (256 GB at 16 bits, more memory than any GPU or host this runs on) is refused here rather than
  // failing an allocation later.
  const Dims& d = base.dims;
  const double q_elems = double(d.B) * d.H * d.S_q * d.D, k_elems = double(d.B) * d.H_kv * d.S_k * d.D;
  if (std::max(q_elems, k_elems) > double(int64_t(1) << 37))
    throw InputError(where + fmt::format(": Q and K would hold {:.3g} and {:.3g} elements (at most 2^37 each)", q_elems,
                                         k_elems));
  base.modes = f.contains("modes") ? parse_modes(f["modes"], where)
                                   : parse_modes(f.value("mode", json("both")), where);
  if (f.contains("kernels")) base.kernels = parse_kernels(f["kernels"], where);

  for (const json& dt : values_of(f.value("dtype", json("bf16")))) {
    DType t;
    if (!dt.is_string() || !parse_dtype(dt.get<std::string>(), &t) || !dtype_is_float(t) || t == DType::F64)
      throw InputError(where + ": dtype must be fp32, fp16 or bf16, got " + dt.dump());
    for (const json& c : values_of(f.value("causal", json(false)))) {
      if (!c.is_boolean()) throw InputError(where + ": causal must be true, false or a list of them, got " + c.dump());
      SweepPoint p = base;
      p.dtype = t;
      p.causal = c.get<bool>();
      out.push_back(p);
    }
  }
}

json fa_grid_points() {
  // FlashAttention's benchmark grid: constant tokens per batch (B*S = 16384) and model width
  // (H*D = 2048), so FLOPs grow linearly with S and only the attention span changes.
  json pts = json::array();
  for (bool causal : {false, true})
    for (int D : {64, 128})
      for (int S : {512, 1024, 2048, 4096, 8192, 16384})
        pts.push_back({{"B", 16384 / S}, {"H", 2048 / D}, {"S", S}, {"D", D}, {"causal", causal}});
  return pts;
}

}  // namespace

SweepGrid load_sweep(const std::string& spec, const SweepDefaults& cli) {
  SweepGrid g;
  json points, defaults = json::object();
  std::string origin;
  if (spec == "fa-grid") {
    g.name = "fa-grid";
    points = fa_grid_points();
    origin = "--sweep fa-grid";
  } else {
    // read_file refuses directories, FIFOs and other non-regular files before reading a byte, and
    // notes the preset as an input (no output of the sweep may replace it).
    const std::vector<uint8_t> text = read_file(spec);
    const json doc = parse_json_file_text(text.data(), text.size(), spec);
    origin = spec;
    if (doc.is_array()) {
      points = doc;
    } else if (doc.is_object() && doc.contains("points") && doc["points"].is_array()) {
      points = doc["points"];
      if (doc.contains("defaults")) defaults = doc["defaults"];
      if (!defaults.is_object()) throw InputError(spec + ": \"defaults\" must be an object");
      for (auto it = defaults.begin(); it != defaults.end(); ++it)
        if (!kPointFields.count(it.key())) throw InputError(spec + ": defaults: unknown field '" + it.key() + "'");
      g.name = doc.value("name", std::string());
    } else {
      throw InputError(spec + ": expected {\"points\": [...]} or a list of points");
    }
    if (g.name.empty()) {
      const size_t slash = spec.find_last_of('/');
      g.name = spec.substr(slash == std::string::npos ? 0 : slash + 1);
    }
  }
  for (size_t i = 0; i < points.size(); ++i)
    expand(points[i], defaults, cli, fmt::format("{}: point {}", origin, i + 1), g.points);
  if (g.points.empty()) throw InputError(origin + ": no points");
  return g;
}

json sweep_grid_json(const SweepGrid& g) {
  json pts = json::array();
  for (const SweepPoint& p : g.points) {
    json modes = json::array();
    for (Mode m : p.modes) modes.push_back(mode_name(m));
    json j = {{"B", p.dims.B},     {"H", p.dims.H},         {"H_kv", p.dims.H_kv},   {"S_q", p.dims.S_q},
              {"S_k", p.dims.S_k}, {"D", p.dims.D},         {"dtype", dtype_name(p.dtype)},
              {"causal", p.causal}, {"modes", modes}};
    if (!p.kernels.empty()) j["kernels"] = p.kernels;
    pts.push_back(j);
  }
  return {{"name", g.name}, {"points", pts}};
}

}  // namespace flashattn

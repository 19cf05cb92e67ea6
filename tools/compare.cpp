// flashattn-compare: error statistics between an array A and a reference array B.
//
// Metrics are accumulated in double over the positions where both values are finite; positions
// where both are NaN, or both the same infinity, agree; any other non-finite position (NaN or inf
// on one side only, or opposite infinities) is a mismatch and always fails the comparison.
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <fmt/core.h>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "array.h"
#include "flashattn/error.h"
#include "npy.h"

namespace fa = flashattn;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

// Denominator floor of the max relative error: |a - b| / max(|b|, kRelFloorFraction * max|b|),
// the same convention as flashattn --check and scripts/reference.py.
constexpr double kRelFloorFraction = 1e-3;

std::string lower_ext(const std::string& path) {
  std::string e = fs::path(path).extension().string();
  for (char& c : e) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return e;
}

std::optional<std::vector<int64_t>> parse_shape(const std::string& s) {
  std::vector<int64_t> shape;
  size_t start = 0;
  while (start <= s.size()) {
    const size_t comma = std::min(s.find(',', start), s.size());
    const std::string item = s.substr(start, comma - start);
    size_t used = 0;
    long long v = -1;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      return std::nullopt;
    }
    if (used != item.size() || v < 0) return std::nullopt;
    shape.push_back(v);
    start = comma + 1;
  }
  return shape;
}

// The "files" entry named by the file's stem in meta.json beside it, if any.
void meta_entry(const std::string& path, std::optional<fa::DType>* dtype, std::optional<std::vector<int64_t>>* shape) {
  const fs::path p(path);
  const std::string meta_path = (p.parent_path() / "meta.json").string();
  std::error_code ec;
  if (!fs::exists(meta_path, ec)) return;
  const std::vector<uint8_t> bytes = fa::read_file(meta_path);
  json j;
  try {
    j = json::parse(bytes.begin(), bytes.end());
  } catch (const json::exception&) {
    throw fa::InputError(meta_path + ": invalid JSON");
  }
  const std::string stem = p.stem().string();
  if (!j.is_object() || !j.contains("files") || !j["files"].is_object() || !j["files"].contains(stem)) return;
  const json& e = j["files"][stem];
  const std::string field = meta_path + ": field 'files." + stem;
  if (!e.is_object()) throw fa::InputError(field + "' must be an object");
  if (e.contains("dtype")) {
    fa::DType t;
    if (!e["dtype"].is_string() || !fa::parse_dtype(e["dtype"].get<std::string>(), &t)) {
      throw fa::InputError(field + ".dtype' must be a dtype name");
    }
    *dtype = t;
  }
  if (e.contains("shape")) {
    std::vector<int64_t> s;
    bool ok = e["shape"].is_array();
    for (const json& d : ok ? e["shape"] : json::array()) {
      ok = ok && d.is_number_integer() && d.get<int64_t>() >= 0;
      if (ok) s.push_back(d.get<int64_t>());
    }
    if (!ok) throw fa::InputError(field + ".shape' must be a list of non-negative integers");
    *shape = s;
  }
}

fa::HostArray load(const std::string& path, const std::optional<fa::DType>& cli_dtype,
                   const std::optional<std::vector<int64_t>>& cli_shape) {
  const std::string ext = lower_ext(path);
  if (ext == ".npy") return fa::read_npy(path);
  if (ext != ".bin") throw fa::InputError(path + ": expected a .npy or .bin file");
  std::optional<fa::DType> dtype = cli_dtype;
  std::optional<std::vector<int64_t>> shape = cli_shape;
  if (!dtype || !shape) {
    std::optional<fa::DType> meta_dtype;
    std::optional<std::vector<int64_t>> meta_shape;
    meta_entry(path, &meta_dtype, &meta_shape);
    if (!dtype) dtype = meta_dtype;
    if (!shape) shape = meta_shape;
  }
  if (!shape) {
    throw fa::InputError(path + ": no shape for a .bin file (no 'files' entry '" + fs::path(path).stem().string() +
                         "' in meta.json beside it); pass --shape and --dtype");
  }
  return fa::read_raw(path, dtype.value_or(fa::DType::F32), *shape);
}

std::vector<int64_t> unravel(int64_t flat, const std::vector<int64_t>& shape) {
  std::vector<int64_t> idx(shape.size(), 0);
  for (size_t k = shape.size(); k-- > 0;) {
    idx[k] = shape[k] ? flat % shape[k] : 0;
    flat = shape[k] ? flat / shape[k] : 0;
  }
  return idx;
}

struct Stats {
  int64_t numel = 0, finite_pairs = 0;
  double max_abs = 0, mean_abs = 0, mse = 0, max_rel = 0, rel_l2 = 0;
  int64_t max_abs_at = -1;
  int64_t nan_a = 0, inf_a = 0, nan_b = 0, inf_b = 0;
  int64_t nonfinite_mismatches = 0, first_mismatch_at = -1;
};

Stats compare(const fa::HostArray& a, const fa::HostArray& b) {
  Stats s;
  s.numel = a.numel();
  double sum_abs = 0, sum_sq = 0, ref_sq = 0, ref_max = 0;
  for (int64_t i = 0; i < s.numel; ++i) {
    const double y = fa::element_as_double(b, i);
    if (std::isfinite(y)) ref_max = std::max(ref_max, std::fabs(y));
  }
  const double rel_floor = std::max(kRelFloorFraction * ref_max, std::numeric_limits<double>::min());
  for (int64_t i = 0; i < s.numel; ++i) {
    const double x = fa::element_as_double(a, i), y = fa::element_as_double(b, i);
    s.nan_a += std::isnan(x);
    s.inf_a += std::isinf(x);
    s.nan_b += std::isnan(y);
    s.inf_b += std::isinf(y);
    if (!std::isfinite(x) || !std::isfinite(y)) {
      const bool agree = (std::isnan(x) && std::isnan(y)) || (std::isinf(x) && x == y);
      if (!agree && s.nonfinite_mismatches++ == 0) s.first_mismatch_at = i;
      continue;
    }
    const double diff = std::fabs(x - y);
    ++s.finite_pairs;
    sum_abs += diff;
    sum_sq += diff * diff;
    ref_sq += y * y;
    if (diff > s.max_abs || s.max_abs_at < 0) {
      s.max_abs = diff;
      s.max_abs_at = i;
    }
    s.max_rel = std::max(s.max_rel, diff / std::max(std::fabs(y), rel_floor));
  }
  if (s.finite_pairs > 0) {
    s.mean_abs = sum_abs / s.finite_pairs;
    s.mse = sum_sq / s.finite_pairs;
  }
  if (ref_sq > 0) s.rel_l2 = std::sqrt(sum_sq) / std::sqrt(ref_sq);
  else s.rel_l2 = sum_sq > 0 ? std::numeric_limits<double>::infinity() : 0.0;
  return s;
}

struct Args {
  std::string a, b;
  std::optional<double> max_rel_l2, max_abs;
  bool json_out = false;
  std::string dtype, shape;
};

int run(const Args& args) {
  std::optional<fa::DType> dtype;
  std::optional<std::vector<int64_t>> shape;
  if (!args.dtype.empty()) {
    fa::DType t;
    if (!fa::parse_dtype(args.dtype, &t)) throw fa::InputError("--dtype: unknown dtype '" + args.dtype + "'");
    dtype = t;
  }
  if (!args.shape.empty()) {
    shape = parse_shape(args.shape);
    if (!shape) throw fa::InputError("--shape: '" + args.shape + "' is not a comma-separated list of sizes");
  }
  const fa::HostArray a = load(args.a, dtype, shape);
  const fa::HostArray b = load(args.b, dtype, shape);
  if (a.shape != b.shape) {
    throw fa::InputError(args.a + ": shape " + fa::shape_str(a.shape) + " differs from " + args.b + " " +
                         fa::shape_str(b.shape));
  }
  const Stats s = compare(a, b);
  std::vector<std::string> failures;
  if (s.nonfinite_mismatches > 0) failures.push_back(std::to_string(s.nonfinite_mismatches) + " NaN/Inf mismatches");
  if (args.max_abs && !(s.max_abs <= *args.max_abs)) {
    failures.push_back(fmt::format("max abs {:.3e} > {:.3e}", s.max_abs, *args.max_abs));
  }
  if (args.max_rel_l2 && !(s.rel_l2 <= *args.max_rel_l2)) {
    failures.push_back(fmt::format("rel l2 {:.3e} > {:.3e}", s.rel_l2, *args.max_rel_l2));
  }
  const bool pass = failures.empty();

  if (args.json_out) {
    auto index = [&](int64_t flat) { return flat < 0 ? json(nullptr) : json(unravel(flat, a.shape)); };
    auto opt = [](const std::optional<double>& v) { return v ? json(*v) : json(nullptr); };
    // JSON has no infinity: an infinite rel_l2 (reference all zero) is written as null.
    const json j = {{"a", args.a}, {"b", args.b}, {"shape", a.shape}, {"dtype_a", fa::dtype_name(a.dtype)},
                    {"dtype_b", fa::dtype_name(b.dtype)}, {"numel", s.numel}, {"max_abs", s.max_abs},
                    {"max_abs_index", index(s.max_abs_at)}, {"mean_abs", s.mean_abs}, {"mse", s.mse},
                    {"max_rel", s.max_rel}, {"max_rel_floor_fraction", kRelFloorFraction}, {"rel_l2", s.rel_l2},
                    {"nan_a", s.nan_a}, {"inf_a", s.inf_a}, {"nan_b", s.nan_b}, {"inf_b", s.inf_b},
                    {"nonfinite_mismatches", s.nonfinite_mismatches},
                    {"first_nonfinite_mismatch", index(s.first_mismatch_at)},
                    {"max_abs_threshold", opt(args.max_abs)}, {"max_rel_l2_threshold", opt(args.max_rel_l2)},
                    {"pass", pass}};
    fmt::print("{}\n", j.dump());
  } else {
    fmt::print("A        {} {} {}\n", args.a, fa::shape_str(a.shape), fa::dtype_name(a.dtype));
    fmt::print("B (ref)  {} {} {}\n", args.b, fa::shape_str(b.shape), fa::dtype_name(b.dtype));
    fmt::print("max abs  {:.6e}{}\n", s.max_abs,
               s.max_abs_at >= 0 ? " at " + fa::shape_str(unravel(s.max_abs_at, a.shape)) : "");
    fmt::print("mean abs {:.6e}\n", s.mean_abs);
    fmt::print("mse      {:.6e}\n", s.mse);
    fmt::print("max rel  {:.6e}  (|a-b| / max(|b|, {:g} * max|b|))\n", s.max_rel, kRelFloorFraction);
    fmt::print("rel l2   {:.6e}  (||a-b|| / ||b||)\n", s.rel_l2);
    fmt::print("nonfinite: A {} NaN {} inf, B {} NaN {} inf, {} mismatches{}\n", s.nan_a, s.inf_a, s.nan_b, s.inf_b,
               s.nonfinite_mismatches,
               s.first_mismatch_at >= 0 ? " (first at " + fa::shape_str(unravel(s.first_mismatch_at, a.shape)) + ")"
                                        : "");
    std::string verdict = pass ? "PASS" : "FAIL: ";
    for (size_t i = 0; i < failures.size(); ++i) verdict += (i ? "; " : "") + failures[i];
    fmt::print("{}\n", verdict);
  }
  return pass ? fa::kExitOk : fa::kExitValidation;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"flashattn-compare: error statistics of A against the reference B (.npy, or .bin with meta.json)"};
  app.footer(
      "Exit codes: 0 ok, 1 runtime failure, 2 usage or input error (incl. shape mismatch),\n"
      "3 a threshold exceeded or a NaN/Inf mismatch (one side non-finite, the other not).");
  Args args;
  double max_rel_l2 = 0, max_abs = 0;
  app.add_option("A", args.a, "array to check")->required();
  app.add_option("B", args.b, "reference array")->required();
  auto* rel_opt = app.add_option("--max-rel-l2", max_rel_l2, "fail (exit 3) if ||A-B|| / ||B|| exceeds this");
  auto* abs_opt = app.add_option("--max-abs", max_abs, "fail (exit 3) if max |A-B| exceeds this");
  app.add_flag("--json", args.json_out, "print one JSON object instead of text");
  app.add_option("--dtype", args.dtype, ".bin files: element type (default: meta.json entry, else fp32)");
  app.add_option("--shape", args.shape, ".bin files: comma-separated shape (default: meta.json entry)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    fmt::print(stderr, "flashattn-compare: {} (see --help)\n", e.what());
    return fa::kExitInput;
  }
  // A threshold is a finite number >= 0: NaN would pass every comparison, a negative one fail all.
  for (const auto& [opt, value, name] : {std::tuple{rel_opt, max_rel_l2, "--max-rel-l2"}, std::tuple{abs_opt, max_abs, "--max-abs"}}) {
    if (opt->count() && !(std::isfinite(value) && value >= 0)) {
      fmt::print(stderr, "flashattn-compare: {}: must be a finite number >= 0 (see --help)\n", name);
      return fa::kExitInput;
    }
  }
  if (rel_opt->count()) args.max_rel_l2 = max_rel_l2;
  if (abs_opt->count()) args.max_abs = max_abs;
  try {
    return run(args);
  } catch (const fa::Error& e) {
    fmt::print(stderr, "{}\n", e.what());
    return e.exit_code();
  } catch (const std::bad_alloc&) {
    fmt::print(stderr, "flashattn-compare: out of memory\n");
    return fa::kExitRuntime;
  } catch (const std::exception& e) {
    fmt::print(stderr, "flashattn-compare: {}\n", e.what());
    return fa::kExitRuntime;
  }
}

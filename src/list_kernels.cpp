// `flashattn --list` and `--list-json`: the support matrix, from the registry.
#include <fmt/format.h>

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "app.h"
#include "flashattn/registry.h"

namespace flashattn {

std::string list_kernels(bool as_json) {
  const std::vector<const KernelMode*> entries = Registry::entries();
  auto dtypes_of = [](uint32_t m) {
    std::vector<std::string> v;
    for (int t = 0; t < kNumDTypes; ++t)
      if (m & (1u << t)) v.push_back(dtype_name(static_cast<DType>(t)));
    return v;
  };
  auto features_of = [](uint32_t m) {
    std::vector<std::string> v;
    for (int b = 0; b < kNumFeatures; ++b)
      if (m & (1u << b)) v.push_back(feature_name(1u << b));
    return v;
  };
  auto dims_of = [](const KernelMode& e) {
    if (!e.head_dims.empty()) {
      std::string s;
      for (int d : e.head_dims) s += (s.empty() ? "" : ",") + std::to_string(d);
      return s;
    }
    return e.max_head_dim > 0 ? "1.." + std::to_string(e.max_head_dim) : std::string("any");
  };
  if (as_json) {
    nlohmann::json arr = nlohmann::json::array();
    for (const KernelMode* e : entries) {
      const char* role = e->role == KernelRole::Reference ? "reference"
                         : e->role == KernelRole::Baseline ? "baseline"
                                                           : "kernel";
      arr.push_back({{"kernel", e->kernel},
                     {"role", role},
                     {"mode", mode_name(e->mode)},
                     {"summary", e->summary},
                     {"rung", e->rung},
                     {"gpu", e->gpu},
                     {"min_sm", e->min_sm},
                     {"max_sm", e->max_sm},
                     {"fallback_head_dims", e->fallback_head_dims},
                     {"fallback_kernel", e->fallback_kernel},
                     {"dtypes", dtypes_of(e->dtypes)},
                     {"head_dims", e->head_dims},
                     {"max_head_dim", e->max_head_dim},
                     {"features", features_of(e->features)},
                     {"uses_atomics", e->uses_atomics},
                     {"bitwise_reproducible", e->bitwise_reproducible},
                     {"deterministic_path", e->has_deterministic_path},
                     {"partial_outputs", e->partial_outputs},
                     {"fp32_gradients", e->fp32_gradients != nullptr},
                     {"merges_output", e->merges_output != nullptr},
                     {"dq_accumulator", e->dq_finish != nullptr},
                     {"key_tiles", e->key_tile != nullptr},
                     {"compiled_archs", e->compiled_archs}});
    }
    return arr.dump(2) + "\n";
  }
  std::string out = fmt::format("{:<8} {:<8} {:<4} {:<20} {:<16} {:<50} {}\n", "kernel", "mode", "sm", "dtypes",
                                "head dims", "features", "notes");
  std::string last;
  for (const KernelMode* e : entries) {
    std::string dt, ft;
    for (const std::string& s : dtypes_of(e->dtypes)) dt += (dt.empty() ? "" : ",") + s;
    for (const std::string& s : features_of(e->features)) ft += (ft.empty() ? "" : ",") + s;
    std::string notes = e->gpu ? "" : "host";
    if (e->max_sm > 0) notes += "sm_" + std::to_string(e->max_sm) + (e->max_sm == e->min_sm ? " only" : " at most");
    if (!e->fallback_head_dims.empty()) {
      std::string dims;
      for (int d : e->fallback_head_dims) dims += (dims.empty() ? "" : ",") + std::to_string(d);
      notes += std::string(notes.empty() ? "" : "; ") + "D " + dims + " run " + e->fallback_kernel;
    }
    if (e->uses_atomics) {
      notes += std::string(notes.empty() ? "" : "; ") + "atomics";
      notes += e->bitwise_reproducible ? " (reproducible)"
                                       : e->has_deterministic_path ? " (--deterministic: reproducible)" : " (not reproducible)";
    }
    if (e->partial_outputs)
      notes += std::string(notes.empty() ? "" : "; ") + "ring (--devices" + (e->fp32_gradients ? ", fp32 gradients" : "") +
               (e->merges_output ? ", merges into its outputs" : "") + ")";
    out += fmt::format("{:<8} {:<8} {:<4} {:<20} {:<16} {:<50} {}\n", e->kernel, mode_name(e->mode),
                       e->gpu ? std::to_string(e->min_sm) : "-", dt, dims_of(*e), ft, notes);
  }
  out += "\n";
  for (const std::string& n : Registry::kernel_names()) {
    for (const KernelMode* e : entries) {
      if (e->kernel == n) {
        out += fmt::format("  {:<8} {}\n", n, e->summary);
        break;
      }
    }
  }
  return out;
}

}  // namespace flashattn

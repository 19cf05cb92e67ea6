// What the run loop (run.cpp) says about a run before and after it: whether a kernel supports a
// problem (and why not), its NVTX range name, the notes on how far to trust its timing, and the
// minimum bytes its mode must move.
#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "device_info.h"
#include "run.h"

namespace flashattn {

namespace {

std::string join_ints(const std::vector<int>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s;
}

std::string dtype_list(uint32_t mask) {
  std::string s;
  for (int t = 0; t < kNumDTypes; ++t)
    if (mask & (1u << t)) s += (s.empty() ? "" : ",") + std::string(dtype_name(static_cast<DType>(t)));
  return s;
}

}  // namespace

std::string why_unsupported(const KernelMode& e, const Requirements& need, int sm) {
  const std::string who = "kernel '" + e.kernel + "' (" + mode_name(e.mode) + ")";
  if (!(e.dtypes & dtype_bit(need.dtype)))
    return who + " does not support dtype " + dtype_name(need.dtype) + " (supports " + dtype_list(e.dtypes) + ")";
  const int D = need.head_dim;
  if (!e.head_dims.empty()) {
    if (std::find(e.head_dims.begin(), e.head_dims.end(), D) == e.head_dims.end())
      return who + " does not support head dim " + std::to_string(D) + " (supports " + join_ints(e.head_dims) + ")";
  } else if (e.max_head_dim > 0 && D > e.max_head_dim) {
    return who + " does not support head dim " + std::to_string(D) + " (supports 1.." +
           std::to_string(e.max_head_dim) + ")";
  }
  const uint32_t missing = need.features & ~e.features;
  if (missing) {
    std::string names;
    for (int b = 0; b < kNumFeatures; ++b)
      if (missing & (1u << b)) names += (names.empty() ? "" : ", ") + std::string(feature_name(1u << b));
    return who + " does not support " + names;
  }
  const std::string gpu_why = why_gpu_unsupported(e, sm);
  return gpu_why.empty() ? "" : who + " " + gpu_why;
}

std::string why_unsupported(const KernelMode& e, const Problem& p, int sm) {
  return why_unsupported(e, Requirements{p.dtype, p.dims.D, p.required_features()}, sm);
}

std::string nvtx_name(const KernelMode& e, const Problem& p) {
  const Dims& d = p.dims;
  std::ostringstream os;
  os << e.kernel << " " << mode_name(e.mode) << " B" << d.B << " H" << d.H;
  if (d.H_kv != d.H) os << "/" << d.H_kv;
  os << " S" << d.S_q;
  if (d.S_k != d.S_q) os << "x" << d.S_k;
  os << " D" << d.D << " " << dtype_name(p.dtype);
  if (p.causal) os << " causal";
  if (p.window_left >= 0 || p.window_right >= 0) os << " window(" << p.window_left << "," << p.window_right << ")";
  if (p.has_padding) os << " seqlens_k";
  if (p.has_mask) os << " mask";
  if (p.layout == Layout::BSHD) os << " bshd";
  return os.str();
}

void add_timing_notes(RunRecord& rec) {
  const TimingStats& t = rec.timing;
  char buf[256];
  if (t.noise_rule == 0) {
    std::snprintf(buf, sizeof(buf), "noise %.2f%% above --max-noise %.2f%% after %zu samples (stopped at %s)",
                  100 * t.rel_stddev, 100 * t.max_noise, t.samples_ms.size(), t.stop_reason.c_str());
    rec.notes.push_back(buf);
  }
  if (t.clock.samples == 0) {
    const std::string why = nvml_status();
    rec.notes.push_back("SM clock not sampled: " + (why.empty() ? std::string("NVML gave no reading") : why));
  } else if (t.clock.throttled) {
    std::snprintf(buf, sizeof(buf), "throttled: SM clock %d MHz at start, %d..%d MHz during timing", t.clock.start_mhz,
                  t.clock.min_mhz, t.clock.max_mhz);
    std::string note = buf;
    const std::vector<std::string> why = slowdown_reason_names(t.clock.reasons);
    for (size_t i = 0; i < why.size(); ++i) note += (i ? ", " : "; NVML reports ") + why[i];
    rec.notes.push_back(note);
  }
}

double min_bytes_moved(const Problem& p, Mode mode, bool has_mask_input, bool has_seqlens) {
  const Dims& d = p.dims;
  const double es = double(dtype_size(p.dtype));
  const double q = double(d.B) * d.H * d.S_q * d.D * es;
  const double kv = double(d.B) * d.H_kv * d.S_k * d.D * es;
  const double lse = double(d.B) * d.H * d.S_q * (p.dtype == DType::F64 ? 8 : 4);
  double extra = has_seqlens ? 4.0 * d.B : 0.0;
  if (has_mask_input) extra += double(d.B) * d.H * d.S_q * d.S_k * 4;  // upper bound for broadcast masks
  if (mode == Mode::Forward) return q + 2 * kv + q + lse + extra;  // read Q, K, V; write O, lse
  // Backward: read Q, K, V, O, dO, lse; write dQ, dK, dV.
  return 3 * q + 2 * kv + lse + q + 2 * kv + extra;
}

}  // namespace flashattn

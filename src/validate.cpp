#include "validate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <random>
#include <set>
#include <tuple>

namespace flashattn {

ErrorStats compare_values(const std::vector<double>& got, const std::vector<double>& want, int cols,
                          double mismatch_tol) {
  ErrorStats e;
  const int64_t n = static_cast<int64_t>(std::min(got.size(), want.size()));
  double ref_max = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isfinite(want[i])) ref_max = std::max(ref_max, std::fabs(want[i]));
  }
  e.ref_max_abs = ref_max;
  const double rel_floor = std::max(1e-3 * ref_max, std::numeric_limits<double>::min());
  double sum_abs = 0, sum_sq = 0, ref_sq = 0;
  auto note = [&](int64_t i) {
    if (e.first_mismatches.size() < 5) {
      Mismatch m;
      m.index = i;
      m.row = cols > 0 ? i / cols : i;
      m.col = cols > 0 ? static_cast<int>(i % cols) : 0;
      m.got = got[i];
      m.want = want[i];
      e.first_mismatches.push_back(m);
    }
  };
  for (int64_t i = 0; i < n; ++i) {
    const double g = got[i], w = want[i];
    if (!std::isfinite(w)) {
      // Only lse has non-finite references (-inf for empty rows): demand the same value.
      if (!(g == w)) {
        ++e.nonfinite;
        note(i);
      }
      continue;
    }
    if (!std::isfinite(g)) {
      ++e.nonfinite;
      note(i);
      continue;
    }
    const double d = std::fabs(g - w);
    ++e.count;
    sum_abs += d;
    sum_sq += d * d;
    ref_sq += w * w;
    e.max_abs = std::max(e.max_abs, d);
    e.max_rel = std::max(e.max_rel, d / std::max(std::fabs(w), rel_floor));
    if (d > mismatch_tol) note(i);
  }
  if (e.count > 0) {
    e.mean_abs = sum_abs / double(e.count);
    e.mse = sum_sq / double(e.count);
    e.ref_rms = std::sqrt(ref_sq / double(e.count));
  }
  e.rel_l2 = sum_sq == 0 ? 0.0 : std::sqrt(sum_sq) / std::max(std::sqrt(ref_sq), std::numeric_limits<double>::min());
  return e;
}

RowSelection select_rows(const Dims& d, bool backward, double budget_macs, uint64_t seed) {
  RowSelection sel;
  sel.q_total = int64_t(d.B) * d.H * d.S_q;
  sel.k_total = backward ? int64_t(d.B) * d.H_kv * d.S_k : 0;
  std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ull);

  // Query rows: a forward row costs S_k * D * 2 multiply-adds; backward (dQ) about twice that.
  const double row_cost = double(d.S_k) * d.D * (backward ? 4.0 : 2.0);
  const int64_t q_budget = std::max<int64_t>(256, static_cast<int64_t>(budget_macs / std::max(row_cost, 1.0)));
  if (sel.q_total <= q_budget) {
    for (int b = 0; b < d.B; ++b)
      for (int h = 0; h < d.H; ++h)
        for (int i = 0; i < d.S_q; ++i) sel.q_rows.push_back({b, h, i});
  } else {
    std::set<std::tuple<int, int, int>> picked = {
        {0, 0, 0}, {0, 0, d.S_q - 1}, {d.B - 1, d.H - 1, 0}, {d.B - 1, d.H - 1, d.S_q - 1}};
    std::uniform_int_distribution<int64_t> any(0, sel.q_total - 1);
    while (static_cast<int64_t>(picked.size()) < q_budget) {
      const int64_t r = any(rng);
      picked.insert({int(r / (int64_t(d.H) * d.S_q)), int(r / d.S_q % d.H), int(r % d.S_q)});
    }
    for (auto& t : picked) sel.q_rows.push_back({std::get<0>(t), std::get<1>(t), std::get<2>(t)});
  }
  if (!backward) return sel;

  // Key rows: each (b, kv head) group needs a full forward over its query heads first.
  const int group = d.H / d.H_kv;
  const double group_cost = double(group) * d.S_q * d.S_k * d.D * 4.0;
  const int64_t groups_total = int64_t(d.B) * d.H_kv;
  const int64_t groups = std::clamp<int64_t>(static_cast<int64_t>(budget_macs / std::max(group_cost, 1.0)), 1,
                                             groups_total);
  std::vector<int64_t> order(groups_total);
  for (int64_t g = 0; g < groups_total; ++g) order[g] = g;
  if (groups < groups_total) std::shuffle(order.begin(), order.end(), rng);
  order.resize(groups);
  std::sort(order.begin(), order.end());
  const int max_keys_per_group = 4096;
  for (int64_t bg : order) {
    const int b = int(bg / d.H_kv), g = int(bg % d.H_kv);
    if (d.S_k <= max_keys_per_group) {
      for (int j = 0; j < d.S_k; ++j) sel.k_rows.push_back({b, g, j});
    } else {
      std::set<int> keys = {0, d.S_k - 1};
      std::uniform_int_distribution<int> any_key(0, d.S_k - 1);
      while (static_cast<int>(keys.size()) < max_keys_per_group) keys.insert(any_key(rng));
      for (int j : keys) sel.k_rows.push_back({b, g, j});
    }
  }
  return sel;
}

ReferenceRows compute_reference(const RefInputs& in, const RowSelection& sel, bool backward) {
  ReferenceRows r;
  const int D = in.dims.D;
  r.o.resize(sel.q_rows.size() * D);
  r.lse.resize(sel.q_rows.size());
  reference_forward_rows(in, sel.q_rows, r.o.data(), r.lse.data());
  if (backward) {
    r.dq.resize(sel.q_rows.size() * D);
    r.dk.resize(sel.k_rows.size() * D);
    r.dv.resize(sel.k_rows.size() * D);
    reference_backward_rows(in, sel.q_rows, r.dq.data(), sel.k_rows, r.dk.data(), r.dv.data());
  }
  return r;
}

ReferenceRows compute_baseline(const RefInputs& in, const RowSelection& sel, bool backward, DType dtype) {
  ReferenceRows r;
  const int D = in.dims.D;
  r.o.resize(sel.q_rows.size() * D);
  r.lse.resize(sel.q_rows.size());
  baseline_forward_rows(in, dtype, sel.q_rows, r.o.data(), r.lse.data());
  if (backward) {
    r.dq.resize(sel.q_rows.size() * D);
    r.dk.resize(sel.k_rows.size() * D);
    r.dv.resize(sel.k_rows.size() * D);
    baseline_backward_rows(in, dtype, sel.q_rows, r.dq.data(), sel.k_rows, r.dk.data(), r.dv.data());
  }
  return r;
}

namespace {

std::vector<double> gather(const HostArray& a, const std::vector<RowId>& rows, int heads, int seq, int D,
                           Layout layout) {
  const Strides st = layout_strides(layout, heads, seq, D);
  std::vector<double> out(rows.size() * D);
  for (size_t r = 0; r < rows.size(); ++r) {
    const int64_t base = rows[r].b * st.batch + rows[r].h * st.head + rows[r].i * st.row;
    for (int c = 0; c < D; ++c) out[r * D + c] = element_as_double(a, base + c);
  }
  return out;
}

}  // namespace

ReferenceRows gather_rows(const KernelOutputs& out, const RowSelection& sel, const Dims& d, Layout layout) {
  ReferenceRows r;
  if (out.o) r.o = gather(*out.o, sel.q_rows, d.H, d.S_q, d.D, layout);
  if (out.lse) {
    r.lse.resize(sel.q_rows.size());
    for (size_t k = 0; k < sel.q_rows.size(); ++k) {
      const RowId& q = sel.q_rows[k];
      r.lse[k] = element_as_double(*out.lse, (int64_t(q.b) * d.H + q.h) * d.S_q + q.i);
    }
  }
  if (out.dq) r.dq = gather(*out.dq, sel.q_rows, d.H, d.S_q, d.D, layout);
  if (out.dk) r.dk = gather(*out.dk, sel.k_rows, d.H_kv, d.S_k, d.D, layout);
  if (out.dv) r.dv = gather(*out.dv, sel.k_rows, d.H_kv, d.S_k, d.D, layout);
  return r;
}

std::string inject_fault_if_asked(const std::string& kernel, KernelOutputs& out) {
  const char* target = std::getenv("FLASHATTN_INJECT_FAULT");
  if (!target || kernel != target) return "";
  HostArray* a = out.o ? &*out.o : out.dq ? &*out.dq : nullptr;
  const char* name = out.o ? "O" : "dQ";
  if (!a || a->numel() == 0) return "";
  const double x = element_as_double(*a, 0) + 1.0;
  switch (a->dtype) {
    case DType::F64: a->data<double>()[0] = x; break;
    case DType::F32: a->data<float>()[0] = static_cast<float>(x); break;
    case DType::F16: a->data<uint16_t>()[0] = float_to_half_bits(static_cast<float>(x)); break;
    case DType::BF16: a->data<uint16_t>()[0] = float_to_bf16_bits(static_cast<float>(x)); break;
    default: return "";
  }
  return std::string("FLASHATTN_INJECT_FAULT: added 1.0 to element 0 of ") + name + " (test-only fault injection)";
}

std::vector<std::pair<std::string, ErrorStats>> measure_errors(const ReferenceRows& got, const ReferenceRows& want,
                                                               int D) {
  std::vector<std::pair<std::string, ErrorStats>> out;
  auto add = [&](const char* name, const std::vector<double>& g, const std::vector<double>& w, int cols) {
    if (g.empty() || w.empty()) return;
    double ref_max = 0;
    for (double x : w)
      if (std::isfinite(x)) ref_max = std::max(ref_max, std::fabs(x));
    out.emplace_back(name, compare_values(g, w, cols, 1e-3 * std::max(1.0, ref_max)));
  };
  add("O", got.o, want.o, D);
  add("lse", got.lse, want.lse, 1);
  add("dQ", got.dq, want.dq, D);
  add("dK", got.dk, want.dk, D);
  add("dV", got.dv, want.dv, D);
  return out;
}

double dtype_eps(DType t) {
  switch (t) {
    case DType::F16: return std::ldexp(1.0, -10);
    case DType::BF16: return std::ldexp(1.0, -7);
    case DType::F32: return std::ldexp(1.0, -23);
    default: return std::ldexp(1.0, -52);
  }
}

namespace {

std::string fmt_g(double x) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3g", x);
  return buf;
}

}  // namespace

CheckResult judge(const OutputErrors& errors, DType dtype, const OutputErrors* baseline) {
  CheckResult res;
  res.performed = true;
  const bool half = dtype == DType::F16 || dtype == DType::BF16;
  if (half && baseline) res.baseline = std::string("cpu-naive-") + dtype_name(dtype);
  for (const auto& [name, e] : errors) {
    OutputCheck c;
    c.name = name;
    c.err = e;
    const bool grad = name == "dQ" || name == "dK" || name == "dV";
    const ErrorStats* base = nullptr;
    if (half && baseline) {
      for (const auto& [bn, be] : *baseline)
        if (bn == name) base = &be;
    }
    if (!half) {
      const double tol = dtype == DType::F32 ? 1e-5 : 1e-12;
      const double zero_rms = dtype == DType::F32 ? 1e-6 : 1e-12;
      if (e.ref_rms < zero_rms) {
        // Zero by symmetry: relative error is undefined, hold the absolute RMS error instead.
        c.metric = "rms_abs";
        c.measured = std::sqrt(e.mse);
        c.tolerance = zero_rms;
        c.rule = "rms_abs <= " + fmt_g(zero_rms) + " (reference is zero)";
      } else {
        c.metric = "rel_l2";
        c.measured = e.rel_l2;
        c.tolerance = tol;
        c.rule = "rel_l2 <= " + fmt_g(c.tolerance);
      }
    } else if (base) {
      const double factor = grad ? 3.0 : 2.0;
      const double floor = 1e-6 * std::max(1.0, e.ref_max_abs);
      c.metric = "max_abs";
      c.measured = e.max_abs;
      c.baseline = base->max_abs;
      c.baseline_bound = name == "lse" ? kLseBaselineBound * dtype_eps(DType::F32) * std::max(1.0, base->ref_max_abs)
                                       : std::max(kBaselineBound * dtype_eps(dtype) * base->ref_max_abs, floor);
      c.baseline_passed = base->nonfinite == 0 && base->max_abs <= c.baseline_bound;
      // The cap: a baseline within its bound can widen the tolerance to factor x bound at most.
      c.tolerance = factor * std::min(base->max_abs, c.baseline_bound) + floor;
      if (c.baseline_passed) {
        c.rule = "max_abs <= " + fmt_g(factor) + " x " + res.baseline + " (" + fmt_g(base->max_abs) + ") + " + fmt_g(floor);
      } else {
        c.rule = "baseline out of bounds: " + res.baseline + " max_abs " + fmt_g(base->max_abs) +
                 (base->nonfinite ? " with " + std::to_string(base->nonfinite) + " non-finite" : "") + " > bound " +
                 fmt_g(c.baseline_bound) + " vs fp64; no tolerance derived from it";
      }
    } else {
      // No same-dtype baseline: the sanity bound on relative error, and the rule says so.
      c.metric = "rel_l2";
      c.measured = e.rel_l2;
      c.tolerance = 4 * dtype_eps(dtype);
      c.rule = "rel_l2 <= 4 eps(" + std::string(dtype_name(dtype)) + ") (no same-dtype baseline)";
    }
    c.passed = c.baseline_passed && e.nonfinite == 0 && c.measured <= c.tolerance;
    res.passed = res.passed && c.passed;
    res.outputs.push_back(c);
  }
  return res;
}

}  // namespace flashattn

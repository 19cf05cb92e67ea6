#include "validate.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
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

namespace {

double dtype_eps(DType t) {
  switch (t) {
    case DType::F16: return std::ldexp(1.0, -10);
    case DType::BF16: return std::ldexp(1.0, -7);
    case DType::F32: return std::ldexp(1.0, -23);
    default: return std::ldexp(1.0, -52);
  }
}

std::string fmt_g(double x) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3g", x);
  return buf;
}

}  // namespace

CheckResult judge(const std::vector<std::pair<std::string, ErrorStats>>& errors, DType dtype, bool is_baseline,
                  const std::vector<std::pair<std::string, ErrorStats>>* baseline) {
  CheckResult res;
  res.performed = true;
  for (const auto& [name, e] : errors) {
    OutputCheck c;
    c.name = name;
    c.err = e;
    const bool grad = name == "dQ" || name == "dK" || name == "dV";
    if (dtype == DType::F32 || dtype == DType::F64) {
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
    } else if (is_baseline) {
      c.metric = "rel_l2";
      c.measured = e.rel_l2;
      c.tolerance = 4 * dtype_eps(dtype);
      c.rule = "rel_l2 <= 4 eps(" + std::string(dtype_name(dtype)) + ") = " + fmt_g(c.tolerance);
    } else {
      const ErrorStats* base = nullptr;
      if (baseline) {
        for (const auto& [bn, be] : *baseline)
          if (bn == name) base = &be;
      }
      const double factor = grad ? 3.0 : 2.0;
      const double floor = 1e-6 * std::max(1.0, e.ref_max_abs);
      c.metric = "max_abs";
      c.measured = e.max_abs;
      if (base) {
        c.baseline = base->max_abs;
        c.tolerance = factor * base->max_abs + floor;
        c.rule = "max_abs <= " + fmt_g(factor) + " x naive (" + fmt_g(base->max_abs) + ") + " + fmt_g(floor);
      } else {
        // No same-dtype baseline available: fall back to the sanity bound on relative error.
        c.metric = "rel_l2";
        c.measured = e.rel_l2;
        c.tolerance = 4 * dtype_eps(dtype);
        c.rule = "rel_l2 <= 4 eps(" + std::string(dtype_name(dtype)) + ") (no naive baseline)";
      }
    }
    c.passed = e.nonfinite == 0 && c.measured <= c.tolerance;
    res.passed = res.passed && c.passed;
    res.outputs.push_back(c);
  }
  return res;
}

}  // namespace flashattn

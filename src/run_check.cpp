#include "run_check.h"

#include "dataset.h"
#include "nvtx.h"
#include "parallel.h"
#include "run.h"

namespace flashattn {

namespace {

// A tensor in fp64, [B, H, S, D]: a (batch, head) per task, on every core (a long sequence's
// tensors are 10^8 elements and more).
std::vector<double> to_bhsd(const HostArray& a, const Dims& dims, Layout layout, int H, int S, int threads) {
  const int D = dims.D;
  std::vector<double> out(size_t(dims.B) * H * S * D);
  const Strides st = layout_strides(layout, H, S, D);
  const int64_t tasks = int64_t(dims.B) * H;
  parallel_tasks(tasks, parallel_workers(threads, tasks, double(out.size())), [] { return 0; }, [&](int64_t t, int) {
    const int b = static_cast<int>(t / H), h = static_cast<int>(t % H);
    double* dst = out.data() + size_t(t) * S * D;
    for (int i = 0; i < S; ++i)
      for (int c = 0; c < D; ++c) *dst++ = element_as_double(a, b * st.batch + h * st.head + i * st.row + c);
  });
  return out;
}

// The entry of mode m in one of the cache's maps, made by make() on first use.
template <class Map, class Make>
const typename Map::mapped_type& cached(Map& map, Mode m, Make make) {
  const int key = static_cast<int>(m);
  auto it = map.find(key);
  if (it == map.end()) it = map.emplace(key, make()).first;
  return it->second;
}

}  // namespace

RefInputs CheckCache::ref_inputs(bool backward, const RunInputs& in, const SessionOptions& opt) {
  const Problem& p = in.problem;
  const Dims& d = p.dims;
  if (ref_q.empty()) {
    ref_q = to_bhsd(in.q, d, p.layout, d.H, d.S_q, opt.cpu_threads);
    ref_k = to_bhsd(in.k, d, p.layout, d.H_kv, d.S_k, opt.cpu_threads);
    ref_v = to_bhsd(in.v, d, p.layout, d.H_kv, d.S_k, opt.cpu_threads);
  }
  if (backward && ref_do.empty()) ref_do = to_bhsd(*in.dout, d, p.layout, d.H, d.S_q, opt.cpu_threads);
  RefInputs r;
  r.dims = d;
  r.scale = p.scale;
  r.causal = p.causal;
  r.window_left = p.window_left;
  r.window_right = p.window_right;
  r.q = ref_q.data(), r.k = ref_k.data(), r.v = ref_v.data();
  r.dout = backward ? ref_do.data() : nullptr;
  r.seqlens_k = in.seqlens_k ? in.seqlens_k->data<int32_t>() : nullptr;
  if (in.mask) r.mask = mask_view(in.mask->shape, d, in.mask->data<float>(), "mask");
  r.threads = opt.cpu_threads;
  return r;
}

const RowSelection& CheckCache::rows_for(Mode m, const RunInputs& in, const SessionOptions& opt) {
  return cached(selection, m, [&] {
    return select_rows(in.problem.dims, m == Mode::Backward, opt.check_budget_macs, opt.seed);
  });
}

const ReferenceRows& CheckCache::reference_for(Mode m, const RunInputs& in, const SessionOptions& opt) {
  return cached(reference, m, [&] {
    const bool bwd = m == Mode::Backward;
    return compute_reference(ref_inputs(bwd, in, opt), rows_for(m, in, opt), bwd);
  });
}

// Errors of the same-dtype baseline (fp16/bf16) against the reference, on the same rows.
const OutputErrors& CheckCache::baseline_for(Mode m, const RunInputs& in, const SessionOptions& opt) {
  return cached(baseline, m, [&] {
    const bool bwd = m == Mode::Backward;
    NvtxRange range("same-dtype baseline");
    const ReferenceRows rows = compute_baseline(ref_inputs(bwd, in, opt), rows_for(m, in, opt), bwd, in.problem.dtype);
    return measure_errors(rows, reference_for(m, in, opt), in.problem.dims.D);
  });
}

CheckResult CheckCache::check(const KernelOutputs& out, Mode m, const RunInputs& in, const SessionOptions& opt) {
  const DType t = in.problem.dtype;
  const RowSelection& sel = rows_for(m, in, opt);
  const auto errs = measure_errors(gather_rows(out, sel, in.problem.dims, in.problem.layout),
                                   reference_for(m, in, opt), in.problem.dims.D);
  const bool half = t == DType::F16 || t == DType::BF16;
  CheckResult c = judge(errs, t, half ? &baseline_for(m, in, opt) : nullptr);
  c.rows_checked = static_cast<int64_t>(sel.q_rows.size());
  c.rows_total = sel.q_total;
  c.key_rows_checked = static_cast<int64_t>(sel.k_rows.size());
  c.key_rows_total = sel.k_total;
  return c;
}

}  // namespace flashattn

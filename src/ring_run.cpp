// The ring's host-side rules and records (ring.h): whether a kernel and a problem can run as a
// ring, how its outputs compare with the same kernel on one GPU, and its line on the console;
// and the Session's ring runs (run_impl.h): the ring timed and profiled, the one-GPU runs beside
// it, the record.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "parallel.h"
#include "ring.h"
#include "run_impl.h"
#include "validate.h"

namespace flashattn {

std::string why_ring_unsupported(const KernelMode& e, const Problem& p, int n_devices) {
  if (n_devices < 2) return "--devices: a ring needs at least two GPUs";
  if (!e.gpu) return "kernel '" + e.kernel + "' runs on the host: a ring runs GPU kernels";
  if (!e.partial_outputs)
    return "kernel '" + e.kernel + "' does not declare partial outputs (O and lse of a block, and a backward "
           "against given O and lse), which a ring merges";
  if (p.dims.S_q != p.dims.S_k)
    return "a ring shards one sequence for queries and keys: S_q (" + std::to_string(p.dims.S_q) +
           ") must equal S_k (" + std::to_string(p.dims.S_k) + ")";
  if (p.has_mask) return "a ring does not carry an additive mask";
  if (p.window_left >= 0 || p.window_right >= 0) return "a ring does not carry a window (causal is supported)";
  return "";
}

namespace {

// One unit in the last place of |x| in `t`: the dtype's epsilon scaled to x's binade; 0 for 0.
double ulp_in(DType t, double x) {
  if (x == 0 || !std::isfinite(x)) return 0;
  int e = 0;
  std::frexp(x, &e);  // |x| = m * 2^e, m in [0.5, 1): the binade starts at 2^(e - 1)
  return std::ldexp(dtype_eps(t), e - 1);
}

}  // namespace

void compare_ring_outputs(const KernelOutputs& a, const KernelOutputs& b, RingRecord* info) {
  bool same = true;
  auto one = [&](const char* name, const std::optional<HostArray>& x, const std::optional<HostArray>& y) {
    if (!x || !y) return;
    same = same && x->bytes == y->bytes;
    RingRecord::VsOneGpu d;
    d.name = name;
    // Chunks of a fixed size on every core (a long ring's outputs are 10^8 elements and more),
    // their sums added in chunk order: the same result for any thread count.
    constexpr int64_t kChunk = int64_t(1) << 20;
    const int64_t n = x->numel(), chunks = (n + kChunk - 1) / kChunk;
    struct Part {
      double max_abs = 0, beyond_ulp = 0, diff2 = 0, ref2 = 0;
    };
    std::vector<Part> parts(chunks);
    parallel_tasks(chunks, parallel_workers(0, chunks, double(n)), [] { return 0; }, [&](int64_t c, int) {
      Part& p = parts[c];
      for (int64_t i = c * kChunk; i < std::min(n, (c + 1) * kChunk); ++i) {
        const double u = element_as_double(*x, i), v = element_as_double(*y, i);
        if (std::isfinite(v)) p.ref2 += v * v;
        if (u == v) continue;  // equal infinities (an empty row's lse) included
        const double e = std::isfinite(u - v) ? std::fabs(u - v) : std::numeric_limits<double>::infinity();
        p.max_abs = std::max(p.max_abs, e);
        p.beyond_ulp = std::max(p.beyond_ulp, e - ulp_in(x->dtype, std::max(std::fabs(u), std::fabs(v))));
        p.diff2 += e * e;
      }
    });
    double diff2 = 0, ref2 = 0;
    for (const Part& p : parts) {
      d.max_abs = std::max(d.max_abs, p.max_abs);
      d.beyond_ulp = std::max(d.beyond_ulp, p.beyond_ulp);
      diff2 += p.diff2, ref2 += p.ref2;
    }
    d.rel_l2 = ref2 > 0 ? std::sqrt(diff2 / ref2) : (diff2 > 0 ? std::numeric_limits<double>::infinity() : 0.0);
    info->vs_one_gpu.push_back(d);
  };
  one("O", a.o, b.o), one("lse", a.lse, b.lse), one("dQ", a.dq, b.dq), one("dK", a.dk, b.dk), one("dV", a.dv, b.dv);
  info->bitwise_vs_one_gpu = same;
}

// --check on a ring: each output against the one-GPU run as well, with the one-GPU output in the
// reference's place, held to twice the check's tolerance for that output: relative L2 (fp32), or
// max abs (fp16, bf16) beyond one unit in the last place of the output's dtype. Twice, because
// each run is held to the tolerance against the truth, so two correct runs may part by twice it:
// the ring's blocks may run the kernel in other tiles than the whole problem does (`hopper`'s
// forward takes 192-row tiles under a causal mask from 32768 rows, so a 32k ring's 16k shards run
// 128-row ones), and the backward's D_i = dO·O then meets another rounding of O (a 32k causal
// ring's dQ parts from the one-GPU run's by 0.00244 beyond an ulp, and a 64k ring with a shard of
// 32640 rows by the same against a tolerance of 0.00235). Beyond one ulp: where the two
// runs' fp32 sums straddle a rounding boundary, the final rounding parts them by one ulp, which no
// tolerance on the error against fp64 (about half an ulp of the largest outputs) is meant to
// absorb. A ring that misses or repeats a block parts from the one-GPU run by far more.
void judge_ring_vs_one_gpu(RunRecord& rec) {
  if (!rec.ring || !rec.check.performed) return;
  for (RingRecord::VsOneGpu& d : rec.ring->vs_one_gpu) {
    for (const OutputCheck& o : rec.check.outputs) {
      if (o.name != d.name) continue;
      d.metric = o.metric == "rel_l2" ? "rel_l2" : "max_abs_beyond_1ulp";
      d.measured = o.metric == "rel_l2" ? d.rel_l2 : d.beyond_ulp;
      d.tolerance = 2 * o.tolerance;
      d.passed = d.measured <= d.tolerance;
      if (!d.passed) {
        rec.check.passed = false;
        char buf[200];
        std::snprintf(buf, sizeof buf, "ring vs one GPU: %s %s %.3g > tolerance %.3g", d.name.c_str(),
                      d.metric.c_str(), d.measured, d.tolerance);
        rec.notes.push_back(buf);
      }
    }
  }
}

// The console's line for a ring run: per-GPU throughput, what the transfers cost, the scaling.
std::string ring_note(const RingRecord& g, double median_ms) {
  std::string ids, tf;
  for (size_t i = 0; i < g.devices.size(); ++i) {
    ids += (i ? "," : "") + std::to_string(g.devices[i]);
    char b[32];
    std::snprintf(b, sizeof b, "%s%.0f", i ? ", " : "", i < g.tflops_per_gpu.size() ? g.tflops_per_gpu[i] : 0.0);
    tf += b;
  }
  std::string how = g.gradients.empty() ? "" : ", " + g.gradients + " gradients";
  if (g.side_stream) how += g.side_after_first_shard ? ", own block on a second stream after the first shard" : ", own block on a second stream";
  if (g.last_block_alone) how += g.last_block_merges ? ", last block alone, merging in its kernel" : ", last block alone";
  if (!g.registered_buffers) how += ", unregistered buffers";
  if (g.copy_engine) how += ", copy-engine transfers";
  if (g.lend_rank >= 0 || g.lend_auto) {
    char lent[128];
    if (g.lend_rank >= 0)
      std::snprintf(lent, sizeof lent, ", rank %d lending %g kv heads", g.lend_rank, g.lend_kv_heads);
    else
      std::snprintf(lent, sizeof lent, ", no lending");
    how += lent;
    if (g.lend_auto) {
      std::snprintf(lent, sizeof lent, " (auto: blocks ended %.3f ms apart)", g.lend_lag_ms);
      how += lent;
    }
  }
  char buf[400];
  std::string who = "ring over GPUs " + ids;
  if (g.rank >= 0) who = "ring of " + std::to_string(g.size) + " processes (rank " + std::to_string(g.rank) + " on GPU " + ids + ")";
  if (g.loopback)
    who = "ring of " + std::to_string(g.size) + " ranks on GPU " + std::to_string(g.devices.empty() ? 0 : g.devices[0]) +
          " alone (transfers by copies on it: its times are not a ring's)";
  std::snprintf(buf, sizeof buf, "%s (zig-zag%s): TFLOP/s per GPU %s; transfers not hidden %.3f ms of %.3f, link %.0f GB/s",
                who.c_str(), how.c_str(), tf.c_str(), g.exposed_comm_ms, g.profiled_ms, g.link_gbps);
  std::string s = buf;
  if (g.one_gpu_median_ms > 0) {
    std::snprintf(buf, sizeof buf, "; one GPU %.4g ms, scaling efficiency %.3f (%.4g / (%d x %.4g))", g.one_gpu_median_ms,
                  g.scaling_efficiency, g.one_gpu_median_ms, g.size, median_ms);
    s += buf;
  } else if (!g.one_gpu_skipped.empty()) {
    s += "; one GPU not run: " + g.one_gpu_skipped;
  }
  if (g.scaling_efficiency_cards > 0) {
    std::string each;
    for (const RingRecord::CardTime& c : g.one_gpu_per_rank) {
      std::snprintf(buf, sizeof buf, "%s%.4g", each.empty() ? "" : " / ", c.median_ms);
      each += buf;
    }
    std::snprintf(buf, sizeof buf, "; each rank's card alone %s ms, scaling efficiency %.3f against their combined rate",
                  each.c_str(), g.scaling_efficiency_cards);
    s += buf;
  }
  if (g.max_abs_vs_one_gpu() >= 0) {
    std::snprintf(buf, sizeof buf, "; outputs vs one GPU: %s (max abs %.3g)",
                  g.bitwise_vs_one_gpu ? "bitwise identical" : "differ", g.max_abs_vs_one_gpu());
    s += buf;
  }
  return s;
}

// ---- the Session's ring runs ---------------------------------------------------------------------

Session::Impl::GpuRun Session::Impl::run_ring(const KernelMode& e, RingRecord* info) {
  if (!ring)
    ring = opt.ring_process.size > 1 ? std::make_unique<Ring>(opt.device, opt.ring_process)
                                     : std::make_unique<Ring>(opt.devices);
  if (generated()) ensure_uploaded(e.kernel);  // made on the first GPU (fast), then downloaded once
  ensure_host_inputs();
  ring->prepare(e, in, opt.deterministic);
  ring->poison_outputs();
  CUDA_CHECK(cudaSetDevice(opt.device));
  {
    NvtxRange range("check");
    ring->enqueue(stream, false);
    CUDA_CHECK(cudaStreamSynchronize(stream));
  }
  GpuRun r;
  r.out = ring->gather();
  CUDA_CHECK(cudaSetDevice(opt.device));
  // Ranks in other processes must run the same repetitions (every one is a set of NCCL
  // transfers between them): a fixed count, no noise or time rule.
  TimingOptions timing = opt.timing;
  if (opt.ring_process.size > 1) timing.max_noise = 0, timing.min_time_ms = 0;
  r.timing = timed_run([&] { ring->enqueue(stream, opt.timing.flush_l2); }, r, &timing);
  r.mem.peak_bytes = ring->bytes_per_device();
  info->devices = ring->devices();
  info->size = ring->size();
  info->side_stream = ring->side_stream();
  info->side_after_first_shard = ring->side_after_first_shard();
  info->last_block_alone = ring->last_block_alone();
  info->registered_buffers = ring->registered_buffers();
  info->copy_engine = ring->copy_engine();
  info->loopback = ring->loopback();
  info->lend_rank = ring->lend_rank();
  info->lend_kv_heads = ring->lend_kv_heads();
  info->lend_auto = ring->lend_auto();
  info->lend_lag_ms = ring->lend_lag_ms();
  info->last_block_merges = ring->last_block_merges();
  if (e.mode == Mode::Backward) info->gradients = ring->fp32_gradients() ? "fp32" : "partial";
  if (opt.ring_process.size > 1) info->rank = opt.ring_process.rank;
  const RingProfile prof = ring->profile(stream);
  CUDA_CHECK(cudaSetDevice(opt.device));
  info->profiled_ms = prof.total_ms;
  info->waiting_ms = prof.waiting_ms;
  info->blocks_ms = prof.blocks_ms;
  info->block_spans = prof.block_spans;
  info->exposed_comm_ms = prof.exposed_comm_ms;
  info->link_gbps = prof.link_gbps;
  for (double f : ring->flops_per_device())
    info->tflops_per_gpu.push_back(r.timing.median_ms > 0 ? f / (r.timing.median_ms * 1e-3) / 1e12 : 0);
  ring_one_gpu_runs(e, r.out, info);
  return r;
}

void Session::Impl::ring_one_gpu_runs(const KernelMode& e, const KernelOutputs& ring_out, RingRecord* info) {
  RingRecord::CardTime first(0, opt.device);
  if (ring->root()) {
    try {
      GpuRun one = run_gpu(e, /*timed=*/true);
      info->one_gpu_median_ms = first.median_ms = one.timing.median_ms;
      info->one_gpu_clock_mean_mhz = first.clock_mean_mhz = one.timing.clock.mean_mhz;
      compare_ring_outputs(ring_out, one.out, info);
    } catch (const InputError& x) {
      info->one_gpu_skipped = first.skipped = x.what();
    }
  }
  if (!opt.ring_baseline_each) return;
  const int n = ring->size();
  if (opt.ring_process.size > 1) {
    const int me = opt.ring_process.rank;
    RingRecord::CardTime mine = me == 0 ? first : RingRecord::CardTime(me, opt.device);
    std::vector<double> all;
    for (int turn = 0; turn < n; ++turn) {  // each share() waits for every rank: one GPU at a time
      if (turn == me && me != 0) mine = time_alone(e, this);
      all = ring->share({double(opt.device), mine.median_ms, mine.clock_mean_mhz});
    }
    for (int r = 0; r < n; ++r) {
      RingRecord::CardTime c(r, int(all[3 * r]), all[3 * r + 1], all[3 * r + 2]);
      if (r == me) c.skipped = mine.skipped;
      else if (!(c.median_ms > 0)) c.skipped = "rank " + std::to_string(r) + " could not run it (its own record says why)";
      info->one_gpu_per_rank.push_back(c);
    }
    return;
  }
  // One process: each card once, however many ranks it plays (`--devices 0,0`: one).
  std::vector<RingRecord::CardTime> cards{first};
  for (int r = 0; r < n; ++r) {
    const int dev = ring->devices()[r];
    auto it = std::find_if(cards.begin(), cards.end(), [&](const RingRecord::CardTime& c) { return c.device == dev; });
    if (it == cards.end()) {
      SessionOptions o = opt;
      o.device = dev, o.devices.clear(), o.ring_process = {}, o.check = false;
      Session other(inputs_for_another_card(), o);
      cards.push_back(time_alone(e, other.impl_.get()));
      it = cards.end() - 1;
    }
    RingRecord::CardTime c = *it;
    c.rank = r, c.device = dev;
    info->one_gpu_per_rank.push_back(c);
  }
  CUDA_CHECK(cudaSetDevice(opt.device));
}

RingRecord::CardTime Session::Impl::time_alone(const KernelMode& e, Impl* s) {
  RingRecord::CardTime c(0, s->opt.device);
  try {
    const GpuRun one = s->run_gpu(e, /*timed=*/true);
    c.median_ms = one.timing.median_ms, c.clock_mean_mhz = one.timing.clock.mean_mhz;
  } catch (const InputError& x) {
    c.skipped = x.what();
  }
  return c;
}

RunInputs Session::Impl::inputs_for_another_card() const {
  return generated() ? generated_inputs(in.problem, *in.generate_seed) : in;
}

void Session::Impl::run_on_ring(const KernelMode& e, RunRecord& rec) {
  const Problem& p = in.problem;
  const std::string why_ring = why_ring_unsupported(e, p, ring_size());
  if (!why_ring.empty()) throw InputError(why_ring);
  NvtxRange range("ring " + nvtx_name(e, p));
  RingRecord info;
  GpuRun r = run_ring(e, &info);
  rec.outputs = std::move(r.out);
  rec.timing = std::move(r.timing);
  rec.memory = r.mem;
  rec.sm_clock_start_mhz = r.clock_start;
  rec.sm_clock_end_mhz = r.clock_end;
  if (info.one_gpu_median_ms > 0 && rec.timing.median_ms > 0)
    info.scaling_efficiency = info.one_gpu_median_ms / (double(info.size) * rec.timing.median_ms);
  if (int(info.one_gpu_per_rank.size()) == info.size) {
    std::vector<double> per_rank;
    for (const RingRecord::CardTime& c : info.one_gpu_per_rank) per_rank.push_back(c.median_ms);
    info.scaling_efficiency_cards = ring_cards_efficiency(per_rank, rec.timing.median_ms);
  }
  rec.notes.push_back(ring_note(info, rec.timing.median_ms));
  rec.ring = std::move(info);
  add_timing_notes(rec);
}

}  // namespace flashattn

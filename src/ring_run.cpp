// The ring's host-side rules and records (ring.h): whether a kernel and a problem can run as a
// ring, how its outputs compare with the same kernel on one GPU, and its line on the console.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "parallel.h"
#include "ring.h"
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

}  // namespace flashattn

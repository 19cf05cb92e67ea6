#include "report.h"

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <ctime>
#include <thread>

#include "version.h"

namespace flashattn {

using nlohmann::json;

std::string iso8601_now() {
  const std::time_t t = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[32];
  std::strftime(buf, sizeof(buf), "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

namespace {

// NaN/inf are not JSON: they become null.
json num(double x) { return std::isfinite(x) ? json(x) : json(nullptr); }
json opt_int(int x) { return x >= 0 ? json(x) : json(nullptr); }

std::string version_str(int v) { return v > 0 ? fmt::format("{}.{}", v / 1000, (v % 1000) / 10) : ""; }

json error_json(const ErrorStats& e) {
  json j = {{"count", e.count},     {"max_abs", num(e.max_abs)}, {"mean_abs", num(e.mean_abs)},
            {"mse", num(e.mse)},    {"max_rel", num(e.max_rel)}, {"rel_l2", num(e.rel_l2)},
            {"ref_max_abs", num(e.ref_max_abs)}, {"ref_rms", num(e.ref_rms)}, {"nonfinite", e.nonfinite}};
  json mm = json::array();
  for (const Mismatch& m : e.first_mismatches)
    mm.push_back({{"row", m.row}, {"col", m.col}, {"got", num(m.got)}, {"want", num(m.want)}});
  j["first_mismatches"] = mm;
  return j;
}

}  // namespace

json timing_json(const TimingStats& t, int clock_start_mhz, int clock_end_mhz) {
  json samples = json::array();
  for (double s : t.samples_ms) samples.push_back(num(s));
  const ClockStats& c = t.clock;
  const bool sampled = c.samples > 0;
  const char* method = !t.device_events ? "host_clock" : t.held ? kHeldStreamMethod : "events";
  return {{"unit", "ms"},
          {"clock", t.device_events ? "cuda_events" : "host_steady_clock"},
          {"method", method},
          {"hold_timeouts", t.hold_timeouts},
          {"batches_rerun", t.batches_rerun},
          {"mode", t.l2_flush ? "cold" : "hot"},
          {"flush_method", t.l2_flush ? json(L2Flusher::kMethod) : json(nullptr)},
          {"warmup", t.warmup},
          {"repeat", static_cast<int>(t.samples_ms.size())},
          {"min_samples", t.min_samples},
          {"l2_flush", t.l2_flush},
          {"median_ms", num(t.median_ms)},
          {"min_ms", num(t.min_ms)},
          {"max_ms", num(t.max_ms)},
          {"mean_ms", num(t.mean_ms)},
          {"rel_stddev", num(t.rel_stddev)},
          {"noise", num(t.rel_stddev)},
          {"max_noise", t.max_noise > 0 ? num(t.max_noise) : json(nullptr)},
          {"max_time_s", t.max_noise > 0 ? num(t.max_time_s) : json(nullptr)},
          {"noise_rule_met", t.noise_rule < 0 ? json(nullptr) : json(t.noise_rule == 1)},
          {"stop_reason", t.stop_reason},
          {"wall_s", num(t.wall_s)},
          {"samples_ms", samples},
          {"sm_clock_start_mhz", opt_int(clock_start_mhz)},
          {"sm_clock_end_mhz", opt_int(clock_end_mhz)},
          {"sm_clock_samples", c.samples},
          {"sm_clock_min_mhz", sampled ? json(c.min_mhz) : json(nullptr)},
          {"sm_clock_max_mhz", sampled ? json(c.max_mhz) : json(nullptr)},
          {"sm_clock_mean_mhz", sampled ? num(c.mean_mhz) : json(nullptr)},
          {"throttled", sampled || c.reasons ? json(c.throttled) : json(nullptr)},
          {"throttle_reasons", slowdown_reason_names(c.reasons)}};
}

json check_json(const CheckResult& c) {
  if (!c.performed) return c.note.empty() ? json(nullptr) : json{{"performed", false}, {"note", c.note}};
  json outs = json::object();
  for (const OutputCheck& o : c.outputs) {
    json j = error_json(o.err);
    j["rule"] = o.rule;
    j["metric"] = o.metric;
    j["measured"] = num(o.measured);
    j["tolerance"] = num(o.tolerance);
    j["baseline"] = o.baseline >= 0 ? num(o.baseline) : json(nullptr);
    j["baseline_bound"] = o.baseline_bound >= 0 ? num(o.baseline_bound) : json(nullptr);
    j["baseline_passed"] = o.baseline >= 0 ? json(o.baseline_passed) : json(nullptr);
    j["passed"] = o.passed;
    outs[o.name] = j;
  }
  return {{"performed", true},
          {"passed", c.passed},
          {"reference", c.reference},
          {"baseline", c.baseline.empty() ? json(nullptr) : json(c.baseline)},
          {"rows_checked", c.rows_checked},
          {"rows_total", c.rows_total},
          {"key_rows_checked", c.key_rows_checked},
          {"key_rows_total", c.key_rows_total},
          {"seconds", c.seconds >= 0 ? num(c.seconds) : json(nullptr)},
          {"outputs", outs}};
}

json device_json(const DeviceInfo* d, const std::string& no_device_reason, int clock_start, int clock_end) {
  if (!d) return {{"present", false}, {"reason", no_device_reason}};
  return {{"present", true},
          {"index", d->index},
          {"name", d->name},
          {"pci_bus_id", d->pci_bus_id},
          {"sm_count", d->sm_count},
          {"compute_capability", fmt::format("{}.{}", d->cc_major, d->cc_minor)},
          {"memory_bytes", d->memory_bytes},
          {"l2_bytes", d->l2_bytes},
          {"smem_per_block_optin", d->smem_per_block_optin},
          {"sm_clock_max_mhz", d->max_sm_clock_mhz},
          {"mem_clock_max_mhz", d->max_mem_clock_mhz},
          {"sm_clock_start_mhz", opt_int(clock_start)},
          {"sm_clock_end_mhz", opt_int(clock_end)},
          {"driver_version", version_str(d->driver_version)},
          {"runtime_version", version_str(d->runtime_version)},
          {"peak", {{"fp32_tflops", num(d->peak_fp32_tflops)},
                    {"tensor_fp16_bf16_tflops", num(d->peak_tensor_tflops)},
                    {"dram_gbps", num(d->peak_dram_gbps)}}}};
}

json run_json(const ReportHeader& h, const RunRecord& r) {
  const Problem& p = h.problem;
  json j = {{"kernel", r.kernel},
            {"mode", mode_name(r.mode)},
            {"status", status_name(r.status)},
            {"reason", r.reason},
            {"gpu", r.gpu},
            {"shape", {{"B", p.dims.B}, {"H", p.dims.H}, {"H_kv", p.dims.H_kv}, {"S_q", p.dims.S_q},
                       {"S_k", p.dims.S_k}, {"D", p.dims.D}}},
            {"dtype", dtype_name(r.dtype ? *r.dtype : p.dtype)},
            {"layout", layout_name(p.layout)},
            {"flags", {{"causal", p.causal},
                       {"window_left", p.window_left},
                       {"window_right", p.window_right},
                       {"scale", p.scale},
                       {"seqlens_k", h.has_seqlens},
                       {"mask", h.has_mask}}}};
  if (!r.ok()) return j;
  j["timing"] = timing_json(r.timing, r.sm_clock_start_mhz, r.sm_clock_end_mhz);
  j["throughput"] = {{"flops", num(r.flops)},
                     {"tflops", num(r.tflops)},
                     {"bytes", num(r.bytes)},
                     {"gbps", num(r.gbps)},
                     {"peak_fraction", r.peak_fraction >= 0 ? num(r.peak_fraction) : json(nullptr)}};
  j["memory"] = {{"inputs_bytes", r.memory.inputs_bytes},
                 {"outputs_bytes", r.memory.outputs_bytes},
                 {"workspace_bytes", r.memory.workspace_bytes},
                 {"extra_bytes", r.memory.extra_bytes},
                 {"peak_bytes", r.memory.peak_bytes},
                 {"device_used_bytes", r.memory.device_used_bytes >= 0 ? json(r.memory.device_used_bytes)
                                                                         : json(nullptr)}};
  j["check"] = check_json(r.check);
  if (r.ring) {
    const RingRecord& g = *r.ring;
    auto opt_num = [](double x) { return x >= 0 ? num(x) : json(nullptr); };
    json per_gpu = json::array();
    for (size_t i = 0; i < g.devices.size(); ++i) {
      json blocks = json::array();
      if (i < g.block_spans.size())
        for (const RingRecord::BlockSpan& b : g.block_spans[i])
          blocks.push_back({{"step", b.step}, {"src", b.src}, {"stream", b.side ? "side" : "compute"},
                            {"lent", b.lent}, {"causal", b.causal}, {"q_rows", b.q_rows}, {"k_rows", b.k_rows},
                            {"begin_ms", num(b.begin_ms)}, {"end_ms", num(b.end_ms)}});
      per_gpu.push_back({{"device", g.devices[i]},
                         {"tflops", i < g.tflops_per_gpu.size() ? num(g.tflops_per_gpu[i]) : json(nullptr)},
                         {"waiting_ms", i < g.waiting_ms.size() ? num(g.waiting_ms[i]) : json(nullptr)},
                         {"blocks_ms", i < g.blocks_ms.size() ? num(g.blocks_ms[i]) : json(nullptr)},
                         {"blocks", blocks}});
    }
    json cards = json::array();
    for (const RingRecord::CardTime& c : g.one_gpu_per_rank)
      cards.push_back({{"rank", c.rank}, {"device", c.device}, {"median_ms", opt_num(c.median_ms)},
                       {"sm_clock_mean_mhz", opt_num(c.clock_mean_mhz)},
                       {"skipped", c.skipped.empty() ? json(nullptr) : json(c.skipped)}});
    json vs = json::array();
    for (const RingRecord::VsOneGpu& d : g.vs_one_gpu)
      vs.push_back({{"name", d.name}, {"max_abs", num(d.max_abs)}, {"rel_l2", num(d.rel_l2)},
                    {"metric", d.metric.empty() ? json(nullptr) : json(d.metric)},
                    {"measured", d.metric.empty() ? json(nullptr) : num(d.measured)},
                    {"tolerance", d.metric.empty() ? json(nullptr) : num(d.tolerance)}, {"passed", d.passed}});
    j["ring"] = {{"size", g.size},
                 {"rank", g.rank >= 0 ? json(g.rank) : json(nullptr)},
                 {"devices", g.devices},
                 {"sharding", "zig-zag"},
                 {"gradients", g.gradients.empty() ? json(nullptr) : json(g.gradients)},
                 {"side_stream", g.side_stream},
                 {"side_after_first_shard", g.side_after_first_shard},
                 {"last_block_alone", g.last_block_alone},
                 {"last_block_merges", g.last_block_merges},
                 {"registered_buffers", g.registered_buffers},
                 {"copy_engine", g.copy_engine},
                 {"loopback", g.loopback},
                 {"lend", g.lend_rank >= 0 || g.lend_auto
                              ? json{{"rank", g.lend_rank >= 0 ? json(g.lend_rank) : json(nullptr)},
                                     {"kv_heads", g.lend_kv_heads},
                                     {"auto", g.lend_auto},
                                     {"lag_ms", g.lend_auto ? num(g.lend_lag_ms) : json(nullptr)}}
                              : json(nullptr)},
                 {"per_gpu", per_gpu},
                 {"profiled_ms", num(g.profiled_ms)},
                 {"exposed_comm_ms", num(g.exposed_comm_ms)},
                 {"link_gbps", num(g.link_gbps)},
                 {"one_gpu_median_ms", opt_num(g.one_gpu_median_ms)},
                 {"one_gpu_sm_clock_mean_mhz", opt_num(g.one_gpu_clock_mean_mhz)},
                 {"one_gpu_skipped", g.one_gpu_skipped},
                 {"scaling_efficiency", opt_num(g.scaling_efficiency)},
                 {"one_gpu_per_rank", cards},
                 {"scaling_efficiency_cards", opt_num(g.scaling_efficiency_cards)},
                 {"max_abs_vs_one_gpu", opt_num(g.max_abs_vs_one_gpu())},
                 {"vs_one_gpu", vs},
                 {"bitwise_vs_one_gpu", g.bitwise_vs_one_gpu}};
  }
  j["notes"] = r.notes;
  return j;
}

json session_json(const ReportHeader& h, const std::vector<RunRecord>& runs) {
  json arr = json::array();
  for (const RunRecord& r : runs) arr.push_back(run_json(h, r));
  json dev = device_json(h.device, h.no_device_reason, h.sm_clock_start_mhz, h.sm_clock_end_mhz);
  if (h.device) dev["other_processes"] = h.other_processes >= 0 ? json(h.other_processes) : json(nullptr);
  json doc = {{"schema_version", kJsonSchemaVersion},
          {"tool", {{"name", "flashattn"},
                    {"version", kVersion},
                    {"git_sha", kGitSha},
                    {"build_type", kBuildType},
                    {"cuda_archs", kCudaArchs}}},
          {"device", dev},
          {"host", {{"cpu_threads", h.cpu_threads > 0 ? h.cpu_threads
                                                       : static_cast<int>(std::thread::hardware_concurrency())}}},
          {"command_line", h.command_line},
          {"started_at", h.started_at},
          {"data", {{"dir", h.data_dir},
                    {"format", h.data_format},
                    {"input_dtype", h.input_dtype},
                    {"generated_dO", h.generated_dout}}},
          {"warnings", h.warnings},
          {"runs", arr}};
  if (!h.ceilings.is_null()) doc["ceilings"] = h.ceilings;
  return doc;
}

namespace {

std::string fmt_ms(double ms) {
  if (ms >= 100) return fmt::format("{:.1f}", ms);
  if (ms >= 1) return fmt::format("{:.3f}", ms);
  return fmt::format("{:.4f}", ms);
}


std::string fmt_err(const RunRecord& r) {
  if (!r.check.performed) return r.check.note.empty() ? "-" : "ref";
  double worst = 0;
  std::string metric;
  for (const OutputCheck& o : r.check.outputs) {
    if (o.measured >= worst) {
      worst = o.measured;
      metric = o.metric == "rel_l2" ? "rel" : "abs";
    }
  }
  return fmt::format("{:.2e} {} {}", worst, metric, r.check.passed ? "ok" : "FAIL");
}

}  // namespace

std::string render_table(const std::vector<RunRecord>& runs, const std::string& baseline, bool with_check) {
  // Runs in several dtypes (--dtype auto) name theirs next to the kernel.
  bool mixed = false;
  for (const RunRecord& r : runs) mixed = mixed || (r.dtype && runs.front().dtype && *r.dtype != *runs.front().dtype);
  const int w = mixed ? 12 : 10;
  auto label = [&](const RunRecord& r) { return mixed && r.dtype ? r.kernel + " " + dtype_name(*r.dtype) : r.kernel; };
  std::string out = fmt::format("{:<{}} {:<8} {:>10} {:>7} {:>9} {:>9} {:>9} {:>8}", "kernel", w, "mode", "median ms",
                                "noise", "TFLOP/s", "GB/s", "peak mem", "speedup");
  if (with_check) out += fmt::format("  {:<20}", "max error (check)");
  out += "\n";
  std::string notes;
  for (const RunRecord& r : runs) {
    if (!r.ok()) {
      out += fmt::format("{:<{}} {:<8} {}: {}\n", label(r), w, mode_name(r.mode), status_name(r.status), r.reason);
      continue;
    }
    std::string speedup = "-";
    for (const RunRecord& b : runs) {
      if (b.kernel == baseline && b.mode == r.mode && b.ok() && r.timing.median_ms > 0)
        speedup = fmt::format("{:.2f}x", b.timing.median_ms / r.timing.median_ms);
    }
    // '*': the noise rule was not met; 'T': the SM clock was throttled during timing.
    std::string flag = r.timing.noise_rule == 0 ? "*" : "";
    if (r.timing.clock.throttled) flag += "T";
    const std::string noise = fmt::format("{:.1f}%{}", 100 * r.timing.rel_stddev, flag);
    const std::string mem = r.memory.peak_bytes ? human_bytes(double(r.memory.peak_bytes)) : "-";
    out += fmt::format("{:<{}} {:<8} {:>10} {:>7} {:>9.2f} {:>9.1f} {:>9} {:>8}", label(r), w, mode_name(r.mode),
                       fmt_ms(r.timing.median_ms), noise, r.tflops, r.gbps, mem, speedup);
    if (with_check) out += "  " + fmt_err(r);
    out += "\n";
    for (const std::string& n : r.notes) notes += fmt::format("  note ({} {}): {}\n", r.kernel, mode_name(r.mode), n);
  }
  return out + notes;
}

std::string render_check(const RunRecord& r) {
  const CheckResult& c = r.check;
  if (!c.performed) return "";
  // The dtype beside the kernel where a session mixes dtypes (--dtype auto or a list).
  const std::string who = r.dtype ? fmt::format("{} {}", r.kernel, dtype_name(*r.dtype)) : r.kernel;
  std::string out = fmt::format("  check {} {}: {} ({} of {} query rows", who, mode_name(r.mode),
                                c.passed ? "passed" : "FAILED", c.rows_checked, c.rows_total);
  if (c.key_rows_total) out += fmt::format(", {} of {} key rows", c.key_rows_checked, c.key_rows_total);
  if (c.seconds >= 0) out += fmt::format("; {:.1f} s", c.seconds);
  out += ")\n";
  for (const OutputCheck& o : c.outputs) {
    out += fmt::format("    {:<4} max_abs {:.3e}  mean_abs {:.3e}  mse {:.3e}  max_rel {:.3e}  rel_l2 {:.3e}  [{}] {}\n",
                       o.name, o.err.max_abs, o.err.mean_abs, o.err.mse, o.err.max_rel, o.err.rel_l2, o.rule,
                       o.passed ? "ok" : "FAIL");
    if (o.err.nonfinite) out += fmt::format("         {} non-finite value(s) where the reference is finite (or -inf mismatch)\n", o.err.nonfinite);
    if (!o.passed) {
      for (const Mismatch& m : o.err.first_mismatches)
        out += fmt::format("         row {} col {}: got {:.6g}, want {:.6g}\n", m.row, m.col, m.got, m.want);
    }
  }
  return out;
}

std::string human_bytes(double b) {
  if (b >= double(1ull << 30)) return fmt::format("{:.2f} GiB", b / double(1ull << 30));
  if (b >= double(1ull << 20)) return fmt::format("{:.1f} MiB", b / double(1ull << 20));
  if (b >= 1024) return fmt::format("{:.0f} KiB", b / 1024.0);
  return fmt::format("{:.0f} B", b);
}

}  // namespace flashattn

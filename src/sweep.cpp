// Running a --sweep: one Session per grid point on inputs generated from --seed, every kernel x
// mode of the point, skips and failures recorded without stopping, progress on stderr, and the
// results as one session document (--json FILE.json or -) or one document per point (FILE.jsonl,
// written as each point finishes).
#include <fmt/format.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>

#include "ceilings.h"
#include "flashattn/error.h"
#include "flashattn/registry.h"
#include "harness.h"
#include "io_guard.h"
#include "npy.h"
#include "report.h"
#include "run.h"
#include "sweep.h"
#include "stopwatch.h"

namespace flashattn {

using nlohmann::json;
namespace fs = std::filesystem;

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

std::string duration_str(double sec) {
  const long s = std::lround(std::max(0.0, sec));
  if (s < 60) return fmt::format("{}s", s);
  if (s < 3600) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}h{:02}m", s / 3600, (s % 3600) / 60);
}

std::string point_title(const Problem& p) {
  const Dims& d = p.dims;
  std::string t = fmt::format("B{} H{}", d.B, d.H);
  if (d.H_kv != d.H) t += fmt::format("/{}", d.H_kv);
  t += d.S_q == d.S_k ? fmt::format(" S{}", d.S_q) : fmt::format(" S{}x{}", d.S_q, d.S_k);
  t += fmt::format(" D{} {}", d.D, dtype_name(p.dtype));
  if (p.causal) t += " causal";
  return t;
}

// Every GPU kernel (`--compute all` in a sweep; the cpu kernel only when named).
std::vector<std::string> gpu_kernels() {
  std::vector<std::string> out;
  for (const std::string& k : Registry::kernel_names())
    for (int m = 0; m < kNumModes; ++m) {
      const KernelMode* e = Registry::find(k, static_cast<Mode>(m));
      if (e && e->gpu) {
        out.push_back(k);
        break;
      }
    }
  return out;
}

RunRecord unrun(const std::string& kernel, Mode m, bool gpu, RunStatus status, const std::string& reason) {
  RunRecord r;
  r.kernel = kernel, r.mode = m, r.gpu = gpu, r.status = status, r.reason = reason;
  return r;
}

// --dry-run: one point per line: readable, and still a preset file that --sweep accepts.
void print_grid(const SweepGrid& grid) {
  const json g = sweep_grid_json(grid);
  std::string text = "{\"name\": " + g["name"].dump() + ",\n \"points\": [\n";
  for (size_t i = 0; i < g["points"].size(); ++i)
    text += "  " + g["points"][i].dump() + (i + 1 < g["points"].size() ? ",\n" : "\n");
  std::fputs((text + "]}\n").c_str(), stdout);
}

void check_point_kernels(const SweepGrid& grid) {
  for (const SweepPoint& p : grid.points) {
    if (p.kernels.empty()) throw InputError("--sweep: name the kernels with --compute (or \"kernels\" in the preset)");
    for (const std::string& k : p.kernels) {
      bool known = false;
      for (int m = 0; m < kNumModes; ++m) known = known || Registry::find(k, static_cast<Mode>(m));
      if (!known) throw InputError("--compute: unknown kernel '" + k + "'");
    }
  }
}

// Without a GPU, GPU kernels are recorded as skipped (like `--compute all`); a sweep of GPU
// kernels only cannot run here at all: a usage error.
void require_runnable(const SweepGrid& grid, const DeviceChoice& dev) {
  if (dev.device >= 0) return;
  bool any_host = false;
  for (const SweepPoint& p : grid.points)
    for (const std::string& k : p.kernels)
      for (int m = 0; m < kNumModes; ++m) {
        const KernelMode* e = Registry::find(k, static_cast<Mode>(m));
        any_host = any_host || (e && !e->gpu);
      }
  if (!any_host) throw InputError("--sweep: the kernels need a GPU: " + dev.no_device + " (the cpu kernel still runs)");
}

struct SweepContext {
  const AppOptions& opt;
  TimingOptions timing;
  DeviceChoice dev;
  const DeviceInfo* info = nullptr;
  bool any_failed = false, any_check_failed = false;
};

// One point: the plan (what runs, what is skipped and why), then the planned runs in one session
// on inputs generated from --seed. A kernel that does not fit is skipped, not failed.
std::vector<RunRecord> run_point(const SweepPoint& pt, const Problem& prob, SweepContext* cx) {
  std::vector<RunRecord> records;
  std::vector<std::pair<const KernelMode*, size_t>> planned;  // entry, index into records
  for (const std::string& k : pt.kernels) {
    for (Mode m : pt.modes) {
      const KernelMode* e = Registry::find(k, m);
      if (!e) {
        records.push_back(unrun(k, m, true, RunStatus::Skipped, fmt::format("kernel '{}' has no {} pass", k, mode_name(m))));
        continue;
      }
      std::string why = e->gpu && cx->dev.device < 0 ? "no GPU: " + cx->dev.no_device
                                                      : why_unsupported(*e, prob, cx->info ? cx->info->sm() : 0);
      records.push_back(unrun(k, m, e->gpu, why.empty() ? RunStatus::Ok : RunStatus::Skipped, why));
      if (why.empty()) planned.emplace_back(e, records.size() - 1);
    }
  }
  if (planned.empty()) return records;
  const AppOptions& opt = cx->opt;
  SessionOptions so;
  so.device = cx->dev.device;
  so.devices = opt.devices;
  so.ring_process = {opt.ring_rank, opt.ring_size, opt.ring_id};
  so.ring_baseline_each = opt.ring_baseline_each;
  so.timing = cx->timing;
  so.cpu_timing = cx->timing;
  so.cpu_timing.warmup = std::min(cx->timing.warmup, 1);
  so.cpu_timing.repeat = std::min(cx->timing.repeat, 3);
  so.check = opt.check;
  so.deterministic = opt.deterministic;
  so.cpu_threads = opt.threads;
  so.seed = opt.seed;
  try {
    Session session(generated_inputs(prob, opt.seed), so);
    for (const auto& [e, idx] : planned) {
      try {
        records[idx] = session.run(*e);
        if (records[idx].check.performed && !records[idx].check.passed) cx->any_check_failed = true;
      } catch (const InputError& err) {  // e.g. does not fit in GPU memory
        records[idx] = unrun(e->kernel, e->mode, e->gpu, RunStatus::Skipped, err.what());
      } catch (const RuntimeError& err) {
        // An allocation the memory estimate missed is "does not fit", not a failure (and not
        // sticky: the sweep goes on).
        const std::string what = err.what();
        const bool oom = what.find("cudaErrorMemoryAllocation") != std::string::npos;
        records[idx] = unrun(e->kernel, e->mode, e->gpu, oom ? RunStatus::Skipped : RunStatus::Failed,
                             oom ? "does not fit in GPU memory: " + what : what);
        cx->any_failed = cx->any_failed || !oom;
      }
    }
  } catch (const Error& err) {  // the session itself (stream, flush buffer) could not be set up
    const bool input = dynamic_cast<const InputError*>(&err) != nullptr;
    for (const auto& [e, idx] : planned)
      records[idx] = unrun(e->kernel, e->mode, e->gpu, input ? RunStatus::Skipped : RunStatus::Failed, err.what());
    cx->any_failed = cx->any_failed || !input;
  }
  return records;
}

}  // namespace

std::string sweep_run_summary(const RunRecord& r) {
  const std::string who = fmt::format("{} {}", r.kernel, r.mode == Mode::Forward ? "fwd" : "bwd");
  if (!r.ok()) return fmt::format("{} {}", who, status_name(r.status));
  // A ring's TFLOP/s are its GPUs' together: say over how many.
  const std::string over = r.ring && r.ring->size > 1 ? fmt::format(" over {} GPUs", r.ring->size) : "";
  return fmt::format("{} {:.3g} ms {:.1f} TFLOP/s{}{}", who, r.timing.median_ms, r.tflops, over,
                     r.timing.noise_rule == 0 ? " (noisy)" : "");
}

int run_sweep(const AppOptions& opt) {
  if (!opt.data.empty()) throw InputError("--sweep: generates its inputs from --seed; drop --data");
  if (!opt.out.empty()) throw InputError("--sweep: writes no data files; drop --out");
  if (opt.dtype.kind == DtypeChoice::Kind::Auto)
    throw InputError("--dtype auto: not with --sweep (the preset or --dtype names one dtype)");
  if (opt.dtype.is_list() && !opt.dtype.one())
    throw InputError("--dtype " + opt.dtype.text() + ": not with --sweep (the preset or --dtype names one dtype)");
  SweepDefaults cli;
  cli.dtype = opt.dtype.text();
  cli.mode = opt.mode ? run_mode_name(*opt.mode) : "";
  cli.causal = opt.causal;
  const bool all = opt.compute.size() == 1 && opt.compute[0] == "all";
  cli.kernels = all ? gpu_kernels() : opt.compute;
  const SweepGrid grid = load_sweep(opt.sweep, cli);
  if (opt.dry_run) {
    print_grid(grid);
    return kExitOk;
  }
  check_point_kernels(grid);
  SweepContext cx{opt, timing_options(opt), {}, nullptr};
  const TimingOptions& timing = cx.timing;
  const Window window = opt.window.value_or(Window{});
  const Layout layout = opt.layout.value_or(Layout::BHSD);

  cx.dev = pick_device(opt.device, /*wants_gpu=*/true);
  const int device = cx.dev.device;
  const std::string& no_device = cx.dev.no_device;
  std::unique_ptr<DeviceInfo> info;
  if (device >= 0) info = std::make_unique<DeviceInfo>(query_device(device));
  cx.info = info.get();
  require_runnable(grid, cx.dev);

  const bool jsonl = ends_with(opt.json, ".jsonl");
  // Refused now (the preset is known by identity), before any point runs or a JSON Lines file is
  // opened.
  if (!opt.json.empty() && opt.json != "-") check_output_file(opt.json, "--json");
  std::ofstream lines;
  if (jsonl) {
    lines.open(opt.json, std::ios::trunc);
    if (!lines) throw InputError("--json: " + opt.json + ": cannot open for writing");
  }
  FILE* human = opt.json == "-" ? stderr : stdout;

  ReportHeader base;
  base.command_line = opt.command_line;
  base.started_at = iso8601_now();
  base.device = info.get();
  base.no_device_reason = no_device;
  base.timing = timing;
  base.cpu_threads = opt.threads;
  base.data_format = "generated";
  note_device_state(&base, device);
  if (!base.warnings.empty() && !opt.quiet) std::fprintf(stderr, "warning: %s\n", base.warnings.back().c_str());
  if (opt.ceilings) {
    if (!info) throw InputError("--ceilings: needs a GPU: " + no_device);
    base.ceilings = ceilings_json(measure_ceilings(device, timing));
  }

  size_t total_runs = 0, done_runs = 0;
  for (const SweepPoint& p : grid.points) total_runs += p.kernels.size() * p.modes.size();
  const Stopwatch since_start;
  json all_runs = json::array();
  std::vector<std::string> table;
  int ring_gpus = 0;  // GPUs of the sweep's rings (--devices), 0 without

  for (size_t i = 0; i < grid.points.size(); ++i) {
    const SweepPoint& pt = grid.points[i];
    Problem prob;
    prob.dims = pt.dims;
    prob.dtype = pt.dtype;
    prob.layout = layout;
    prob.scale = opt.scale ? *opt.scale : 1.0 / std::sqrt(double(pt.dims.D));
    prob.causal = pt.causal;
    prob.window_left = window.left;
    prob.window_right = window.right;

    const std::vector<RunRecord> records = run_point(pt, prob, &cx);

    ReportHeader hdr = base;
    hdr.problem = prob;
    if (i > 0) hdr.ceilings = json();  // measured once: in the first document
    if (info) hdr.sm_clock_end_mhz = nvml_sm_clock_mhz(*info);
    const json gen = {{"generated", "normal(0, 1)"}, {"where", device >= 0 ? "device" : "host"}, {"seed", opt.seed}};
    if (jsonl) {
      json doc = session_json(hdr, records);
      doc["data"] = gen;
      doc["sweep"] = {{"name", grid.name}, {"point", i + 1}, {"points", grid.points.size()}};
      lines << doc.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
      lines.flush();
    } else {
      for (const RunRecord& r : records) all_runs.push_back(run_json(hdr, r));
    }

    done_runs += pt.kernels.size() * pt.modes.size();
    const double elapsed = since_start.seconds();
    std::string line = fmt::format("[{:>{}}/{}] {}:", i + 1, std::to_string(grid.points.size()).size(),
                                   grid.points.size(), point_title(prob));
    for (size_t r = 0; r < records.size(); ++r) line += (r ? ", " : " ") + sweep_run_summary(records[r]);
    const double eta = done_runs ? elapsed * double(total_runs - done_runs) / double(done_runs) : 0;
    line += fmt::format(" | {} elapsed, ETA {}", duration_str(elapsed), duration_str(eta));
    if (!opt.quiet) std::fprintf(stderr, "%s\n", line.c_str());
    for (const RunRecord& r : records) {
      const std::string res = r.ok()
          ? fmt::format("{:>10.4f} {:>9.2f} {:>10.1f}", r.timing.median_ms, r.tflops, r.memory.peak_bytes / 1048576.0)
          : fmt::format("{}: {}", status_name(r.status), r.reason);
      table.push_back(fmt::format("{:<32} {:<10} {:<8} {}", point_title(prob), r.kernel, mode_name(r.mode), res));
      if (r.ring) ring_gpus = r.ring->size;
    }
  }

  if (!opt.json.empty() && !jsonl) {
    ReportHeader hdr = base;
    if (info) hdr.sm_clock_end_mhz = nvml_sm_clock_mhz(*info);
    json doc = session_json(hdr, {});
    doc["runs"] = all_runs;
    doc["data"] = {{"generated", "normal(0, 1)"}, {"where", device >= 0 ? "device" : "host"}, {"seed", opt.seed}};
    doc["sweep"] = {{"name", grid.name}, {"points", grid.points.size()}};
    emit_json(opt.json, doc);
  }
  if (opt.json.empty() && !opt.quiet) {
    std::string out = fmt::format("{:<32} {:<10} {:<8} {:>10} {:>9} {:>10}\n", "problem", "kernel", "mode", "median ms",
                                  "TFLOP/s", "peak MiB");
    for (const std::string& l : table) out += l + "\n";
    if (ring_gpus > 1)
      out += fmt::format("(a ring's TFLOP/s: its {} GPUs together; per GPU in the JSON's ring.per_gpu)\n", ring_gpus);
    std::fputs(out.c_str(), human);
  }
  return exit_code(cx.any_failed, cx.any_check_failed);
}

}  // namespace flashattn

#include "app.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <thread>

#include "dataset.h"
#include "io_guard.h"
#include "decode_app.h"
#include "device_info.h"
#include "flashattn/error.h"
#include "flashattn/registry.h"
#include "harness.h"
#include "nonfinite.h"
#include "npy.h"
#include "random.h"
#include "ceilings.h"
#include "report.h"
#include "ring.h"
#include "run.h"
#include "sweep.h"

namespace flashattn {

namespace fs = std::filesystem;

namespace {

// The cpu kernel is skipped by `--compute all` above this many forward FLOPs (it would take
// minutes); naming it explicitly always runs it.
constexpr double kCpuAllFlopLimit = 2e11;

std::string known_kernels() {
  std::string s;
  for (const std::string& n : Registry::kernel_names()) s += (s.empty() ? "" : ", ") + n;
  return s;
}

std::string modes_of(const std::string& kernel) {
  std::string s;
  for (int m = 0; m < kNumModes; ++m)
    if (Registry::find(kernel, static_cast<Mode>(m))) s += (s.empty() ? "" : ", ") + std::string(mode_name(static_cast<Mode>(m)));
  return s;
}

HostArray generate_dout(const std::vector<int64_t>& shape, DType dtype, uint64_t seed) {
  HostArray f64(DType::F64, shape);
  Rng rng(seed, /*stream=*/0x644f);  // "dO"
  double* p = f64.data<double>();
  for (int64_t i = 0; i < f64.numel(); ++i) p[i] = rng.normal();
  return convert(f64, dtype);
}

// An output directory must not be the input directory and must be writable (or creatable).
void check_output_dir(const std::string& dir, const std::string& out_option, const std::string& data) {
  std::error_code ec1, ec2;
  if (fs::weakly_canonical(dir, ec1) == fs::weakly_canonical(data, ec2) || same_file(dir, data))
    throw InputError("--out: " + dir + " is the input directory; outputs go to a directory of their own");
  if (is_input_file(dir)) throw InputError("--out: " + dir + " is one of this run's input files");
  try {
    OutputWriter::check_writable(dir);
  } catch (const InputError& e) {
    if (!out_option.empty()) throw InputError(std::string("--out: ") + e.what());
    throw InputError(std::string(e.what()) + "; choose another with --out DIR, or --no-write");
  }
}

// NaN or Inf in an input makes every output row that reads it NaN, and --check then proves
// nothing: refused unless --allow-nonfinite. (The loader already refuses NaN and +inf in masks.)
void check_inputs_finite(const Dataset& ds, const std::vector<Mode>& modes, bool allow,
                         std::vector<std::string>* notes) {
  const bool backward = std::find(modes.begin(), modes.end(), Mode::Backward) != modes.end();
  const std::string ext = ds.format == FileFormat::Npy ? ".npy" : ".bin";
  std::vector<std::pair<std::string, const HostArray*>> arrays = {{"Q", &ds.q}, {"K", &ds.k}, {"V", &ds.v}};
  if (backward && ds.dout) arrays.emplace_back("dO", &*ds.dout);
  for (const auto& a : arrays) {
    const NonFiniteCount c = scan_nonfinite(*a.second);
    if (c.total() == 0) continue;
    const std::string what = (fs::path(ds.dir) / (a.first + ext)).string() + ": " + describe_nonfinite(c, a.second->shape);
    if (!allow) throw InputError(what + "; pass --allow-nonfinite to run anyway");
    notes->push_back(what + "; running anyway (--allow-nonfinite)");
  }
}

// Converting into a narrower compute dtype can overflow (fp32 70000 -> fp16 inf).
void check_conversion_finite(const Dataset& ds, const std::string& name, const HostArray& stored,
                             const HostArray& converted, bool allow, std::vector<std::string>* notes) {
  if (stored.dtype == converted.dtype) return;
  const NonFiniteCount before = scan_nonfinite(stored), after = scan_nonfinite(converted);
  if (after.total() == before.total()) return;
  const std::string ext = ds.format == FileFormat::Npy ? ".npy" : ".bin";
  const int64_t n = after.total() - before.total();
  std::string what = fmt::format("{}: {} {} {} when converted", (fs::path(ds.dir) / (name + ext)).string(), n,
                                 n == 1 ? "value overflows" : "values overflow", dtype_name(converted.dtype));
  if (before.total() == 0) what += " (first at " + index_str(stored.shape, after.first) + ")";
  if (!allow) throw InputError(what + "; pass --allow-nonfinite to run anyway, or choose a wider --dtype");
  notes->push_back(what + "; running anyway (--allow-nonfinite)");
}

}  // namespace

TimingOptions timing_options(const AppOptions& opt) {
  TimingOptions t;  // the values were checked by type_options()
  t.warmup = opt.timing.warmup;
  t.repeat = opt.timing.repeat;
  t.min_time_ms = opt.timing.min_time_ms;
  t.flush_l2 = !opt.timing.no_flush;
  t.max_noise = opt.timing.max_noise_pct / 100.0;
  t.max_time_s = opt.timing.max_time_s;
  return t;
}

namespace {

// ---- the forward/backward workload, phase by phase (run_app below strings them together) -------

// --compute: the kernels named (registry order for `all`), each once; --baseline among them.
std::vector<std::string> select_kernels(const AppOptions& opt, bool all) {
  std::vector<std::string> kernels;
  if (all) {
    kernels = Registry::kernel_names();
  } else {
    for (const std::string& k : opt.compute) {
      if (k == "all") throw InputError("--compute: 'all' cannot be combined with kernel names");
      bool known = false;
      for (int m = 0; m < kNumModes; ++m) known = known || Registry::find(k, static_cast<Mode>(m));
      if (!known) throw InputError("--compute: unknown kernel '" + k + "' (known: " + known_kernels() + ")");
      if (std::find(kernels.begin(), kernels.end(), k) == kernels.end()) kernels.push_back(k);
    }
  }
  if (!opt.baseline.empty() && std::find(kernels.begin(), kernels.end(), opt.baseline) == kernels.end())
    throw InputError("--baseline: '" + opt.baseline + "' is not one of the kernels run (--compute)");
  return kernels;
}

// Compute dtype: --dtype's one dtype, else the input's; fp64 inputs go to fp32 unless every kernel
// takes fp64.
DType choose_dtype(const AppOptions& opt, const Dataset& ds, const std::vector<std::string>& kernels,
                   const std::vector<Mode>& modes, std::vector<std::string>* notes) {
  DType dtype = ds.dtype;
  if (opt.dtype.one()) {
    dtype = opt.dtype.list[0];
  } else if (ds.dtype == DType::F64) {
    bool all_f64 = true;
    for (const std::string& k : kernels)
      for (Mode m : modes)
        if (const KernelMode* e = Registry::find(k, m)) all_f64 = all_f64 && (e->dtypes & dtype_bit(DType::F64));
    if (!all_f64) dtype = DType::F32;
  }
  if (dtype != ds.dtype)
    notes->push_back(fmt::format("inputs are {}; computing in {} (converted once, round to nearest)",
                                 dtype_name(ds.dtype), dtype_name(dtype)));
  return dtype;
}

// --dtype auto: a kernel's own dtype, from the dtypes its requested modes all take (else any of
// them): the input's if it takes it (fp32 for fp64 input), else bf16, fp16, fp32.
DType natural_dtype(const std::string& k, const std::vector<Mode>& modes, DType input) {
  uint32_t every = ~0u, some = 0;
  for (Mode m : modes)
    if (const KernelMode* e = Registry::find(k, m)) every &= e->dtypes, some |= e->dtypes;
  const uint32_t mask = every != ~0u && every != 0 ? every : some;
  const DType fallback = input == DType::F64 ? DType::F32 : input;
  for (DType t : {input, fallback, DType::BF16, DType::F16, DType::F32})
    if (mask & dtype_bit(t)) return t;
  return fallback;  // it takes none of them: its plan says why
}

// The kernels of one compute dtype, their problem and their plan.
struct DtypeGroup {
  DType dtype = DType::F32;
  std::vector<std::string> kernels;
  Problem prob;
  std::vector<Planned> plan;
};

std::vector<DtypeGroup> dtype_groups(const AppOptions& opt, const Dataset& ds, const std::vector<std::string>& kernels,
                                     const std::vector<Mode>& modes, std::vector<std::string>* notes) {
  const bool auto_dtype = opt.dtype.kind == DtypeChoice::Kind::Auto;
  if (!auto_dtype && !(opt.dtype.is_list() && opt.dtype.list.size() > 1))
    return {DtypeGroup{choose_dtype(opt, ds, kernels, modes, notes), kernels, {}, {}}};
  std::vector<DtypeGroup> groups;
  auto add = [&](DType t, const std::string& k) {
    auto g = std::find_if(groups.begin(), groups.end(), [&](const DtypeGroup& x) { return x.dtype == t; });
    if (g == groups.end()) g = groups.insert(groups.end(), DtypeGroup{t, {}, {}, {}});
    g->kernels.push_back(k);
  };
  if (auto_dtype) {
    for (const std::string& k : kernels) add(natural_dtype(k, modes, ds.dtype), k);
  } else {
    // A list: groups in the listed order; each kernel in every listed dtype one of its requested
    // passes takes, and one that takes none of them in the first (where its plan says why).
    for (DType t : opt.dtype.list) groups.push_back(DtypeGroup{t, {}, {}, {}});
    for (const std::string& k : kernels) {
      uint32_t takes = 0;
      for (Mode m : modes)
        if (const KernelMode* e = Registry::find(k, m)) takes |= e->dtypes;
      bool any = false;
      for (DType t : opt.dtype.list)
        if (takes & dtype_bit(t)) add(t, k), any = true;
      if (!any) add(opt.dtype.list[0], k);
    }
    groups.erase(std::remove_if(groups.begin(), groups.end(), [](const DtypeGroup& g) { return g.kernels.empty(); }),
                 groups.end());
  }
  for (const DtypeGroup& g : groups) {
    if (g.dtype == ds.dtype) continue;
    std::string names;
    for (const std::string& k : g.kernels) names += (names.empty() ? "" : ", ") + k;
    notes->push_back(fmt::format("inputs are {}; computing in {} for {} (--dtype {}; converted once, round to nearest)",
                                 dtype_name(ds.dtype), dtype_name(g.dtype), names, opt.dtype.text()));
  }
  return groups;
}

// Whether any (kernel, mode) of the run is a GPU kernel (then a device is looked for).
bool wants_gpu(const std::vector<std::string>& kernels, const std::vector<Mode>& modes) {
  bool gpu = false;
  for (const std::string& k : kernels)
    for (Mode m : modes)
      if (const KernelMode* e = Registry::find(k, m)) gpu = gpu || e->gpu;
  return gpu;
}

// Which (kernel, mode) pairs run. Named explicitly, a pair that cannot run is an error; under
// `all` it is recorded as skipped with the reason.
std::vector<Planned> make_plan(const std::vector<std::string>& kernels, const std::vector<Mode>& modes, bool all,
                               const Problem& prob, const DeviceChoice& dev) {
  std::vector<Planned> plan;
  for (const std::string& k : kernels) {
    for (Mode m : modes) {
      const KernelMode* e = Registry::find(k, m);
      if (!e) {
        if (!all) throw InputError("kernel '" + k + "' has no " + mode_name(m) + " pass (it has: " + modes_of(k) + ")");
        continue;
      }
      Planned p;
      p.entry = e;
      // Without a GPU, judge the problem as if the GPU were new enough: an unsupported dtype, head
      // dim or feature is the real error there, and no GPU would fix it.
      std::string why = why_unsupported(*e, prob, dev.device >= 0 ? dev.sm : std::max(e->min_sm, 1));
      if (why.empty() && e->gpu && dev.device < 0) {
        if (!all)
          throw InputError(
              fmt::format("kernel '{}' needs a GPU: {} (the cpu kernel still runs: --compute cpu)", k, dev.no_device));
        p.skip_reason = "no GPU: " + dev.no_device;
      } else if (!why.empty()) {
        if (!all) throw InputError(why);
        p.skip_reason = why;
      }
      if (all && p.skip_reason.empty() && !e->gpu && forward_flops(prob, nullptr) > kCpuAllFlopLimit)
        p.skip_reason = "skipped by 'all' at this size (name it explicitly to run the cpu kernel)";
      plan.push_back(p);
    }
  }
  return plan;
}

// Q, K, V (and dO, generated when a backward pass needs one and the data has none) in the
// compute dtype.
RunInputs make_inputs(const AppOptions& opt, const Dataset& ds, const std::vector<Mode>& modes, const Problem& prob,
                      std::vector<std::string>* notes, bool* generated_dout) {
  const bool needs_backward = std::find(modes.begin(), modes.end(), Mode::Backward) != modes.end();
  RunInputs in;
  in.problem = prob;
  in.q = convert(ds.q, prob.dtype);
  in.k = convert(ds.k, prob.dtype);
  in.v = convert(ds.v, prob.dtype);
  check_conversion_finite(ds, "Q", ds.q, in.q, opt.allow_nonfinite, notes);
  check_conversion_finite(ds, "K", ds.k, in.k, opt.allow_nonfinite, notes);
  check_conversion_finite(ds, "V", ds.v, in.v, opt.allow_nonfinite, notes);
  *generated_dout = false;
  if (ds.dout) {
    in.dout = convert(*ds.dout, prob.dtype);
    if (needs_backward) check_conversion_finite(ds, "dO", *ds.dout, *in.dout, opt.allow_nonfinite, notes);
  } else if (needs_backward) {
    in.dout = generate_dout(ds.q.shape, prob.dtype, opt.seed);
    *generated_dout = true;
    notes->push_back(fmt::format("no dO in {}: generated N(0,1) from --seed {} (written to the output directory)",
                                 opt.data, opt.seed));
  }
  in.seqlens_k = ds.seqlens_k;
  in.mask = ds.mask;
  return in;
}

// The forward/backward workload of one dtype group: each planned kernel on the group's session.
class FwdBwdWorkload : public Workload {
 public:
  explicit FwdBwdWorkload(Session& s) : session_(s) {}
  RunRecord run(const KernelMode& e) override { return session_.run(e); }

 private:
  Session& session_;
};

// Each kernel that ran writes its outputs and its timing.json into its own directory, all of
// them or none.
template <class OutDir>
void write_outputs(const std::vector<RunRecord>& records, const Dataset& ds, const Session& session,
                   const ReportHeader& hdr, bool generated_dout, const OutDir& out_dir_for, const Console& con) {
  std::vector<std::string> ran;
  for (const RunRecord& r : records)
    if (r.ok() && std::find(ran.begin(), ran.end(), r.kernel) == ran.end()) ran.push_back(r.kernel);
  for (const std::string& k : ran) {
    const std::string dir = out_dir_for(k);
    OutputWriter w(dir, ds.format, ds.layout, ds.input_paths);
    std::vector<RunRecord> mine;
    for (const RunRecord& r : records) {
      if (r.kernel != k) continue;
      mine.push_back(r);
      if (!r.ok()) continue;
      const KernelOutputs& o = r.outputs;
      if (o.o) w.add("O", *o.o);
      if (o.lse) w.add("lse", *o.lse);
      if (o.dq) w.add("dQ", *o.dq);
      if (o.dk) w.add("dK", *o.dk);
      if (o.dv) w.add("dV", *o.dv);
    }
    if (generated_dout) w.add("dO", *session.inputs().dout);
    w.add_file("timing.json", json_text(session_json(hdr, mine)));
    w.finish();  // all of the kernel's files appear together, or none (disk full, an error)
    con.note("wrote " + dir);
  }
}

// The table (speedups against --baseline, else the registry's baseline kernel (cublas), else the
// first GPU kernel that ran), the check details, and the session JSON.
void report(const AppOptions& opt, const ReportHeader& hdr, const std::vector<RunRecord>& records, const Console& con) {
  if (opt.ring_size > 0 && opt.ring_rank > 0) return;  // rank 0 reports the ring's runs
  std::string baseline = opt.baseline;
  if (baseline.empty()) {
    for (const RunRecord& r : records) {
      const KernelMode* e = Registry::find(r.kernel, r.mode);
      if (baseline.empty() && e && e->role == KernelRole::Baseline && r.ok()) baseline = r.kernel;
    }
    for (const RunRecord& r : records)
      if (baseline.empty() && r.gpu && r.ok()) baseline = r.kernel;
  }
  if (!opt.quiet || opt.json != "-") {
    con.print(render_table(records, baseline, opt.check));
    if (!baseline.empty() && records.size() > 1)
      con.print(fmt::format("speedup: median time of '{}' / median time, same mode\n", baseline));
    for (const RunRecord& r : records) {
      if (r.check.performed && (!opt.quiet || !r.check.passed)) con.print(render_check(r));
    }
  }
  emit_json(opt.json, session_json(hdr, records));
}

std::string run_title(const Problem& prob, const ReportHeader& hdr) {
  const Dims& d = prob.dims;
  std::string title = fmt::format("B={} H={} H_kv={} S_q={} S_k={} D={} {} {}", d.B, d.H, d.H_kv, d.S_q, d.S_k, d.D,
                                  dtype_name(prob.dtype), layout_name(prob.layout));
  if (prob.causal) title += " causal";
  if (prob.window_left >= 0 || prob.window_right >= 0)
    title += fmt::format(" window=({},{})", prob.window_left, prob.window_right);
  if (prob.has_padding) title += " seqlens_k";
  if (prob.has_mask) title += " mask";
  title += hdr.device ? fmt::format("  on {} (sm_{})", hdr.device->name, hdr.device->sm()) : "  (no GPU)";
  return title + "\n";
}

// The forward/backward workload: options, data, plan, run, outputs, report.
int run_forward_backward(const AppOptions& opt) {
  const Console con(opt.quiet, opt.json);
  const std::string started = iso8601_now();

  if (opt.data.empty()) throw InputError("--data: a data directory is required (see --help)");
  if (opt.compute.empty()) throw InputError("--compute: name at least one kernel (known: " + known_kernels() + ")");
  const std::vector<Mode> modes = run_mode_passes(*opt.mode);
  const bool all = opt.compute.size() == 1 && opt.compute[0] == "all";
  const std::vector<std::string> kernels = select_kernels(opt, all);

  // ---- data -----------------------------------------------------------------------------------
  LoadOptions lo;
  lo.layout = opt.layout;
  Dataset ds = load_dataset(opt.data, lo);
  // --json is written last, after every kernel ran: check now (the inputs are known by identity
  // now) that it can be.
  if (!opt.json.empty() && opt.json != "-") check_output_file(opt.json, "--json");
  // Notes are printed once every check has passed, so a refused run prints its one error line only.
  std::vector<std::string> notes = ds.notices;
  check_inputs_finite(ds, modes, opt.allow_nonfinite, &notes);

  // The compute dtypes: one (--dtype's, else the input's), each kernel's own (--dtype auto), or
  // each listed one (--dtype fp32,bf16); the kernels of one dtype share a session. Every plan is
  // made before anything runs, so a kernel named explicitly that cannot run fails the command
  // before any work.
  std::vector<DtypeGroup> groups = dtype_groups(opt, ds, kernels, modes, &notes);
  // Where each kernel's outputs go (a kernel run in several dtypes: one subdirectory per dtype);
  // checked now so a bad directory fails before any kernel runs.
  auto out_dir_for = [&](const std::string& k, DType t) {
    fs::path dir = opt.out.empty() ? fs::path(opt.data) / "out" / k : kernels.size() == 1 ? fs::path(opt.out) : fs::path(opt.out) / k;
    int in_groups = 0;
    for (const DtypeGroup& g : groups) in_groups += std::count(g.kernels.begin(), g.kernels.end(), k) > 0;
    if (in_groups > 1) dir /= dtype_name(t);
    return dir.string();
  };
  if (!opt.no_write) {
    for (const DtypeGroup& g : groups)
      for (const std::string& k : g.kernels) check_output_dir(out_dir_for(k, g.dtype), opt.out, opt.data);
  }
  const DeviceChoice dev = pick_device(opt.device, wants_gpu(kernels, modes));
  for (DtypeGroup& g : groups) {
    g.prob.dims = ds.dims;
    g.prob.dtype = g.dtype;
    g.prob.layout = ds.layout;
    g.prob.scale = opt.scale ? *opt.scale : 1.0 / std::sqrt(double(ds.dims.D));
    g.prob.causal = opt.causal;
    g.prob.window_left = opt.window ? opt.window->left : -1;
    g.prob.window_right = opt.window ? opt.window->right : -1;
    g.prob.has_padding = ds.seqlens_k.has_value();
    g.prob.has_mask = ds.mask.has_value();
    g.plan = make_plan(g.kernels, modes, all, g.prob, dev);
  }

  SessionOptions so;
  so.device = dev.device;
  so.devices = opt.devices;
  so.ring_process = {opt.ring_rank, opt.ring_size, opt.ring_id};
  so.ring_baseline_each = opt.ring_baseline_each;
  so.timing = timing_options(opt);
  so.cpu_timing.warmup = std::min(opt.timing.warmup, 1);
  so.cpu_timing.repeat = std::min(opt.timing.repeat, 3);
  so.check = opt.check;
  so.deterministic = opt.deterministic;
  so.cpu_threads = opt.threads;
  so.seed = opt.seed;
  ReportHeader hdr;
  hdr.command_line = opt.command_line;
  hdr.started_at = started;
  hdr.no_device_reason = dev.device < 0 ? (dev.wants_gpu ? dev.no_device : "not used (host kernels only)") : "";
  hdr.data_dir = opt.data;
  hdr.data_format = ds.source;
  hdr.input_dtype = dtype_name(ds.dtype);
  hdr.has_mask = ds.mask.has_value();
  hdr.has_seqlens = ds.seqlens_k.has_value();
  hdr.timing = so.timing;
  hdr.cpu_threads = opt.threads;

  std::optional<DeviceInfo> device_info;  // the header points here, past each group's session
  std::set<std::string> printed;
  Outcome all_runs;
  for (size_t gi = 0; gi < groups.size(); ++gi) {
    const DtypeGroup& g = groups[gi];
    bool generated_dout = false;
    RunInputs in = make_inputs(opt, ds, modes, g.prob, &notes, &generated_dout);
    for (const std::string& n : notes)
      if (printed.insert(n).second) con.note(n);  // each group's dO note is the same
    notes.clear();
    // One group's session at a time: its device buffers go before the next group's arrive.
    Session session(std::move(in), so);
    hdr.problem = g.prob;
    hdr.generated_dout = generated_dout;
    if (gi == 0) {
      if (session.device()) device_info = *session.device();
      hdr.device = device_info ? &*device_info : nullptr;
      note_device_state(&hdr, dev.device, &con);
      if (opt.ceilings && hdr.device) hdr.ceilings = ceilings_json(measure_ceilings(dev.device, so.timing));
    }
    if (!opt.quiet) con.print(run_title(g.prob, hdr));
    FwdBwdWorkload work(session);
    Outcome run = run_planned(g.plan, all, work);
    if (groups.size() > 1)
      for (RunRecord& r : run.records) r.dtype = g.dtype;
    if (!opt.no_write) {
      auto dir_of = [&](const std::string& k) { return out_dir_for(k, g.dtype); };
      write_outputs(run.records, ds, session, hdr, generated_dout, dir_of, con);
    }
    for (RunRecord& r : run.records) all_runs.records.push_back(std::move(r));
    all_runs.any_failed = all_runs.any_failed || run.any_failed;
    all_runs.any_check_failed = all_runs.any_check_failed || run.any_check_failed;
  }
  if (hdr.device) hdr.sm_clock_end_mhz = nvml_sm_clock_mhz(*hdr.device);
  report(opt, hdr, all_runs.records, con);
  return exit_code(all_runs.any_failed, all_runs.any_check_failed);
}

// --devices / --ring-rank: a ring needs NCCL in this build and the GPUs present; decode does not
// shard.
void check_devices(const AppOptions& opt) {
  const std::string what = opt.devices.empty() ? "--ring-rank" : "--devices";
  if (opt.mode == RunMode::Decode) throw InputError(what + ": not with --mode decode (a ring shards forward and backward runs)");
  const std::string why = ring_unavailable();
  if (!why.empty()) throw InputError(what + ": " + why);
  std::string no_gpu;
  const int count = cuda_device_count(&no_gpu);
  const std::vector<int> ids = opt.devices.empty() ? std::vector<int>{opt.device} : opt.devices;
  for (int id : ids)
    if (id >= count)
      throw InputError(what + ": GPU " + std::to_string(id) + " does not exist (" +
                       (count == 0 ? no_gpu : std::to_string(count) + " present") + ")");
}

}  // namespace

int run_app(const AppOptions& given) {
  AppOptions opt = given;
  protect_input_files();  // every workload: no output may replace a file the run read
  for (const auto& [path, what] : {std::pair{opt.data, "--data"}, std::pair{opt.out, "--out"},
                                   std::pair{opt.json, "--json"}, std::pair{opt.sweep, "--sweep"}})
    check_utf8_path(path, what);
  if (!opt.devices.empty() || opt.ring_size > 0) check_devices(opt);
  // A ring's other ranks compute their part and report nothing: rank 0 gathers, checks, prints
  // and writes.
  if (opt.ring_size > 0 && opt.ring_rank > 0) opt.quiet = true, opt.no_write = true, opt.json.clear();
  if (opt.mode == RunMode::Decode) return run_decode(opt);
  // Decode's own options mean nothing to forward/backward runs and sweeps: refused, not ignored.
  const std::pair<bool, const char*> decode_only[] = {{opt.decode.splits != 0, "--splits"},
                                                      {opt.decode.steps != 0, "--steps"},
                                                      {opt.decode.prompt_len != 0, "--prompt-len"},
                                                      {opt.decode.write_cache, "--write-cache"}};
  for (const auto& [given, name] : decode_only)
    if (given) throw InputError(std::string(name) + ": only with --mode decode");
  if (!opt.sweep.empty()) return run_sweep(opt);
  if (opt.dry_run) throw InputError("--dry-run: only with --sweep");
  if (opt.ceilings && opt.data.empty() && opt.compute.empty()) return run_ceilings(opt);
  return run_forward_backward(opt);
}

}  // namespace flashattn

#include "decode_app.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>

#include "ceilings.h"
#include "decode_data.h"
#include "decode_sim.h"
#include "device_info.h"
#include "flashattn/error.h"
#include "flashattn/registry.h"
#include "harness.h"
#include "io_guard.h"
#include "nonfinite.h"
#include "npy.h"
#include "report.h"

namespace flashattn {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string decode_kernel_names() {
  std::string s;
  for (const KernelMode* e : Registry::entries())
    if (e->mode == Mode::Decode) s += (s.empty() ? "" : ", ") + e->kernel;
  return s;
}

void check_options(const AppOptions& opt) {
  if (!opt.sweep.empty()) throw InputError("--sweep: not available with --mode decode");
  if (opt.dry_run) throw InputError("--dry-run: only with --sweep");
  if (opt.data.empty()) throw InputError("--data: a decode data directory is required (see data/README.md)");
  if (opt.compute.empty())
    throw InputError("--compute: name at least one kernel (decode kernels: " + decode_kernel_names() + ")");
  if (opt.window)
    throw InputError("--window: not available in decode mode (a step is causal within each batch element's length)");
  if (opt.layout && *opt.layout != Layout::BHSD) throw InputError("--layout: decode directories are bhsd");
  if (opt.decode.splits < 0) throw InputError("--splits: must be >= 0 (0: the kernel chooses)");
  if (opt.decode.splits > 65535) throw InputError("--splits: at most 65535");
  if (opt.decode.steps < 0) throw InputError("--steps: must be >= 0");
  if (opt.decode.prompt_len < 0) throw InputError("--prompt-len: must be >= 0");
  if (opt.decode.prompt_len > 0 && opt.decode.steps == 0) throw InputError("--prompt-len: only with --steps");
  if (opt.decode.steps > 0 && opt.decode.write_cache) throw InputError("--write-cache: not with --steps (the simulation writes no outputs)");
  if (opt.decode.write_cache && opt.no_write) throw InputError("--write-cache: conflicts with --no-write");
  if (!opt.json.empty() && opt.json != "-") check_output_file(opt.json, "--json");
}

std::vector<const KernelMode*> plan_kernels(const AppOptions& opt, bool* all) {
  *all = opt.compute.size() == 1 && opt.compute[0] == "all";
  std::vector<const KernelMode*> plan;
  if (*all) {
    for (const KernelMode* e : Registry::entries())
      if (e->mode == Mode::Decode) plan.push_back(e);
    return plan;
  }
  for (const std::string& k : opt.compute) {
    if (k == "all") throw InputError("--compute: 'all' cannot be combined with kernel names");
    const KernelMode* e = Registry::find(k, Mode::Decode);
    if (!e) {
      bool known = false;
      for (int m = 0; m < kNumModes; ++m) known = known || Registry::find(k, static_cast<Mode>(m));
      if (!known) throw InputError("--compute: unknown kernel '" + k + "'");
      throw InputError("kernel '" + k + "' has no decode pass (decode kernels: " + decode_kernel_names() + ")");
    }
    if (std::find(plan.begin(), plan.end(), e) == plan.end()) plan.push_back(e);
  }
  return plan;
}

json lengths_json(const DecodeInputs& in) {
  const std::vector<int> L = decode_lengths(in.cache_seqlens, in.dims.S_new);
  std::vector<int> c(in.cache_seqlens.data<int32_t>(), in.cache_seqlens.data<int32_t>() + in.dims.B);
  double sum = 0;
  for (int l : L) sum += l;
  return {{"cache_seqlens", c},
          {"kv_lengths", {{"min", *std::min_element(L.begin(), L.end())},
                          {"max", *std::max_element(L.begin(), L.end())},
                          {"mean", sum / double(L.size())}}}};
}

std::string fraction_str(double gbps, double ref, const char* kind) {
  if (!(ref > 0)) return "";
  return fmt::format(" ({:.1f}% of {} {:.0f} GB/s)", 100 * gbps / ref, std::string(kind) == "copy" ? "copy" : "DRAM peak", ref);
}

}  // namespace

json decode_json(const DecodeRecord& r, const DecodeInputs& in, int splits_option, double ref_gbps, const char* ref_kind) {
  const DecodeDims& d = in.dims;
  json j = lengths_json(in);
  j["S_new"] = d.S_new;
  j["S_max"] = d.S_max;
  j["paged"] = d.paged();
  j["page_size"] = d.page_size;
  j["num_blocks"] = d.num_blocks;
  j["max_blocks"] = d.max_blocks;
  j["splits"] = r.splits;
  j["splits_forced"] = splits_option > 0;
  j["kv_bytes"] = r.kv_bytes;
  const double step_ms = r.run.timing.median_ms, attend_ms = r.attend.median_ms;
  auto rate = [&](double ms) { return ms > 0 ? r.kv_bytes / (ms * 1e-3) / 1e9 : 0.0; };
  auto frac = [&](double ms) { return ref_gbps > 0 && ms > 0 ? json(rate(ms) / ref_gbps) : json(nullptr); };
  j["step"] = {{"median_ms", step_ms}, {"gbps", rate(step_ms)}, {"bandwidth_fraction", frac(step_ms)},
               {"what", "update-cache kernel + attention (+ split merge)"}};
  if (!r.attend.samples_ms.empty())
    j["attention"] = {{"median_ms", attend_ms}, {"gbps", rate(attend_ms)}, {"bandwidth_fraction", frac(attend_ms)},
                      {"timing", timing_json(r.attend, -1, -1)}};
  j["bandwidth_reference"] = {{"kind", ref_kind}, {"gbps", ref_gbps > 0 ? json(ref_gbps) : json(nullptr)}};
  j["cache_check"] = r.cache_checked ? json({{"performed", true}, {"mismatches", r.cache_mismatches}}) : json(nullptr);
  return j;
}

namespace {

// The decode directory, refused with a clear line when it is not one.
DecodeDataset load_checked(const AppOptions& opt) {
  if (!is_decode_dir(opt.data)) {
    std::error_code ec;
    if (!fs::is_directory(opt.data, ec)) throw InputError(opt.data + ": no such directory");
    throw InputError(opt.data + ": not a decode directory (no K_cache.npy or K_cache.bin; see data/README.md)");
  }
  return load_decode_dataset(opt.data);
}

// The inputs in the compute dtype (fp64 data computes in fp32); the new tokens must be finite.
DecodeInputs make_decode_inputs(const AppOptions& opt, DecodeDataset& ds, std::vector<std::string>* notes) {
  DType dtype = ds.dtype == DType::F64 ? DType::F32 : ds.dtype;
  if (opt.dtype.kind != DtypeChoice::Kind::Input) {
    if (!opt.dtype.one() || opt.dtype.list[0] == DType::F64)
      throw InputError("--dtype: '" + opt.dtype.text() + "' is not one of fp32, fp16, bf16 (decode kernels)");
    dtype = opt.dtype.list[0];
  }
  if (dtype != ds.dtype)
    notes->push_back(fmt::format("inputs are {}; computing in {} (converted once, round to nearest)",
                                 dtype_name(ds.dtype), dtype_name(dtype)));
  DecodeInputs in;
  in.dims = ds.dims;
  in.dtype = dtype;
  in.scale = opt.scale ? *opt.scale : 1.0 / std::sqrt(double(ds.dims.D));
  in.q = convert(ds.q, dtype);
  in.k_new = convert(ds.k_new, dtype);
  in.v_new = convert(ds.v_new, dtype);
  in.k_cache = convert(ds.k_cache, dtype);
  in.v_cache = convert(ds.v_cache, dtype);
  in.cache_seqlens = ds.cache_seqlens;
  in.block_table = ds.block_table;
  ds.q = ds.k_new = ds.v_new = ds.k_cache = ds.v_cache = HostArray();  // only the converted copies are used
  if (opt.decode.steps > 0) return in;
  // Cache rows past cache_seqlens are never read, so only the new tokens are scanned.
  const std::pair<const char*, const HostArray*> scanned[] = {{"q", &in.q}, {"k_new", &in.k_new}, {"v_new", &in.v_new}};
  for (const auto& a : scanned) {
    const NonFiniteCount c = scan_nonfinite(*a.second);
    if (c.total() == 0) continue;
    const std::string what =
        (fs::path(ds.dir) / (std::string(a.first) + (ds.format == FileFormat::Npy ? ".npy" : ".bin"))).string() +
        ": " + describe_nonfinite(c, a.second->shape) + (dtype != ds.dtype ? " (after conversion)" : "");
    if (!opt.allow_nonfinite) throw InputError(what + "; pass --allow-nonfinite to run anyway");
    notes->push_back(what + "; running anyway (--allow-nonfinite)");
  }
  return in;
}

std::string decode_title(const AppOptions& opt, const DecodeInputs& in, const DeviceInfo* dev) {
  const std::vector<int> L = decode_lengths(in.cache_seqlens, in.dims.S_new);
  std::string title = fmt::format("decode B={} H={} H_kv={} S_new={} D={} S_max={} kv lengths {}..{} {}", in.dims.B,
                                  in.dims.H, in.dims.H_kv, in.dims.S_new, in.dims.D, in.dims.S_max,
                                  *std::min_element(L.begin(), L.end()), *std::max_element(L.begin(), L.end()),
                                  dtype_name(in.dtype));
  if (in.dims.paged()) title += fmt::format(" paged({}x{})", in.dims.num_blocks, in.dims.page_size);
  if (opt.decode.steps > 0) title += fmt::format(" --steps {}", opt.decode.steps);
  title += dev ? fmt::format("  on {} (sm_{})", dev->name, dev->sm()) : "  (no GPU)";
  return title + "\n";
}

// What each planned kernel's run produced: its record, its "decode" JSON object (null when it did
// not run), its caches, and its console line.
// A decode run's records and what each adds: its "decode" JSON object (null for a run that did
// not happen), its step record (updated caches), and its console line.
struct DecodeOutcome : Outcome {
  std::vector<json> extras;
  std::vector<DecodeRecord> decoded;
  std::vector<std::string> lines;
};

// The bandwidth a decode step is compared with: the measured copy rate (--ceilings), else the
// datasheet DRAM peak.
struct BandwidthRef {
  double gbps = 0;
  const char* kind = "dram_peak";
};

// The decode workload: a simulation per kernel with --steps, else one step each in a shared
// session (made on first use: the caches can be GBs, so they move into it).
class DecodeWorkload : public Workload {
 public:
  DecodeWorkload(const AppOptions& opt, DecodeInputs& in, const DecodeSimOptions& so, const BandwidthRef& ref,
                 DecodeOutcome* out)
      : opt_(opt), in_(in), so_(so), ref_(ref), out_(out) {}

  RunRecord run(const KernelMode& e) override { return opt_.decode.steps > 0 ? simulate(e) : step(e); }

  // Keeps extras and decoded aligned with the records: a run that did not happen adds none.
  void recorded(const RunRecord&) override {
    if (out_->extras.size() > n_) return void(++n_);
    out_->extras.push_back(nullptr);
    out_->decoded.emplace_back();
    ++n_;
  }

 private:
  RunRecord simulate(const KernelMode& e) {
    DecodeSimResult s = simulate_decode(e, in_, so_);
    DecodeRecord dr;
    dr.run = s.run;
    json x = lengths_json(in_);
    x["S_new"] = in_.dims.S_new, x["S_max"] = in_.dims.S_max, x["paged"] = in_.dims.paged(),
    x["page_size"] = in_.dims.page_size;
    x["simulation"] = s.sim;
    out_->extras.push_back(x);
    out_->decoded.push_back(std::move(dr));
    out_->lines.push_back("  " + s.summary);
    return s.run;
  }

  RunRecord step(const KernelMode& e) {
    if (!session_) {
      DecodeOptions dopt;
      dopt.device = so_.device, dopt.timing = so_.timing, dopt.check = opt_.check, dopt.cpu_threads = opt_.threads;
      dopt.cpu_timing.warmup = std::min(opt_.timing.warmup, 1);
      dopt.cpu_timing.repeat = std::min(opt_.timing.repeat, 3);
      dopt.seed = opt_.seed, dopt.splits = opt_.decode.splits, dopt.keep_caches = opt_.decode.write_cache && !opt_.no_write;
      session_ = std::make_unique<DecodeSession>(std::move(in_), dopt);  // the caches can be GBs: no copy
    }
    DecodeRecord dr = session_->run(e);
    const double step_gbps = dr.run.gbps;
    const double attend_gbps = dr.attend.median_ms > 0 ? dr.kv_bytes / (dr.attend.median_ms * 1e-3) / 1e9 : 0;
    std::string line =
        fmt::format("  decode {}: splits {}{}, K+V {:.1f} MB; step (update + attention) {:.4f} ms {:.0f} GB/s{}",
                    e.kernel, dr.splits, opt_.decode.splits > 0 ? " (forced)" : "", dr.kv_bytes / 1e6,
                    dr.run.timing.median_ms, step_gbps, fraction_str(step_gbps, ref_.gbps, ref_.kind));
    if (dr.attend.median_ms > 0)
      line += fmt::format("; attention alone {:.4f} ms {:.0f} GB/s{}", dr.attend.median_ms, attend_gbps,
                          fraction_str(attend_gbps, ref_.gbps, ref_.kind));
    out_->lines.push_back(line);
    out_->extras.push_back(decode_json(dr, session_->inputs(), opt_.decode.splits, ref_.gbps, ref_.kind));
    RunRecord r = dr.run;
    out_->decoded.push_back(std::move(dr));
    return r;
  }

  const AppOptions& opt_;
  DecodeInputs& in_;
  const DecodeSimOptions& so_;
  const BandwidthRef& ref_;
  DecodeOutcome* out_;
  std::unique_ptr<DecodeSession> session_;
  size_t n_ = 0;  // records seen
};

// The session JSON of some of the records, with each one's "decode" object.
json decode_document(const ReportHeader& hdr, const DecodeOutcome& run, const std::vector<size_t>& which) {
  std::vector<RunRecord> runs;
  for (size_t k : which) runs.push_back(run.records[k]);
  json doc = session_json(hdr, runs);
  doc["data"]["kind"] = "decode";
  for (size_t n = 0; n < which.size(); ++n)
    if (!run.extras[which[n]].is_null()) doc["runs"][n]["decode"] = run.extras[which[n]];
  return doc;
}

void decode_report(const AppOptions& opt, const ReportHeader& hdr, const DecodeOutcome& run, const Console& con) {
  std::string baseline = opt.baseline;
  if (baseline.empty())
    for (const RunRecord& r : run.records)
      if (baseline.empty() && r.ok()) baseline = r.kernel;
  if (!opt.quiet || opt.json != "-") {
    con.print(render_table(run.records, baseline, opt.check));
    for (const std::string& l : run.lines) con.print(l + "\n");
    if (opt.decode.steps == 0) con.print("  (GB/s: K+V bytes read, sum_b L_b * H_kv * D * 2 * itemsize, over the median time)\n");
    for (const RunRecord& r : run.records)
      if (r.check.performed && (!opt.quiet || !r.check.passed)) con.print(render_check(r));
  }
  if (!opt.json.empty()) {
    std::vector<size_t> every(run.records.size());
    for (size_t k = 0; k < every.size(); ++k) every[k] = k;
    emit_json(opt.json, decode_document(hdr, run, every));
  }
}

}  // namespace

int run_decode(const AppOptions& opt) {
  check_options(opt);
  const Console con(opt.quiet, opt.json);
  const std::string started = iso8601_now();
  bool all = false;
  const std::vector<const KernelMode*> plan = plan_kernels(opt, &all);
  if (!opt.baseline.empty() &&
      std::none_of(plan.begin(), plan.end(), [&](const KernelMode* e) { return e->kernel == opt.baseline; }))
    throw InputError("--baseline: '" + opt.baseline + "' is not one of the kernels run (--compute)");

  DecodeDataset ds = load_checked(opt);
  if (!opt.json.empty() && opt.json != "-") check_output_file(opt.json, "--json");  // now against the inputs too
  std::vector<std::string> notes = ds.notices;
  auto out_dir_for = [&](const std::string& k) {
    if (opt.out.empty()) return (fs::path(opt.data) / "out" / k).string();
    return plan.size() == 1 ? opt.out : (fs::path(opt.out) / k).string();
  };
  if (!opt.no_write && opt.decode.steps == 0) {
    for (const KernelMode* e : plan) {
      const std::string dir = out_dir_for(e->kernel);
      std::error_code ec1, ec2;
      if (fs::weakly_canonical(dir, ec1) == fs::weakly_canonical(opt.data, ec2) || same_file(dir, opt.data))
        throw InputError("--out: " + dir + " is the input directory; outputs go to a directory of their own");
      OutputWriter::check_writable(dir);
    }
  }
  DecodeInputs in = make_decode_inputs(opt, ds, &notes);
  const DType dtype = in.dtype;

  const DeviceChoice dc = pick_device(opt.device, /*wants_gpu=*/true);
  const int device = dc.device;
  DecodeSimOptions so;
  so.device = device, so.timing = timing_options(opt), so.steps = opt.decode.steps, so.prompt_len = opt.decode.prompt_len;
  so.seed = opt.seed, so.splits = opt.decode.splits, so.check = opt.check, so.cpu_threads = opt.threads;
  std::vector<Planned> planned(plan.size());
  for (size_t k = 0; k < plan.size(); ++k) {
    const KernelMode& e = *plan[k];
    const int sm = device >= 0 ? dc.sm : std::max(e.min_sm, 1);
    std::string why = opt.decode.steps > 0 ? decode_sim_unsupported(e, in, so, sm) : decode_why_unsupported(e, in.dims, dtype, sm);
    if (why.empty() && device < 0 && e.gpu) why = "kernel '" + e.kernel + "' needs a GPU: " + dc.no_device;
    if (!why.empty() && !all) throw InputError(why);
    planned[k] = Planned{&e, why};
  }
  for (const std::string& n : notes) con.note(n);

  ReportHeader hdr;
  std::optional<DeviceInfo> dev;
  if (device >= 0) dev = query_device(device);
  hdr.command_line = opt.command_line;
  hdr.started_at = started;
  hdr.device = dev ? &*dev : nullptr;
  hdr.no_device_reason = dc.no_device;
  hdr.data_dir = opt.data;
  hdr.data_format = format_name(ds.format);
  hdr.input_dtype = dtype_name(ds.dtype);
  hdr.problem.dims = Dims{in.dims.B, in.dims.H, in.dims.H_kv, in.dims.S_new, in.dims.S_max, in.dims.D};
  hdr.problem.dtype = dtype;
  hdr.problem.layout = Layout::BHSD;
  hdr.problem.scale = in.scale;
  hdr.problem.causal = true;
  hdr.problem.has_padding = true;
  hdr.has_seqlens = true;
  hdr.timing = so.timing;
  hdr.cpu_threads = opt.threads;
  note_device_state(&hdr, device, &con);
  BandwidthRef ref;
  if (dev) ref.gbps = dev->peak_dram_gbps;
  if (opt.ceilings && dev) {
    const Ceilings c = measure_ceilings(device, so.timing);
    hdr.ceilings = ceilings_json(c);
    ref.gbps = c.copy_gbps;
    ref.kind = "copy";
  }
  if (!opt.quiet) con.print(decode_title(opt, in, hdr.device));

  DecodeOutcome run;
  DecodeWorkload work(opt, in, so, ref, &run);
  static_cast<Outcome&>(run) = run_planned(planned, all, work);
  if (hdr.device) hdr.sm_clock_end_mhz = nvml_sm_clock_mhz(*hdr.device);
  if (!opt.no_write && opt.decode.steps == 0) {
    for (size_t k = 0; k < run.records.size(); ++k) {
      if (!run.records[k].ok()) continue;
      const std::string dir = out_dir_for(run.records[k].kernel);
      OutputWriter w(dir, ds.format, Layout::BHSD, ds.input_paths);
      const KernelOutputs& o = run.records[k].outputs;
      if (o.o) w.add("O", *o.o);
      if (o.lse) w.add("lse", *o.lse);
      if (run.decoded[k].k_cache) w.add("K_cache", *run.decoded[k].k_cache);
      if (run.decoded[k].v_cache) w.add("V_cache", *run.decoded[k].v_cache);
      w.add_file("timing.json", json_text(decode_document(hdr, run, {k})));
      w.finish();
      con.note("wrote " + dir);
    }
  }
  decode_report(opt, hdr, run, con);
  return exit_code(run.any_failed, run.any_check_failed);
}

}  // namespace flashattn

#include "harness.h"

#include <fmt/format.h>

#include "flashattn/error.h"
#include "npy.h"

namespace flashattn {

void Console::note(const std::string& s) const {
  if (!quiet) std::fprintf(stderr, "note: %s\n", s.c_str());
}

void Console::print(const std::string& s) const {
  std::fputs(s.c_str(), human);
  std::fflush(human);
}

DeviceChoice pick_device(int requested, bool wants_gpu) {
  DeviceChoice d;
  d.wants_gpu = wants_gpu;
  if (!wants_gpu) return d;
  const int n = cuda_device_count(&d.no_device);
  if (n > 0) {
    if (requested < 0 || requested >= n)
      throw InputError(
          fmt::format("--device: {} is out of range ({} CUDA device{} present)", requested, n, n == 1 ? "" : "s"));
    d.device = requested;
    d.sm = query_device(d.device).sm();
  }
  return d;
}

void note_device_state(ReportHeader* hdr, int device, const Console* con) {
  if (!hdr->device) return;
  hdr->sm_clock_start_mhz = nvml_sm_clock_mhz(*hdr->device);
  hdr->other_processes = nvml_other_processes(*hdr->device);
  if (hdr->other_processes > 0) {
    hdr->warnings.push_back(
        fmt::format("{} other process(es) are using GPU {}: timings may be disturbed", hdr->other_processes, device));
    if (con != nullptr) con->note(hdr->warnings.back());
  }
}

const char* status_name(RunStatus s) {
  switch (s) {
    case RunStatus::Ok: return "ok";
    case RunStatus::Skipped: return "skipped";
    case RunStatus::Failed: return "failed";
  }
  return "?";
}

RunRecord not_run(const KernelMode& e, Mode mode, RunStatus status, const std::string& reason) {
  RunRecord r;
  r.kernel = e.kernel;
  r.mode = mode;
  r.gpu = e.gpu;
  r.status = status;
  r.reason = reason;
  return r;
}

Outcome run_planned(const std::vector<Planned>& plan, bool all, Workload& w) {
  Outcome out;
  auto record = [&](RunRecord r) {
    w.recorded(r);
    out.records.push_back(std::move(r));
  };
  for (const Planned& p : plan) {
    const KernelMode& e = *p.entry;
    if (!p.skip_reason.empty()) {
      record(not_run(e, e.mode, RunStatus::Skipped, p.skip_reason));
      continue;
    }
    try {
      RunRecord r = w.run(e);
      if (r.check.performed && !r.check.passed) out.any_check_failed = true;
      record(std::move(r));
    } catch (const InputError& err) {
      if (!all) throw;
      record(not_run(e, e.mode, RunStatus::Skipped, err.what()));
    } catch (const RuntimeError& err) {
      std::fprintf(stderr, "error: %s\n", err.what());
      record(not_run(e, e.mode, RunStatus::Failed, err.what()));
      out.any_failed = true;
    }
  }
  return out;
}

std::string json_text(const nlohmann::json& doc) {
  return doc.dump(2, ' ', false, nlohmann::json::error_handler_t::replace) + "\n";
}

void emit_json(const std::string& target, const nlohmann::json& doc) {
  if (target.empty()) return;
  const std::string text = json_text(doc);
  if (target == "-")
    std::fputs(text.c_str(), stdout);
  else
    write_file_atomic(target, text.data(), text.size());
}

int exit_code(bool any_failed, bool any_check_failed) {
  if (any_failed) return kExitRuntime;
  if (any_check_failed) return kExitValidation;
  return kExitOk;
}

}  // namespace flashattn

// The pieces every workload's driver shares (forward/backward in app.cpp, decode in
// decode_app.cpp): the console, the device choice, the device part of the report header, the
// plan -> skip -> run -> record loop over a small workload interface, records of runs that did
// not happen, the session JSON's destination and the exit code.
#pragma once

#include <cstdio>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "device_info.h"
#include "flashattn/registry.h"
#include "report.h"
#include "run.h"

namespace flashattn {

// Human output: the table and titles on stdout (stderr when the JSON goes to stdout), notes on
// stderr; --quiet drops the notes.
struct Console {
  bool quiet = false;
  FILE* human = stdout;
  Console(bool quiet_, const std::string& json_target) : quiet(quiet_), human(json_target == "-" ? stderr : stdout) {}
  void note(const std::string& s) const;
  void print(const std::string& s) const;
};

// The CUDA device a run uses: -1 when none is wanted or none is present (no_device says why).
struct DeviceChoice {
  bool wants_gpu = false;
  int device = -1;
  int sm = 0;
  std::string no_device;
};
// `requested` is --device; out of range is an input error when devices are present.
DeviceChoice pick_device(int requested, bool wants_gpu);

// The header's device fields at the start of a run: the SM clock, other processes on the GPU (a
// warning, also noted on `con` where one is given). Nothing without a device.
void note_device_state(ReportHeader* hdr, int device, const Console* con = nullptr);

// A record for a (kernel, mode) that did not run (skipped) or failed, and why.
RunRecord not_run(const KernelMode& e, Mode mode, RunStatus status, const std::string& reason);

// One (kernel, mode) of a plan: run it, or record it as skipped with the reason (made from the
// kernel's declared requirements before anything runs).
struct Planned {
  const KernelMode* entry = nullptr;
  std::string skip_reason;  // non-empty: recorded as skipped, not run
};

// What a workload (forward/backward, decode, decode simulation) gives the shared loop.
class Workload {
 public:
  virtual ~Workload() = default;
  // Runs one planned kernel: timed, checked when asked, its outputs kept for the commit. Throws
  // InputError for a problem this kernel refuses, RuntimeError when it fails.
  virtual RunRecord run(const KernelMode& e) = 0;
  // Told of each record in plan order, run or not (a workload keeping per-run extras aligns them).
  virtual void recorded(const RunRecord& r) { (void)r; }
};

struct Outcome {
  std::vector<RunRecord> records;  // in plan order
  bool any_failed = false, any_check_failed = false;
};

// Runs the plan in order: a skipped pair is recorded with its reason; an input error of one
// kernel skips it under `all` (named explicitly, it ends the command); a runtime error fails its
// run (printed at once) and the rest go on.
Outcome run_planned(const std::vector<Planned>& plan, bool all, Workload& w);

// The session JSON as written everywhere: two-space indent, invalid UTF-8 replaced, a newline.
std::string json_text(const nlohmann::json& doc);
// --json: "-" is stdout, anything else a file written atomically; empty: nothing.
void emit_json(const std::string& target, const nlohmann::json& doc);

// 1 when a run failed, else 3 when a check failed, else 0 (the documented exit codes).
int exit_code(bool any_failed, bool any_check_failed);

}  // namespace flashattn

// The pieces every workload's driver shares (forward/backward in app.cpp, decode in
// decode_app.cpp): the console, the device choice, the device part of the report header, records
// of runs that did not happen, the session JSON's destination and the exit code.
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

// The session JSON as written everywhere: two-space indent, invalid UTF-8 replaced, a newline.
std::string json_text(const nlohmann::json& doc);
// --json: "-" is stdout, anything else a file written atomically; empty: nothing.
void emit_json(const std::string& target, const nlohmann::json& doc);

// 1 when a run failed, else 3 when a check failed, else 0 (the documented exit codes).
int exit_code(bool any_failed, bool any_check_failed);

}  // namespace flashattn

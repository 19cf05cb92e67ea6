// Reports: the timing JSON (schema documented in README.md) and the console comparison table.
#pragma once

#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "device_info.h"
#include "problem.h"
#include "run.h"

namespace flashattn {

constexpr int kJsonSchemaVersion = 1;

// What the JSON says about the session apart from the runs.
struct ReportHeader {
  std::string command_line;
  std::string started_at;  // ISO 8601, UTC
  const DeviceInfo* device = nullptr;
  std::string no_device_reason;
  int sm_clock_start_mhz = -1, sm_clock_end_mhz = -1;
  std::string data_dir, data_format, input_dtype;
  Problem problem;
  bool has_mask = false, has_seqlens = false, generated_dout = false;
  TimingOptions timing;
  int cpu_threads = 0;
  int other_processes = -1;           // other compute processes on the GPU (NVML), -1 unknown
  std::vector<std::string> warnings;  // session-wide, e.g. other processes on the GPU
  nlohmann::json ceilings;            // --ceilings measurements (null when not measured)
};

// The "timing" object of a run (also used for the --ceilings measurements).
nlohmann::json timing_json(const TimingStats& t, int clock_start_mhz, int clock_end_mhz);
nlohmann::json device_json(const DeviceInfo* d, const std::string& no_device_reason, int clock_start, int clock_end);
nlohmann::json run_json(const ReportHeader& h, const RunRecord& r);
// The "check" object of a run (null when not performed).
nlohmann::json check_json(const CheckResult& c);
nlohmann::json session_json(const ReportHeader& h, const std::vector<RunRecord>& runs);

// Bytes for people: "512 B", "64 KiB", "16.1 MiB", "1.25 GiB" (the table, memory errors).
std::string human_bytes(double b);

// The comparison table: one row per run, speedup against `baseline` (kernel name) in the same mode.
std::string render_table(const std::vector<RunRecord>& runs, const std::string& baseline, bool with_check);
// Per-output error lines of a checked run, with the first mismatches when it failed.
std::string render_check(const RunRecord& r);

std::string iso8601_now();

}  // namespace flashattn

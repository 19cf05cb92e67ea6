// The flashattn command: options (parsed by main.cpp) and the orchestration from data directory to
// outputs, table and JSON.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace flashattn {

struct AppOptions {
  std::vector<std::string> compute;  // kernel names, or {"all"}
  std::string mode = "forward";      // forward | backward | both
  std::string data;
  std::string out;                   // empty: DATA/out/<kernel>
  bool causal = false;
  std::string window;                // "LEFT,RIGHT" or empty
  std::optional<double> scale;
  std::string dtype;                 // empty: the input's dtype
  std::string layout;                // empty: meta.json's, else bhsd
  int warmup = 3;
  int repeat = 20;
  double min_time_ms = 0;
  bool no_flush = false;
  bool check = false;
  std::string json;                  // FILE or "-" (stdout)
  bool no_write = false;
  uint64_t seed = 0;
  int device = 0;
  int threads = 0;
  bool deterministic = false;
  std::string baseline;              // kernel the speedup column is relative to
  bool quiet = false;
  std::string command_line;
};

// Runs the command; returns the exit code (0, 1 runtime failure, 3 validation failed). Usage and
// input errors are thrown as InputError (exit 2).
int run_app(const AppOptions& opt);

// `--list`: the support matrix derived from the registry (as text, or JSON when `json`).
std::string list_kernels(bool json);

}  // namespace flashattn

// The flashattn command: the orchestration from typed options (options.h, parsed by main.cpp) to
// outputs, table and JSON.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "options.h"
#include "timing.h"

namespace flashattn {


// Runs the command; returns the exit code (0, 1 runtime failure, 3 validation failed). Usage and
// input errors are thrown as InputError (exit 2).
int run_app(const AppOptions& opt);

// The timing options of the command line (shared by runs, sweeps and --ceilings), as
// type_options() checked them.
TimingOptions timing_options(const AppOptions& opt);

// `--list`: the support matrix derived from the registry (as text, or JSON when `json`).
std::string list_kernels(bool json);

}  // namespace flashattn

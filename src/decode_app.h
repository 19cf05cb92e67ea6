// `flashattn --mode decode`: the decode counterpart of run_app, from a decode data directory
// (data/README.md) to outputs, table and JSON; with --steps, the TTFT/TBT simulation instead
// (decode_sim.h).
#pragma once

#include <nlohmann/json.hpp>

#include "app.h"
#include "decode_run.h"

namespace flashattn {

// Runs the command in decode mode; returns the exit code (0, 1 runtime failure, 3 validation
// failed). Usage and input errors are thrown as InputError (exit 2).
int run_decode(const AppOptions& opt);

// The "decode" object of a run's JSON: the step's shape, cache lengths, paging, splits, bytes and
// bandwidth (GB/s of K+V read, and the fraction of `ref_gbps`, the measured copy rate when
// `ref_kind` is "copy", else the device's datasheet DRAM peak, "dram_peak").
nlohmann::json decode_json(const DecodeRecord& r, const DecodeInputs& in, int splits_option, double ref_gbps,
                           const char* ref_kind);

}  // namespace flashattn

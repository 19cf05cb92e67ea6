// The command's options, typed: what main.cpp parses (each option validated once, here), and what
// every workload (forward/backward, decode, decode simulation, sweep, ceilings) reads.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "flashattn/types.h"

namespace flashattn {

// --mode: which workload runs, and in it which passes.
enum class RunMode { Forward, Backward, Both, Decode };
const char* run_mode_name(RunMode m);  // "forward", "backward", "both", "decode"
// The passes of a forward/backward run (Both: forward then backward); {Decode} for decode.
std::vector<Mode> run_mode_passes(RunMode m);

// --window LEFT,RIGHT: keys [i - LEFT, i + RIGHT] around query i; -1 = unbounded on that side.
struct Window {
  int left = -1, right = -1;
};

// --dtype: the input's dtype (nothing given), each kernel its own (auto), or the dtypes listed
// (fp32,bf16: every kernel in each listed dtype it takes).
struct DtypeChoice {
  enum class Kind { Input, Auto, List };
  Kind kind = Kind::Input;
  std::vector<DType> list;  // Kind::List, in the order given, no repeats
  bool is_list() const { return kind == Kind::List; }
  bool one() const { return kind == Kind::List && list.size() == 1; }  // a single dtype
  std::string text() const;                                           // as typed ("" for Input)
};

// How each run is timed (timing.h's TimingOptions is built from it, with checks).
struct TimingChoice {
  int warmup = 3;
  int repeat = 20;  // --repeat / --min-samples
  double min_time_ms = 0;
  bool no_flush = false;       // --no-flush / --hot
  double max_noise_pct = 0.5;  // --max-noise: percent; 0 turns the noise rule off
  double max_time_s = 1.0;     // --max-time: wall seconds the noise rule may spend per run
};

// The decode workload's own options (decode_app.h), refused by the others.
struct DecodeChoice {
  int splits = 0;            // --splits N: split-K pieces per (batch, kv head); 0: the kernel's choice
  bool write_cache = false;  // --write-cache: also write the updated K_cache, V_cache
  int steps = 0;             // --steps N: prefill + N decode steps (TTFT/TBT simulation)
  int prompt_len = 0;        // --prompt-len N: prompt of the simulation (0: cache_seqlens)
};

struct AppOptions {
  std::vector<std::string> compute;  // kernel names, or {"all"}
  // Unset only for a sweep without --mode (each point's modes come from the preset).
  std::optional<RunMode> mode = RunMode::Forward;
  std::string data;
  std::string out;  // empty: DATA/out/<kernel>
  bool causal = false;
  std::optional<Window> window;
  std::optional<double> scale;
  DtypeChoice dtype;
  std::optional<Layout> layout;  // unset: meta.json's, else bhsd
  TimingChoice timing;
  std::string sweep;           // --sweep fa-grid | FILE.json (see sweep.h)
  bool dry_run = false;        // --dry-run: print the sweep's points and exit
  bool ceilings = false;       // --ceilings: measure GEMM and copy ceilings (ceilings.h)
  bool check = false;
  std::string json;  // FILE or "-" (stdout)
  bool no_write = false;
  uint64_t seed = 0;
  int device = 0;
  // --devices 0,1: GPU kernels run as a ring over these GPUs (two or more, distinct), the first
  // one's stream timing the run; empty: one GPU (--device).
  std::vector<int> devices;
  // --ring-rank R --ring-size N --ring-id FILE: this process is rank R of a ring of N processes
  // (one GPU each, --device), the NCCL unique id exchanged through FILE. ring_size 0: none.
  int ring_rank = 0, ring_size = 0;
  std::string ring_id;
  // --ring-baseline each|first: a ring's one-GPU runs on every card of it (default), or on the
  // first alone (SessionOptions::ring_baseline_each).
  bool ring_baseline_each = true;
  int threads = 0;
  bool deterministic = false;
  bool allow_nonfinite = false;  // run even when an input holds NaN or Inf (else exit 2)
  DecodeChoice decode;
  std::string baseline;     // kernel the speedup column is relative to
  bool quiet = false;
  std::string command_line;
};

// The options given as words, before they are typed.
struct OptionWords {
  std::string mode = "forward";
  bool mode_given = false;
  std::string window, dtype, layout, devices, ring_baseline;
  bool ring_rank_given = false;
};

// Types the words into `opt` and checks what every workload shares (ranges, conflicts); throws
// InputError naming the option. Checks that belong to one workload stay with it.
void type_options(const OptionWords& words, AppOptions* opt);

// The parsers behind type_options (InputError naming the option on anything else).
RunMode parse_run_mode(const std::string& s);            // forward | backward | both | decode
Window parse_window(const std::string& s);               // LEFT,RIGHT, integers >= -1
DtypeChoice parse_dtype_choice(const std::string& s);    // "" | auto | NAME[,NAME...]
Layout parse_layout_option(const std::string& s);        // bhsd | bshd
std::vector<int> parse_devices(const std::string& s);    // I,J[,K...]: two or more distinct indices

}  // namespace flashattn

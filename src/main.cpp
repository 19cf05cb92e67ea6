// flashattn: run, check and benchmark attention kernels. See README.md.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <exception>
#include <string>

#include "app.h"
#include "flashattn/error.h"
#include "version.h"

namespace {

const char* kExamples = R"(
Examples:
  flashattn --list
  flashattn-gen --out data/B2_H8_S512_D64 --B 2 --H 8 --S 512 --D 64
  flashattn --compute fa2 --mode both --data data/B2_H8_S512_D64
  flashattn --compute cpu,naive,cublas --mode both --data data/B2_H8_S512_D64 --check
  flashattn --compute all --mode forward --data DIR --causal --dtype bf16 --json results.json
  flashattn --compute cublas --data DIR --window 128,0 --repeat 50 --no-write --json -
  flashattn --compute cublas --sweep fa-grid --json results.jsonl
  flashattn --ceilings --json ceilings.json
  flashattn-gen --decode --out data/dec --B 16 --H 32 --H-kv 8 --D 128 --S-max 8192 --cache-seqlens 8191 --dtype bf16
  flashattn --mode decode --compute naive,mma --data data/dec --check --write-cache
  flashattn --mode decode --compute mma --data data/dec --steps 64 --prompt-len 4096

Exit codes: 0 ok, 1 runtime failure, 2 usage or input error, 3 validation (--check) failed.
)";

// An integer option's range, with a message of our own (CLI11's Range words it differently from
// one version to the next, and scripts and tests match the message).
CLI::Validator int_range(long long lo, long long hi) {
  return CLI::Validator(
      [lo, hi](std::string& v) -> std::string {
        const std::string why = "value " + v + " not in range " + std::to_string(lo) + " to " + std::to_string(hi);
        if (v.empty() || v.size() > 12) return why;
        size_t used = 0;
        long long x = 0;
        try {
          x = std::stoll(v, &used);
        } catch (const std::exception&) {
          return why;
        }
        return used == v.size() && x >= lo && x <= hi ? "" : why;
      },
      "INT in [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
}

}  // namespace

int main(int argc, char** argv) {
  flashattn::AppOptions opt;
  flashattn::OptionWords words;  // typed by type_options() once parsed
  for (int i = 0; i < argc; ++i) opt.command_line += (i ? " " : "") + std::string(argv[i]);

  // A seed is a decimal integer in [0, 2^64): CLI11 alone would wrap "-1" and saturate overflows.
  const CLI::Validator kUnsigned64(
      [](std::string& v) -> std::string {
        if (v.empty() || v.size() > 20 || v.find_first_not_of("0123456789") != std::string::npos)
          return "'" + v + "' is not an integer in [0, 2^64)";
        if (v.size() == 20 && v > "18446744073709551615") return "'" + v + "' is not an integer in [0, 2^64)";
        return "";
      },
      "UINT64");
  CLI::App app{"flashattn: run, check and benchmark attention kernels (forward, backward and decode)"};
  app.footer(kExamples);
  app.set_version_flag("--version", std::string("flashattn ") + flashattn::kVersion + " (" + flashattn::kGitSha +
                                        ", " + flashattn::kBuildType + ", CUDA archs " + flashattn::kCudaArchs + ")");
  bool list = false, list_json = false;
  app.add_flag("--list", list, "Print the support matrix (kernel x mode x dtype x head dims x features) and exit");
  app.add_flag("--list-json", list_json, "Print the support matrix as JSON and exit");
  app.add_option("--compute,-c", opt.compute, "Kernels to run: NAME[,NAME...] or all")->delimiter(',');
  app.add_option("--mode,-m", words.mode, "forward | backward | both | decode (a decode data directory)")->capture_default_str();
  app.add_option("--data,-d", opt.data, "Input directory (Q, K, V [, dO, seqlens_k, mask] as .npy or .bin)");
  app.add_option("--out,-o", opt.out, "Output directory (default DATA/out/<kernel>; with several kernels OUT/<kernel>)");
  app.add_flag("--causal", opt.causal, "Causal mask, bottom-right aligned: query i sees keys j <= i + S_k - S_q");
  app.add_option("--window", words.window, "Sliding window LEFT,RIGHT (-1 = unbounded)");
  app.add_option("--scale", opt.scale, "Softmax scale (default 1/sqrt(D))");
  app.add_option("--dtype", words.dtype, "Compute dtype fp32 | fp16 | bf16 (| fp64 for cpu), a list of them (fp32,bf16: each kernel in each listed dtype it takes) or auto (each kernel its own: the input's if it takes it, else bf16, fp16, fp32); default: the input's");
  app.add_option("--layout", words.layout, "Layout of the files: bhsd | bshd (default: meta.json's, else bhsd)");
  app.add_option("--warmup", opt.timing.warmup, "Untimed repetitions before timing")
      ->capture_default_str()
      ->check(int_range(0, 1000000));
  app.add_option("--repeat,--min-samples", opt.timing.repeat, "Timed repetitions (at least)")
      ->capture_default_str()
      ->check(int_range(1, 10000000));
  app.add_option("--min-time", opt.timing.min_time_ms, "Keep repeating until this many ms were timed")->capture_default_str();
  app.add_option("--max-noise", opt.timing.max_noise_pct,
                 "Then repeat until the relative stddev is at most PCT percent (0: no noise rule)")
      ->capture_default_str();
  app.add_option("--max-time", opt.timing.max_time_s, "...or until SEC seconds were spent in the timed loop")
      ->capture_default_str();
  app.add_flag("--no-flush,--hot", opt.timing.no_flush, "Do not flush the L2 cache between repetitions (hot timing)");
  app.add_option("--sweep", opt.sweep, "Run a grid of generated problems: fa-grid, or a preset FILE.json");
  app.add_flag("--dry-run", opt.dry_run, "With --sweep: print the grid's points (preset-file JSON) and exit");
  app.add_flag("--ceilings", opt.ceilings, "Measure bf16/fp32 cuBLAS GEMM TFLOP/s and copy GB/s (in the JSON)");
  app.add_flag("--check", opt.check, "Validate every output against the fp64 cpu reference");
  app.add_option("--json", opt.json, "Write the session JSON to FILE, or - for stdout");
  app.add_flag("--no-write", opt.no_write, "Benchmark only: write no output files");
  app.add_option("--seed", opt.seed, "Seed for generated inputs (dO) and row sampling")
      ->capture_default_str()
      ->check(kUnsigned64);
  auto* device_opt =
      app.add_option("--device", opt.device, "CUDA device index")->capture_default_str()->check(int_range(0, 1023));
  app.add_option("--devices", words.devices,
                 "Run GPU kernels as a ring over these GPUs (I,J[,...]): the sequence sharded across them, K/V "
                 "passed around by NCCL; one index for every rank (0,0) has that GPU play them all, to check a ring")
      ->excludes(device_opt);
  app.add_option("--ring-rank", opt.ring_rank, "This process's rank in a ring of processes, one GPU each (--device)");
  app.add_option("--ring-size", opt.ring_size, "Processes (GPUs) in that ring");
  app.add_option("--ring-id", opt.ring_id,
                 "File through which the ring's processes share NCCL's unique id: rank 0 creates it (a new path per "
                 "launch), the others wait for it");
  app.add_option("--ring-baseline", words.ring_baseline,
                 "A ring's one-GPU runs: each (every card of the ring in turn; the efficiency against their combined "
                 "rate too) or first (the first GPU alone); default each");
  app.add_option("--threads", opt.threads, "Threads for the cpu kernel and the reference (0 = all)")
      ->capture_default_str()
      ->check(int_range(0, 4096));
  app.add_flag("--deterministic", opt.deterministic, "Use a kernel's deterministic path where it has one");
  app.add_flag("--allow-nonfinite", opt.allow_nonfinite,
               "Run even when Q, K, V or dO hold NaN or Inf (by default an input error, exit 2)");
  app.add_option("--baseline", opt.baseline, "Kernel the speedup column is relative to (default cublas, else the first GPU kernel)");
  app.add_flag("--quiet,-q", opt.quiet, "Print only the table and errors");
  app.add_option("--splits", opt.decode.splits, "Decode: split-K pieces per (batch, kv head) (0: the kernel chooses)")
      ->capture_default_str();
  app.add_flag("--write-cache", opt.decode.write_cache, "Decode: also write the updated K_cache and V_cache");
  app.add_option("--steps", opt.decode.steps, "Decode: prefill, then N decode steps; reports TTFT and TBT (mean, p50, p99)")
      ->capture_default_str();
  app.add_option("--prompt-len", opt.decode.prompt_len, "Decode with --steps: prompt tokens per batch element (0: cache_seqlens)")
      ->capture_default_str();

  try {
    app.parse(argc, argv);
    // CLI11 drops the empty items of a delimited list: check the words as typed.
    for (int i = 1; i < argc; ++i) {
      const std::string arg = argv[i];
      std::string list;
      if ((arg == "--compute" || arg == "-c") && i + 1 < argc) list = argv[i + 1];
      else if (arg.rfind("--compute=", 0) == 0) list = arg.substr(10);
      else continue;
      if (list.empty() || list.front() == ',' || list.back() == ',' || list.find(",,") != std::string::npos)
        throw CLI::ValidationError("--compute", "an empty name in '" + list + "' (NAME[,NAME...])");
    }
    words.mode_given = app.count("--mode") > 0;
    words.ring_rank_given = app.count("--ring-rank") > 0;
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::CallForVersion& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "flashattn: %s (see --help)\n", e.what());
    return flashattn::kExitInput;
  }

  try {
    if (list || list_json) {
      std::fputs(flashattn::list_kernels(list_json).c_str(), stdout);
      return flashattn::kExitOk;
    }
    flashattn::type_options(words, &opt);
    return flashattn::run_app(opt);
  } catch (const flashattn::Error& e) {
    std::fprintf(stderr, "flashattn: %s\n", e.what());
    return e.exit_code();
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "flashattn: out of host memory\n");
    return flashattn::kExitRuntime;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "flashattn: %s\n", e.what());
    return flashattn::kExitRuntime;
  }
}

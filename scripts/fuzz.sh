#!/usr/bin/env bash
# Builds flashattn_fuzz (libFuzzer + ASan + UBSan over the .npy/.bin/meta.json readers) with
# clang++ in a build directory of its own, and runs it for SECONDS (default 60) on a copy of the
# seed corpus tests/fuzz/corpus. Exits 0 when nothing was found; non-zero on a crash, a leak, a
# sanitizer report, an input taking over 5 s (hang) or over 2 GiB; 77 when clang/libFuzzer is
# missing. The log, any reproducer (crash-*, leak-*, timeout-*, oom-*) and the grown corpus stay
# in the work directory it prints.
#
#   scripts/fuzz.sh                                      # 60 s, as scripts/test.sh runs it
#   scripts/fuzz.sh 900                                  # the long run (README "Reliability")
#   FLASHATTN_FUZZ_WORK=/tmp/fz scripts/fuzz.sh 600      # keep the work directory somewhere known
#   build-fuzz/tests/fuzz/flashattn_fuzz crash-<sha>     # replay a reproducer
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
secs=${1:-60}
build=${FLASHATTN_FUZZ_BUILD_DIR:-$root/build-fuzz}
cxx=${FLASHATTN_FUZZ_CXX:-clang++}
jobs=${FLASHATTN_JOBS:-$(nproc)}

if ! command -v "$cxx" >/dev/null; then
  echo "fuzz: skipped: $cxx not found (Debian: apt-get install clang)"
  exit 77
fi
probe=$(mktemp -d)
trap 'rm -rf "$probe"' EXIT
echo 'extern "C" int LLVMFuzzerTestOneInput(const unsigned char*, unsigned long) { return 0; }' >"$probe/p.cpp"
if ! "$cxx" -fsanitize=fuzzer,address,undefined "$probe/p.cpp" -o "$probe/p" >"$probe/log" 2>&1; then
  echo "fuzz: skipped: $cxx cannot link libFuzzer ($(head -n 1 "$probe/log")); Debian: apt-get install libclang-rt-dev"
  exit 77
fi

echo "fuzz: building flashattn_fuzz ($build)"
cmake -S "$root" -B "$build" -DFLASHATTN_FUZZ=ON -DCMAKE_CXX_COMPILER="$cxx" -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  >"$probe/configure.log" 2>&1 || { cat "$probe/configure.log"; exit 1; }
cmake --build "$build" -j "$jobs" --target flashattn_fuzz >"$probe/build.log" 2>&1 || { cat "$probe/build.log"; exit 1; }

work=${FLASHATTN_FUZZ_WORK:-$(mktemp -d -t flashattn-fuzz.XXXXXX)}
mkdir -p "$work/corpus"
cp "$root"/tests/fuzz/corpus/* "$work/corpus/"
echo "fuzz: running ${secs}s on $(ls "$work/corpus" | wc -l) seeds (work dir $work)"

rc=0
(cd "$work" && "$build/tests/fuzz/flashattn_fuzz" -max_total_time="$secs" -timeout=5 -rss_limit_mb=2048 -max_len=4096 \
  -dict="$root/tests/fuzz/readers.dict" -artifact_prefix="$work/" -print_final_stats=1 corpus) \
  >"$work/fuzz.log" 2>&1 || rc=$?

# The last status line ("#N DONE cov: ... ft: ... corpus: ...") and the executions per second.
grep -E '^#[0-9]+[[:space:]]+DONE' "$work/fuzz.log" | tail -n 1 | sed 's/^/fuzz: /' || true
grep -E '^stat::(number_of_executed_units|average_exec_per_sec|peak_rss_mb)' "$work/fuzz.log" | sed 's/^/fuzz: /' || true
if [ "$rc" -ne 0 ]; then
  echo "fuzz: FAILED (exit $rc); the end of $work/fuzz.log:"
  tail -n 40 "$work/fuzz.log"
  ls "$work" | grep -E '^(crash|leak|timeout|oom|slow-unit)-' | sed "s|^|fuzz: reproducer $work/|" || true
  exit "$rc"
fi
echo "fuzz: clean (no crash, leak, sanitizer report, hang or oom in ${secs}s)"

#!/usr/bin/env bash
# Installs what is missing, configures, builds, runs ctest (CPU tests; GPU tests skip without a
# device) and pytest, then the quality stages: cppcheck, the ring's stand-ins for a build without
# NCCL (scripts/ring_stubs.py), the CPU tests and pytest again against an
# ASan + UBSan build (its own build directory, one CUDA arch, host targets only), and a 60 s
# libFuzzer run over the input readers (skipped, saying why, without clang). Prints the time of
# every stage and a summary. Safe to re-run; works on a fresh CPU-only machine.
#
#   scripts/test.sh
#   FLASHATTN_BUILD_DIR=/tmp/b FLASHATTN_CUDA_ARCHS=90a scripts/test.sh
#   FLASHATTN_CI_SANITIZE=0 FLASHATTN_CI_FUZZ_SECONDS=0 scripts/test.sh   # skip the slow stages
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${FLASHATTN_BUILD_DIR:-$root/build}
jobs=${FLASHATTN_JOBS:-$(nproc)}
source "$root/scripts/lib.sh"
start=$(date +%s)

ensure_deps
build_start=$(date +%s)
build_tree "$root" "$build" "$jobs"
build_s=$(( $(date +%s) - build_start ))

declare -A stage_rc stage_s stage_why
stages=()
skip_note=$(mktemp)
trap 'rm -f "$skip_note"' EXIT
# skipped REASON: what a stage function prints and returns (77) when it cannot run here; the summary
# then says "skipped (REASON)", never "passed".
skipped() {
  echo "$1" >"$skip_note"
  echo "skipped: $1"
  return 77
}
# stage NAME COMMAND...: runs one stage, records its exit status and duration, never aborts.
stage() {
  local name=$1 t0 rc=0
  shift
  say "$name"
  : >"$skip_note"
  t0=$(date +%s)
  "$@" || rc=$?
  stage_rc[$name]=$rc
  stage_why[$name]=$(cat "$skip_note")
  stage_s[$name]=$(( $(date +%s) - t0 ))
  stages+=("$name")
  echo "-- $name: ${stage_s[$name]}s"
}

stage ctest ctest --test-dir "$build" --output-on-failure -j "$jobs"
gpu_note=$(grep -h "GPU tests skipped" "$build"/Testing/Temporary/LastTest.log 2>/dev/null | head -n 1 || true)
stage pytest env FLASHATTN_BUILD_DIR="$build" "$PY" -m pytest -q "$root/tests/py"

# cppcheck: clean on src/ and tools/. check.h's launch check has an #ifdef'd synchronisation
# between two identical tests, which cppcheck (checking the configuration without it) calls
# redundant: suppressed for that header only.
run_cppcheck() {
  if ! command -v cppcheck >/dev/null; then
    as_root apt-get install -y -q cppcheck >/dev/null 2>&1 || { skipped "cppcheck is not installed and could not be"; return; }
  fi
  (cd "$root" && cppcheck --quiet --enable=warning,performance,portability --std=c++17 --error-exitcode=1 \
    --inline-suppr --suppress=identicalInnerCondition:include/flashattn/check.h -I include -I src src tools)
}
stage cppcheck run_cppcheck

# A build without NCCL links src/ring.cpp's stand-ins for the Ring methods: every method the NCCL
# build defines must have one (scripts/ring_stubs.py compiles that half once more and compares).
run_ring_stubs() {
  local rc=0
  "$PY" "$root/scripts/ring_stubs.py" "$build" || rc=$?
  [[ $rc -eq 77 ]] && { skipped "this build has no NCCL: it links the stand-ins itself"; return; }
  return $rc
}
stage ring-stubs run_ring_stubs

# ASan + UBSan: the CPU tests and the CLI tests against sanitized binaries. Any report (a leak
# too) fails the run with its own exit code (86), so a test expecting exit 1 or 2 cannot pass by
# accident. The static CUDA runtime leaks nothing when no driver is present: no suppressions.
san_build=${FLASHATTN_SANITIZE_BUILD_DIR:-$build-asan}
run_sanitized() {
  mkdir -p "$san_build"
  # -O0 -g1: the instrumented host code (CLI11- and json-heavy) compiles 3-5x faster than at -O2,
  # line tables suffice for the reports, and without NDEBUG the library assertions stay on.
  cmake -S "$root" -B "$san_build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O0 -g1" \
    -DFLASHATTN_SANITIZE=ON -DFLASHATTN_CUDA_ARCHS=80 >"$san_build/configure.log" 2>&1 ||
    { cat "$san_build/configure.log"; return 1; }
  cmake --build "$san_build" -j "$jobs" --target flashattn flashattn-gen flashattn-compare flashattn_cpu_tests \
    >"$san_build/build.log" 2>&1 || { tail -n 40 "$san_build/build.log"; return 1; }
  echo "sanitized build: $(( $(date +%s) - san_t0 ))s"
  local rc=0
  export ASAN_OPTIONS="detect_leaks=1:exitcode=86:protect_shadow_gap=0:strict_string_checks=1:detect_stack_use_after_return=1"
  export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1:exitcode=86"
  ctest --test-dir "$san_build" -L cpu --output-on-failure -j "$jobs" || rc=$?
  FLASHATTN_BUILD_DIR="$san_build" "$PY" -m pytest -q "$root/tests/py" || rc=$?
  return $rc
}
if [ "${FLASHATTN_CI_SANITIZE:-1}" != 0 ]; then
  san_t0=$(date +%s)
  stage asan-ubsan run_sanitized
fi

fuzz_s=${FLASHATTN_CI_FUZZ_SECONDS:-60}
if [ "$fuzz_s" != 0 ]; then
  fuzz() {
    local rc=0
    FLASHATTN_FUZZ_BUILD_DIR=${FLASHATTN_FUZZ_BUILD_DIR:-$build-fuzz} bash "$root/scripts/fuzz.sh" "$fuzz_s" || rc=$?
    [ $rc -eq 77 ] && { skipped "clang++ with libFuzzer is not available (fuzz.sh says which)"; return; }
    return $rc
  }
  stage fuzz fuzz
fi

echo
say "summary"
echo "build: ${build_s}s   total: $(( $(date +%s) - start ))s"
ok=0
for name in "${stages[@]}"; do
  rc=${stage_rc[$name]}
  if [ "$rc" -eq 0 ]; then verdict=passed
  elif [ "$rc" -eq 77 ]; then verdict="skipped (${stage_why[$name]})"
  else verdict="FAILED ($rc)"; ok=1
  fi
  printf '%-11s %s (%ss)\n' "$name:" "$verdict" "${stage_s[$name]}"
done
for name in FLASHATTN_CI_SANITIZE:asan-ubsan FLASHATTN_CI_FUZZ_SECONDS:fuzz; do
  [ -n "${stage_rc[${name#*:}]:-}" ] || printf '%-11s %s\n' "${name#*:}:" "skipped (${name%%:*}=0)"
done
# The GPU test binaries exit 77 (ctest: skipped) without a device; say so rather than "passed".
if [ -n "$gpu_note" ]; then printf '%-11s %s\n' "gpu-tests:" "skipped (${gpu_note#GPU tests skipped: })"; fi
exit $ok

#!/usr/bin/env bash
# Installs what is missing, configures, builds, runs ctest (CPU tests; GPU tests skip without a
# device) and pytest, then prints a summary. Safe to re-run; works on a fresh CPU-only machine.
#
#   scripts/test.sh
#   FLASHATTN_BUILD_DIR=/tmp/b FLASHATTN_CUDA_ARCHS=90a scripts/test.sh
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

ctest_rc=0
say "ctest"
ctest --test-dir "$build" --output-on-failure -j "$jobs" || ctest_rc=$?
gpu_note=$(grep -h "GPU tests skipped" "$build"/Testing/Temporary/LastTest.log 2>/dev/null | head -n 1 || true)
py_rc=0
say "pytest"
FLASHATTN_BUILD_DIR="$build" "$PY" -m pytest -q "$root/tests/py" || py_rc=$?

echo
say "summary"
echo "build: ${build_s}s   total: $(( $(date +%s) - start ))s"
echo "ctest:  $([ $ctest_rc -eq 0 ] && echo passed || echo "FAILED ($ctest_rc)")"
echo "pytest: $([ $py_rc -eq 0 ] && echo passed || echo "FAILED ($py_rc)")"
if [ -n "$gpu_note" ]; then echo "$gpu_note"; fi
[ $ctest_rc -eq 0 ] && [ $py_rc -eq 0 ]

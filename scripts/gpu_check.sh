#!/usr/bin/env bash
# On a GPU machine: Release build for the GPU found (-j16), every test (GPU matrix included), then
# a benchmark of the GPU kernels next to PyTorch SDPA on the same data, ending with a short
# comparison table. Logs and JSON go to $GPU_CHECK_OUT (default ./results/gpu_check), generated
# data to $GPU_CHECK_DATA (default ./data/gpu_check).
#
#   scripts/gpu_check.sh                 # build + all tests + benchmark table
#   GPU_CHECK_TESTS=0 scripts/gpu_check.sh   # benchmark only
#   GPU_CHECK_BENCH=0 scripts/gpu_check.sh   # tests only
#   GPU_CHECK_FILTER='*cublas*' ...          # gtest filter for the GPU matrix
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${FLASHATTN_BUILD_DIR:-$root/build-gpu}
jobs=${FLASHATTN_JOBS:-16}
out=${GPU_CHECK_OUT:-$root/results/gpu_check}
source "$root/scripts/lib.sh"
mkdir -p "$out"
PY=${PYTHON:-python3}
export NCCL_NVLS_ENABLE=0
status=0

nvidia-smi --query-gpu=name,compute_cap,clocks.sm,clocks.max.sm,memory.used,memory.total --format=csv || true
t0=$(date +%s)
build_tree "$root" "$build" "$jobs" >"$out/build.log" 2>&1 || { tail -n 60 "$out/build.log"; exit 1; }
echo "build: $(( $(date +%s) - t0 ))s"
grep -h "spill\|stack frame" "$out/build.log" | grep -v " 0 bytes spill" | sort -u | head -20 || true

# The hopper kernels must be on Hopper's own paths: warpgroup MMAs (HGMMA) fed by the tensor copy
# engine (UTMALDG). An object without them means a silent fallback to older instructions.
say "hopper SASS"
check_hopper_sass "$build" || status=1

if [ "${GPU_CHECK_TESTS:-1}" != 0 ]; then
  say "GPU test matrix"
  t0=$(date +%s)
  "$build/tests/flashattn_gpu_tests" --gtest_brief=1 ${GPU_CHECK_FILTER:+--gtest_filter=$GPU_CHECK_FILTER} \
    >"$out/gpu_tests.log" 2>&1
  rc=$?
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |tests ran|FAILED  \]" "$out/gpu_tests.log" | tail -n 40
  echo "gpu tests: rc=$rc, $(( $(date +%s) - t0 ))s"
  [ $rc -eq 0 ] || status=1
  say "CPU tests and pytest"
  ctest --test-dir "$build" -L cpu -j "$jobs" >"$out/ctest.log" 2>&1 || { status=1; tail -n 30 "$out/ctest.log"; }
  tail -n 3 "$out/ctest.log"
  FLASHATTN_HAS_GPU=1 FLASHATTN_BUILD_DIR="$build" "$PY" -m pytest -q -x "$root/tests/py" >"$out/pytest.log" 2>&1 ||
    { status=1; tail -n 30 "$out/pytest.log"; }
  tail -n 1 "$out/pytest.log"
fi

if [ "${GPU_CHECK_BENCH:-1}" != 0 ]; then
  say "benchmark"
  data=${GPU_CHECK_DATA:-$root/data/gpu_check}
  # name  gen-args  flashattn-args
  cases=(
    "B4_H8_S1024_D64_fp32|--B 4 --H 8 --S 1024 --D 64 --dtype fp32|"
    "B4_H8_S1024_D64_bf16|--B 4 --H 8 --S 1024 --D 64 --dtype bf16|"
    "B4_H8_S1024_D64_bf16_causal|--B 4 --H 8 --S 1024 --D 64 --dtype bf16|--causal"
    "B2_H16_S2048_D128_fp16|--B 2 --H 16 --S 2048 --D 128 --dtype fp16|"
  )
  for c in "${cases[@]}"; do
    IFS='|' read -r name gargs fargs <<<"$c"
    [ -f "$data/$name/Q.npy" ] || "$build/flashattn-gen" --out "$data/$name" $gargs --seed 1 --with-dO >/dev/null
    dtype=$(sed -E 's/.*--dtype ([a-z0-9]+).*/\1/' <<<"$gargs")
    # Per mode, the GPU kernels that have that mode and take this case's dtype (naming one that
    # does not is an error).
    for mode in forward backward; do
      kernels=${GPU_CHECK_KERNELS:-$("$PY" - "$build" "$dtype" "$mode" <<'PYEOF'
import json, subprocess, sys
entries = json.loads(subprocess.run([sys.argv[1] + "/flashattn", "--list-json"], capture_output=True, text=True).stdout)
names = []
for e in sorted(entries, key=lambda e: e["rung"]):
    if e["gpu"] and e["kernel"] not in names and e["mode"] == sys.argv[3] and sys.argv[2] in e["dtypes"]:
        names.append(e["kernel"])
print(",".join(names))
PYEOF
)}
      "$build/flashattn" --compute "$kernels" --mode "$mode" --data "$data/$name" $fargs --check --no-write \
        --json "$out/$name.$mode.flashattn.json" --quiet >"$out/$name.$mode.flashattn.txt" 2>&1 ||
        { status=1; echo "flashattn failed on $name ($mode):"; tail -n 5 "$out/$name.$mode.flashattn.txt"; }
    done
    if [ -f "$root/scripts/peers.py" ]; then
      "$PY" "$root/scripts/peers.py" --capi "$build/libflashattn_capi.so" "$data/$name" --mode both $fargs \
        --json "$out/$name.peers.json" \
        >"$out/$name.peers.txt" 2>&1 || { status=1; tail -n 5 "$out/$name.peers.txt"; }
    fi
  done
  say "comparison (ratio = PyTorch SDPA median time / kernel median time; >1 means faster than that backend)"
  "$PY" "$root/scripts/report.py" --table --baseline peers "$out"/*.json || status=1
fi
exit $status

#!/usr/bin/env bash
# The hopper forward kernel's own check and benchmark, on an H100/H200: the SASS must hold HGMMA
# and UTMALDG, the GPU test matrix's hopper cases must pass, then scripts/presets/hopper_fwd.json
# (FlashAttention's grid at D 64/128/256, causal or not, plus GQA 32/8 at D128; bf16, forward;
# every row --check'ed) for hopper and its ablation variants, PyTorch SDPA's flash and cuDNN
# backends on the same inputs, and the comparison table last. docs/PERF.md's hopper entries come
# from this script.
#
#   scripts/hopper_bench.sh                        # every stage (about 8 minutes once built)
#   HOPPER_STAGES="tests sweep" scripts/hopper_bench.sh
#   HOPPER_VARIANTS="default grid=tiles" ...       # which kernel variants the sweep runs
#   HOPPER_PRESET=scripts/presets/hopper_bwd.json ... # the backward's grid (D 64/128, bf16) instead
#
# Stages: sass, tests, sweep (one JSON Lines file per variant), peers, table. A variant is
# "default" or NAME=VALUE for FLASHATTN_HOPPER_NAME (schedule=serial: the step-1 schedule, D128
# only; grid=tiles: one CTA per tile instead of the persistent grid; d64_rows=128 or 192 and
# d128_rows=128 or 192: force one of D64's or D128's two tile heights instead of the kernel's
# choice).
# Environment: FLASHATTN_BUILD_DIR (default build-gpu), HOPPER_OUT (default results/hopper).
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${FLASHATTN_BUILD_DIR:-$root/build-gpu}
out=${HOPPER_OUT:-$root/results/hopper}
stages=" ${HOPPER_STAGES:-sass tests sweep peers table} "
variants=${HOPPER_VARIANTS:-default}
preset=${HOPPER_PRESET:-$root/scripts/presets/hopper_fwd.json}
PY=${PYTHON:-python3}
export NCCL_NVLS_ENABLE=0
source "$root/scripts/lib.sh"
mkdir -p "$out"
status=0
want() { [[ "$stages" == *" $1 "* ]]; }

if [ ! -x "$build/flashattn" ]; then
  t0=$(date +%s)
  build_tree "$root" "$build" "${FLASHATTN_JOBS:-16}" >"$out/build.log" 2>&1 || { tail -n 40 "$out/build.log"; exit 1; }
  echo "build: $(( $(date +%s) - t0 ))s"
fi
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu --format=csv,noheader 2>/dev/null

if want sass; then
  say "hopper SASS"
  check_hopper_sass "$build" || status=1
fi

if want tests; then
  say "GPU test matrix, hopper cases"
  "$build/tests/flashattn_gpu_tests" --gtest_brief=1 --gtest_filter='*hopper*' >"$out/tests.log" 2>&1 || status=1
  grep -E "^\[  (PASSED|FAILED|SKIPPED) |FAILED  \]" "$out/tests.log" | tail -n 20
fi

if want sweep; then
  for v in $variants; do
    say "sweep: hopper ($v)"
    env_args=()
    if [ "$v" != default ]; then
      name=$(tr '[:lower:]' '[:upper:]' <<<"${v%%=*}")
      env_args=("FLASHATTN_HOPPER_$name=${v#*=}")
    fi
    tag=${v//=/-}
    t0=$(date +%s)
    env "${env_args[@]}" "$build/flashattn" --sweep "$preset" --compute hopper --warmup 2 --repeat 10 --max-time 0.25 \
      --check --no-write -q --json "$out/hopper_$tag.jsonl" >"$out/hopper_$tag.log" 2>&1 || status=1
    echo "   ($(( $(date +%s) - t0 ))s)"
  done
fi

if want peers; then
  say "PyTorch SDPA (flash, cuDNN) on the same preset"
  "$PY" "$root/scripts/peers.py" --capi "$build/libflashattn_capi.so" --sweep "$preset" --backends flash,cudnn \
    --warmup 2 --repeat 10 --max-time 0.25 --seed 0 --json "$out/peers.jsonl" >"$out/peers.log" 2>&1 || status=1
fi

if want table; then
  say "comparison (ratio = PyTorch median / kernel median; > 1: faster than that backend)"
  for f in "$out"/hopper_*.jsonl; do
    v=$(basename "$f" .jsonl)
    "$PY" "$root/scripts/report.py" --table --baseline peers "$f" "$out/peers.jsonl" >"$out/table_$v.md" || status=1
    echo "-- ${v#hopper_} (full table: $out/table_$v.md)"
    grep -E "\| hopper \|" "$out/table_$v.md" | cut -d'|' -f2,9,12,13
  done
fi
exit $status

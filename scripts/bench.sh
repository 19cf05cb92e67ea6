#!/usr/bin/env bash
# Regenerates the README's results on a GPU machine: tables, CSV and plots under docs/results/
# and the section of README.md between the results markers. About 4-6 minutes on an H100 once
# built (each stage prints its time; the budget is 10 minutes).
#
#   scripts/bench.sh                 # build if needed, measure, report
#   BENCH_PEERS=0 scripts/bench.sh   # without PyTorch
#
# Stages, all on inputs generated on the device (no data files):
#   1. flashattn --ceilings                      bf16/fp32 cuBLAS GEMM and copy ceilings (roofline)
#   2. flashattn --sweep fa-grid --dtype bf16    FlashAttention's grid (B*S = 16384, H*D = 2048,
#                                                S 512..16k, D 64/128, causal or not, fwd + bwd) for
#                                                the bf16 kernels that take D 64 or 128 (not naive:
#                                                minutes per point at S = 16k)
#   3. flashattn --sweep scripts/presets/fp32_ladder.json    the fp32 kernels on the ladder shapes
#   4. peers.py --sweep (same two grids)         PyTorch SDPA flash, cuDNN, efficient, math
#   5. report.py                                 docs/results/{results.md,summary.md,results.csv,*.png}
#                                                and README.md's results section
# Environment: FLASHATTN_BUILD_DIR (default build-gpu), BENCH_OUT (raw JSON Lines, default
# results/bench), BENCH_DOCS (default docs/results), BENCH_GRID_KERNELS / BENCH_FP32_KERNELS
# (override the kernel lists), BENCH_MAX_TIME (noise-rule time cap per run, default 0.25 s).
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${FLASHATTN_BUILD_DIR:-$root/build-gpu}
out=${BENCH_OUT:-$root/results/bench}
docs=${BENCH_DOCS:-$root/docs/results}
max_time=${BENCH_MAX_TIME:-0.25}
PY=${PYTHON:-python3}
source "$root/scripts/lib.sh"
mkdir -p "$out" "$docs"
t_all=$(date +%s)
stage() {  # stage NAME CMD...: runs and times one stage; a failed stage is reported, not fatal
  local t0=$(date +%s) rc name=$1
  say "$name"
  shift
  "$@"
  rc=$?
  echo "   ($name: $(( $(date +%s) - t0 ))s, exit $rc)"
  [ $rc -eq 0 ] || status=1
}
status=0

if [ ! -x "$build/flashattn" ]; then
  t0=$(date +%s)
  build_tree "$root" "$build" "${FLASHATTN_JOBS:-16}" >"$out/build.log" 2>&1 || { tail -n 40 "$out/build.log"; exit 1; }
  echo "build: $(( $(date +%s) - t0 ))s (not counted in the benchmark budget)"
  t_all=$(date +%s)
fi
fa="$build/flashattn"
nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm,power.draw,temperature.gpu,memory.used --format=csv 2>/dev/null

kernels_for() {  # kernels_for grid|fp32: GPU kernels from the registry
  "$fa" --list-json | "$PY" -c '
import json, sys
which, names = sys.argv[1], []
for e in json.load(sys.stdin):
    if not e["gpu"] or e["kernel"] in names:
        continue
    dims = e["head_dims"] or []
    takes = lambda d: (d in dims) if dims else (e["max_head_dim"] in (0, None) or d <= e["max_head_dim"])
    if which == "grid" and "bf16" in e["dtypes"] and (takes(64) or takes(128)) and e["kernel"] != "naive":
        names.append(e["kernel"])
    if which == "fp32" and "fp32" in e["dtypes"]:
        names.append(e["kernel"])
print(",".join(names))' "$1"
}
grid_k=${BENCH_GRID_KERNELS:-$(kernels_for grid)}
fp32_k=${BENCH_FP32_KERNELS:-$(kernels_for fp32)}
ladder="$root/scripts/presets/fp32_ladder.json"
echo "bf16 grid kernels: $grid_k; fp32 ladder kernels: $fp32_k"

stage "ceilings" "$fa" --ceilings --json "$out/ceilings.json"
# The grid: at least 10 samples, then the noise rule up to max_time per run.
stage "fa-grid (bf16)" "$fa" --sweep fa-grid --compute "$grid_k" --dtype bf16 --warmup 2 --repeat 10 \
  --max-time "$max_time" --json "$out/grid.jsonl"
# The ladder holds the slow rungs (naive: up to 1.5 s a run): 5 samples, 1 warm-up.
stage "fp32 ladder" "$fa" --sweep "$ladder" --compute "$fp32_k" --warmup 1 --repeat 5 --max-time "$max_time" \
  --json "$out/ladder.jsonl"
if [ "${BENCH_PEERS:-1}" != 0 ]; then
  if "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    stage "PyTorch SDPA on fa-grid" "$PY" "$root/scripts/peers.py" --sweep fa-grid --dtype bf16 --warmup 2 \
      --repeat 10 --max-time "$max_time" --json "$out/grid_peers.jsonl"
    stage "PyTorch SDPA on the fp32 ladder" "$PY" "$root/scripts/peers.py" --sweep "$ladder" --warmup 1 --repeat 5 \
      --max-time "$max_time" --json "$out/ladder_peers.jsonl"
  else
    echo "PyTorch with CUDA is not importable: the tables have no PyTorch rows"
  fi
fi

if ! "$PY" -c 'import matplotlib' 2>/dev/null; then
  say "installing matplotlib (for the plots)"
  "$PY" -m pip install -q matplotlib 2>/dev/null || "$PY" -m pip install -q --break-system-packages matplotlib
fi
inputs=()
for f in ceilings.json grid.jsonl ladder.jsonl grid_peers.jsonl ladder_peers.jsonl; do
  [ -s "$out/$f" ] && inputs+=("$out/$f")
done
stage "report" "$PY" "$root/scripts/report.py" "${inputs[@]}" --md "$docs/results.md" \
  --summary "$docs/summary.md" --csv "$docs/results.csv" --plots "$docs" --readme "${BENCH_README:-$root/README.md}"
total=$(( $(date +%s) - t_all ))
echo "bench: ${total}s in all$([ $total -gt 600 ] && echo " (over the 10-minute budget: lower BENCH_MAX_TIME)")"
echo "raw results: $out; tables and plots: $docs; README.md results section updated"
exit $status

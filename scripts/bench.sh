#!/usr/bin/env bash
# Regenerates the README's results on a GPU machine: tables, CSV and plots under docs/results/
# and the section of README.md between the results markers. Every row is checked (--check: the
# fp64 reference and the same-dtype baseline on sampled rows, for our kernels and, through
# libflashattn_capi, for the PyTorch peers), and both sides are timed the same way (events around
# each repetition, the stream held until a batch is enqueued, L2 flushed clean in between). About
# 7-9 minutes on an H100 once built, the checks' host work included (each stage prints its time).
#
#   scripts/bench.sh                 # build if needed, measure, report
#   BENCH_PEERS=0 scripts/bench.sh   # without PyTorch
#   BENCH_STAGES="decode report" scripts/bench.sh   # some stages only (raw results are kept)
#
# Stages, all on inputs generated on the device (no data files), except decode:
#   ceilings  flashattn --ceilings                      bf16/fp32 cuBLAS GEMM and copy ceilings
#   grid      flashattn --sweep fa-grid --dtype bf16    FlashAttention's grid (B*S = 16384,
#             H*D = 2048, S 512..16k, D 64/128, causal or not, fwd + bwd) for the bf16 kernels that
#             take D 64 or 128 (not naive: minutes per point at S = 16k), --check
#   ladder    flashattn --sweep scripts/presets/fp32_ladder.json   the fp32 kernels, --check
#   peers     peers.py --sweep (same two grids, same seed: the same input values)   PyTorch SDPA
#             flash, cuDNN, efficient, math, each row checked by the same validator
#   decode    flashattn-gen --decode, then flashattn --mode decode --check and peers.py, cold and
#             hot, on the decode points (bf16, H32 H_kv8 D128, one new token)
#   report    report.py: docs/results/{results.md,summary.md,results.csv,decode.md,*.png} and
#             README.md's results section
# Environment: FLASHATTN_BUILD_DIR (default build-gpu), BENCH_OUT (raw JSON Lines, default
# results/bench), BENCH_DOCS (default docs/results), BENCH_GRID_KERNELS / BENCH_FP32_KERNELS /
# BENCH_DECODE_KERNELS (override the kernel lists), BENCH_MAX_TIME (noise-rule time cap per run,
# default 0.25 s), BENCH_STAGES (default: all of the above).
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${FLASHATTN_BUILD_DIR:-$root/build-gpu}
out=${BENCH_OUT:-$root/results/bench}
docs=${BENCH_DOCS:-$root/docs/results}
max_time=${BENCH_MAX_TIME:-0.25}
stages=" ${BENCH_STAGES:-ceilings grid ladder peers decode report} "
PY=${PYTHON:-python3}
export NCCL_NVLS_ENABLE=0
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

want() { [[ "$stages" == *" $1 "* ]]; }
capi="$build/libflashattn_capi.so"

kernels_for() {  # kernels_for grid|fp32|decode: GPU kernels from the registry
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
    if which == "decode" and e["mode"] == "decode" and "bf16" in e["dtypes"] and takes(128) and e["kernel"] != "naive":
        names.append(e["kernel"])
print(",".join(names))' "$1"
}
grid_k=${BENCH_GRID_KERNELS:-$(kernels_for grid)}
fp32_k=${BENCH_FP32_KERNELS:-$(kernels_for fp32)}
decode_k=${BENCH_DECODE_KERNELS:-$(kernels_for decode)}
ladder="$root/scripts/presets/fp32_ladder.json"
echo "bf16 grid kernels: $grid_k; fp32 ladder kernels: $fp32_k; decode kernels: $decode_k"
has_torch() { "$PY" -c 'import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; }
peers=0
if [ "${BENCH_PEERS:-1}" != 0 ]; then
  if has_torch; then peers=1; else echo "PyTorch with CUDA is not importable: the tables have no PyTorch rows"; fi
fi

want ceilings && stage "ceilings" "$fa" --ceilings --json "$out/ceilings.json"
# The grid: at least 10 samples, then the noise rule up to max_time per run; every run checked.
want grid && stage "fa-grid (bf16)" "$fa" --sweep fa-grid --compute "$grid_k" --dtype bf16 --warmup 2 --repeat 10 \
  --max-time "$max_time" --check --seed 0 --json "$out/grid.jsonl"
# The ladder holds the slow rungs (naive: up to 1.5 s a run): 5 samples, 1 warm-up.
want ladder && stage "fp32 ladder" "$fa" --sweep "$ladder" --compute "$fp32_k" --warmup 1 --repeat 5 \
  --max-time "$max_time" --check --seed 0 --json "$out/ladder.jsonl"
if want peers && [ $peers = 1 ]; then
  stage "PyTorch SDPA on fa-grid" "$PY" "$root/scripts/peers.py" --capi "$capi" --sweep fa-grid --dtype bf16 \
    --warmup 2 --repeat 10 --max-time "$max_time" --seed 0 --json "$out/grid_peers.jsonl"
  stage "PyTorch SDPA on the fp32 ladder" "$PY" "$root/scripts/peers.py" --capi "$capi" --sweep "$ladder" --warmup 1 \
    --repeat 5 --max-time "$max_time" --seed 0 --json "$out/ladder_peers.jsonl"
fi

# Decode: one step of bf16 H32 H_kv8 D128 with one new token, at the points of the decode issue,
# cold (L2 flushed clean before every repetition) and hot, ours and PyTorch's on the same data.
decode_points=(
  "B16_S8192|--B 16 --S-max 8256 --cache-seqlens 8191"
  "B64_S2048|--B 64 --S-max 2112 --cache-seqlens 2047"
  "B1_S32768|--B 1 --S-max 32832 --cache-seqlens 32767"
  "B1_S4096|--B 1 --S-max 4160 --cache-seqlens 4095"
  "B16_S8192_paged64|--B 16 --S-max 8256 --cache-seqlens 8191 --page-size 64"
)
run_decode() {
  local copy name gargs dir
  copy=$("$PY" -c 'import json,sys; print(json.load(open(sys.argv[1]))["ceilings"]["copy_gbps"])' "$out/ceilings.json" \
         2>/dev/null || echo "")
  for p in "${decode_points[@]}"; do
    IFS='|' read -r name gargs <<<"$p"
    dir="$out/data/dec_$name"
    [ -f "$dir/K_cache.npy" ] || "$build/flashattn-gen" --decode --out "$dir" --H 32 --H-kv 8 --D 128 --dtype bf16 \
      --seed 3 $gargs >/dev/null || return 1
    for temp in cold hot; do
      local hot=()
      [ $temp = hot ] && hot=(--hot)
      "$fa" --mode decode --compute "$decode_k" --data "$dir" --check --no-write "${hot[@]}" --repeat 20 \
        --max-time "$max_time" --json "$out/decode_${name}_$temp.json" --quiet || return 1
      if [ $peers = 1 ]; then
        "$PY" "$root/scripts/peers.py" --capi "$capi" "$dir" --mode decode --backends flash,cudnn "${hot[@]}" \
          --repeat 20 --max-time "$max_time" ${copy:+--copy-gbps "$copy"} --json "$out/decode_${name}_${temp}_peers.json" \
          >/dev/null || return 1
      fi
    done
    echo "   decode $name: done"
  done
}
want decode && stage "decode (cold and hot)" run_decode

if want report; then
  if ! "$PY" -c 'import matplotlib' 2>/dev/null; then
    say "installing matplotlib (for the plots)"
    "$PY" -m pip install -q matplotlib 2>/dev/null || "$PY" -m pip install -q --break-system-packages matplotlib
  fi
  inputs=()
  for f in ceilings.json grid.jsonl ladder.jsonl grid_peers.jsonl ladder_peers.jsonl; do
    [ -s "$out/$f" ] && inputs+=("$out/$f")
  done
  for f in "$out"/decode_*.json; do [ -s "$f" ] && inputs+=("$f"); done
  stage "report" "$PY" "$root/scripts/report.py" "${inputs[@]}" --md "$docs/results.md" \
    --summary "$docs/summary.md" --csv "$docs/results.csv" --decode-md "$docs/decode.md" --plots "$docs" \
    --readme "${BENCH_README:-$root/README.md}"
fi
total=$(( $(date +%s) - t_all ))
echo "bench: ${total}s in all"
echo "raw results: $out; tables and plots: $docs; README.md results section updated"
exit $status

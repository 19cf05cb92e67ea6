#!/usr/bin/env bash
# On a machine with two or more GPUs: flashattn's ring (--devices) and PyTorch's context
# parallelism (scripts/peers_ring.py, under torchrun) on the same preset, every ring of ours
# --check'ed; then the side-by-side table (scripts/report_ring.py) and the model of larger rings
# (scripts/ring_model.py).
#
#   scripts/ring_bench.sh                      # scripts/presets/ring.json, hopper, GPUs 0,1
#   RING_PRESET=FILE RING_KERNEL=mma RING_DEVICES=0,1,2,3 RING_OUT=results/ring scripts/ring_bench.sh
#
# Builds (Release, -j16) into $FLASHATTN_BUILD_DIR (default build-gpu) when flashattn or
# libflashattn_capi is missing. Writes $RING_OUT/{ours,peers}.jsonl, table.md, model.md.
set -euo pipefail
export NCCL_NVLS_ENABLE=0  # NVLink multicast stays off
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
build=${FLASHATTN_BUILD_DIR:-build-gpu}
preset=${RING_PRESET:-scripts/presets/ring.json}
kernel=${RING_KERNEL:-hopper}
devices=${RING_DEVICES:-0,1}
out=${RING_OUT:-results/ring}
n=$(awk -F, '{print NF}' <<<"$devices")

if [ ! -x "$build/flashattn" ] || [ ! -f "$build/libflashattn_capi.so" ]; then
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$build" -j16 --target flashattn flashattn_capi >/dev/null
fi
mkdir -p "$out"
rm -f "$out/ours.jsonl" "$out/peers.jsonl"
"$build/flashattn" --devices "$devices" --sweep "$preset" --compute "$kernel" --mode both --check \
  --warmup 2 --repeat 5 --max-time 0.5 --no-write --json "$out/ours.jsonl"
CUDA_VISIBLE_DEVICES=$devices torchrun --standalone --nproc-per-node "$n" scripts/peers_ring.py --sweep "$preset" \
  --mode both --warmup 2 --repeat 5 --capi "$build/libflashattn_capi.so" --json "$out/peers.jsonl"
python3 scripts/report_ring.py "$out/ours.jsonl" "$out/peers.jsonl" --kernel "$kernel" | tee "$out/table.md"
python3 scripts/ring_model.py "$out/ours.jsonl" >"$out/model.md"
echo "ring_bench: $out/table.md, $out/model.md"

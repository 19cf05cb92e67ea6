#!/usr/bin/env bash
# On a machine with two or more GPUs: flashattn's ring (--devices) and PyTorch's context
# parallelism (scripts/peers_ring.py, under torchrun) on the same preset, every ring of ours
# --check'ed; then the side-by-side table (scripts/report_ring.py) and the model of larger rings
# (scripts/ring_model.py). Each side also times its kernel alone on every card of the ring
# (--ring-baseline each): the table's efficiency against the cards' combined rate, and each card's
# time, which tells a slower card from a slower ring.
#
#   scripts/ring_bench.sh                      # scripts/presets/ring.json, hopper, GPUs 0,1
#   RING_PRESET=FILE RING_KERNEL=mma RING_DEVICES=0,1,2,3 RING_OUT=results/ring scripts/ring_bench.sh
#   RING_ONLY=peers scripts/ring_bench.sh; RING_ONLY=ours scripts/ring_bench.sh
#                                              # one side per call (a long --check), same $RING_OUT
#
# Builds (Release, -j16) flashattn and libflashattn_capi into $FLASHATTN_BUILD_DIR (default
# build-gpu), incrementally. Writes $RING_OUT/{ours,peers}.jsonl, and table.md and model.md once
# both are there.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
source scripts/lib.sh
ring_settings  # NCCL_NVLS_ENABLE=0; build, preset, kernel, devices
out=${RING_OUT:-results/ring}
only=${RING_ONLY:-}
case "$only" in "" | ours | peers) ;; *) echo "ring_bench: RING_ONLY must be ours or peers, got '$only'" >&2; exit 2 ;; esac
n=$(awk -F, '{print NF}' <<<"$devices")

ring_build flashattn flashattn_capi
mkdir -p "$out"
if [ "$only" != peers ]; then
  rm -f "$out/ours.jsonl"
  "$build/flashattn" --devices "$devices" --sweep "$preset" --compute "$kernel" --mode both --check \
    --warmup 2 --repeat 5 --max-time 0.5 --no-write --json "$out/ours.jsonl"
fi
if [ "$only" != ours ]; then
  rm -f "$out/peers.jsonl"
  CUDA_VISIBLE_DEVICES=$devices torchrun --standalone --nproc-per-node "$n" scripts/peers_ring.py --sweep "$preset" \
    --mode both --warmup 2 --repeat 5 --capi "$build/libflashattn_capi.so" --json "$out/peers.jsonl"
fi
if [ ! -f "$out/ours.jsonl" ] || [ ! -f "$out/peers.jsonl" ]; then
  echo "ring_bench: $out/${only}.jsonl written; run the other side (RING_ONLY) for the table"
  exit 0
fi
python3 scripts/report_ring.py "$out/ours.jsonl" "$out/peers.jsonl" --kernel "$kernel" | tee "$out/table.md"
python3 scripts/ring_model.py "$out/ours.jsonl" >"$out/model.md"
echo "ring_bench: $out/table.md, $out/model.md"

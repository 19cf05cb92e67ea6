#!/usr/bin/env bash
# One command on a fresh machine: installs what is missing, builds, generates a default dataset,
# runs every available kernel forward and backward with --check, each in its own dtype (--dtype
# auto: the fp32 ladder and the bf16 tensor-core kernels in one table), and prints the table.
# Without a GPU only the cpu kernel runs, and the table says why the others were skipped.
#
#   scripts/run.sh                      # default dataset B2_H8_S512_D64, fp32
#   scripts/run.sh --dtype bf16 --causal   # extra arguments go to flashattn
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${FLASHATTN_BUILD_DIR:-$root/build}
jobs=${FLASHATTN_JOBS:-$(nproc)}
source "$root/scripts/lib.sh"

ensure_deps
build_tree "$root" "$build" "$jobs" >/dev/null
data=${FLASHATTN_DATA:-$root/data/B2_H8_S512_D64}
if [ ! -f "$data/Q.npy" ] && [ ! -f "$data/Q.bin" ]; then
  say "generating $data"
  "$build/flashattn-gen" --out "$data" --B 2 --H 8 --S 512 --D 64 --seed 0 --with-dO
fi
# --dtype auto unless the arguments name a dtype.
dtype_args=(--dtype auto)
for a in "$@"; do
  if [[ $a == --dtype* ]]; then dtype_args=(); fi
done
say "flashattn --compute all --mode both --check ${dtype_args[*]}"
"$build/flashattn" --compute all --mode both --data "$data" --check "${dtype_args[@]}" "$@"

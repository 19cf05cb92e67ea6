#!/usr/bin/env bash
# The ring (--devices) on one preset under several settings of its switches (the FLASHATTN_RING_*
# ablations), interleaved in rounds so that a drift of the clocks falls on every setting alike;
# every run --check'ed; then the table of scripts/report_ring_variants.py.
#
#   RING_VARIANTS='base lend=FLASHATTN_RING_LEND=auto one=FLASHATTN_RING_SIDE_STREAM=0' scripts/ring_variants.sh
#   RING_PRESET=FILE RING_KERNEL=hopper RING_DEVICES=0,1 RING_MODE=backward RING_ROUNDS=2 \
#     RING_OUT=results/ring_variants scripts/ring_variants.sh
#
# A setting is NAME or NAME=VAR=VALUE[,VAR=VALUE...] (no spaces): NAME alone runs with no variable
# set. Builds flashattn (Release, -j16) into $FLASHATTN_BUILD_DIR (default build-gpu),
# incrementally. Writes $RING_OUT/NAME.rI.jsonl and $RING_OUT/table.md.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
cd "$root"
source scripts/lib.sh
ring_settings  # NCCL_NVLS_ENABLE=0; build, preset, kernel, devices
mode=${RING_MODE:-both}
rounds=${RING_ROUNDS:-2}
out=${RING_OUT:-results/ring_variants}
read -r -a settings <<<"${RING_VARIANTS:-base}"
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || { echo "ring_variants: RING_ROUNDS must be a positive count, got '$rounds'" >&2; exit 2; }

names=()
for s in "${settings[@]}"; do
  name=${s%%=*}
  [[ "$name" =~ ^[A-Za-z0-9_.-]+$ ]] || { echo "ring_variants: '$s': NAME must be letters, digits, . _ -" >&2; exit 2; }
  if [ "$name" != "$s" ]; then
    IFS=, read -r -a kvs <<<"${s#*=}"
    for kv in "${kvs[@]}"; do
      [[ "$kv" =~ ^FLASHATTN_RING_[A-Z0-9_]+=[^=]*$ ]] ||
        { echo "ring_variants: '$kv' in '$s' is not FLASHATTN_RING_VAR=VALUE" >&2; exit 2; }
    done
  fi
  for n in "${names[@]}"; do [ "$n" != "$name" ] || { echo "ring_variants: setting '$name' named twice" >&2; exit 2; }; done
  names+=("$name")
done

ring_build flashattn
mkdir -p "$out"
args=()
for ((r = 1; r <= rounds; r++)); do
  for s in "${settings[@]}"; do
    name=${s%%=*}
    envs=()
    [ "$name" = "$s" ] || IFS=, read -r -a envs <<<"${s#*=}"
    file="$out/$name.r$r.jsonl"
    rm -f "$file"
    echo "ring_variants: round $r, $name${envs[*]:+ (${envs[*]})}" >&2
    env ${envs[@]+"${envs[@]}"} "$build/flashattn" --devices "$devices" --sweep "$preset" --compute "$kernel" \
      --mode "$mode" --check --warmup 2 --repeat 5 --max-time 0.5 --no-write --quiet --json "$file" >/dev/null ||
      echo "ring_variants: round $r, $name: flashattn exited $? (3: a check failed, counted under the table)" >&2
    [ ! -f "$file" ] || args+=("$name=$file")
  done
done
[ "${#args[@]}" -gt 0 ] || { echo "ring_variants: no run wrote its record" >&2; exit 1; }
python3 scripts/report_ring_variants.py --kernel "$kernel" "${args[@]}" | tee "$out/table.md"

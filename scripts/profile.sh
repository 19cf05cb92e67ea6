#!/usr/bin/env bash
# Profiles one timed repetition of one kernel with Nsight Compute and prints the metrics that
# matter (docs/PROFILING.md says how to read them).
#
#   scripts/profile.sh KERNEL MODE SHAPE [-- extra flashattn args]
#   scripts/profile.sh cublas forward B4_H8_S4096_D64_bf16_causal
#   scripts/profile.sh naive backward B2_H8_Hkv2_S1024_D128
#
# SHAPE is B<b>_H<h>[_Hkv<h_kv>]_S<s>_D<d>[_fp32|_fp16|_bf16][_causal] (default fp32, not causal).
# The data is generated once into $PROFILE_DATA/SHAPE (default data/profile). The run is
#   ncu --set full --clock-control none --nvtx --nvtx-include timed/ \
#       flashattn --compute KERNEL --mode MODE --warmup 0 --repeat 1 --max-noise 0 --no-write ...
# so every kernel launched inside the one timed repetition is profiled (one for a fused kernel,
# several for cuBLAS-based ones), at the GPU's own clocks, like the timings. The report
# ($PROFILE_OUT/NAME.ncu-rep, default results/profile) opens in the Nsight Compute UI.
# PROFILE_KERNEL_REGEX narrows the profiled kernels (ncu -k regex:...); NCU names the ncu binary.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
build=${FLASHATTN_BUILD_DIR:-$root/build}
data_root=${PROFILE_DATA:-$root/data/profile}
out=${PROFILE_OUT:-$root/results/profile}
NCU=${NCU:-ncu}
PY=${PYTHON:-python3}
die() { echo "profile.sh: $*" >&2; exit 2; }

[ $# -ge 3 ] || die "usage: profile.sh KERNEL MODE SHAPE [-- extra flashattn args]"
kernel=$1 mode=$2 shape=$3
shift 3
[ "${1:-}" = "--" ] && shift
[[ $mode == forward || $mode == backward ]] || die "MODE must be forward or backward, got '$mode'"
re='^B([0-9]+)_H([0-9]+)(_Hkv([0-9]+))?_S([0-9]+)_D([0-9]+)(_(fp32|fp16|bf16))?(_causal)?$'
[[ $shape =~ $re ]] || die "SHAPE '$shape' is not B<b>_H<h>[_Hkv<h>]_S<s>_D<d>[_fp32|_fp16|_bf16][_causal]"
B=${BASH_REMATCH[1]} H=${BASH_REMATCH[2]} Hkv=${BASH_REMATCH[4]:-${BASH_REMATCH[2]}} S=${BASH_REMATCH[5]}
D=${BASH_REMATCH[6]} dtype=${BASH_REMATCH[8]:-fp32} causal=${BASH_REMATCH[9]:+--causal}
command -v "$NCU" >/dev/null || die "'$NCU' not found: install Nsight Compute or set NCU=/path/to/ncu"
[ -x "$build/flashattn" ] || die "$build/flashattn not found (build first, or set FLASHATTN_BUILD_DIR)"

data="$data_root/B${B}_H${H}_Hkv${Hkv}_S${S}_D${D}_${dtype}"
if [ ! -f "$data/Q.npy" ]; then
  echo "== generating $data"
  "$build/flashattn-gen" --out "$data" --B "$B" --H "$H" --H-kv "$Hkv" --S "$S" --D "$D" --dtype "$dtype" \
    --seed 0 --with-dO --force >/dev/null || exit 1
fi
mkdir -p "$out"
name="${kernel}_${mode}_${shape}"
filter=()
[ -n "${PROFILE_KERNEL_REGEX:-}" ] && filter=(-k "regex:$PROFILE_KERNEL_REGEX")

echo "== ncu --set full on one timed repetition of $kernel $mode $shape"
# ncu flushes the caches before every profiled kernel itself (--cache-control all) and serialises
# launches, so the run neither flushes (the flush's read kernel would be profiled too) nor holds
# its stream.
FLASHATTN_TIMING_HOLD=0 "$NCU" --set full --clock-control none --nvtx --nvtx-include "timed/" "${filter[@]}" -f \
  -o "$out/$name" "$build/flashattn" --compute "$kernel" --mode "$mode" --data "$data" --dtype "$dtype" $causal \
  --warmup 0 --repeat 1 --max-noise 0 --no-flush --no-write --json "$out/$name.json" --quiet "$@" >"$out/$name.log" 2>&1
rc=$?
grep -E "==(PROF|ERROR|WARNING)==" "$out/$name.log" | grep -v "Profiling \"" | tail -n 5
[ $rc -eq 0 ] || { echo "profile.sh: ncu exited $rc; see $out/$name.log" >&2; tail -n 5 "$out/$name.log" >&2; exit 1; }

"$NCU" --import "$out/$name.ncu-rep" --csv --page raw --print-units base >"$out/$name.raw.csv" || exit 1
"$PY" "$root/scripts/ncu_summary.py" "$out/$name.raw.csv" --run-json "$out/$name.json" || exit 1
echo "full report: $out/$name.ncu-rep (open with ncu-ui); raw metrics: $out/$name.raw.csv"

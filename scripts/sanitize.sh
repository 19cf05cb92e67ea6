#!/usr/bin/env bash
# On a GPU machine: runs every registered GPU kernel x mode under compute-sanitizer (memcheck with
# leak checking, racecheck, synccheck, initcheck) at small awkward shapes, and prints a table
# kernel x mode x tool: "clean (N runs)" or "N errors" with the first error line. Exit 0 when
# everything is clean, 1 otherwise.
#
#   scripts/sanitize.sh                        # build (or reuse $FLASHATTN_BUILD_DIR) and run all
#   SANITIZE_KERNELS="fa2 tiled" scripts/sanitize.sh
#   SANITIZE_TOOLS="memcheck initcheck" SANITIZE_JOBS=2 scripts/sanitize.sh
#   SANITIZE_EXTRA=--deterministic SANITIZE_OUT=results/sanitize-det scripts/sanitize.sh   # options added to every run
#
# The matrix (the kernel's dtypes and features decide what applies; D = its smallest declared head
# dim that it runs itself, not through a fallback kernel, or 40 for kernels that take any; "+64"
# adds D = 64 where the kernel declares it):
#   shapes   s1: B1 H2 S1    s17: B2 H2 S17    s100: B1 H2 S100    gqa: B1 H4 H_kv2 S33
#            c40x70 / c70x40: B1 H2, causal, S_q != S_k both ways
#   memcheck   every shape x every dtype at D, plus s17 and c70x40 at 64    (--leak-check full)
#   initcheck  s17, gqa, c70x40 x every dtype at D
#   synccheck  s17, s100, c40x70 x every dtype at D
#   racecheck  s17, c70x40 at D in one dtype (bf16 where supported): racecheck replays shared-
#              memory accesses and costs 10-100x a memcheck run, so it gets the two shapes that
#              cover partial tiles and the causal diagonal
# Every run: flashattn --compute K --mode M --warmup 0 --repeat 1 --no-write --quiet (a backward
# run also runs the kernel's forward), SANITIZE_JOBS (default 4) at a time on the one GPU; the
# matrix is sized to stay under about 8 minutes on an H100 for six kernels (the script prints the
# time it took; SANITIZE_TOOLS and SANITIZE_KERNELS trim it). Logs go to $SANITIZE_OUT (default
# results/sanitize), one per run, and results.tsv lists every run.
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# ---- one run (called back through xargs) -------------------------------------------------------
if [ "${1:-}" = "__run" ]; then
  # __run TOOL KERNEL MODE SHAPE DTYPE D DATA_DIR EXTRA...
  shift
  tool=$1 kernel=$2 mode=$3 shape=$4 dtype=$5 d=$6 data=$7
  shift 7
  log="$SANITIZE_OUT/logs/$kernel.$mode.$tool.$shape.$dtype.D$d.log"
  args=(--tool "$tool" --error-exitcode 99 --print-limit 20)
  [ "$tool" = memcheck ] && args+=(--leak-check full)
  start=$(date +%s)
  FLASHATTN_TIMING_HOLD=0 "$SANITIZER" "${args[@]}" "$FLASHATTN" --compute "$kernel" --mode "$mode" --data "$data" \
    --warmup 0 --repeat 1 \
    --no-write --no-flush --quiet $FLASHATTN_EXTRA "$@" >"$log" 2>&1
  rc=$?
  secs=$(( $(date +%s) - start ))
  errors=$(grep -E '^========= ERROR SUMMARY: [0-9]+ error' "$log" | tail -n 1 | sed -E 's/.*SUMMARY: ([0-9]+) error.*/\1/')
  first=$(grep -E '^========= [A-Za-z]' "$log" | grep -vE 'COMPUTE-SANITIZER|ERROR SUMMARY|RACECHECK SUMMARY|LEAK SUMMARY' |
          head -n 1 | sed -E 's/^========= //' | tr '\t' ' ' | cut -c1-160)
  if [ $rc -eq 0 ]; then
    status=clean
  elif [ $rc -eq 99 ]; then
    status=errors
  elif [ $rc -eq 2 ]; then
    status=unsupported  # the driver refused the combination (exit 2): listed, not counted
    first=$(grep -E '^flashattn: ' "$log" | head -n 1 | cut -c1-160)
  else
    status="exit$rc"
    [ -n "$first" ] || first=$(grep -E 'flashattn: |error' "$log" | head -n 1 | cut -c1-160)
  fi
  printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$kernel" "$mode" "$tool" "$shape" "$dtype" "$d" "$status" \
    "${errors:-0}" "$secs" "$first" >>"$SANITIZE_OUT/results.tsv"
  exit 0
fi

# ---- setup ----------------------------------------------------------------------------------------
source "$root/scripts/lib.sh"
out=${SANITIZE_OUT:-$root/results/sanitize}
jobs=${SANITIZE_JOBS:-4}
tools=${SANITIZE_TOOLS:-"memcheck racecheck synccheck initcheck"}
PY=${PYTHON:-python3}

sanitizer=$(command -v compute-sanitizer || true)
[ -n "$sanitizer" ] || sanitizer=/usr/local/cuda/bin/compute-sanitizer
[ -x "$sanitizer" ] || { echo "sanitize: compute-sanitizer not found (CUDA toolkit bin/)" >&2; exit 1; }
command -v nvidia-smi >/dev/null && nvidia-smi -L >/dev/null 2>&1 || { echo "sanitize: no GPU found" >&2; exit 1; }

build=${FLASHATTN_BUILD_DIR:-$root/build-sanitize}
mkdir -p "$(dirname "$out")"
if [ ! -x "$build/flashattn" ] || [ ! -x "$build/flashattn-gen" ]; then
  t0=$(date +%s)
  ensure_deps
  build_tree "$root" "$build" "${FLASHATTN_JOBS:-$(nproc)}" >"$out.build.log" 2>&1 || { tail -n 40 "$out.build.log"; exit 1; }
  echo "sanitize: built $build in $(( $(date +%s) - t0 ))s"
fi
rm -rf "$out"
mkdir -p "$out/logs" "$out/data"
: >"$out/results.tsv"

# Options that only some builds have: turn the noise rule off so one repetition is one repetition.
extra="${SANITIZE_EXTRA:-}"
"$build/flashattn" --help 2>/dev/null | grep -q -- '--max-noise' && extra="$extra --max-noise 0"

# ---- the job list -------------------------------------------------------------------------------
# kernel mode dtypes(comma) D64(0/1) Dmin features(comma), one line per GPU kernel x mode.
"$build/flashattn" --list-json | "$PY" -c '
import json, os, sys
only = os.environ.get("SANITIZE_KERNELS", "").split()
for e in json.load(sys.stdin):
    if not e["gpu"] or (only and e["kernel"] not in only) or e["mode"] not in ("forward", "backward", "decode"):
        continue
    dtypes = [t for t in e["dtypes"] if t in ("fp32", "fp16", "bf16")]
    # Head dims a kernel hands to its fallback kernel would sanitize that kernel instead.
    dims = sorted(d for d in e["head_dims"] if d not in e.get("fallback_head_dims", []))
    dmin = dims[0] if dims else 40
    d64 = 1 if (dims and 64 in dims and dmin != 64) or (not dims and (e["max_head_dim"] == 0 or e["max_head_dim"] >= 64)) else 0
    print(e["kernel"], e["mode"], ",".join(dtypes), d64, dmin, ",".join(e["features"]) or "-")
' >"$out/entries.txt" || { echo "sanitize: cannot read --list-json" >&2; exit 1; }
[ -s "$out/entries.txt" ] || { echo "sanitize: no GPU kernel registered (or none matched SANITIZE_KERNELS)" >&2; exit 1; }

# shape name -> flashattn-gen sizes, and extra flashattn flags
declare -A gen_args=(
  [s1]="--B 1 --H 2 --S 1" [s17]="--B 2 --H 2 --S 17" [s100]="--B 1 --H 2 --S 100"
  [gqa]="--B 1 --H 4 --H-kv 2 --S 33" [c40x70]="--B 1 --H 2 --S-q 40 --S-k 70" [c70x40]="--B 1 --H 2 --S-q 70 --S-k 40"
)
declare -A run_args=([s1]="" [s17]="" [s100]="" [gqa]="" [c40x70]="--causal" [c70x40]="--causal")
declare -A needs=([s1]="" [s17]="" [s100]="" [gqa]="gqa" [c40x70]="causal sq!=sk" [c70x40]="causal sq!=sk")
# Decode (mode decode): dlen: lengths 0 (an empty cache) and 77 in one batch, GQA 2, one new
# token, the kernel's split choice; dsplit: 3 new tokens, MQA, forced 7 split pieces (most of them
# empty or partial); dpage: a paged cache (16-token pages), 3 new tokens, lengths 17 and 100.
gen_args+=(
  [dlen]="--decode --B 2 --H 4 --H-kv 2 --S-max 100 --cache-seqlens 0,77"
  [dsplit]="--decode --B 2 --H 4 --H-kv 1 --S-max 300 --cache-seqlens 5,290 --S-new 3"
  [dpage]="--decode --B 2 --H 4 --H-kv 2 --S-max 128 --cache-seqlens 17,100 --S-new 3 --page-size 16"
)
run_args+=([dlen]="" [dsplit]="--splits 7" [dpage]="")
needs+=([dlen]="gqa" [dsplit]="gqa" [dpage]="paged")

data_for() {  # shape dtype D -> a generated data directory (made once)
  local dir="$out/data/$1.$2.D$3"
  local with_do=--with-dO
  [[ $1 == d* ]] && with_do=""  # decode directories have no dO
  if [ ! -f "$dir/meta.json" ] && [ ! -f "$dir/Q.npy" ]; then
    "$build/flashattn-gen" --out "$dir" ${gen_args[$1]} --D "$3" --dtype "$2" --seed 7 $with_do >/dev/null ||
      { echo "sanitize: flashattn-gen failed for $1 $2 D=$3" >&2; exit 1; }
  fi
  echo "$dir"
}

has_features() {  # features(comma) shape
  local f
  for f in ${needs[$2]}; do [[ ",$1," == *",$f,"* ]] || return 1; done
}

jobfile="$out/jobs.txt"
: >"$jobfile"
add() {  # tool kernel mode shape dtype D features
  has_features "$7" "$4" || return 0
  local dir
  dir=$(data_for "$4" "$5" "$6") || exit 1
  # No trailing blank: xargs -L would join the next line to this one.
  if [ -n "${run_args[$4]}" ]; then echo "$1 $2 $3 $4 $5 $6 $dir ${run_args[$4]}"; else echo "$1 $2 $3 $4 $5 $6 $dir"; fi >>"$jobfile"
}

while read -r kernel mode dtypes d64 dmin features; do
  IFS=, read -r -a dts <<<"$dtypes"
  if [ "$mode" = decode ]; then  # the decode shapes, every tool, every dtype (racecheck: one)
    for tool in $tools; do
      for dt in "${dts[@]}"; do
        [ "$tool" = racecheck ] && [ "$dt" != "${dts[-1]}" ] && continue
        for s in dlen dsplit dpage; do add "$tool" "$kernel" "$mode" $s "$dt" "$dmin" "$features"; done
      done
    done
    continue
  fi
  race_dt=${dts[0]}
  [[ ",$dtypes," == *",bf16,"* ]] && race_dt=bf16
  for tool in $tools; do
    case $tool in
      memcheck)
        for dt in "${dts[@]}"; do
          for s in s1 s17 s100 gqa c40x70 c70x40; do add memcheck "$kernel" "$mode" $s "$dt" "$dmin" "$features"; done
          if [ "$d64" = 1 ]; then
            for s in s17 c70x40; do add memcheck "$kernel" "$mode" $s "$dt" 64 "$features"; done
          fi
        done ;;
      initcheck)
        for dt in "${dts[@]}"; do
          for s in s17 gqa c70x40; do add initcheck "$kernel" "$mode" $s "$dt" "$dmin" "$features"; done
        done ;;
      synccheck)
        for dt in "${dts[@]}"; do
          for s in s17 s100 c40x70; do add synccheck "$kernel" "$mode" $s "$dt" "$dmin" "$features"; done
        done ;;
      racecheck)
        for s in s17 c70x40; do add racecheck "$kernel" "$mode" $s "$race_dt" "$dmin" "$features"; done ;;
      *) echo "sanitize: unknown tool '$tool'" >&2; exit 1 ;;
    esac
  done
done <"$out/entries.txt"

total=$(wc -l <"$jobfile")
echo "sanitize: $total runs ($(wc -l <"$out/entries.txt") kernel x mode entries; tools: $tools), $jobs at a time"
t0=$(date +%s)
# racecheck first: the longest runs start early and the tail of the schedule stays short.
{ grep '^racecheck ' "$jobfile"; grep -v '^racecheck ' "$jobfile"; } |
  SANITIZE_OUT="$out" SANITIZER="$sanitizer" FLASHATTN="$build/flashattn" FLASHATTN_EXTRA="$extra" \
  xargs -P "$jobs" -L 1 "$root/scripts/sanitize.sh" __run
echo "sanitize: done in $(( $(date +%s) - t0 ))s"

# ---- the table ----------------------------------------------------------------------------------
echo
printf '| kernel | mode | tool | result |\n|---|---|---|---|\n'
sort -t$'\t' -k1,1 -k2,2 -k3,3 "$out/results.tsv" | awk -F'\t' '
  function flush() {
    if (key == "") return
    if (bad == 0 && unsup == n) r = "not run: " reason
    else if (bad == 0) r = "clean (" n - unsup " runs" (unsup ? "; " unsup " refused with exit 2: " reason : "") ")"
    else r = bad " of " n " runs failed, " errs " errors: " first " [" where "]"
    printf "| %s | %s | %s | %s |\n", k, m, t, r
  }
  {
    cur = $1 FS $2 FS $3
    if (cur != key) { flush(); key = cur; k = $1; m = $2; t = $3; n = 0; bad = 0; errs = 0; unsup = 0; first = ""; where = ""; reason = "" }
    n++
    if ($7 == "unsupported") { unsup++; if (reason == "") reason = $10 }
    else if ($7 != "clean") {
      bad++; errs += $8
      if (first == "") { first = ($10 == "" ? $7 : $10); where = $4 " " $5 " D=" $6 }
    }
  }
  END { flush() }'
failed=$(awk -F'\t' '$7 != "clean" && $7 != "unsupported"' "$out/results.tsv" | wc -l)
# A kernel x mode x tool whose every run was refused was not checked at all: that fails too.
notrun=$(awk -F'\t' '{ k = $1 FS $2 FS $3; n[k]++; if ($7 == "unsupported") u[k]++ }
                     END { c = 0; for (k in n) if (u[k] == n[k]) c++; print c }' "$out/results.tsv")
echo
echo "sanitize: $failed of $total runs not clean, $notrun kernel x mode x tool not run; logs in $out/logs," \
  "every run in $out/results.tsv"
[ "$failed" -eq 0 ] && [ "$notrun" -eq 0 ]

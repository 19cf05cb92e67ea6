#!/usr/bin/env bash
# Sweeps shapes x kernels x modes through the command-line tools and appends every run to one
# JSON Lines file (one session document per line), resuming where an interrupted sweep stopped.
#
#   scripts/sweep.sh --out results/sweep.jsonl --kernels cublas,naive \
#       --B 4 --H 8 --S 1024,2048,4096 --D 64,128 --dtype bf16,fp32 --causal 0,1 [--peers]
#   scripts/report.py results/sweep.jsonl --plots results/plots
#
# Every point (B, H, H_kv, S, D, dtype, causal) gets a data directory from flashattn-gen (seed
# --seed, with dO) under --data-dir, deleted after the point unless --keep-data; each kernel x
# mode is one `flashattn --json -` call. A run is keyed by shape + dtype + causal + kernel + mode;
# keys already in the results file with status ok or skipped are not run again (failed ones are),
# so re-running the same command after an interruption finishes the sweep. --peers also times
# PyTorch SDPA's backends (scripts/peers.py) on the same data and appends them to the same file.
#
# Options (comma-separated lists; every combination is run):
#   --out FILE        results file (JSON Lines; created or appended)           required
#   --kernels K,...   flashattn kernels                                        required
#   --B --H --S --D   shapes (default B 4, H 8, S 1024, D 64); --H-kv (default H)
#   --dtype LIST      fp32 | fp16 | bf16 (default bf16)      --causal LIST  0 | 1 (default 0)
#   --modes LIST      forward | backward (default both)
#   --peers [LIST]    also peers.py with these backends (default flash,cudnn,efficient,math)
#   --seed N          seed of the generated data (default 0)
#   --data-dir DIR    where point data is generated (default a temporary directory)
#   --keep-data       keep each point's data (and reuse it on the next sweep)
#   --build DIR       build with flashattn and flashattn-gen (default $FLASHATTN_BUILD_DIR or build)
#   -- ARGS           passed to every flashattn call (e.g. -- --max-time 0.5 --hot)
set -uo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
PY=${PYTHON:-python3}
out="" kernels="" Bs=4 Hs=8 Hkvs="" Ss=1024 Ds=64 dtypes=bf16 causals=0 modes=forward,backward
peers="" seed=0 data_dir="" keep=0 build=${FLASHATTN_BUILD_DIR:-$root/build}
extra=()
die() { echo "sweep.sh: $*" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case $1 in
    --out) out=$2; shift 2 ;;
    --kernels) kernels=$2; shift 2 ;;
    --B) Bs=$2; shift 2 ;;
    --H) Hs=$2; shift 2 ;;
    --H-kv) Hkvs=$2; shift 2 ;;
    --S) Ss=$2; shift 2 ;;
    --D) Ds=$2; shift 2 ;;
    --dtype) dtypes=$2; shift 2 ;;
    --causal) causals=$2; shift 2 ;;
    --modes) modes=$2; shift 2 ;;
    --peers)
      if [ $# -gt 1 ] && [[ $2 != --* ]]; then peers=$2; shift 2; else peers=flash,cudnn,efficient,math; shift; fi ;;
    --seed) seed=$2; shift 2 ;;
    --data-dir) data_dir=$2; shift 2 ;;
    --keep-data) keep=1; shift ;;
    --build) build=$2; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h|--help) sed -n '2,/^set -uo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option '$1' (see --help)" ;;
  esac
done
[ -n "$out" ] || die "--out FILE is required"
[ -n "$kernels" ] || die "--kernels K[,K...] is required"
for t in flashattn flashattn-gen; do [ -x "$build/$t" ] || die "$build/$t not found (build first, or --build DIR)"; done
for m in ${modes//,/ }; do [[ $m == forward || $m == backward ]] || die "--modes: '$m' is not forward or backward"; done
for c in ${causals//,/ }; do [[ $c == 0 || $c == 1 ]] || die "--causal: '$c' is not 0 or 1"; done
known=$("$build/flashattn" --list-json | "$PY" -c 'import json, sys; print(" ".join({e["kernel"] for e in json.load(sys.stdin)}))')
for k in ${kernels//,/ }; do [[ " $known " == *" $k "* ]] || die "--kernels: unknown kernel '$k' (known: $known)"; done
mkdir -p "$(dirname "$out")" && touch "$out" || die "cannot write $out"
tmp_data=0
if [ -z "$data_dir" ]; then data_dir=$(mktemp -d "${TMPDIR:-/tmp}/flashattn-sweep.XXXXXX"); tmp_data=1; fi
cleanup() { [ $tmp_data -eq 1 ] && rm -rf "$data_dir"; }
trap cleanup EXIT

# key B H H_kv S D dtype causal kernel mode -> the resume key (the same format as done_keys below)
key() { echo "B=$1,H=$2,H_kv=$3,S_q=$4,S_k=$4,D=$5,dtype=$6,causal=$7,kernel=$8,mode=$9"; }

# Keys of the runs already in the results file (status ok or skipped), one per line.
done_keys() {
  "$PY" - "$out" <<'PY'
import json, sys
for line in open(sys.argv[1]):
    if not line.strip():
        continue
    try:
        doc = json.loads(line)
    except ValueError:
        continue  # a line cut short by an interruption: its runs are redone
    for r in doc.get("runs", []):
        if r.get("status") not in ("ok", "skipped"):
            continue
        s, f = r.get("shape", {}), r.get("flags", {})
        print(f"B={s.get('B')},H={s.get('H')},H_kv={s.get('H_kv')},S_q={s.get('S_q')},S_k={s.get('S_k')},"
              f"D={s.get('D')},dtype={r.get('dtype')},causal={int(bool(f.get('causal')))},"
              f"kernel={r.get('kernel')},mode={r.get('mode')}")
PY
}

# append RC STDOUT_FILE STDERR_FILE KERNEL MODE B H H_KV S D DTYPE CAUSAL: appends the session
# JSON of one call as one line; when the call wrote none (an unsupported kernel exits 2 with one
# line), appends a document with a skipped (exit 2) or failed run carrying that line as reason.
append() {
  "$PY" - "$out" "$@" <<'PY'
import json, sys
out, rc, so, se, kernel, mode, B, H, Hkv, S, D, dtype, causal = sys.argv[1:14]
try:
    doc = json.loads(open(so).read())
except ValueError:
    doc = None
if not doc or not doc.get("runs"):
    err = open(se).read().strip().splitlines()
    reason = err[-1] if err else f"exit code {rc}"
    if kernel.startswith("peers:"):
        kernels = [f"torch-{b}" for b in kernel[len("peers:"):].split(",")]
    else:
        kernels = [kernel]
    shape = {"B": int(B), "H": int(H), "H_kv": int(Hkv), "S_q": int(S), "S_k": int(S), "D": int(D)}
    doc = {"schema_version": 1, "tool": {"name": "sweep.sh"},
           "runs": [{"kernel": k, "mode": mode, "status": "skipped" if rc == "2" else "failed", "reason": reason,
                     "gpu": True, "shape": shape, "dtype": dtype, "layout": "bhsd",
                     "flags": {"causal": causal == "1", "window_left": -1, "window_right": -1}} for k in kernels]}
with open(out, "a") as f:
    f.write(json.dumps(doc, separators=(",", ":")) + "\n")
PY
}

declare -A done=()
while IFS= read -r k; do done[$k]=1; done < <(done_keys)
IFS=, read -ra Bl <<<"$Bs"; IFS=, read -ra Hl <<<"$Hs"; IFS=, read -ra Sl <<<"$Ss"; IFS=, read -ra Dl <<<"$Ds"
IFS=, read -ra dtl <<<"$dtypes"; IFS=, read -ra cl <<<"$causals"; IFS=, read -ra ml <<<"$modes"
IFS=, read -ra kl <<<"$kernels"; IFS=, read -ra pl <<<"$peers"
Hkvl=("")
[ -n "$Hkvs" ] && IFS=, read -ra Hkvl <<<"$Hkvs"

per_point=$(( ${#kl[@]} * ${#ml[@]} + ${#pl[@]} * ${#ml[@]} ))
total=$(( ${#Bl[@]} * ${#Hl[@]} * ${#Hkvl[@]} * ${#Sl[@]} * ${#Dl[@]} * ${#dtl[@]} * ${#cl[@]} * per_point ))
n=0 ran=0 start=$(date +%s)
so=$(mktemp) se=$(mktemp)
trap 'rm -f "$so" "$se"; cleanup' EXIT
fmt_s() { local s=$1; if [ "$s" -ge 60 ]; then printf '%dm%02ds' $((s / 60)) $((s % 60)); else printf '%ds' "$s"; fi; }
progress() {  # progress WHAT STATUS
  local el=$(( $(date +%s) - start )) eta="?"
  [ $ran -gt 0 ] && eta=$(fmt_s $(( el * (total - n) / ran )))
  printf '[%d/%d] %s: %s | %s elapsed, ETA %s\n' "$n" "$total" "$1" "$2" "$(fmt_s $el)" "$eta" >&2
}

for B in "${Bl[@]}"; do for H in "${Hl[@]}"; do for Hkv0 in "${Hkvl[@]}"; do Hkv=${Hkv0:-$H}
for S in "${Sl[@]}"; do for D in "${Dl[@]}"; do for dt in "${dtl[@]}"; do
  dir="$data_dir/B${B}_H${H}_Hkv${Hkv}_S${S}_D${D}_${dt}_seed${seed}"
  generated=0
  ensure_data() {
    [ -f "$dir/Q.npy" ] && return 0
    "$build/flashattn-gen" --out "$dir" --B "$B" --H "$H" --H-kv "$Hkv" --S "$S" --D "$D" --dtype "$dt" \
      --seed "$seed" --with-dO --force >/dev/null 2>"$se" || { cat "$se" >&2; return 1; }
    generated=1
  }
  for c in "${cl[@]}"; do
    cflag=(); [ "$c" = 1 ] && cflag=(--causal)
    title="B$B H$H$([ "$Hkv" != "$H" ] && echo "/$Hkv") S$S D$D $dt$([ "$c" = 1 ] && echo " causal")"
    for k in "${kl[@]}"; do for m in "${ml[@]}"; do
      n=$((n + 1))
      kk=$(key "$B" "$H" "$Hkv" "$S" "$D" "$dt" "$c" "$k" "$m")
      if [ -n "${done[$kk]:-}" ]; then progress "$title $k $m" "done before"; continue; fi
      ensure_data || { echo "sweep.sh: data generation failed for $title" >&2; exit 1; }
      "$build/flashattn" --compute "$k" --mode "$m" --data "$dir" "${cflag[@]}" --dtype "$dt" --no-write \
        --json - --quiet "${extra[@]}" >"$so" 2>"$se"
      rc=$?
      append "$rc" "$so" "$se" "$k" "$m" "$B" "$H" "$Hkv" "$S" "$D" "$dt" "$c"
      ran=$((ran + 1))
      progress "$title $k $m" "$([ $rc -eq 0 ] && echo ok || echo "exit $rc: $(tail -n 1 "$se")")"
    done; done
    for m in "${ml[@]}"; do
      missing=()
      for b in "${pl[@]}"; do
        n=$((n + 1))
        kk=$(key "$B" "$H" "$Hkv" "$S" "$D" "$dt" "$c" "torch-$b" "$m")
        [ -n "${done[$kk]:-}" ] || missing+=("$b")
      done
      [ ${#missing[@]} -eq 0 ] && { [ ${#pl[@]} -gt 0 ] && progress "$title peers $m" "done before"; continue; }
      ensure_data || exit 1
      list=$(IFS=,; echo "${missing[*]}")
      "$PY" "$root/scripts/peers.py" "$dir" --mode "$m" --backends "$list" "${cflag[@]}" --dtype "$dt" \
        --json - >"$so" 2>"$se"
      rc=$?
      append "$rc" "$so" "$se" "peers:$list" "$m" "$B" "$H" "$Hkv" "$S" "$D" "$dt" "$c"
      ran=$((ran + ${#missing[@]}))
      progress "$title peers $m ($list)" "$([ $rc -eq 0 ] && echo ok || echo "exit $rc: $(tail -n 1 "$se")")"
    done
  done
  if [ $keep -eq 0 ] && [ $generated -eq 1 ]; then rm -rf "$dir"; fi
done; done; done; done; done; done
echo "sweep.sh: $total runs in $out ($(fmt_s $(( $(date +%s) - start ))))" >&2

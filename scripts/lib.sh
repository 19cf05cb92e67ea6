# Shared by scripts/test.sh, run.sh and gpu_check.sh: dependency installation and the build.
# Source it; it defines functions only.

say() { printf '== %s\n' "$*"; }

as_root() {
  if [ "$(id -u)" -eq 0 ]; then "$@"; elif command -v sudo >/dev/null; then sudo "$@"; else "$@"; fi
}

# Installs the Debian packages and Python modules the build and tests need, where missing.
ensure_deps() {
  local missing=() pkg
  if command -v dpkg >/dev/null; then
    for pkg in libcli11-dev nlohmann-json3-dev libfmt-dev libgtest-dev cmake; do
      dpkg -s "$pkg" >/dev/null 2>&1 || missing+=("$pkg")
    done
  fi
  if [ ${#missing[@]} -gt 0 ]; then
    say "installing ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    as_root apt-get install -y -q "${missing[@]}" >/dev/null 2>&1 ||
      { as_root apt-get update -q >/dev/null && as_root apt-get install -y -q "${missing[@]}" >/dev/null; }
  fi
  PY=${PYTHON:-python3}
  if ! "$PY" -c 'import numpy, ml_dtypes, pytest' >/dev/null 2>&1; then
    say "installing numpy ml_dtypes pytest"
    "$PY" -m pip install -q numpy ml_dtypes pytest 2>/dev/null ||
      "$PY" -m pip install -q --break-system-packages numpy ml_dtypes pytest
  fi
  if ! command -v nvcc >/dev/null; then
    local d
    for d in /usr/local/cuda/bin /usr/local/cuda-*/bin; do
      if [ -x "$d/nvcc" ]; then export PATH="$d:$PATH"; break; fi
    done
  fi
  command -v nvcc >/dev/null || { echo "nvcc not found: install the CUDA toolkit" >&2; return 1; }
}

# build_tree ROOT BUILD_DIR JOBS [cmake args...]: configure (Release) and build.
build_tree() {
  local root=$1 build=$2 jobs=$3
  shift 3
  mkdir -p "$build"
  say "configure ($build)"
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release \
    ${FLASHATTN_CUDA_ARCHS:+-DFLASHATTN_CUDA_ARCHS=$FLASHATTN_CUDA_ARCHS} "$@" >"$build/configure.log" 2>&1 ||
    { cat "$build/configure.log"; return 1; }
  grep 'flashattn:' "$build/configure.log" || true
  say "build (-j$jobs)"
  cmake --build "$build" -j "$jobs"
}

# check_hopper_sass BUILD_DIR: the sm_90a objects must hold warpgroup MMAs (HGMMA) fed by the
# tensor copy engine (UTMALDG); an object without them means a silent fallback to older
# instructions. Prints the counts per object; returns 1 if one lacks either.
check_hopper_sass() {
  local obj counts rc=0
  for obj in "$1"/CMakeFiles/flashattn_kernels_sm90a.dir/kernels/*.o; do
    counts=$(cuobjdump -sass "$obj" 2>/dev/null | grep -oE "HGMMA|UTMALDG|UTMASTG|USETMAXREG" | sort | uniq -c | tr -s ' \n' ' ')
    echo "$(basename "$obj"): $counts"
    [[ $counts == *HGMMA* && $counts == *UTMALDG* ]] || { echo "no HGMMA/UTMALDG in $obj"; rc=1; }
  done
  return $rc
}

# The ring scripts' (ring_bench.sh, ring_variants.sh) common part: NVLink multicast off, and the
# settings both take (build, preset, kernel, devices) from their variables or defaults.
ring_settings() {
  export NCCL_NVLS_ENABLE=0  # NVLink multicast stays off
  build=${FLASHATTN_BUILD_DIR:-build-gpu}
  preset=${RING_PRESET:-scripts/presets/ring.json}
  kernel=${RING_KERNEL:-hopper}
  devices=${RING_DEVICES:-0,1}
}

# ring_build TARGET...: those targets into $build (Release, configured where it is not yet), -j16.
ring_build() {
  [ -f "$build/CMakeCache.txt" ] || cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release >/dev/null
  cmake --build "$build" -j16 --target "$@" >/dev/null
}

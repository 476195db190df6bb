#!/usr/bin/env bash
# GPU acceptance tests and benchmarks of gpureclaim. See tests/gpu/README.md.
#
#   tests/gpu/run.sh [BUILD_DIR] [OUT_DIR]     defaults: BUILD_DIR build-gpu (under the repository root),
#                                              OUT_DIR BUILD_DIR/gpu-results
#
# Without a GPU it prints "tests/gpu: skipped: no GPU (...)" and exits 0. With one it builds libgpureclaim.so in
# BUILD_DIR (configuring it first when needed), builds the nvcc programs, runs every test under a timeout, prints
# PASS|FAIL|SKIP lines and a summary, writes logs and results.json into OUT_DIR, and exits 1 if anything failed.
# About 3 to 4 minutes on an H200; never more than GPU_TESTS_BUDGET seconds (default 470).
#
# Environment: NVCC (default: nvcc on PATH, else /usr/local/cuda/bin/nvcc), PYTHON (default python3),
# GPU_TESTS_BUDGET (seconds), GPU_TESTS (space-separated test names or shell patterns: run only those).
set -u

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
ROOT=$(cd "$HERE/../.." && pwd)
OUT_GIVEN=0
[ $# -ge 2 ] && OUT_GIVEN=1
BUILD_ARG=${1:-$ROOT/build-gpu}
OUT_ARG=${2:-$BUILD_ARG/gpu-results}
TOTAL_BUDGET=${GPU_TESTS_BUDGET:-470}
START=$SECONDS

skip_all() {
  echo "tests/gpu: skipped: no GPU ($1)"
  # results.json only where the caller named an output directory (CI runs leave no files behind)
  if [ "$OUT_GIVEN" = 1 ] && mkdir -p "$OUT_ARG" 2>/dev/null; then
    local why=${1//\\/\\\\}
    printf '{"skipped": true, "reason": "%s", "tests": []}\n' "${why//\"/\\\"}" >"$OUT_ARG/results.json" 2>/dev/null
  fi
  exit 0
}

# ---- is there a GPU? ----
if ! command -v nvidia-smi >/dev/null 2>&1; then
  skip_all "nvidia-smi not found"
fi
SMI=$(timeout 30 nvidia-smi -L 2>&1)
SMI_RC=$?
if [ "$SMI_RC" -ne 0 ]; then
  skip_all "nvidia-smi -L failed with status $SMI_RC: $(printf '%s' "$SMI" | head -n1)"
fi
if ! printf '%s\n' "$SMI" | grep -q '^GPU [0-9]'; then
  skip_all "nvidia-smi -L lists no GPU"
fi

abspath() { case $1 in /*) printf '%s' "$1" ;; *) printf '%s/%s' "$PWD" "$1" ;; esac; }
BUILD=$(abspath "$BUILD_ARG")
mkdir -p "$OUT_ARG" || { echo "tests/gpu: cannot create $OUT_ARG"; exit 1; }
OUT=$(cd "$OUT_ARG" && pwd)
LOGS=$OUT/logs
RES=$OUT/results.d
rm -rf "$LOGS" "$RES" "$OUT/rundir" "$OUT/reports" "$OUT/results.json" "$OUT/results.txt" "$OUT"/bench_*.json \
  "$OUT"/bench_*.txt "$OUT/00-all-results.tar.gz"
mkdir -p "$LOGS" "$RES" "$OUT/reports"
mkdir -m 700 "$OUT/rundir"
cd "$ROOT" || exit 1

# ---- a clean environment: the real driver (no simulator), no inherited preload or gpureclaim settings ----
clean_path() {  # drops entries that hold the CUDA simulator (tests/sim) from a :-separated list
  local IFS=: out="" d
  for d in $1; do
    [ -z "$d" ] && continue
    if [ -e "$d/libsimpreload.so" ] || [ -e "$d/libsimplugin.so" ] || [[ "$d" == */sim ]] || [[ "$d" == */sim/* ]]; then
      continue
    fi
    out=${out:+$out:}$d
  done
  printf '%s' "$out"
}
LD_LIBRARY_PATH=$(clean_path "${LD_LIBRARY_PATH:-}")
export LD_LIBRARY_PATH
[ -z "$LD_LIBRARY_PATH" ] && unset LD_LIBRARY_PATH
unset LD_PRELOAD
for v in $(env | sed -n 's/^\(GPURECLAIM_[A-Z0-9_]*\)=.*/\1/p'); do unset "$v"; done
unset PYTORCH_CUDA_ALLOC_CONF XLA_PYTHON_CLIENT_PREALLOCATE XLA_PYTHON_CLIENT_MEM_FRACTION XLA_PYTHON_CLIENT_ALLOCATOR
export PYTHONUNBUFFERED=1
export PYTHONDONTWRITEBYTECODE=1

NVCC=${NVCC:-}
if [ -z "$NVCC" ]; then
  if command -v nvcc >/dev/null 2>&1; then NVCC=$(command -v nvcc); else NVCC=/usr/local/cuda/bin/nvcc; fi
fi
CUDA_HOME_GUESS=$(cd "$(dirname "$NVCC")/.." 2>/dev/null && pwd)
PY=${PYTHON:-python3}
GPU_MEM_TOTAL_MIB=$(timeout 30 nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits -i 0 2>/dev/null |
  head -n1 | tr -dc '0-9')
export GPU_MEM_TOTAL_MIB

{
  echo "date: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
  echo "host: $(uname -a)"
  echo "repository: $ROOT ($(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')$(
    [ -n "$(git -C "$ROOT" status --porcelain -- src include 2>/dev/null)" ] && echo ', src/include modified'))"
  echo "build: $BUILD"
  echo "nvidia-smi -L:"; printf '%s\n' "$SMI"
  timeout 30 nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv 2>&1
  echo "nvcc: $("$NVCC" --version 2>&1 | tail -n2 | tr '\n' ' ')"
  echo "python: $(command -v "$PY") $($PY --version 2>&1)"
  timeout 120 "$PY" - <<'EOF' 2>&1
import importlib
for m in ("torch", "cupy", "jax", "jaxlib", "numpy"):
    try:
        print("%s: %s" % (m, importlib.import_module(m).__version__))
    except Exception as e:
        print("%s: not importable (%s)" % (m, type(e).__name__))
EOF
} >"$OUT/environment.txt" 2>&1

remaining() { echo $((TOTAL_BUDGET - (SECONDS - START))); }

# ---- results ----
NPASS=0; NFAIL=0; NSKIP=0
record() {  # record STATUS NAME DETAIL: a result decided by this script
  echo "$1 $2: $3"
  case $1 in PASS) NPASS=$((NPASS + 1)) ;; FAIL) NFAIL=$((NFAIL + 1)) ;; *) NSKIP=$((NSKIP + 1)) ;; esac
  printf '%s\t%s\t%s\n' "$1" "$2" "$3" >>"$RES/_shell.tsv"
}

HAVE_PY=0
"$PY" -c 'import json, sys' >/dev/null 2>&1 && HAVE_PY=1

# collect NAME RC ELAPSED LIMIT: turns the GPUTEST lines of logs/NAME.log into PASS/FAIL/SKIP lines
collect() {
  local name=$1 rc=$2 el=$3 lim=$4 line st
  if [ "$HAVE_PY" = 1 ]; then
    while IFS= read -r line; do
      echo "$line"
      st=${line%% *}
      case $st in PASS) NPASS=$((NPASS + 1)) ;; FAIL) NFAIL=$((NFAIL + 1)) ;; SKIP) NSKIP=$((NSKIP + 1)) ;; esac
    done < <("$PY" "$HERE/collect.py" test "$OUT" "$name" "$rc" "$el" "$lim")
  else
    local n
    n=$(grep -c '^GPUTEST ' "$LOGS/$name.log" 2>/dev/null)
    if [ "$rc" = 0 ] && [ "${n:-0}" -gt 0 ] && ! grep -q '"status": "FAIL"' "$LOGS/$name.log"; then
      record PASS "$name" "$n checks ($PY missing: details in logs/$name.log)"
    else
      record FAIL "$name" "exit status $rc (details in logs/$name.log)"
    fi
  fi
}

selected() {  # selected NAME: whether GPU_TESTS (if set) names this test
  [ -z "${GPU_TESTS:-}" ] && return 0
  local p
  for p in $GPU_TESTS; do
    # shellcheck disable=SC2254
    case $1 in $p) return 0 ;; esac
  done
  return 1
}

# run_test NAME LIMIT MODE CMD...   MODE: preload (LD_PRELOAD=libgpureclaim) or plain (no preload)
LIB=$BUILD/src/libgpureclaim.so
run_test() {
  local name=$1 lim=$2 mode=$3; shift 3
  selected "$name" || return 0
  local left; left=$(remaining)
  if [ "$left" -lt 25 ]; then
    record SKIP "$name" "time budget of ${TOTAL_BUDGET}s used up"
    return
  fi
  [ "$lim" -gt $((left - 10)) ] && lim=$((left - 10))
  local t0=$SECONDS rc
  echo "---- $name (limit ${lim}s)"
  (
    cd "$OUT" || exit 1
    export GPURECLAIM_RUNDIR=$OUT/rundir
    export GPURECLAIM_LOG=$OUT/reports/$name.jsonl
    export PYTHONPATH=$HERE${PYTHONPATH:+:$PYTHONPATH}
    export GPU_TEST_NAME=$name GPU_TEST_OUT=$OUT
    if [ "$mode" = preload ]; then export LD_PRELOAD=$LIB; fi
    timeout -k 10 "$lim" "$@"
    exit $?  # (no exec: a crash is reported by this shell, into the log)
  ) >"$LOGS/$name.log" 2>&1
  rc=$?
  collect "$name" "$rc" $((SECONDS - t0)) "$lim"
}

finish() {
  if [ "$HAVE_PY" = 1 ]; then
    "$PY" "$HERE/collect.py" summary "$OUT" $((SECONDS - START)) >/dev/null 2>"$LOGS/collect.log" ||
      echo "tests/gpu: collect.py summary failed, see logs/collect.log"
  fi
  # everything in one archive too (copying OUT_DIR back from a remote machine may only take a few files)
  local tmp
  tmp=$(mktemp "${TMPDIR:-/tmp}/gpu-results.XXXXXX" 2>/dev/null) &&
    tar -czf "$tmp" -C "$OUT" --exclude='./00-all-results.tar.gz' --exclude='*.sock' . 2>/dev/null &&
    mv -f "$tmp" "$OUT/00-all-results.tar.gz" && chmod 644 "$OUT/00-all-results.tar.gz"
  [ -n "${tmp:-}" ] && rm -f "$tmp"
  echo "tests/gpu: summary: $NPASS passed, $NFAIL failed, $NSKIP skipped in $((SECONDS - START))s; results in $OUT/results.json"
  [ "$NFAIL" -eq 0 ]
  exit $?
}

# ---- build libgpureclaim (the project's own CMake build; Release) ----
echo "tests/gpu: $(printf '%s' "$SMI" | head -n1)"
echo "tests/gpu: build in $BUILD, output in $OUT"
if [ -f "$BUILD/CMakeCache.txt" ] && grep -Eq '^GPURECLAIM_(ASAN|TSAN):BOOL=ON' "$BUILD/CMakeCache.txt"; then
  echo "tests/gpu: $BUILD is a sanitizer build (it cannot be preloaded into Python); using $BUILD-release"
  BUILD=$BUILD-release
  LIB=$BUILD/src/libgpureclaim.so
fi
do_build() {
  local gen=()
  command -v ninja >/dev/null 2>&1 && gen=(-G Ninja)
  if [ ! -f "$BUILD/CMakeCache.txt" ]; then
    cmake -S "$ROOT" -B "$BUILD" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DGPURECLAIM_BUILD_TESTS=OFF \
      -DCUDAToolkit_ROOT="$CUDA_HOME_GUESS" || return 1
  fi
  cmake --build "$BUILD" --target gpureclaim gpureclaim_cmd -j "$(nproc 2>/dev/null || echo 4)"
}
t0=$SECONDS
do_build >"$LOGS/build.log" 2>&1
BRC=$?
if [ "$BRC" -ne 0 ] || [ ! -e "$LIB" ]; then
  record FAIL build "cmake build of libgpureclaim failed (status $BRC), see logs/build.log: $(tail -n3 "$LOGS/build.log" | tr '\n' ' ')"
  finish
fi
BTYPE=$(sed -n 's/^CMAKE_BUILD_TYPE:[A-Z]*=//p' "$BUILD/CMakeCache.txt" 2>/dev/null)
record PASS build "libgpureclaim built in $((SECONDS - t0))s ($LIB, build type ${BTYPE:-?})"
echo "build: $LIB (${BTYPE:-?})" >>"$OUT/environment.txt"

# ---- nvcc programs ----
BIN=$BUILD/gpu-bin
mkdir -p "$BIN"
INC=$ROOT/include
CUDA_LIB64=$CUDA_HOME_GUESS/lib64
[ -d "$CUDA_LIB64" ] || CUDA_LIB64=$CUDA_HOME_GUESS/lib
build_one() {  # build_one OUTPUT SOURCE FLAGS...
  local out=$1 src=$2; shift 2
  rm -f "$BIN/$out"
  timeout 300 "$NVCC" -O2 -std=c++17 -I"$INC" -o "$BIN/$out" "$src" "$@" -ldl -lpthread >"$LOGS/nvcc-$out.log" 2>&1
}
t0=$SECONDS
NV_PROGS=(alloc_count_static alloc_count_shared scope_model bench_overhead bench_release)
build_one alloc_count_static "$HERE/alloc_count.cu" -cudart static &
build_one alloc_count_shared "$HERE/alloc_count.cu" -cudart shared -Xlinker -rpath,"$CUDA_LIB64" &
build_one scope_model "$HERE/scope_model.cu" -L"$BUILD/src" -lgpureclaim -Xlinker -rpath,"$BUILD/src" &
build_one bench_overhead "$ROOT/bench/gpu/bench_overhead.cu" &
build_one bench_release "$ROOT/bench/gpu/bench_release.cu" -L"$BUILD/src" -lgpureclaim -Xlinker -rpath,"$BUILD/src" &
# (C, no kernels: the host compiler and the driver API alone, as gpureclaim's sleep uses it)
CC_HOST=${CC:-$(command -v cc || command -v gcc)}
NV_PROGS+=(checkpoint_self)
rm -f "$BIN/checkpoint_self"
timeout 120 "$CC_HOST" -O2 -std=gnu11 -I"$HERE" -I"$CUDA_HOME_GUESS/include" -o "$BIN/checkpoint_self" \
  "$HERE/checkpoint_self.c" -L"$CUDA_LIB64/stubs" -lcuda -ldl -lpthread >"$LOGS/nvcc-checkpoint_self.log" 2>&1 &
wait
for p in "${NV_PROGS[@]}"; do
  [ -x "$BIN/$p" ] || record FAIL "nvcc-$p" "nvcc failed, see logs/nvcc-$p.log: $(tail -n3 "$LOGS/nvcc-$p.log" | tr '\n' ' ')"
done
echo "tests/gpu: nvcc programs built in $((SECONDS - t0))s"

have() { [ -x "$BIN/$1" ]; }

# ---- the frameworks without gpureclaim: tells a broken environment from a gpureclaim failure ----
run_test baseline 120 plain "$PY" "$HERE/baseline.py"

# ---- exact counts from nvcc-built programs, static and shared cudart ----
have alloc_count_static && run_test c_alloc_static 60 preload "$BIN/alloc_count_static" static
have alloc_count_shared && run_test c_alloc_shared 60 preload "$BIN/alloc_count_shared" shared
# ---- scopes, GPURECLAIM_ALL and a pool trim in a C program linked with -lgpureclaim ----
have scope_model && run_test c_scope_all 90 plain "$BIN/scope_model"

# ---- frameworks (each script runs the exact accounting and the signal release) ----
run_test torch_default 120 preload "$PY" -X faulthandler "$HERE/torch_test.py" default
run_test torch_async 120 preload env PYTORCH_CUDA_ALLOC_CONF=backend:cudaMallocAsync \
  "$PY" -X faulthandler "$HERE/torch_test.py" async
run_test torch_expandable 120 preload env PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True \
  "$PY" -X faulthandler "$HERE/torch_test.py" expandable
run_test cupy 100 preload "$PY" -X faulthandler "$HERE/cupy_test.py"
run_test jax 120 preload env XLA_PYTHON_CLIENT_PREALLOCATE=false "$PY" -X faulthandler "$HERE/jax_test.py" counts
run_test jax_prealloc 90 preload "$PY" -X faulthandler "$HERE/jax_test.py" prealloc

# ---- sleep: the driver's checkpoint API as gpureclaim uses it, then sleep/wake and peer reclaim with PyTorch ----
have checkpoint_self && run_test checkpoint_self 90 plain "$BIN/checkpoint_self" 1024
run_test sleep 200 plain env GPU_PART=sleep bash "$HERE/sleep_peers.sh" "$BUILD"
run_test peers 150 plain env GPU_PART=peers bash "$HERE/sleep_peers.sh" "$BUILD"

# ---- benchmarks ----
have bench_release && run_test bench_release 120 plain "$BIN/bench_release" "$OUT/bench_release.json"
have bench_overhead && run_test bench_overhead 150 plain "$BIN/bench_overhead" "$LIB" "$OUT/bench_overhead.json"

# ---- status files left behind (a process that was killed or crashed leaves its own) ----
left=$(find "$OUT/rundir" -mindepth 1 -printf '%f ' 2>/dev/null)
echo "rundir left-overs: ${left:-none}" >>"$OUT/environment.txt"
finish

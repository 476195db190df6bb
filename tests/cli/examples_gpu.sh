#!/usr/bin/env bash
# The examples and the command on a real GPU, as the README and examples/shell-session.md show them: demo and
# inference, then train.py (PyTorch when it is there) started with `gpureclaim run`, looked at with ps, snapshot
# and --prometheus, and given its memory back with `gpureclaim release` from outside.
#
#   tests/cli/examples_gpu.sh BUILD_DIR SOURCE_DIR
#
# Exits 77 (CTest: skipped) where there is no GPU or in a sanitizer build (GR_PRELOAD set: the real driver and
# PyTorch are not run under sanitizers here), 1 if a check failed. Environment: CUDA_HOME (default
# /usr/local/cuda), PYTHON (default python3).
set -uo pipefail
build=$1 src=$2
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q GPU; then
  echo "examples_gpu: skipped: no GPU (nvidia-smi lists none)"
  exit 77
fi
if [[ -n "${GR_PRELOAD:-}" ]]; then
  echo "examples_gpu: skipped: sanitizer build (use a plain build on the GPU)"
  exit 77
fi
# The real runtime ahead of the simulator the examples may be linked with (LD_LIBRARY_PATH beats RUNPATH).
export LD_LIBRARY_PATH="${CUDA_HOME:-/usr/local/cuda}/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
unset LD_PRELOAD
tmp="$(mktemp -d)"
trap 'kill "$train" 2>/dev/null; rm -rf "$tmp"' EXIT
export GPURECLAIM_RUNDIR="$tmp/run" GPURECLAIM_LOG="$tmp/releases.log"
cmd="$build/tools/gpureclaim" py="${PYTHON:-python3}" failed=0 train=""
pass() { echo "PASS $1"; }
fail() { echo "FAIL $1"; failed=1; }
expect() { # expect NAME TEXT PATTERN: PATTERN (an extended regex) is found in TEXT
  if grep -Eq -- "$3" <<<"$2"; then pass "$1"; else fail "$1: no /$3/ in:"; echo "$2" | sed 's/^/    /'; fi
}
echo "== $(nvidia-smi -L | head -1)"

out="$("$cmd" run -- "$build/examples/demo" 2>&1)"
echo "$out"
expect "demo: the release gave back the pool and the orphans" "$out" "gpureclaim_release: 1536\.0 MiB back"
expect "demo: the weights were left alone" "$out" "after the release +live +768\.0 MiB"

out="$("$build/examples/inference" 10 2>&1)"
echo "$out" | tail -3
expect "inference: memory stayed flat" "$out" "memory stayed flat over 10 model loads"

"$cmd" run -- "$py" "$src/examples/train.py" --steps 5 --width 4096 --wait 120 >"$tmp/train.out" 2>&1 &
train=$!
for _ in $(seq 600); do grep -q "waiting up to" "$tmp/train.out" && break; kill -0 "$train" 2>/dev/null || break; sleep 0.1; done
cat "$tmp/train.out"
expect "train.py: waits for a release" "$(cat "$tmp/train.out")" "waiting up to"
out="$("$cmd" ps)"
echo "$out"
expect "ps: lists train.py on device 0" "$out" "^ *$train 0 .*python3? .*train\.py"
expect "ps: the GPU's used and total memory as the driver reports them" "$out" "^ +0 GPU-[0-9a-f-]{36} +[0-9.]+ [KMG]?i?B +[0-9.]+ GiB "
expect "ps --json parses" "$("$cmd" ps --json | "$py" -c 'import json,sys; r=json.load(sys.stdin); print(r[0]["answered"], r[0]["devices"])')" "^True \[0\]$"
# The UUID is nvidia-smi's; the framework cache is counted in CACHED before the release (checked below).
uuid="$("$cmd" ps --query gpu_uuid --format csv,noheader | head -1)"
expect "ps: the GPU's UUID is one nvidia-smi -L lists" "$(nvidia-smi -L)" "UUID: ${uuid:-none}\)"
cached="$("$cmd" ps --query cached --format csv,noheader | head -1)"
expect "ps: the framework's releasable cache is in CACHED" "$("$cmd" ps --json)" "\"frameworks\":\[\{\"framework\":\"(pytorch|simframework)\",\"device\":0,\"reserved_bytes\":[1-9]"
"$cmd" ps --prometheus "$tmp/g.prom" && expect "ps --prometheus" "$(cat "$tmp/g.prom")" "^gpureclaim_live_bytes\{pid=\"$train\",device=\"0\",command=\"python3?[^\"]*\"\} [1-9]"
out="$("$cmd" snapshot "$train")"
echo "$out" | head -8
expect "snapshot: blocks attributed to PyTorch's library" "$out" "libc10_cuda\.so|libtorch|simframework|libcudart"
out="$("$cmd" release --json "$train")"
echo "$out"
expect "release: PyTorch's cache came back" "$out" "\"ok\":true.*\"framework_bytes\":[1-9]"
fw="$(grep -Eo '"framework_bytes":[0-9]+' <<<"$out" | head -1 | cut -d: -f2)"
# Not less than ps said: the release also empties cuBLAS's workspaces into the cache first.
if [[ -n "$fw" && -n "$cached" && "$cached" -gt 0 && "$fw" -ge "$cached" ]]; then pass "release: at least what ps said ($cached)"
else fail "release: framework_bytes $fw, ps said $cached"; fi
wait "$train"
rc=$?
train=""
cat "$tmp/train.out" | tail -3
[[ $rc == 0 ]] && pass "train.py: exit status 0" || fail "train.py: exit status $rc"
expect "train.py: nothing left reserved after the release" "$(cat "$tmp/train.out")" "after the release: 0\.0 MiB reserved"
expect "train.py: model 2 trained afterwards" "$(cat "$tmp/train.out")" "^model 2: trained"
exit $failed

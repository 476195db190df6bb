#!/usr/bin/env bash
# Installs what is missing, builds, and runs the demo under gpureclaim: on the real driver when a GPU is
# present, else on the CUDA simulator. Then shows the same from outside: a program holding memory, listed
# with `gpureclaim ps` and released with `gpureclaim release`.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
build="${BUILD_DIR:-build}"
mkdir -p "$build"
log="$build/demo-build.log"
echo "== building in $build (about a minute on 2 cores; output in $log)"
if ! { cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo && cmake --build "$build" -j"$(nproc 2>/dev/null || echo 2)"; } >"$log" 2>&1; then
  tail -n 40 "$log" >&2
  echo "demo: the build failed (whole output in $log)" >&2
  exit 1
fi
export GPURECLAIM_RUNDIR="${GPURECLAIM_RUNDIR:-$(mktemp -d)/run}"
if command -v nvidia-smi >/dev/null && nvidia-smi -L 2>/dev/null | grep -q GPU; then
  echo "== demo on the real driver: $(nvidia-smi -L | head -1)"
  export LD_LIBRARY_PATH="${CUDA_HOME:-/usr/local/cuda}/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
else
  echo "== no GPU here: the demo runs on the CUDA simulator ($build/sim)"
  export LD_LIBRARY_PATH="$(cd "$build/sim" && pwd)${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
echo "\$ gpureclaim run -- $build/examples/demo"
"$build/tools/gpureclaim" run -- "$build/examples/demo"

echo
echo "== from outside the process"
coproc HOLD { exec "$build/tools/gpureclaim" run -- "$build/tests/cli/hold"; }
hold_pid=$HOLD_PID # bash unsets HOLD_PID as soon as the coprocess has exited: keep it for the wait below
read -r _ pid <&"${HOLD[0]}"
echo "\$ gpureclaim ps"
"$build/tools/gpureclaim" ps
echo "\$ gpureclaim release $pid"
"$build/tools/gpureclaim" release "$pid"
echo "\$ gpureclaim snapshot $pid"
"$build/tools/gpureclaim" snapshot "$pid"
exec {HOLD[1]}>&-
wait "$hold_pid" 2>/dev/null || true

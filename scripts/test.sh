#!/usr/bin/env bash
# Builds gpureclaim and runs the whole test suite (on the CUDA simulator; tests/gpu/ too when a GPU is
# present). Extra arguments go to CMake (e.g. -DGPURECLAIM_ASAN=ON). Environment: BUILD_DIR (default build),
# CTEST_ARGS (e.g. "-L concurrency").
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
build="${BUILD_DIR:-build}"
jobs="$(nproc 2>/dev/null || echo 2)"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGPURECLAIM_WERROR=ON "$@" >/dev/null
cmake --build "$build" -j"$jobs"
# shellcheck disable=SC2086
ctest --test-dir "$build" -j"$jobs" --output-on-failure ${CTEST_ARGS:-}

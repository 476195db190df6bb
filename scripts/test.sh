#!/usr/bin/env bash
# Builds gpureclaim and runs the whole test suite (on the CUDA simulator; tests/gpu/ too when a GPU is
# present). Extra arguments go to CMake (e.g. -DGPURECLAIM_ASAN=ON). Environment: BUILD_DIR (default build),
# CTEST_ARGS (e.g. "-L concurrency"). Fails when a test fails, and when one was skipped that tests/expected_skips
# does not allow in this configuration; every skip is printed with its reason.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/deps.sh
build="${BUILD_DIR:-build}"
jobs="$(nproc 2>/dev/null || echo 2)"
cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DGPURECLAIM_WERROR=ON "$@" >/dev/null
cmake --build "$build" -j"$jobs"
log="$build/ctest.log"
set +e
# shellcheck disable=SC2086
ctest --test-dir "$build" -j"$jobs" --output-on-failure ${CTEST_ARGS:-} | tee "$log"
rc=${PIPESTATUS[0]}
set -e

# Skips: which conditions of tests/expected_skips hold here.
conds=""
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q GPU; then conds+=" nogpu"; fi
if env -u LD_LIBRARY_PATH python3 -c "import ctypes; ctypes.CDLL('libcuda.so.1')" 2>/dev/null; then conds+=" driver"; fi
[[ $(id -u) -eq 0 ]] || conds+=" notroot"
grep -q '^GPURECLAIM_ASAN:BOOL=ON' "$build/CMakeCache.txt" && conds+=" asan san"
grep -q '^GPURECLAIM_TSAN:BOOL=ON' "$build/CMakeCache.txt" && conds+=" tsan san"
skipped=$(sed -n '/^The following tests did not run:/,/^$/s/^[[:space:]]*[0-9]* - \([^ ]*\) (.*$/\1/p' "$log")
unexpected=0
for t in $skipped; do
  allowed=$(awk -v t="$t" -v c="$conds " '$1 == t && index(c, " " $2 " ") { print $2; exit }' tests/expected_skips)
  if [[ -n "$allowed" ]]; then echo "skipped: $t (expected here: $allowed)"; else echo "skipped: $t (NOT EXPECTED)"; fi
  [[ -f "$build/run/$t.skip" ]] && sed 's/^/    /' "$build/run/$t.skip"
  [[ -n "$allowed" ]] || unexpected=1
done
if [[ $unexpected -ne 0 ]]; then
  echo "a test was skipped that tests/expected_skips does not allow here (conditions:$conds)"
  [[ $rc -ne 0 ]] || rc=1
fi
exit "$rc"

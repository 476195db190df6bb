#!/usr/bin/env bash
# Random sequences of driver calls, valid and invalid, give the same results and out-parameters with and
# without gpureclaim (GPURECLAIM_OOM_RETRY=0: the documented exception switched off). Every run "with" must prove,
# from inside the process, that gpureclaim was loaded, enabled and tracking (its table equal to the simulator's
# blocks); every run "without" that it was not loaded. A wrong PRELOAD or GPURECLAIM_DISABLE=1 fails the test.
# Usage: test_differential.sh DIFF_DRIVER PRELOAD [SEEDS]
set -euo pipefail
prog="$1" preload="$2" seeds="${3:-25}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
calls=0 allocs=0
for seed in $(seq 1 "$seeds"); do
  rm -f "$tmp/ev_plain" "$tmp/ev_with"
  env -u LD_PRELOAD DIFF_EVIDENCE="$tmp/ev_plain" "$prog" "$seed" > "$tmp/plain" 2>/dev/null
  LD_PRELOAD="$preload" GPURECLAIM_OOM_RETRY=0 GPURECLAIM_LOG="$tmp/log" GPURECLAIM_RUNDIR="$tmp/run" \
    DIFF_EVIDENCE="$tmp/ev_with" "$prog" "$seed" > "$tmp/with" 2>"$tmp/with_err" || {
    echo "test_differential: seed $seed: the run with gpureclaim failed:"; head -20 "$tmp/with_err"; exit 1; }
  if ! grep -qx "loaded 0" "$tmp/ev_plain" 2>/dev/null; then
    echo "test_differential: seed $seed: gpureclaim was loaded in the run without it"
    exit 1
  fi
  if ! grep -qx "verdict tracked" "$tmp/ev_with" 2>/dev/null; then
    echo "test_differential: seed $seed: no evidence that gpureclaim ran (LD_PRELOAD=$preload):"
    cat "$tmp/ev_with" 2>/dev/null || echo "(no evidence written)"
    head -5 "$tmp/with_err"
    exit 1
  fi
  if ! cmp -s "$tmp/plain" "$tmp/with"; then
    echo "test_differential: seed $seed: results differ with gpureclaim:"
    diff "$tmp/plain" "$tmp/with" | head -20
    exit 1
  fi
  calls=$((calls + $(wc -l < "$tmp/plain")))
  allocs=$((allocs + $(sed -n 's/^allocs \([0-9]*\) .*/\1/p' "$tmp/ev_with")))
done
grep -q " [1-9]" "$tmp/plain" || { echo "test_differential: no failing call was exercised"; exit 1; }
echo "test_differential: $seeds seeds, $calls calls ($allocs allocations, every one tracked): identical results" \
  "and out-parameters"

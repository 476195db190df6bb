#!/usr/bin/env bash
# Random sequences of driver calls, valid and invalid, give the same results and out-parameters with and
# without gpureclaim (GPURECLAIM_OOM_RETRY=0: the documented exception switched off).
# Usage: test_differential.sh DIFF_DRIVER PRELOAD [SEEDS]
set -euo pipefail
prog="$1" preload="$2" seeds="${3:-25}"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
calls=0
for seed in $(seq 1 "$seeds"); do
  env -u LD_PRELOAD "$prog" "$seed" > "$tmp/plain" 2>/dev/null
  LD_PRELOAD="$preload" GPURECLAIM_OOM_RETRY=0 GPURECLAIM_LOG="$tmp/log" GPURECLAIM_RUNDIR="$tmp/run" \
    "$prog" "$seed" > "$tmp/with" 2>/dev/null
  if ! cmp -s "$tmp/plain" "$tmp/with"; then
    echo "test_differential: seed $seed: results differ with gpureclaim:"
    diff "$tmp/plain" "$tmp/with" | head -20
    exit 1
  fi
  calls=$((calls + $(wc -l < "$tmp/plain")))
done
grep -q " [1-9]" "$tmp/plain" || { echo "test_differential: no failing call was exercised"; exit 1; }
echo "test_differential: $seeds seeds, $calls calls: identical results and out-parameters"

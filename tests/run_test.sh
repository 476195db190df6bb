#!/bin/sh
# Every CTest test runs through this (gr_add_test in tests/CMakeLists.txt):
#
#   run_test.sh RUNDIR [--expect RE --cmake CMAKE] -- COMMAND [ARG...]
#
# - RUNDIR is the test's own run directory: emptied and created 0700 before the test (the library refuses any
#   other mode), exported as GPURECLAIM_RUNDIR (a test may name another one for its programs).
# - RUNDIR.sim, made the same way, is the test's simulated machine (SIMCUDA_MACHINE, tests/sim/simcuda.h): the
#   test's processes share its GPUs, no other test's do.
# - A skip is never a pass. COMMAND exiting 77, or a test inside it reporting a skip (Criterion's and
#   sim_minicheck's "[SKIP] suite::name: reason" under --verbose, unittest's "... skipped 'reason'"), ends this
#   with 77, which CTest counts as skipped (SKIP_RETURN_CODE); the reasons are printed and kept in RUNDIR.skip for
#   scripts/test.sh, which fails on a skip that tests/expected_skips does not allow.
# - A Criterion program that ran no test at all fails.
# - --expect: the output must also match RE, as CTest's PASS_REGULAR_EXPRESSION would (matched by CMAKE -P
#   output_matches.cmake); unlike that property, the exit status still counts.
set -u
if [ $# -lt 3 ]; then
  echo "usage: run_test.sh RUNDIR [--expect RE --cmake CMAKE] -- COMMAND [ARG...]" >&2
  exit 2
fi
rundir=$1
shift
expect="" cmake=cmake
while [ $# -gt 0 ]; do
  case $1 in
  --expect) expect=$2; shift 2 ;;
  --cmake) cmake=$2; shift 2 ;;
  --) shift; break ;;
  *) echo "run_test.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
rm -rf "$rundir" "$rundir.out" "$rundir.rc" "$rundir.skip" "$rundir.sim"
mkdir -p "$(dirname "$rundir")" && mkdir -m 0700 "$rundir" "$rundir.sim" || exit 2
export GPURECLAIM_RUNDIR="$rundir"
# The sanitizer build's known false positives (tests/lsan.supp); other builds ignore the variable.
export LSAN_OPTIONS="suppressions=$(cd "$(dirname "$0")" && pwd)/lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
# One simulated machine per test: its processes share the simulated GPUs' memory, tests running beside it
# (ctest -j) never see it.
export SIMCUDA_MACHINE="$rundir.sim"

# The output goes through to CTest as it comes and is kept in RUNDIR.out to be judged.
{ "$@"; echo $? >"$rundir.rc"; } 2>&1 | tee "$rundir.out"
rc=$(cat "$rundir.rc" 2>/dev/null || echo 255)
if [ "$rc" -ne 0 ] && [ "$rc" -ne 77 ]; then
  echo "run_test.sh: exit status $rc"
  exit "$rc"
fi
if [ -n "$expect" ] && ! OUT="$rundir.out" RE="$expect" "$cmake" -P "$(dirname "$0")/output_matches.cmake"; then
  echo "run_test.sh: exit status $rc, but the output does not match"
  exit 1
fi
grep -E '^\[SKIP\] |\.\.\. skipped ' "$rundir.out" >"$rundir.skip"
if [ "$rc" -eq 77 ]; then
  tail -n 3 "$rundir.out" >>"$rundir.skip"
fi
if [ -s "$rundir.skip" ]; then
  echo "run_test.sh: skipped, in part or in whole:"
  sed 's/^/  /' "$rundir.skip"
  exit 77
fi
rm -f "$rundir.skip"
if grep -q '^\[====\] Synthesis: Tested: 0 ' "$rundir.out"; then
  echo "run_test.sh: no test ran"
  exit 1
fi
exit 0

#!/bin/sh
# test_no_driver.sh CMD SIM_DIR: `gpureclaim run` says in one line when no CUDA driver (libcuda.so.1) can be
# loaded, with the LD_LIBRARY_PATH of the build tree's simulator, and still runs the program; with the
# simulator on LD_LIBRARY_PATH it says nothing. Where a CUDA driver is installed its absence cannot be shown:
# skipped, saying so (tests/expected_skips: "driver").
set -u
cmd=$1 sim=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
if LD_LIBRARY_PATH="$tmp" python3 -c "import ctypes; ctypes.CDLL('libcuda.so.1')" 2>/dev/null; then
  echo "test_no_driver: skipped: a CUDA driver is installed here (libcuda.so.1 loads): its absence cannot be shown"
  exit 77
fi
fail() { echo "test_no_driver: $*"; exit 1; }
out=$(LD_LIBRARY_PATH="$tmp" "$cmd" run -- sh -c 'echo ran' 2>"$tmp/err") || fail "run failed: $(cat "$tmp/err")"
[ "$out" = ran ] || fail "the program did not run: $out"
cat "$tmp/err"
[ "$(wc -l <"$tmp/err")" -eq 1 ] || fail "expected one line on stderr"
grep -q '^gpureclaim: run: no CUDA driver can be loaded (libcuda.so.1' "$tmp/err" || fail "no word about the driver"
dir=$(sed -n 's/.*export LD_LIBRARY_PATH=//p' "$tmp/err")
[ -f "$dir/libcuda.so.1" ] || fail "the LD_LIBRARY_PATH it gives holds no libcuda.so.1: $dir"
[ "$(cd "$dir" && pwd -P)" = "$(cd "$sim" && pwd -P)" ] || fail "not the build tree's simulator: $dir"
# Followed, the advice works: the driver loads, and run says nothing.
out=$(LD_LIBRARY_PATH="$dir" "$cmd" run -- sh -c 'echo ran' 2>"$tmp/err") || fail "run failed: $(cat "$tmp/err")"
[ "$out" = ran ] && [ ! -s "$tmp/err" ] || fail "with the simulator: '$out', stderr: $(cat "$tmp/err")"
echo "test_no_driver: one line without a driver, naming the simulator; silence with it"

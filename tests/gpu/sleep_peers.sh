#!/usr/bin/env bash
# Sleep/wake and peer reclaim with PyTorch on a real GPU: what the simulator stands in for everywhere else.
#
#   tests/gpu/sleep_peers.sh BUILD_DIR [LIVE_GIB] [CACHED_GIB] [PEER_CACHED_GIB]     (defaults 4 2 80)
#
# 1. sleep: a PyTorch process holding LIVE_GIB live (known contents) and CACHED_GIB cached is put to sleep with
#    `gpureclaim sleep` (the driver's checkpoint API), woken with `gpureclaim wake`, checked; put to sleep again
#    and woken by its own next CUDA call (the gates), checked again. The device's used memory (nvidia-smi) is
#    printed at every step.
# 2. peers: process B caches PEER_CACHED_GIB in PyTorch's allocator and idles; process A asks for more than the
#    device has free: first with peers off (it must fail: the premise), then with peers on (B must give its
#    cache and A's allocation succeed).
#
# GPU_PART=sleep or GPU_PART=peers runs one part only (tests/gpu/run.sh runs them as the tests sleep and
# peers). Prints a GPUTEST line per check (tests/gpu/collect.py; names prefixed with GPU_TEST_NAME); exits 1 if a
# check failed, 0 without a GPU (skipped, saying so).
set -uo pipefail
build=$(cd "${1:?usage: sleep_peers.sh BUILD_DIR [LIVE_GIB] [CACHED_GIB] [PEER_CACHED_GIB]}" && pwd)
live=${2:-4} cached=${3:-2} peer=${4:-80}
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L 2>/dev/null | grep -q '^GPU '; then
  echo "sleep_peers: skipped: no GPU (nvidia-smi lists none)"
  exit 0
fi
py=${PYTHON:-python3}
gr=$build/tools/gpureclaim
unset LD_PRELOAD
tmp=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null; done; rm -rf "$tmp"' EXIT
mkdir -m 700 "$tmp/run"
export GPURECLAIM_RUNDIR=$tmp/run PYTHONUNBUFFERED=1
failed=0
prefix=${GPU_TEST_NAME:-gpu}
jstr() { local s=${1//\\/\\\\}; s=${s//\"/\\\"}; printf '"%s"' "$(printf '%s' "$s" | tr -d '\000-\037')"; }
result() { # result CHECK PASS|FAIL DETAIL: a GPUTEST line (tests/gpu/collect.py)
  [[ $2 == FAIL ]] && failed=1
  printf 'GPUTEST {"name": %s, "status": "%s", "detail": %s, "data": {}}\n' "$(jstr "$prefix.$1")" "$2" "$(jstr "$3")"
}
pass() { result "${1%%:*}" PASS "$1"; }
fail() { result "${1%%:*}" FAIL "$1"; }
used() { nvidia-smi --query-gpu=memory.used --format=csv,noheader,nounits -i 0 | tr -dc '0-9'; }
waitfor() { # waitfor FILE PATTERN SECONDS PID
  local i
  for ((i = 0; i < $3 * 10; i++)); do
    grep -q -- "$2" "$1" 2>/dev/null && return 0
    kill -0 "$4" 2>/dev/null || { grep -q -- "$2" "$1" 2>/dev/null; return; }
    sleep 0.1
  done
  return 1
}

part=${GPU_PART:-all}
# ---------------- sleep / wake ----------------
if [[ $part == all || $part == sleep ]]; then
cat >"$tmp/holder.py" <<'EOF'
import os, sys, time, torch
GiB = 1 << 30
live_gib, cached_gib, go = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
n = live_gib * GiB // 4
live = torch.arange(n, dtype=torch.int32, device="cuda")
c = torch.empty(cached_gib * GiB, dtype=torch.uint8, device="cuda")
del c
torch.cuda.synchronize()
print("ready %d reserved %d" % (os.getpid(), torch.cuda.memory_reserved()), flush=True)
for r in range(2):
    while not os.path.exists(go + str(r)):
        time.sleep(0.05)
    t = time.time()
    ok = bool((live == torch.arange(n, dtype=torch.int32, device="cuda")).all().item())
    a = torch.randn(512, 512, device="cuda", dtype=torch.float64)
    mm = torch.allclose((a @ a).cpu(), a.cpu() @ a.cpu())
    print("check %d contents %s matmul %s in %.3f s" % (r, ok, mm, time.time() - t), flush=True)
EOF
echo "== sleep/wake: $live GiB live, $cached GiB cached; device used $(used) MiB before"
GPURECLAIM_LOG=$tmp/holder.jsonl "$gr" run -- "$py" "$tmp/holder.py" "$live" "$cached" "$tmp/go" >"$tmp/holder.out" 2>&1 &
h=$!; pids+=("$h")
if waitfor "$tmp/holder.out" '^ready' 90 "$h"; then
  u0=$(used); echo "device used with the holder: $u0 MiB"
  "$gr" ps
  t0=$(date +%s%N)
  out=$(timeout 150 "$gr" sleep "$h" --json -t 60 2>&1); rc=$?
  sleep_ms=$((($(date +%s%N) - t0) / 1000000))
  echo "sleep (rc $rc, $sleep_ms ms): $out"
  u1=$(used); echo "device used asleep: $u1 MiB"
  "$gr" ps
  if [[ $rc == 0 && $((u0 - u1)) -ge $(((live + cached) * 1024 * 95 / 100)) ]]; then
    pass "asleep: the device gained $((u0 - u1)) MiB of the holder's $u0 MiB in $sleep_ms ms"
  else fail "asleep: rc $rc, device used $u0 -> $u1 MiB (gpureclaim sleep: $out)"; fi
  t0=$(date +%s%N)
  out=$(timeout 150 "$gr" wake "$h" --json -t 120 2>&1); rc=$?
  wake_ms=$((($(date +%s%N) - t0) / 1000000))
  echo "wake (rc $rc, $wake_ms ms): $out"
  u2=$(used); echo "device used awake: $u2 MiB"
  [[ $rc == 0 && $((u2 - u1)) -ge $((live * 1024 * 95 / 100)) ]] && pass "awake: $((u2 - u1)) MiB back on the device in $wake_ms ms" ||
    fail "awake: rc $rc, device used $u1 -> $u2 MiB (gpureclaim wake: $out)"
  touch "$tmp/go0"
  waitfor "$tmp/holder.out" '^check 0' 120 "$h"
  grep -q '^check 0 contents True matmul True' "$tmp/holder.out" && pass "contents_after_wake: $(grep '^check 0' "$tmp/holder.out")" ||
    fail "contents_after_wake: $(grep '^check 0' "$tmp/holder.out")"
  out=$(timeout 150 "$gr" sleep "$h" 2>&1); rc=$?
  echo "sleep again (rc $rc): $out; device used $(used) MiB"
  touch "$tmp/go1"   # its next CUDA call goes through a gate and wakes it
  waitfor "$tmp/holder.out" '^check 1' 150 "$h"
  grep -q '^check 1 contents True matmul True' "$tmp/holder.out" && pass "woken_by_its_call: $(grep '^check 1' "$tmp/holder.out")" ||
    fail "woken_by_its_call: $(grep '^check 1' "$tmp/holder.out") (sleep: $out)"
  wait "$h"; rc=$?
  [[ $rc == 0 ]] && pass "exit: the holder exited with status 0" || fail "exit: the holder exited with status $rc"
else
  fail "asleep: the holder never got ready: $(tail -3 "$tmp/holder.out" | tr '\n' ' ')"
fi
echo "-- holder output"; cat "$tmp/holder.out"
echo "-- holder log"; cut -c1-600 "$tmp/holder.jsonl" 2>/dev/null
fi

# ---------------- peers ----------------
if [[ $part == all || $part == peers ]]; then
cat >"$tmp/b.py" <<'EOF'
import os, sys, time, torch
GiB = 1 << 30
ts = [torch.empty(8 * GiB, dtype=torch.uint8, device="cuda") for _ in range(int(sys.argv[1]) // 8)]
del ts
keep = torch.ones(1 << 20, device="cuda")
torch.cuda.synchronize()
print("ready reserved %d" % torch.cuda.memory_reserved(), flush=True)
while not os.path.exists(sys.argv[2]):
    time.sleep(0.1)
print("reserved %d keep %s" % (torch.cuda.memory_reserved(), bool((keep == 1).all().item())), flush=True)
EOF
cat >"$tmp/a.py" <<'EOF'
import os, sys, time, torch
free, total = torch.cuda.mem_get_info()
want = free + 10 * (1 << 30)
t = time.time()
try:
    x = torch.empty(want, dtype=torch.uint8, device="cuda")
    x.fill_(1)
    torch.cuda.synchronize()
    print("allocated %d (free was %d) in %.3f s" % (want, free, time.time() - t), flush=True)
except torch.OutOfMemoryError as e:
    print("oom asking %d (free was %d) after %.3f s" % (want, free, time.time() - t), flush=True)
EOF
echo "== peers: B caches $peer GiB; device used $(used) MiB before"
GPURECLAIM_LOG=$tmp/b.jsonl "$gr" run -- "$py" "$tmp/b.py" "$peer" "$tmp/stopb" >"$tmp/b.out" 2>&1 &
b=$!; pids+=("$b")
if waitfor "$tmp/b.out" '^ready' 120 "$b"; then
  echo "device used with B: $(used) MiB"
  out=$(GPURECLAIM_LOG=$tmp/a0.jsonl timeout 120 "$gr" run --peers off -- "$py" "$tmp/a.py" 2>&1)
  echo "A, peers off: $out"
  grep -q '^oom' <<<"$out" && pass "premise: with peers off A runs out ($out)" || fail "premise: with peers off A did not run out ($out)"
  out=$(GPURECLAIM_LOG=$tmp/a1.jsonl GPURECLAIM_PEER_TIMEOUT=30 GPURECLAIM_VERBOSE=1 timeout 120 "$gr" run -- "$py" "$tmp/a.py" 2>&1)
  echo "A, peers on: $out"
  grep -q '^allocated' <<<"$out" && pass "relieved: with peers on A's allocation succeeded ($(grep '^allocated' <<<"$out"))" || fail "relieved: with peers on A did not get its memory ($out)"
  echo "-- A's log"; cut -c1-800 "$tmp/a1.jsonl" 2>/dev/null
  touch "$tmp/stopb"
  waitfor "$tmp/b.out" '^reserved' 30 "$b"
  wait "$b"
  cat "$tmp/b.out"
  grep -q 'keep True' "$tmp/b.out" && pass "giver_intact: $(grep '^reserved' "$tmp/b.out")" || fail "giver_intact: B's live tensor not checked or changed: $(tail -2 "$tmp/b.out" | tr '\n' ' ')"
  echo "-- B's log"; cut -c1-600 "$tmp/b.jsonl" 2>/dev/null
else
  fail "premise: B never got ready: $(tail -3 "$tmp/b.out" | tr '\n' ' ')"
fi
fi
echo "sleep_peers ($part): $([[ $failed == 0 ]] && echo 'all passed' || echo 'FAILED')"
exit $failed

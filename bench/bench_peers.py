#!/usr/bin/env python3
"""bench_peers: time from an allocation that fails for lack of memory to its successful retry after a peer reclaim,
per category of what the peer gives (pool cache, orphans, Python framework cache), on the simulator.

Two processes share one simulated 256 MiB GPU (SIMCUDA_MACHINE): B holds 192 MiB in one category, A allocates
128 MiB with cuMemAlloc. A's own retry finds nothing, it asks B, B gives, A's retry succeeds. The figure is the
whole cuMemAlloc call as A's program times it (CLOCK_MONOTONIC around the call: the failing attempt, A's own
release, the GPU's lock, reading the status files, the request, B's release, the retry). Then A frees its block
and B refills its cache, untimed, for the next trial.

usage: bench_peers.py [TRIALS]   (default 200; PEER_PROG, GR_PRELOAD, GR_EXAMPLES, LD_LIBRARY_PATH as CTest sets
them, each defaulting to the build tree build/ under the repository root: see bench/README.md)"""
import json
import os
import subprocess
import sys
import tempfile
import time

MiB = 1024 * 1024

FRAMEWORK_B = r"""
import os, sys
sys.path.insert(0, os.environ["GR_EXAMPLES"])
import simframework as fw
print("ready %d" % os.getpid(), flush=True)
for line in sys.stdin:
    if line.strip() == "fill":
        ts = [fw.Tensor(32 << 20) for _ in range(6)]
        del ts
        print("filled", flush=True)
"""


class Proc:
    def __init__(self, argv, env):
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        first = self.p.stdout.readline().split()
        if not first or first[0] != "ready":
            sys.exit("bench_peers: %s did not start: %r" % (argv[0], first))
        self.pid = int(first[1])

    def wait_listed(self, rundir):
        """Until its status file names the GPU it holds memory on (its worker rewrites it within 0.5 s)."""
        for _ in range(400):
            try:
                with open(os.path.join(rundir, "%d.json" % self.pid)) as f:
                    if json.load(f)["peer"]["gpus"]:
                        return
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.05)
        sys.exit("bench_peers: the status file of %d never listed a GPU" % self.pid)

    def ask(self, line):
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()
        return self.p.stdout.readline().split()

    def close(self):
        self.p.stdin.close()
        self.p.wait()
        self.p.stdout.close()


def pct(v, q):
    v = sorted(v)
    return v[min(len(v) - 1, int(q * len(v)))]


def run(category, trials, base, where):
    with tempfile.TemporaryDirectory(prefix="bench-peers-", dir=where) as tmp:
        machine, rundir = os.path.join(tmp, "m"), os.path.join(tmp, "r")
        os.mkdir(machine, 0o700)
        os.mkdir(rundir, 0o700)
        env = dict(base, SIMCUDA_MACHINE=machine, GPURECLAIM_RUNDIR=rundir, SIMCUDA_DEVICE_MEM=str(256 * MiB))
        env.pop("LD_PRELOAD", None)
        env.pop("GPURECLAIM_LOG", None)
        if category == "framework":
            b = Proc([sys.executable, "-c", FRAMEWORK_B], dict(env, LD_PRELOAD=base["GR_PRELOAD"]))
            refill = lambda: b.ask("fill")
        else:
            b = Proc([base["PEER_PROG"]], env)
            if category == "pool":
                def refill():
                    for _ in range(6):
                        b.ask("alloc 32 async")
                    b.ask("free")
            else:
                def refill():
                    for _ in range(6):
                        b.ask("orphan 32")
        refill()
        b.wait_listed(rundir)
        a = Proc([base["PEER_PROG"]], env)
        times, failed = [], 0
        for i in range(trials):
            if i:
                refill()
            ans = a.ask("alloc 128 alloc")
            if ans[0] == "ok":
                times.append(float(ans[1]))
            else:
                failed += 1
            a.ask("free")
        a.close()
        b.close()
    return times, failed


def main():
    trials = int(sys.argv[1]) if len(sys.argv) > 1 else 200
    base = dict(os.environ)
    # Unset, each defaults to the build tree under the repository root (build/), as README runs it.
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    defaults = {"PEER_PROG": os.path.join(root, "build", "tests", "integration", "peer_prog"),
                "GR_PRELOAD": os.path.join(root, "build", "src", "libgpureclaim.so"),
                "GR_EXAMPLES": os.path.join(root, "examples"),
                "LD_LIBRARY_PATH": os.path.join(root, "build", "sim")}
    for k, v in defaults.items():
        if not base.get(k):
            base[k] = v
    for k in ("PEER_PROG", "GR_PRELOAD", "GR_EXAMPLES"):
        if not os.path.exists(base[k]):
            sys.exit("bench_peers: %s=%s does not exist (build first, or set it: see bench/README.md)" % (k, base[k]))
    # The run directory where gpureclaim's default puts it: $XDG_RUNTIME_DIR (a tmpfs), else the temporary
    # directory; BENCH_RUNDIR_BASE chooses. Status files are written with fsync: the filesystem shows in the figures.
    where = base.get("BENCH_RUNDIR_BASE") or base.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()
    fs = "?"
    try:
        best = ""
        with open("/proc/self/mounts") as f:
            for line in f:
                dev, mnt, typ = line.split()[:3]
                if (os.path.realpath(where) + "/").startswith(mnt.rstrip("/") + "/") and len(mnt) >= len(best):
                    best, fs = mnt, typ
    except OSError:
        pass
    print("bench_peers: time from the failing cuMemAlloc to its successful retry, ms (%d trials each; run "
          "directory in %s, %s)" % (trials, where, fs))
    print("%-10s %8s %8s %8s %8s %7s" % ("category", "p50", "p99", "min", "max", "failed"))
    for cat in ("pool", "orphans", "framework"):
        t, failed = run(cat, trials, base, where)
        if t:
            print("%-10s %8.2f %8.2f %8.2f %8.2f %7d" % (cat, pct(t, 0.5), pct(t, 0.99), min(t), max(t), failed))
        else:
            print("%-10s %8s %8s %8s %8s %7d" % (cat, "-", "-", "-", "-", failed))


if __name__ == "__main__":
    main()

"""A stand-in for a process running gpureclaim, speaking docs/PROTOCOL.md from the library's side: it writes a
status file in the run directory and serves the control socket with canned answers, and handles the release
signal by counting a release in its status file. The command's tests use it to check parsing, formatting and
refusals without the library, and to make it misbehave in ways the library never does (silence, garbage).

    python3 fakeproc.py RUNDIR [--mode normal|silent|garbage|refuse|close] [--uid N] [--no-socket] [--old-library]
                               [--socket-gone] [--signal USR1] [--deaf] [--ignore-signal] [--program NAME]
                               [--log FILE]
                               [--other-release-first] [--old-status] [--die-on-signal] [--barrier N]
                               [--framework] [--scale N] [--sleeping]
                               [--log-connects] [--goes-to-sleep] [--die-on-release]
                               [--sharing [--wait-for alloc|wake]]

Prints "ready PID" once the status file and the socket exist; exits when stdin closes. Every request line and
every signal it receives is appended to --log, so a test can tell that nothing reached it.
"""
import argparse
import json
import os
import signal
import socket
import sys
import threading
import time

GiB, MiB = 1 << 30, 1 << 20

STATS_FIELDS = ("live_blocks live_bytes peak_bytes total_allocs total_frees pool_reserved_bytes pool_used_bytes "
                "host_pinned_blocks host_pinned_bytes va_reserved_bytes vmm_mapped_bytes orphan_blocks orphan_bytes "
                "ctx_destroyed_blocks ctx_destroyed_bytes untracked_frees late_frees untracked_routes releases "
                "released_bytes oom_retries oom_retry_successes table_bytes contexts pools").split()


def stats(**kw):
    s = dict.fromkeys(STATS_FIELDS, 0)
    s.update(kw)
    return s


# Two devices: 3 GiB live on device 0 (1 GiB cached in its pool: 1.5 GiB reserved, 0.5 GiB used, and a 512 MiB
# orphan), 512 MiB live on device 1; 2 MiB pinned host memory.
DEVICES = [dict(stats(live_blocks=3, live_bytes=3 * GiB, peak_bytes=4 * GiB, pool_reserved_bytes=3 * GiB // 2,
                      pool_used_bytes=GiB // 2, orphan_blocks=1, orphan_bytes=512 * MiB), device=0),
           dict(stats(live_blocks=1, live_bytes=512 * MiB, peak_bytes=512 * MiB), device=1)]
TOTAL = stats(live_blocks=4, live_bytes=3 * GiB + 512 * MiB, peak_bytes=4 * GiB + 512 * MiB,
              pool_reserved_bytes=3 * GiB // 2, pool_used_bytes=GiB // 2, orphan_blocks=1, orphan_bytes=512 * MiB,
              host_pinned_blocks=1, host_pinned_bytes=2 * MiB, contexts=2, pools=1, table_bytes=4096)


# Peer reclaim's counters (in the stats' total): each figure its own number, so that none passes for another.
PEER = {"peer_reclaims": 3, "peer_reclaim_successes": 2, "peer_received_bytes": 5 * MiB, "peer_gives": 4,
        "peer_given_bytes": 7 * MiB}

# The GPUs as the library's stats report them: ordinal, UUID, the driver's free and total memory (10 GiB used on
# device 0, 1 GiB on device 1).
GPUS = [{"device": 0, "uuid": "GPU-11111111-2222-4333-8444-555555555555", "free_bytes": 70 * GiB,
         "total_bytes": 80 * GiB},
        {"device": 1, "uuid": "GPU-aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee", "free_bytes": 79 * GiB,
         "total_bytes": 80 * GiB}]
# --framework: a PyTorch cache on device 0 (inside the live blocks): 2 GiB reserved, 1.25 GiB allocated,
# 512 MiB releasable, the other 256 MiB in split blocks that empty_cache() cannot give back.
FRAMEWORKS = [{"framework": "pytorch", "device": 0, "reserved_bytes": 2 * GiB, "allocated_bytes": GiB + 256 * MiB,
               "releasable_bytes": 512 * MiB}]


def scaled(x, n):
    """x with every *_bytes number multiplied by n."""
    if isinstance(x, list):
        return [scaled(v, n) for v in x]
    if isinstance(x, dict):
        return {k: v * n if k.endswith("_bytes") and isinstance(v, int) else scaled(v, n) for k, v in x.items()}
    return x


def report(seq, trigger, what):
    """A release of 1 GiB of pool cache and a 512 MiB orphan, and, when `all` is named, 256 MiB of live blocks."""
    every = 256 * MiB if "all" in what.split(",") else 0
    return {"seq": seq, "trigger": trigger, "what": what, "cached_bytes": GiB, "pool_bytes": GiB,
            "framework_bytes": 0, "releaser_bytes": 0, "orphaned_bytes": 512 * MiB, "orphaned_blocks": 1,
            "all_bytes": every, "all_blocks": 1 if every else 0, "failed_blocks": 0, "ms": 12.5,
            "devices": [{"device": 0, "pool_bytes": GiB, "orphaned_bytes": 512 * MiB, "orphaned_blocks": 1,
                         "all_bytes": 0, "all_blocks": 0, "free_before": 10 * GiB, "free_after": 11 * GiB + 512 * MiB,
                         "total": 80 * GiB}]}


SNAPSHOT_BLOCKS = [  # device 0: 2 GiB of libtorch_cuda.so blocks, 3 GiB in one async block; device 1: 512 MiB
    {"address": "0x7f0000000000", "bytes": GiB, "kind": "device", "state": "live", "device": 0, "context": "0xc0",
     "pool": None, "scope": 0, "thread": 11, "time_ms": 5, "caller": "0x1234", "library": "libtorch_cuda.so",
     "api": "cudaMalloc", "owner": "pytorch"},
    {"address": "0x7f0040000000", "bytes": GiB, "kind": "device", "state": "live", "device": 0, "context": "0xc0",
     "pool": None, "scope": 0, "thread": 11, "time_ms": 6, "caller": "0x1234", "library": "libtorch_cuda.so",
     "api": "cudaMalloc", "owner": "pytorch"},
    {"address": "0x7f0080000000", "bytes": 3 * GiB, "kind": "async", "state": "orphan", "device": 0,
     "context": None, "pool": "0xp0", "scope": 7, "thread": 12, "time_ms": 7, "caller": "0x5678",
     "library": "libmodel.so", "api": "cudaMallocAsync", "owner": None},
    {"address": "0x7f1000000000", "bytes": 512 * MiB, "kind": "device", "state": "live", "device": 1,
     "context": "0xc1", "pool": None, "scope": 0, "thread": 13, "time_ms": 8, "caller": "0x9abc",
     "library": "libmodel.so", "api": "cuMemAlloc_v2", "owner": None},
]

LEAKS = {"blocks": 3, "bytes": 3 * GiB + 512 * MiB,
         "devices": [{"device": 0, "blocks": 2, "bytes": 3 * GiB}, {"device": 1, "blocks": 1, "bytes": 512 * MiB}],
         "groups": [{"library": "libmodel.so", "caller": "0x5678", "symbol": "load_model+0x4c", "kind": "async",
                     "blocks": 2, "bytes": 3 * GiB, "frames": ["0x5678", "0x9999"],
                     "locations": ["libmodel.so+0x678", "libmodel.so+0x999"]},
                    {"library": "libmodel.so", "caller": "0x9abc", "symbol": None, "kind": "device", "blocks": 1,
                     "bytes": 512 * MiB, "frames": ["0x9abc"]}]}


class Fake:
    def __init__(self, args):
        self.args = args
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.releases = 0
        self.released = 0  # bytes, as the stats' released_bytes counts them
        self.last = None
        self.signal_releases = 0
        self.last_signal = None
        os.makedirs(args.rundir, mode=0o700, exist_ok=True)
        self.status_path = os.path.join(args.rundir, "%d.json" % self.pid)
        self.sock_path = os.path.join(args.rundir, "%d.sock" % self.pid)
        self.started = int(time.time() * 1000)
        with open("/proc/self/stat") as f:
            self.ticks = int(f.read().rsplit(")", 1)[1].split()[19])  # field 22

    def log(self, what):
        if self.args.log:
            with open(self.args.log, "a") as f:
                f.write(what + "\n")

    def write_status(self):
        socket_field = None if self.args.no_socket else self.sock_path
        st = {"pid": self.pid, "uid": self.args.uid if self.args.uid is not None else os.geteuid(),
              "version": "0.1.0", "exe": os.readlink("/proc/self/exe"),  # as the library: checked for an exec
              "cmdline": "/usr/bin/%s /srv/jobs/train.py --fake \"quoted\" --out=/tmp/x" % self.args.program, "start_ticks": self.ticks,
              "started_ms": self.started, "updated_ms": int(time.time() * 1000), "signal": self.args.signal,
              "on_signal": "cached,orphaned", "socket": socket_field, "releases": self.releases,
              "last_release": self.last}
        if not self.args.old_status:
            st.update(signal_releases=self.signal_releases, last_signal_release=self.last_signal)
            # What the library's worker keeps there: the GPUs it sees and, per GPU, what it holds and could give
            # (a not answering process is shown with these figures).
            st["gpus"] = [{"device": g["device"], "uuid": g["uuid"]} for g in GPUS]
            n = self.args.scale
            st["peer"] = {"ask": True, "give": True, "oom": False, "last_gave_ms": 0, "gpus": [
                {"uuid": GPUS[0]["uuid"], "device": 0, "held_bytes": 4 * GiB * n, "pool_cached_bytes": GiB * n,
                 "orphan_bytes": 512 * MiB * n, "framework_bytes": 0},
                {"uuid": GPUS[1]["uuid"], "device": 1, "held_bytes": 512 * MiB * n, "pool_cached_bytes": 0,
                 "orphan_bytes": 0, "framework_bytes": 0}]}
        if self.args.sharing and not self.args.old_status:
            # GPURECLAIM_LIMIT (6 GiB) and GPURECLAIM_GUARANTEE (2 GiB) on device 0, a guarantee only (1 GiB) on
            # device 1, and a wait for 768 MiB on device 1 for an allocation, begun 2.5 s ago.
            rows = st["peer"]["gpus"]
            rows[0].update(limit_bytes=6 * GiB, guarantee_bytes=2 * GiB)
            rows[1].update(limit_bytes=None, guarantee_bytes=GiB)
            st["wait"] = {"uuid": GPUS[1]["uuid"], "bytes": 768 * MiB, "since_ms": int(time.time() * 1000) - 2500,
                          "for": self.args.wait_for}
        elif not self.args.old_status:
            for row in st["peer"]["gpus"]:
                row.update(limit_bytes=None, guarantee_bytes=None)
            st["wait"] = None
        if self.args.sleeping:  # asleep, 3 GiB of it on the host (the stats still answer: canned)
            st["sleep"] = {"state": "sleeping", "host_bytes": 3 * GiB, "sleeps": 1, "wakes": 0, "available": True}
        tmp = self.status_path + ".tmp"
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(st, f)
        os.rename(tmp, self.status_path)

    def release(self, trigger, what):
        with self.lock:
            self.releases += 1
            self.last = report(self.releases, trigger, what)
            self.released += self.last["cached_bytes"] + self.last["orphaned_bytes"] + self.last["all_bytes"]
            if trigger == "signal":
                self.signal_releases += 1
                self.last_signal = self.last
            self.write_status()
            return self.last

    def answer(self, line):
        if line == "ping":
            return {"ok": True, "pid": self.pid, "version": "0.1.0"}
        if line == "stats":
            n = self.args.scale
            return {"ok": True, "pid": self.pid, "total": dict(scaled(TOTAL, n), releases=self.releases,
                                                              released_bytes=self.released, **PEER),
                    "devices": scaled(DEVICES, n), "pools": [{"pool": "0xp0", "device": 0,
                                                             "reserved_bytes": 3 * GiB // 2, "used_bytes": GiB // 2}],
                    "gpus": GPUS, "frameworks": scaled(FRAMEWORKS, n) if self.args.framework else []}
        if line.startswith("release") and self.args.die_on_release:
            self.log("request " + line)
            os._exit(0)  # mid-release: its status file stays; its parent has not reaped it yet
        if (line.startswith("release") and (self.args.sleeping or self.args.goes_to_sleep)) and not self.args.old_library:
            return {"ok": False, "error": "the process sleeps: its device memory is on the host, nothing to release"}
        if line == "release" or line.startswith("release "):
            what = line[8:] or "cached,orphaned"
            return {"ok": True, "report": self.release("command", what)}
        if (line == "release-begun" or line.startswith("release-begun ")) and not self.args.old_library:
            what = line[14:] or "cached,orphaned"
            return {"ok": True, "report": self.release("command", what)}
        if line == "snapshot":
            return {"ok": True, "snapshot": {"pid": self.pid, "version": "0.1.0", "time_ms": 1, "total": TOTAL,
                                             "devices": DEVICES, "contexts": [], "blocks": SNAPSHOT_BLOCKS}}
        if line == "leaks":
            return {"ok": True, "leaks": dict(LEAKS, pid=self.pid)}
        return {"ok": False, "error": "unknown request: " + line}

    def serve_client(self, conn):
        with conn:
            data = b""
            while not data.endswith(b"\n") and len(data) < 256:
                chunk = conn.recv(256)
                if not chunk:
                    break
                data += chunk
            line = data.decode().strip()
            self.log("request " + line)
            if self.args.barrier:
                self.wait_for_requests(self.args.barrier)
            mode = self.args.mode
            if mode == "silent":
                time.sleep(60)
            elif mode == "garbage":
                conn.sendall(b"this is not JSON {\n")
            elif mode == "refuse":
                conn.sendall(json.dumps({"ok": False, "error": "gpureclaim is disabled in this process"}).encode())
            elif mode == "normal":
                if (line.split(" ")[0] == "release-begun" and not self.args.old_library and not self.args.sleeping
                        and not self.args.goes_to_sleep and not self.args.die_on_release):
                    conn.sendall(b'{"ok": true, "begun": true}\n')
                conn.sendall(json.dumps(self.answer(line)).encode() + b"\n")
            # "close": nothing at all

    def wait_for_requests(self, n):
        """Until --log holds n requests (of every fake sharing it), for 10 minutes at most."""
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            with open(self.args.log) as f:
                if sum(1 for line in f if line.startswith("request ")) >= n:
                    return
            time.sleep(0.01)

    def serve(self, srv):
        while True:
            conn, _ = srv.accept()
            if self.args.log_connects:  # in the order they came: one logged after another's answer came later
                self.log("connect %d" % self.pid)
            threading.Thread(target=self.serve_client, args=(conn,), daemon=True).start()

    def on_signal(self, signum, frame):
        self.log("signal %d" % signum)
        if self.args.other_release_first:
            # Another client's release ends first; the signal's comes a moment later.
            self.release("command", "cached")
            threading.Timer(0.5, self.release, ("signal", "cached,orphaned")).start()
            return
        self.release("signal", "cached,orphaned")

    def on_die(self, signum, frame):
        self.log("signal %d" % signum)
        os._exit(0)  # its status file stays; its parent has not reaped it yet: a zombie

    def on_deaf(self, signum, frame):
        self.log("signal %d" % signum)  # caught, and never released

    def run(self):
        signum = signal.SIGUSR2 if self.args.signal == "USR2" else signal.SIGUSR1
        if self.args.ignore_signal:
            signal.signal(signum, signal.SIG_IGN)
        else:
            signal.signal(signum, self.on_deaf if self.args.deaf else self.on_die if self.args.die_on_signal
                          else self.on_signal)
        if not self.args.no_socket and not self.args.socket_gone:
            srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            srv.bind(self.sock_path)
            os.chmod(self.sock_path, 0o600)
            srv.listen(8)
            threading.Thread(target=self.serve, args=(srv,), daemon=True).start()
        self.write_status()
        print("ready %d" % self.pid, flush=True)
        sys.stdin.read()
        for p in (self.status_path, self.sock_path):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("rundir")
    ap.add_argument("--mode", default="normal", choices=["normal", "silent", "garbage", "refuse", "close"])
    ap.add_argument("--uid", type=int)
    ap.add_argument("--no-socket", action="store_true", help='"socket": null in the status file')
    ap.add_argument("--socket-gone", action="store_true", help="the status file names a socket nobody listens on")
    ap.add_argument("--signal", default="USR1", choices=["USR1", "USR2", "off"])
    ap.add_argument("--deaf", action="store_true", help="catch the release signal and never release")
    ap.add_argument("--ignore-signal", action="store_true", help="the release signal ignored (SIG_IGN)")
    ap.add_argument("--program", default="fakeproc")
    ap.add_argument("--other-release-first", action="store_true",
                    help="on the signal, a command release ends first and the signal's 0.5 s later")
    ap.add_argument("--old-status", action="store_true", help="no signal_releases (a library before 0.1.1)")
    ap.add_argument("--old-library", action="store_true", help="no release-begun request (an older library)")
    ap.add_argument("--barrier", type=int, help="answer once --log holds this many requests (of all fakes)")
    ap.add_argument("--die-on-signal", action="store_true", help="exit on the release signal, releasing nothing")
    ap.add_argument("--framework", action="store_true", help="a PyTorch cache in the stats (FRAMEWORKS)")
    ap.add_argument("--scale", type=int, default=1, help="every byte count of the stats times N")
    ap.add_argument("--sleeping", action="store_true",
                    help="the status file says it sleeps (3 GiB on the host); a release is refused")
    ap.add_argument("--log-connects", action="store_true", help="log each connection as it is accepted")
    ap.add_argument("--goes-to-sleep", action="store_true",
                    help="awake in its status file, asleep when asked to release (it went to sleep meanwhile)")
    ap.add_argument("--die-on-release", action="store_true", help="exit when asked to release, answering nothing")
    ap.add_argument("--sharing", action="store_true",
                    help="a limit and a guarantee on device 0, a guarantee on device 1, waiting for memory there")
    ap.add_argument("--wait-for", default="alloc", help="with --sharing: what it waits for (alloc or wake)")
    ap.add_argument("--log")
    Fake(ap.parse_args()).run()


if __name__ == "__main__":
    main()

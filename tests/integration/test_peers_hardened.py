"""Peer reclaim against a hostile or unlucky run directory (issue 31, "the peer protocol hardened"): discovery
bounded in bytes and time, a GPU's lock that a stopped, gone or expired holder cannot keep, a share of the deadline
for each peer, a peer's answer checked against what the driver shows, a backlog that does not make a busy process
unreachable, and peers whose status file does not list the GPU yet asked when the listed ones are not enough.

Real processes on the simulator (peer_prog, as in test_peers.py) and, where a peer must misbehave, OddPeer: a
status file naming a live `sleep` child of the test, whose control socket is served by the test itself. Each
simulated GPU holds 256 MiB. Times are hang guards (the peer timeout plus GUARD), never a measure."""
import errno
import fcntl
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_peers import GUARD, MiB, Base, Proc  # noqa: E402


class OddPeer:
    """A peer that the asker finds in the run directory (its status file lists the GPU with `pool` bytes of cache)
    and that misbehaves on its socket. mode: "silent" (reads the request, never answers), "lie" (answers that it
    gave `total`, which may be any JSON value, and frees nothing), "honest" (answers that it gave nothing).
    backlog/held: the socket listens with that backlog, and serves nobody until `go` is set (a busy process)."""

    def __init__(self, test, uuid, mode="honest", pool=0, total=0, backlog=8, held=False):
        self.child = subprocess.Popen(["sleep", "600"])
        self.pid = self.child.pid
        self.mode, self.total = mode, total
        self.requests = []
        self.go = threading.Event()
        if not held:
            self.go.set()
        self.path = os.path.join(test.rundir, "%d.sock" % self.pid)
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.srv.bind(self.path)
        self.srv.listen(backlog)
        self.conns = []
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()
        status = {"pid": self.pid, "uid": os.geteuid(), "socket": self.path,
                  "peer": {"ask": True, "give": True, "sleep": False, "oom": False, "last_gave_ms": 0,
                           "gpus": [{"uuid": uuid, "device": 0, "held_bytes": pool, "pool_cached_bytes": pool,
                                     "orphan_bytes": 0, "framework_bytes": 0}]}}
        with open(os.path.join(test.rundir, "%d.json" % self.pid), "w") as f:
            json.dump(status, f)
        test.addCleanup(self.close)

    def serve(self):
        self.go.wait()
        while True:
            try:
                c, _ = self.srv.accept()
            except OSError:
                return
            c.settimeout(5)
            line = b""
            try:
                while not line.endswith(b"\n"):
                    chunk = c.recv(4096)
                    if not chunk:
                        break
                    line += chunk
            except OSError:
                pass
            text = line.decode(errors="replace").strip()
            if not text.startswith("give "):
                c.close()  # a filler connection of the test
                continue
            self.requests.append(text)
            if self.mode == "silent":
                self.conns.append(c)  # kept open, never answered
                continue
            given = {k: 0 for k in ("orphaned_bytes", "pool_bytes", "framework_bytes", "releaser_bytes",
                                    "all_bytes", "slept_bytes")}
            given["total_bytes"] = self.total if self.mode == "lie" else 0
            try:
                c.sendall((json.dumps({"ok": True, "pid": self.pid, "on_gpu": True, "given": given}) +
                           "\n").encode())
            except OSError:
                pass
            c.close()

    def close(self):
        self.go.set()
        self.srv.close()
        for c in self.conns:
            c.close()
        self.child.kill()
        self.child.wait()


# A holder of a GPU's lock, as docs/PROTOCOL.md describes the lease: it takes the flock, writes "PID START EXPIRY_MS"
# and then behaves as argv[2] says: "stop" (SIGSTOPs itself), "run" (stays running), "vanish" (a child keeps the
# locked file descriptor, the process named in the lease exits).
HOLDER = r"""
import fcntl, os, signal, sys, time
path, how, expiry_in = sys.argv[1], sys.argv[2], int(sys.argv[3])
fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX)
with open("/proc/self/stat") as f:
    start = f.read().rsplit(")", 1)[1].split()[19]
expiry = int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1000) + expiry_in
os.ftruncate(fd, 0)
os.pwrite(fd, ("%d %s %d\n" % (os.getpid(), start, expiry)).encode(), 0)
if how == "vanish":
    if os.fork() == 0:
        print("held", flush=True)
        time.sleep(600)
        os._exit(0)
    os._exit(0)
print("held", flush=True)
if how == "stop":
    os.kill(os.getpid(), signal.SIGSTOP)
time.sleep(600)
"""


class HardenedTest(Base):
    def setUp(self):
        super().setUp()
        self.extra = []

    def tearDown(self):
        for p in self.extra:
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except OSError:
                pass
            p.wait()
            p.stdout.close()
        super().tearDown()

    def cached_peer(self):
        """B: a real peer with 192 MiB in its pool, unused: what A's 128 MiB needs."""
        b = Proc(self, "b")
        self.fill_cache(b)
        self.wait_holding(b, b.uuid, 192 * MiB, "pool_cached_bytes")
        return b

    def peer_entry(self, ev, pid):
        got = [p for p in ev["peers"] if p["pid"] == pid]
        self.assertTrue(got, "pid %d was not asked: %r" % (pid, ev["peers"]))
        return got[0]

    # ---- a: discovery bounded in bytes and time ----

    def test_discovery_skips_stale_and_huge_status_files(self):
        """20,000 status files of processes that are gone, a 512 MiB one of a live process, a FIFO and a link: none
        is read (the first are not opened, the others are over the cap or no regular file), and the honest peer is
        still asked in time."""
        b = self.cached_peer()
        a = Proc(self, "a", {"GPURECLAIM_PEER_TIMEOUT": "1"})
        stale = json.dumps({"pid": 0, "uid": os.geteuid(), "socket": os.path.join(self.rundir, "x.sock"),
                            "peer": {"give": True, "oom": False, "gpus": [{"uuid": a.uuid, "orphan_bytes": 1 << 30}]}})
        rng = random.Random(31)
        made = 0
        while made < 20000:
            pid = rng.randrange(4194304 + 1, 1 << 30)  # above any pid_max: never a live process
            try:
                with open(os.path.join(self.rundir, "%d.json" % pid), "x") as f:
                    f.write(stale.replace('"pid": 0', '"pid": %d' % pid))
                made += 1
            except FileExistsError:
                pass
        live = subprocess.Popen(["sleep", "600"])
        self.addCleanup(lambda: (live.kill(), live.wait()))
        huge = os.path.join(self.rundir, "%d.json" % live.pid)
        with open(huge, "w") as f:
            f.write('{"pid": %d, ' % live.pid)
        os.truncate(huge, 512 * MiB)  # sparse: no disk, but 512 MiB for a reader that reads it all
        # Two more live processes' names: a FIFO nobody writes (it would block a reader) and a link to B's file.
        more = [subprocess.Popen(["sleep", "600"]) for _ in range(2)]
        self.addCleanup(lambda: [(m.kill(), m.wait()) for m in more])
        os.mkfifo(os.path.join(self.rundir, "%d.json" % more[0].pid), 0o600)
        os.symlink(os.path.join(self.rundir, "%d.json" % b.pid), os.path.join(self.rundir, "%d.json" % more[1].pid))
        t0 = time.monotonic()
        self.assertEqual(self.timed_alloc(a, 128, timeout=1.0), "ok")
        took = time.monotonic() - t0
        ev = self.one_event(a)
        disc = ev["discovery"]
        self.assertEqual(disc["skipped"], 3, disc)  # the huge one, the FIFO, the link (a real peer's is read: B)
        self.assertFalse(disc["cut_by_deadline"], disc)
        self.assertLess(disc["read"], 100, "a stale status file was read: %r" % disc)
        self.assertEqual(self.peer_entry(ev, b.pid)["given"]["pool_bytes"] >= 128 * MiB, True, ev)
        self.assertLess(took, 1.0 + GUARD, "the failing allocation ran past its bound")

    def test_the_scan_stops_at_the_deadline(self):
        """A deadline that passes while the scan runs ends it: 50,000 names of no live process (each a look, not a
        read) take the scan longer than the few milliseconds the asker has. A deadline that passed before the
        GPU's lock was taken asks nobody and writes no event: the next, longer timeout is tried then."""
        names = os.open(self.rundir, os.O_RDONLY)
        for i in range(50000):  # names of no live process (above any pid_max)
            os.close(os.open("%d.json" % (4194305 + i), os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=names))
        os.close(names)
        events = []
        for ms in (1, 2, 4, 8):
            a = Proc(self, "a%d" % ms, {"GPURECLAIM_PEER_TIMEOUT": "%.3f" % (ms / 1000)})
            self.assertEqual(self.timed_alloc(a, 300, timeout=ms / 1000), "oom")
            events = a.events("peer_reclaim")
            if events:
                break
        self.assertTrue(events, "no peer reclaim took the GPU's lock within 8 ms")
        self.assertTrue(events[0]["discovery"]["cut_by_deadline"], events[0])
        self.assertEqual(events[0]["peers"], [])

    # ---- b: the GPU's lock as a lease ----

    def hold_lock(self, uuid, how, expiry_in_ms):
        p = subprocess.Popen([sys.executable, "-c", HOLDER, os.path.join(self.rundir, "gpu-%s.lock" % uuid), how,
                              str(expiry_in_ms)], stdout=subprocess.PIPE, text=True, start_new_session=True)
        self.extra.append(p)
        self.assertEqual(p.stdout.readline().strip(), "held")
        if how == "stop":
            t0 = time.monotonic()
            while True:
                with open("/proc/%d/stat" % p.pid) as f:
                    if f.read().rsplit(")", 1)[1].split()[0] == "T":
                        break
                self.assertLess(time.monotonic() - t0, 30, "the holder never stopped")
                time.sleep(0.005)
        return p

    def test_a_stopped_holder_loses_the_gpus_lock(self):
        b = self.cached_peer()
        a = Proc(self, "a", {"GPURECLAIM_PEER_TIMEOUT": "3"})
        holder = self.hold_lock(a.uuid, "stop", 60000)
        self.assertEqual(self.timed_alloc(a, 128, timeout=3.0), "ok")
        ev = self.one_event(a)
        self.assertEqual(ev["lock_taken"], {"from_pid": holder.pid, "why": "its holder is stopped"}, ev)
        self.assertEqual([p["pid"] for p in ev["peers"]], [b.pid])
        # The next peer reclaim takes the new lock file, not the stopped holder's.
        self.assertEqual(a.ask("free"), "freed")
        self.assertEqual(self.timed_alloc(a, 300, timeout=3.0), "oom")
        self.assertNotIn("lock_taken", a.events("peer_reclaim")[1])

    def test_an_expired_lease_loses_the_gpus_lock(self):
        b = self.cached_peer()
        a = Proc(self, "a", {"GPURECLAIM_PEER_TIMEOUT": "3"})
        holder = self.hold_lock(a.uuid, "run", -1)
        self.assertEqual(self.timed_alloc(a, 128, timeout=3.0), "ok")
        ev = self.one_event(a)
        self.assertEqual(ev["lock_taken"], {"from_pid": holder.pid, "why": "its holder's lease expired"}, ev)
        self.assertEqual([p["pid"] for p in ev["peers"]], [b.pid])

    def test_a_gone_holder_loses_the_gpus_lock(self):
        """The process the lease names exited; a child it forked still holds the flock (fork shares it)."""
        b = self.cached_peer()
        a = Proc(self, "a", {"GPURECLAIM_PEER_TIMEOUT": "3"})
        self.hold_lock(a.uuid, "vanish", 60000)
        self.assertEqual(self.timed_alloc(a, 128, timeout=3.0), "ok")
        ev = self.one_event(a)
        self.assertEqual(ev["lock_taken"]["why"], "its holder is gone", ev)
        self.assertEqual([p["pid"] for p in ev["peers"]], [b.pid])

    def test_a_running_holder_keeps_the_gpus_lock(self):
        """Within its lease, a running holder is waited for: the asker gives up at its deadline, asks nobody."""
        b = self.cached_peer()
        a = Proc(self, "a", {"GPURECLAIM_PEER_TIMEOUT": "1"})
        self.hold_lock(a.uuid, "run", 60000)
        self.assertEqual(self.timed_alloc(a, 128, timeout=1.0), "oom")
        self.assertEqual(a.events("peer_reclaim"), [], "it asked without the lock")
        self.assertEqual(b.stats()["pool_reserved"], 192 * MiB)

    # ---- c: each peer a share of the deadline ----

    def test_an_unresponsive_peer_first_leaves_time_for_the_others(self):
        b = self.cached_peer()
        a = Proc(self, "a", {"GPURECLAIM_PEER_TIMEOUT": "4"})
        mute = OddPeer(self, a.uuid, "silent", pool=250 * MiB)  # most to give: asked first
        self.assertEqual(self.timed_alloc(a, 128, timeout=4.0), "ok")
        ev = self.one_event(a)
        self.assertEqual([p["pid"] for p in ev["peers"]], [mute.pid, b.pid])
        self.assertIn("share of the deadline", ev["peers"][0]["error"])
        self.assertGreaterEqual(ev["peers"][1]["given"]["pool_bytes"], 128 * MiB)
        self.assertEqual(len(mute.requests), 1)

    # ---- d: a peer's answer checked ----

    def test_a_lying_peer_does_not_end_the_asking(self):
        """total_bytes negative, absurd, not an integer, or a plausible figure the driver does not confirm: the
        honest peer after the liar is still asked, and the allocation succeeds."""
        for total in (-1, 1 << 63, 1e30, "128", 128 * MiB):
            with self.subTest(total=total):
                self.tearDown()
                self.setUp()
                b = self.cached_peer()
                a = Proc(self, "a", {"GPURECLAIM_PEER_TIMEOUT": "4"})
                liar = OddPeer(self, a.uuid, "lie", pool=250 * MiB, total=total)
                self.assertEqual(self.timed_alloc(a, 128, timeout=4.0), "ok")
                ev = self.one_event(a)
                self.assertEqual([p["pid"] for p in ev["peers"]], [liar.pid, b.pid], ev)
                first = ev["peers"][0]
                if total == 128 * MiB:
                    self.assertEqual(first["given"]["total_bytes"], 128 * MiB)
                    self.assertLess(first["seen_freed_bytes"], 128 * MiB, first)
                else:
                    self.assertIn("implausible", first["error"])
                self.assertGreaterEqual(ev["given_bytes"], 128 * MiB)
                self.assertLess(ev["given_bytes"], 1 << 40, "the lie was counted")

    def test_an_honest_answer_is_confirmed_by_the_driver(self):
        b = self.cached_peer()
        a = Proc(self, "a")
        self.assertEqual(self.timed_alloc(a, 128), "ok")
        p = self.peer_entry(self.one_event(a), b.pid)
        self.assertGreaterEqual(p["seen_freed_bytes"], 128 * MiB, p)
        self.assertEqual(p["given"]["total_bytes"], p["given"]["pool_bytes"])

    # ---- e: a busy process stays reachable ----

    def test_the_control_socket_takes_a_burst_of_connections(self):
        """64 clients connecting at once to a process whose worker is serving none of them yet: each connect
        succeeds (a backlog of 8 refused the tenth), and the process then serves its peer."""
        b = self.cached_peer()
        os.kill(b.p.pid, signal.SIGSTOP)  # its worker accepts nothing meanwhile
        conns = []
        try:
            for i in range(64):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.setblocking(False)
                try:
                    s.connect(os.path.join(self.rundir, "%d.sock" % b.pid))
                except BlockingIOError:
                    s.close()
                    self.fail("connection %d refused: the backlog is full" % i)
                conns.append(s)
        finally:
            for s in conns:
                s.close()
            os.kill(b.p.pid, signal.SIGCONT)
        a = Proc(self, "a")
        self.assertEqual(self.timed_alloc(a, 128), "ok")

    def test_a_full_backlog_is_retried_within_the_share(self):
        """A peer whose backlog is full (it serves nobody for a while) is connected to again until it accepts,
        within its share of the deadline, instead of being given up at once."""
        a = Proc(self, "a", {"GPURECLAIM_PEER_TIMEOUT": "4"})
        busy = OddPeer(self, a.uuid, "honest", pool=64 * MiB, backlog=0, held=True)
        fillers = []
        for _ in range(64):
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.setblocking(False)
            try:
                s.connect(busy.path)
            except BlockingIOError:
                s.close()
                break
            s.send(b"filler\n")
            fillers.append(s)
        self.addCleanup(lambda: [s.close() for s in fillers])
        self.assertLess(len(fillers), 64, "the backlog never filled")
        a.p.stdin.write("alloc 300 alloc\n")
        a.p.stdin.flush()
        # Until A's peer reclaim has begun (its status file says so), then a little longer: it meets a full backlog.
        path, t0 = os.path.join(self.rundir, "%d.json" % a.pid), time.monotonic()
        while time.monotonic() - t0 < 4.0 + GUARD:
            with open(path) as f:
                try:
                    if json.load(f)["peer"]["oom"]:
                        break
                except ValueError:
                    pass
            time.sleep(0.005)
        time.sleep(0.5)  # (of its 4 s share: A has met the full backlog by then, under any load)
        busy.go.set()
        self.assertEqual(a.p.stdout.readline().split()[0], "oom")  # (it gives nothing: an honest 0)
        p = self.peer_entry(self.one_event(a), busy.pid)
        self.assertNotIn("error", p)
        self.assertGreater(p.get("busy_retries", 0), 0, p)
        self.assertEqual(len(busy.requests), 1, busy.requests)

    # ---- f: peers whose status file does not list the GPU yet ----

    def test_a_peer_not_listed_yet_is_asked_when_the_listed_fall_short(self):
        """B's status file says it holds nothing on the GPU (as before its first update after a new context):
        the listed peers give too little, so B is asked all the same, and gives its orphans."""
        b = Proc(self, "b")
        for _ in range(6):
            self.assertEqual(b.ask("orphan 32"), "orphaned")
        self.wait_holding(b, b.uuid, 192 * MiB, "orphan_bytes")
        path = os.path.join(self.rundir, "%d.json" % b.pid)
        with open(path) as f:
            st = json.load(f)
        st["peer"]["gpus"] = []  # stale: B's worker rewrites it only when its figures change
        with open(path + ".tmp", "w") as f:
            json.dump(st, f)
        os.rename(path + ".tmp", path)
        a = Proc(self, "a")
        self.assertEqual(self.timed_alloc(a, 128), "ok")
        p = self.peer_entry(self.one_event(a), b.pid)
        self.assertFalse(p["listed"])
        self.assertTrue(p["on_gpu"])
        self.assertEqual(p["given"]["orphaned_bytes"], 192 * MiB)

    def test_fresh_orphans_relieve(self):
        """Orphans made 0 to 0.2 s before a peer's out-of-memory (before B's status file can show them) relieve
        it, each of 4 times."""
        for delay in (0.0, 0.05, 0.1, 0.2):
            with self.subTest(delay=delay):
                self.tearDown()
                self.setUp()
                a = Proc(self, "a")
                b = Proc(self, "b")
                for _ in range(6):
                    self.assertEqual(b.ask("orphan 32"), "orphaned")
                time.sleep(delay)
                self.assertEqual(self.timed_alloc(a, 128), "ok")
                self.assertEqual(self.peer_entry(self.one_event(a), b.pid)["given"]["orphaned_bytes"], 192 * MiB)


if __name__ == "__main__":
    unittest.main(verbosity=2)

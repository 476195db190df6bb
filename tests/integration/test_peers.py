"""Peer reclaim with real processes on the simulator: an out-of-memory in one process (A) is relieved by the other
gpureclaim processes of the same user on the same simulated GPU (B), which share its memory (SIMCUDA_MACHINE,
one simulated machine per test). The processes are tests/integration/peer_prog.c (C, linked with gpureclaim), and
for framework caches a Python process running examples/simframework.py under LD_PRELOAD.

Each simulated GPU holds 256 MiB here. Times are hang guards only (the peer timeout plus 3 s), never a measure."""
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import control  # noqa: E402

PROG = os.environ["PEER_PROG"]
EXAMPLES = os.environ["GR_EXAMPLES"]
MiB = 1024 * 1024
GUARD = 3.0  # seconds beyond the peer timeout that a peer reclaim may take before the test calls it a hang

FRAMEWORK_B = r"""
import os, sys
sys.path.insert(0, os.environ["GR_EXAMPLES"])
import simframework as fw
ts = [fw.Tensor(32 << 20) for _ in range(6)]
del ts  # 192 MiB in the framework's cache, none in use
keep = fw.Tensor(1 << 20)
print("ready %d" % os.getpid(), flush=True)
for line in sys.stdin:
    if line.strip() == "reserved":
        print("reserved %d" % fw.memory_reserved(), flush=True)
    elif line.strip() == "alloc":
        t = fw.Tensor(8 << 20)
        print("ok", flush=True)
        del t
    elif line.strip() == "big":  # a size its cache does not hold: a cudaMalloc
        try:
            t = fw.Tensor(64 << 20)
            print("ok", flush=True)
            del t
        except MemoryError:
            print("oom", flush=True)
"""


def wait_stopped(pid):
    """Until every thread of pid is stopped: kill(SIGSTOP) returns before a busy process's threads have stopped,
    and a thread still running could take a request meant to find the process stopped. (A hang guard only.)"""
    t0 = time.monotonic()
    while True:
        states = []
        for tid in os.listdir("/proc/%d/task" % pid):
            try:
                with open("/proc/%d/task/%s/stat" % (pid, tid)) as f:
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
            except OSError:
                pass
        if states and all(st in ("T", "t") for st in states):
            return
        if time.monotonic() - t0 > 30:
            raise AssertionError("process %d did not stop: thread states %s" % (pid, states))
        time.sleep(0.001)


class Proc:
    """A peer_prog process (or any line-driven one), with its own GPURECLAIM_LOG."""

    def __init__(self, test, name, env=None, argv=None, preexec=None, log=None):
        self.log = log or os.path.join(test.tmp, name + ".log")
        # GPURECLAIM_WAIT=0: an allocation that peers cannot relieve fails at once, as these tests expect (the
        # waits are test_wait.py's).
        e = dict(os.environ, GPURECLAIM_LOG=self.log, SIMCUDA_DEVICE_MEM=str(256 * MiB), GPURECLAIM_WAIT="0")
        e.pop("LD_PRELOAD", None)
        e.update(env or {})
        self.p = subprocess.Popen(argv or [PROG], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=e,
                                  preexec_fn=preexec)
        test.procs.append(self)
        first = self.p.stdout.readline().split()
        if not first or first[0] != "ready":
            raise AssertionError("%s did not start: %r" % (name, first))
        self.pid = int(first[1])
        self.uuid = first[2] if len(first) > 2 else None

    def ask(self, line):
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()
        return self.p.stdout.readline().strip()

    def events(self, kind):
        try:
            with open(self.log) as f:
                evs = [json.loads(x) for x in f if x.strip()]
        except FileNotFoundError:
            return []
        return [e for e in evs if e.get("event") == kind]

    def stats(self):
        f = self.ask("stats").split()
        assert f[0] == "stats", f
        keys = ("peer_reclaims", "successes", "received", "gives", "given", "pool_reserved")
        return dict(zip(keys, map(int, f[1:])))


class FakePeer:
    """A status file in the run directory naming a live process (a `sleep` child of the test's) whose control socket
    is the test's own: it records every request and answers that it gave nothing. What an asker does with what the
    status files say (whom it trusts, whom it skips, in which order it asks) is then seen exactly, request by
    request, whatever the asker's own memory."""

    def __init__(self, test, uuid, uid=None, oom=False, give=True, pool=0, orphan=0, framework=0, last_gave_ms=0):
        self.child = subprocess.Popen(["sleep", "600"])
        self.pid = self.child.pid
        self.requests = []
        path = os.path.join(test.rundir, "%d.sock" % self.pid)
        self.srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.srv.bind(path)
        self.srv.listen(8)
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()
        status = {"pid": self.pid, "uid": os.geteuid() if uid is None else uid, "socket": path,
                  "peer": {"ask": True, "give": give, "sleep": False, "oom": oom, "last_gave_ms": last_gave_ms,
                           "gpus": [{"uuid": uuid, "device": 0, "held_bytes": pool + orphan + framework,
                                     "pool_cached_bytes": pool, "orphan_bytes": orphan,
                                     "framework_bytes": framework}]}}
        with open(os.path.join(test.rundir, "%d.json" % self.pid), "w") as f:
            json.dump(status, f)
        test.addCleanup(self.close)

    def serve(self):
        while True:
            try:
                c, _ = self.srv.accept()
            except OSError:
                return
            with c:
                c.settimeout(5)
                line = b""
                try:
                    while not line.endswith(b"\n"):
                        chunk = c.recv(4096)
                        if not chunk:
                            break
                        line += chunk
                    self.requests.append(line.decode().strip())
                    given = {k: 0 for k in ("orphaned_bytes", "pool_bytes", "framework_bytes", "releaser_bytes",
                                            "all_bytes", "slept_bytes", "total_bytes")}
                    c.sendall((json.dumps({"ok": True, "pid": self.pid, "on_gpu": True, "given": given}) +
                               "\n").encode())
                except OSError:
                    pass

    def close(self):
        self.srv.close()
        self.child.kill()
        self.child.wait()


class Base(unittest.TestCase):
    def setUp(self):
        self.assertTrue(os.environ.get("SIMCUDA_MACHINE"), "run_test.sh gives each test a simulated machine")
        self.tmp = tempfile.mkdtemp(prefix="peers-")
        self.procs = []
        # Each test its own machine and run directory: what one test leaves cannot feed the next.
        self.machine = os.path.join(self.tmp, "machine")
        self.rundir = os.path.join(self.tmp, "run")
        os.mkdir(self.machine, 0o700)
        os.mkdir(self.rundir, 0o700)
        os.environ["SIMCUDA_MACHINE"] = self.machine
        os.environ["GPURECLAIM_RUNDIR"] = self.rundir

    def tearDown(self):
        for pr in self.procs:
            if pr.p.poll() is None:
                try:
                    os.kill(pr.p.pid, signal.SIGCONT)
                    pr.p.stdin.close()
                    pr.p.wait(timeout=10)
                    pr.p.stdout.close()
                except (OSError, subprocess.TimeoutExpired):
                    pr.p.kill()
                    pr.p.wait()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def wait_holding(self, pr, uuid, at_least, key="held_bytes"):
        """Until pr's status file says it holds at_least bytes on uuid (the worker refreshes it every 0.5 s)."""
        path = os.path.join(self.rundir, "%d.json" % pr.pid)
        deadline = time.time() + 20
        while time.time() < deadline:
            try:
                with open(path) as f:
                    st = json.load(f)
                for g in st["peer"]["gpus"]:
                    if g["uuid"] == uuid and g[key] >= at_least:
                        return st
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.05)
        self.fail("the status file of %d never showed %d bytes (%s) on %s" % (pr.pid, at_least, key, uuid))

    def fill_cache(self, pr, n=6, each=32):
        """n blocks of `each` MiB allocated at once, then freed into pr's default pool: n chunks it keeps."""
        for _ in range(n):
            self.assertEqual(pr.ask("alloc %d async" % each).split()[0], "ok")
        self.assertEqual(pr.ask("free"), "freed")

    def timed_alloc(self, pr, mib, route="alloc", timeout=2.0):
        t0 = time.monotonic()
        ans = pr.ask("alloc %d %s" % (mib, route)).split()
        took = time.monotonic() - t0
        self.assertLess(took, timeout + GUARD, "the allocation hung: %r" % ans)
        return ans[0]

    def one_event(self, pr):
        evs = pr.events("peer_reclaim")
        self.assertEqual(len(evs), 1, evs)
        return evs[0]


    # ---- the socket ----

    def give_line(self, b, line, close_early=False):
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(5)
        s.connect(os.path.join(self.rundir, "%d.sock" % b.pid))
        data = b""
        try:
            s.sendall(line)  # (a peer that refuses us may have closed already)
            if close_early:
                s.shutdown(socket.SHUT_WR)
            while True:
                chunk = s.recv(65536)
                if not chunk:
                    break
                data += chunk
        except (socket.timeout, ConnectionResetError, BrokenPipeError):
            pass  # (a peer that closes with our bytes unread resets the connection)
        s.close()
        return data


class PeerTest(Base):
    # ---- relieved ----

    def test_shared_machine(self):
        """The premise: the simulated GPU is shared, so B's cache makes A's allocation fail (without peers)."""
        b = Proc(self, "b")
        self.fill_cache(b)
        a = Proc(self, "a", {"GPURECLAIM_PEERS": "off"})
        self.assertEqual(a.uuid, b.uuid)
        self.assertEqual(self.timed_alloc(a, 128), "oom")
        self.assertEqual(a.events("peer_reclaim"), [], "PEERS=off asks no one")
        self.assertEqual(b.stats()["pool_reserved"], 192 * MiB, "and B's cache stayed")

    def relieved_by_pool(self, route):
        b = Proc(self, "b")
        self.fill_cache(b)
        self.wait_holding(b, b.uuid, 192 * MiB, "pool_cached_bytes")
        a = Proc(self, "a")
        self.assertEqual(self.timed_alloc(a, 128, route), "ok", route)
        ev = self.one_event(a)
        self.assertTrue(ev["retry_succeeded"])
        self.assertEqual(ev["uuid"], b.uuid)
        self.assertEqual([p["pid"] for p in ev["peers"]], [b.pid])
        self.assertGreaterEqual(ev["peers"][0]["given"]["pool_bytes"], 128 * MiB)
        self.assertEqual(ev["peers"][0]["given"]["framework_bytes"], 0)
        rel = [r["report"] for r in b.events("release") if r["report"]["trigger"] == "peer"]
        self.assertEqual(len(rel), 1, b.events("release"))
        self.assertEqual(rel[0]["peer_pid"], a.pid)
        # Only what was needed: B's pool keeps the rest, and B goes on working.
        st = b.stats()
        self.assertEqual(st["gives"], 1)
        self.assertEqual(st["pool_reserved"], 64 * MiB, "B trimmed 128 MiB of its 192, not all of it")
        self.assertEqual(a.stats()["successes"], 1)
        self.assertEqual(b.ask("alloc 16 async").split()[0], "ok")

    def test_pool_cache_relieves_cuMemAlloc(self):
        # A FIFO named like a status file (nobody writes it) must not hang the asker that reads the run directory:
        # status files are opened without blocking and only regular files are read.
        os.mkfifo(os.path.join(self.rundir, "1.json"), 0o600)
        self.relieved_by_pool("alloc")

    def test_pool_cache_relieves_every_route(self):
        for route in ("async", "pool", "create", "managed", "pitch"):
            with self.subTest(route=route):
                self.tearDown()
                self.setUp()
                self.relieved_by_pool(route)

    def test_orphans_relieve(self):
        b = Proc(self, "b")
        for _ in range(6):
            self.assertEqual(b.ask("orphan 32"), "orphaned")
        self.assertEqual(b.ask("live 8"), "live")
        self.wait_holding(b, b.uuid, 192 * MiB, "orphan_bytes")
        a = Proc(self, "a")
        self.assertEqual(self.timed_alloc(a, 128), "ok")
        ev = self.one_event(a)
        self.assertTrue(ev["retry_succeeded"])
        self.assertEqual(ev["peers"][0]["given"]["orphaned_bytes"], 192 * MiB, "orphans: all of them (unused)")
        self.assertEqual(b.ask("check"), "intact", "B's live memory was not touched")

    def test_framework_cache_relieves(self):
        pre = os.environ["GR_PRELOAD"]
        b = Proc(self, "b", {"LD_PRELOAD": pre, "GR_EXAMPLES": EXAMPLES}, [sys.executable, "-c", FRAMEWORK_B])
        a = Proc(self, "a")  # (B prints no UUID: both use the machine's GPU 0)
        self.wait_holding(b, a.uuid, 192 * MiB)
        self.assertEqual(int(b.ask("reserved").split()[1]), 193 * MiB)
        self.assertEqual(self.timed_alloc(a, 128), "ok")
        ev = self.one_event(a)
        self.assertTrue(ev["retry_succeeded"])
        self.assertGreaterEqual(ev["peers"][0]["given"]["framework_bytes"], 128 * MiB)
        self.assertLess(int(b.ask("reserved").split()[1]), 193 * MiB, "its cache went")
        self.assertEqual(b.ask("alloc"), "ok", "and B keeps working")

    def test_no_framework_cache_is_given_without_python(self):
        """GPURECLAIM_PYTHON=0 on the giver: its framework cache is not released for a peer (no call into CPython);
        the asker's allocation fails, and the cache is all there."""
        pre = os.environ["GR_PRELOAD"]
        b = Proc(self, "b", {"LD_PRELOAD": pre, "GR_EXAMPLES": EXAMPLES, "GPURECLAIM_PYTHON": "0"},
                 [sys.executable, "-c", FRAMEWORK_B])
        a = Proc(self, "a")
        self.wait_holding(b, a.uuid, 192 * MiB)
        self.assertEqual(self.timed_alloc(a, 128), "oom")
        ev = self.one_event(a)
        self.assertEqual([p["pid"] for p in ev["peers"]], [b.pid], "B was asked")
        self.assertEqual(ev["peers"][0]["given"]["framework_bytes"], 0, ev)
        self.assertEqual(int(b.ask("reserved").split()[1]), 193 * MiB, "its cache went")

    def test_a_recent_giver_is_asked_last(self):
        """Two peers with the same cache: the one that just gave is asked second the next time."""
        mem = {"SIMCUDA_DEVICE_MEM": str(512 * MiB)}
        b1, b2 = Proc(self, "b1", mem), Proc(self, "b2", mem)
        self.fill_cache(b1)
        self.fill_cache(b2)
        c = Proc(self, "c", dict(mem, GPURECLAIM_PEERS="off"))
        self.assertEqual(c.ask("live 128"), "live")  # 192 + 192 + 128: the GPU is full
        for b in (b1, b2):
            self.wait_holding(b, b.uuid, 192 * MiB, "pool_cached_bytes")
        a = Proc(self, "a", mem)
        self.assertEqual(self.timed_alloc(a, 64), "ok")
        first = a.events("peer_reclaim")[0]["peers"]
        gave = first[0]["pid"]
        other = b2.pid if gave == b1.pid else b1.pid
        self.assertEqual(len(first), 1, "one peer covered it")
        giver = b1 if gave == b1.pid else b2
        path = os.path.join(self.rundir, "%d.json" % gave)
        with open(path) as f:
            self.assertGreater(json.load(f)["peer"]["last_gave_ms"], 0, "its status file says it gave")
        self.assertEqual(self.timed_alloc(a, 64), "ok")
        second = a.events("peer_reclaim")[1]["peers"]
        self.assertEqual(second[0]["pid"], other, "the recent giver is asked last: %r" % second)
        self.assertEqual(giver.stats()["gives"], 1)

    def test_a_giver_gives_what_its_on_signal_allows(self):
        """GPURECLAIM_ON_SIGNAL=orphaned: its pool cache stays; all, named: even its live blocks go."""
        b = Proc(self, "b", {"GPURECLAIM_ON_SIGNAL": "orphaned"})
        self.fill_cache(b)
        self.wait_holding(b, b.uuid, 192 * MiB, "pool_cached_bytes")
        a = Proc(self, "a")
        self.assertEqual(self.timed_alloc(a, 128), "oom")
        self.assertEqual(b.stats()["pool_reserved"], 192 * MiB)
        self.tearDown()
        self.setUp()
        b = Proc(self, "b", {"GPURECLAIM_ON_SIGNAL": "all"})
        self.assertEqual(b.ask("live 192"), "live")
        self.wait_holding(b, b.uuid, 192 * MiB)
        a = Proc(self, "a")
        self.assertEqual(self.timed_alloc(a, 128), "ok")
        self.assertGreaterEqual(self.one_event(a)["peers"][0]["given"]["all_bytes"], 128 * MiB)

    def test_no_framework_cache_while_its_own_thread_asks(self):
        """A process whose thread is in a peer reclaim (and may hold the GIL) gives no framework cache to a peer
        meanwhile: only what needs no Python. The test holds the GPU's peer-reclaim lock, so P's thread waits in
        its peer reclaim for as long as the test needs."""
        import fcntl
        pre = os.environ["GR_PRELOAD"]
        p = Proc(self, "p", {"LD_PRELOAD": pre, "GR_EXAMPLES": EXAMPLES, "GPURECLAIM_PEER_TIMEOUT": "20"},
                 [sys.executable, "-c", FRAMEWORK_B])
        b = Proc(self, "b")
        self.assertEqual(b.ask("live 63"), "live")  # 193 + 63: the GPU is full
        self.wait_holding(p, b.uuid, 192 * MiB)
        lock = os.open(os.path.join(self.rundir, "gpu-%s.lock" % b.uuid), os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            p.p.stdin.write("big\n")
            p.p.stdin.flush()
            path = os.path.join(self.rundir, "%d.json" % p.pid)
            deadline = time.monotonic() + 20
            busy = False
            while not busy and time.monotonic() < deadline:
                try:
                    with open(path) as f:
                        busy = json.load(f)["peer"]["oom"]
                except (OSError, ValueError):
                    pass
                time.sleep(0.01)
            self.assertTrue(busy, "P never started its peer reclaim")
            far = int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1000) + 60000
            line = "give bytes=%d uuid=%s deadline_ms=%d pid=%d\n" % (64 * MiB, b.uuid, far, os.getpid())
            ans = json.loads(self.give_line(p, line.encode()))
            self.assertTrue(ans["ok"], ans)
            self.assertEqual(ans["given"]["framework_bytes"], 0, "its framework cache needs its GIL: not offered")
        finally:
            os.close(lock)  # P takes the lock, retries, asks B (nothing to give), and fails
        self.assertEqual(p.p.stdout.readline().strip(), "oom")
        self.assertEqual(int(p.ask("reserved").split()[1]), 193 * MiB, "its cache is all there")
        # Once done, P gives it (the same request, now).
        far = int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1000) + 60000
        line = "give bytes=%d uuid=%s deadline_ms=%d pid=%d\n" % (64 * MiB, b.uuid, far, os.getpid())
        self.assertGreaterEqual(json.loads(self.give_line(p, line.encode()))["given"]["framework_bytes"], 64 * MiB)

    # ---- not taken ----

    def test_live_memory_is_never_taken(self):
        b = Proc(self, "b")
        self.assertEqual(b.ask("live 192"), "live")
        self.wait_holding(b, b.uuid, 192 * MiB)
        a = Proc(self, "a")
        self.assertEqual(self.timed_alloc(a, 128), "oom")
        ev = self.one_event(a)
        self.assertFalse(ev["retry_succeeded"])
        self.assertEqual(ev["given_bytes"], 0)
        self.assertEqual(b.ask("check"), "intact")

    def test_stopped_peer_costs_the_timeout_at_most(self):
        b = Proc(self, "b")
        self.fill_cache(b)
        self.wait_holding(b, b.uuid, 192 * MiB, "pool_cached_bytes")
        a = Proc(self, "a", {"GPURECLAIM_PEER_TIMEOUT": "1"})
        os.kill(b.p.pid, signal.SIGSTOP)
        try:
            wait_stopped(b.p.pid)
            t0 = time.monotonic()
            a.p.stdin.write("alloc 128 alloc\n")
            a.p.stdin.flush()
            # Meanwhile A's status file says it is handling an out-of-memory: its peers do not ask it now.
            seen = False
            while not seen and time.monotonic() - t0 < 1.0:
                try:
                    with open(os.path.join(self.rundir, "%d.json" % a.pid)) as f:
                        seen = json.load(f)["peer"]["oom"]
                except (OSError, ValueError):
                    pass
                time.sleep(0.01)
            ans = a.p.stdout.readline().split()
            self.assertLess(time.monotonic() - t0, 1.0 + GUARD, "the allocation hung")
            self.assertEqual(ans[0], "oom")
            self.assertTrue(seen, "A's status file never said oom: true while it asked")
        finally:
            os.kill(b.p.pid, signal.SIGCONT)
        ev = self.one_event(a)
        self.assertEqual(ev["peers"][0]["pid"], b.pid)
        self.assertIn("deadline", ev["peers"][0]["error"])
        # Resumed, B finds the request's deadline passed and gives nothing behind A's back.
        self.assertEqual(b.ask("alloc 1 alloc").split()[0], "ok")
        self.assertEqual(b.stats()["pool_reserved"], 192 * MiB)
        self.assertEqual([r for r in b.events("release") if r["report"]["trigger"] == "peer"], [])

    def test_other_gpu_is_not_asked(self):
        b = Proc(self, "b", {"PEER_DEVICE": "1"})
        self.fill_cache(b)
        c = Proc(self, "c", {"GPURECLAIM_PEERS": "off"})
        self.assertEqual(c.ask("live 192"), "live")
        self.assertNotEqual(b.uuid, c.uuid)
        self.wait_holding(b, b.uuid, 192 * MiB, "pool_cached_bytes")
        a = Proc(self, "a")
        self.assertEqual(self.timed_alloc(a, 128), "oom")
        # Nothing on the GPU covers the need, so every live peer is asked, also one whose status file does not
        # list the GPU (it may be too fresh to): B answers that it has no such GPU, and gives nothing.
        peers = self.one_event(a)["peers"]
        self.assertEqual([(p["pid"], p["listed"], p.get("on_gpu")) for p in peers], [(b.pid, False, False)], peers)
        self.assertEqual(peers[0]["given"]["total_bytes"], 0)
        self.assertEqual(b.stats()["gives"], 0)
        self.assertEqual(b.stats()["pool_reserved"], 192 * MiB)

    def test_same_gpu_under_another_ordinal(self):
        """CUDA_VISIBLE_DEVICES renumbers: B's device 0 is the machine's GPU 1, A's device 1. Same UUID: asked."""
        b = Proc(self, "b", {"CUDA_VISIBLE_DEVICES": "1"})
        self.fill_cache(b)
        a = Proc(self, "a", {"PEER_DEVICE": "1"})
        self.assertEqual(a.uuid, b.uuid)
        self.wait_holding(b, b.uuid, 192 * MiB, "pool_cached_bytes")
        self.assertEqual(self.timed_alloc(a, 128), "ok")
        ev = self.one_event(a)
        self.assertEqual(ev["device"], 1)
        self.assertEqual([p["pid"] for p in ev["peers"]], [b.pid])

    def opted_out(self, a_env, b_env, a_asks):
        b = Proc(self, "b", b_env)
        self.fill_cache(b)
        if "GPURECLAIM_STATUS" not in b_env:
            self.wait_holding(b, b.uuid, 192 * MiB, "pool_cached_bytes")
        else:
            time.sleep(0.6)
        a = Proc(self, "a", a_env)
        self.assertEqual(self.timed_alloc(a, 128), "oom")
        if a_asks:
            self.assertEqual(self.one_event(a)["peers"], [], "B does not give: not asked")
        else:
            self.assertEqual(a.events("peer_reclaim"), [], "A does not ask")
        self.assertEqual(b.stats()["pool_reserved"], 192 * MiB)
        self.assertEqual(b.stats()["gives"], 0)

    def test_peers_off_on_the_giver(self):
        self.opted_out({}, {"GPURECLAIM_PEERS": "off"}, True)

    def test_peers_ask_only_on_the_giver(self):
        self.opted_out({}, {"GPURECLAIM_PEERS": "ask"}, True)

    def test_no_status_on_the_giver(self):
        self.opted_out({}, {"GPURECLAIM_STATUS": "0"}, True)

    def test_peers_off_on_the_asker(self):
        self.opted_out({"GPURECLAIM_PEERS": "off"}, {}, False)

    def test_give_only_on_the_asker(self):
        self.opted_out({"GPURECLAIM_PEERS": "give"}, {}, False)

    def test_no_status_on_the_asker(self):
        self.opted_out({"GPURECLAIM_STATUS": "0"}, {}, False)

    # ---- what the asker trusts, skips, and asks first (status files of FakePeer) ----

    def asked_in_order(self, a, fakes):
        """A's allocation larger than the GPU fails, its peer reclaim asks; the pids asked, in order."""
        self.assertEqual(self.timed_alloc(a, 300), "oom")
        asked = [p["pid"] for p in self.one_event(a)["peers"]]
        for f in fakes:
            self.assertEqual(len(f.requests), asked.count(f.pid), "what %d got: %r" % (f.pid, f.requests))
        return asked

    def test_status_files_of_another_user_are_not_trusted(self):
        """A status file that says it is another user's is not a peer (its socket could be anyone's), however much
        it offers; one of the same user, offering less, is asked."""
        a = Proc(self, "a")
        mine = FakePeer(self, a.uuid, pool=64 * MiB)
        other_uid = 65534 if os.geteuid() != 65534 else 65533
        theirs = FakePeer(self, a.uuid, uid=other_uid, pool=192 * MiB)
        self.assertEqual(self.asked_in_order(a, [mine, theirs]), [mine.pid])
        self.assertEqual(theirs.requests, [], "another user's status file was trusted")
        self.assertTrue(mine.requests[0].startswith("give bytes=%d uuid=%s " % (300 * MiB, a.uuid)), mine.requests)

    def test_a_peer_handling_its_own_out_of_memory_is_not_asked(self):
        """A peer whose status file says it is handling an out-of-memory ("oom": true) is itself waiting for peers,
        maybe for the asker: it is skipped, whatever it could give."""
        a = Proc(self, "a")
        busy = FakePeer(self, a.uuid, oom=True, pool=192 * MiB)
        idle = FakePeer(self, a.uuid, pool=32 * MiB)
        self.assertEqual(self.asked_in_order(a, [busy, idle]), [idle.pid])
        self.assertEqual(busy.requests, [], "a peer in its own peer reclaim was asked")

    def test_peers_are_asked_cheapest_to_give_first(self):
        """The order of README's "Who is asked": most to give cheaply (pools' unused memory and orphans) first, then
        most framework cache, and a peer that gave in the last 10 seconds last, whatever it holds."""
        a = Proc(self, "a")
        now = int(time.time() * 1000)
        recent = FakePeer(self, a.uuid, pool=160 * MiB, last_gave_ms=now)
        fw_only = FakePeer(self, a.uuid, framework=192 * MiB)
        small = FakePeer(self, a.uuid, pool=32 * MiB)
        small_fw = FakePeer(self, a.uuid, pool=16 * MiB, orphan=16 * MiB, framework=100 * MiB)
        most = FakePeer(self, a.uuid, orphan=96 * MiB)
        fakes = [recent, fw_only, small, small_fw, most]
        self.assertEqual(self.asked_in_order(a, fakes), [f.pid for f in (most, small_fw, small, fw_only, recent)])

    # ---- the giver's own checks (a request sent as a peer would) ----

    def test_a_process_that_does_not_give_refuses_a_request(self):
        """GPURECLAIM_PEERS without give: an asker reads that in the status file and does not ask, but the giver
        must refuse a request all the same (the status file may be stale, the asker another program)."""
        for peers in ("ask", "off"):
            with self.subTest(peers=peers):
                self.tearDown()
                self.setUp()
                b = Proc(self, "b", {"GPURECLAIM_PEERS": peers})
                self.fill_cache(b)
                far = int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1000) + 60000
                line = "give bytes=%d uuid=%s deadline_ms=%d pid=%d\n" % (128 * MiB, b.uuid, far, os.getpid())
                ans = json.loads(self.give_line(b, line.encode()))
                self.assertFalse(ans["ok"], ans)
                self.assertIn("GPURECLAIM_PEERS", ans["error"])
                self.assertEqual(b.stats()["gives"], 0)
                self.assertEqual(b.stats()["pool_reserved"], 192 * MiB, "it gave its cache")

    def test_a_request_past_its_deadline_is_refused(self):
        """A request whose deadline passed (its asker gave up: it waited while the giver was stopped) frees nothing
        behind the asker's back; the same request with a deadline ahead gives."""
        b = Proc(self, "b")
        self.fill_cache(b)
        now = int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1000)
        for deadline in (now - 1, now - 60000):
            line = "give bytes=%d uuid=%s deadline_ms=%d pid=%d\n" % (128 * MiB, b.uuid, deadline, os.getpid())
            ans = json.loads(self.give_line(b, line.encode()))
            self.assertFalse(ans["ok"], ans)
            self.assertIn("deadline", ans["error"])
        self.assertEqual(b.stats()["gives"], 0)
        self.assertEqual(b.stats()["pool_reserved"], 192 * MiB, "an expired request was served")
        far = int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1000) + 60000
        line = "give bytes=%d uuid=%s deadline_ms=%d pid=%d\n" % (128 * MiB, b.uuid, far, os.getpid())
        self.assertGreaterEqual(json.loads(self.give_line(b, line.encode()))["given"]["pool_bytes"], 128 * MiB)

    # ---- at once ----

    def test_two_processes_failing_at_once(self):
        """Each holds, in its pool, what the other needs, and retries nothing of its own (OOM_RETRY=0): both finish
        within the bound, and at least one gets its memory."""
        env = {"GPURECLAIM_OOM_RETRY": "0"}
        a, b = Proc(self, "a", env), Proc(self, "b", env)
        self.fill_cache(a, 4)
        self.fill_cache(b, 4)
        self.wait_holding(a, a.uuid, 128 * MiB, "pool_cached_bytes")
        self.wait_holding(b, b.uuid, 128 * MiB, "pool_cached_bytes")
        t0 = time.monotonic()
        for pr in (a, b):
            pr.p.stdin.write("alloc 64 alloc\n")
            pr.p.stdin.flush()
        answers = [pr.p.stdout.readline().split()[0] for pr in (a, b)]
        self.assertLess(time.monotonic() - t0, 2 * 2.0 + GUARD, "a deadlock, or close to one")
        self.assertIn("ok", answers)
        self.assertEqual(a.ask("check"), "intact")
        self.assertEqual(b.ask("check"), "intact")

    def test_malformed_requests_change_nothing(self):
        b = Proc(self, "b")
        self.fill_cache(b)
        far = int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1000) + 60000
        good = "give bytes=%d uuid=%s deadline_ms=%d pid=%d" % (128 * MiB, b.uuid, far, os.getpid())
        rng = random.Random(15)
        bad = [good[:n] for n in (4, 5, 12, len(good) // 2, len(good) - 1)]  # truncated
        bad += [good.replace("bytes=", "bytes=-"), good.replace("uuid=GPU-", "uuid=GPU-zz"), good + " extra=1",
                good.replace("pid=%d" % os.getpid(), "pid=1"), good.replace("bytes=%d" % (128 * MiB), "bytes=0"),
                good.replace(" ", "  ", 1), "give", "give " + "x" * 240]
        for line in bad:
            ans = self.give_line(b, (line + "\n").encode())
            self.assertFalse(json.loads(ans)["ok"], (line, ans))
        for _ in range(20):
            junk = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 400)))
            self.give_line(b, junk, close_early=True)
        self.assertEqual(b.stats()["gives"], 0)
        self.assertEqual(b.stats()["pool_reserved"], 192 * MiB)
        # The well-formed request, for contrast, gives.
        ans = json.loads(self.give_line(b, (good + "\n").encode()))
        self.assertTrue(ans["ok"], ans)
        self.assertGreaterEqual(ans["given"]["pool_bytes"], 128 * MiB)

    def request(self, pr, line, timeout=60):
        """One control-socket request; returns the answer's last line, parsed (a sleep sends progress lines)."""
        data = control.request(os.path.join(self.rundir, "%d.sock" % pr.pid), (line + "\n").encode(), timeout)
        return json.loads(data.decode().strip().splitlines()[-1])

    def test_a_sleeping_peer_gives_nothing_and_stays_intact(self):
        """Asked while it sleeps, a peer has nothing on the device to give, and must not touch the driver (the
        simulator aborts a process whose checkpointed memory is used): it answers, gives 0 B, and wakes intact."""
        b = Proc(self, "b")
        self.assertEqual(b.ask("live 16"), "live")
        self.fill_cache(b)
        slept = self.request(b, "sleep 10000")
        self.assertTrue(slept["ok"], slept)
        far = int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1000) + 60000
        good = "give bytes=%d uuid=%s deadline_ms=%d pid=%d" % (64 * MiB, b.uuid, far, os.getpid())
        ans = json.loads(self.give_line(b, (good + "\n").encode()))
        self.assertTrue(ans["ok"], ans)
        self.assertEqual(ans["given"]["total_bytes"], 0, ans)
        self.assertIsNone(b.p.poll(), "the sleeping peer died when asked to give")
        self.assertTrue(self.request(b, "wake")["ok"])
        self.assertEqual(b.ask("check"), "intact")

    def test_a_wake_short_of_room_is_relieved_by_a_peers_cache(self):
        """A sleeping process whose memory a peer's cache took meanwhile asks that peer when it wakes: the peer
        gives its pool cache, the restore finds room, and the sleeper's data is intact."""
        a = Proc(self, "a", {"GPURECLAIM_WAKE_TIMEOUT": "3"})
        self.assertEqual(a.ask("live 96"), "live")
        self.assertTrue(self.request(a, "sleep 10000")["ok"])
        b = Proc(self, "b")
        self.fill_cache(b)  # 192 MiB cached in B's pool: with A's 96 MiB the 256 MiB GPU has no room
        self.wait_holding(b, b.uuid, 192 * MiB, "pool_cached_bytes")
        woke = self.request(a, "wake")  # without asking, it would wait its 3 s out and stay asleep
        self.assertTrue(woke["ok"], woke)
        ev = self.one_event(a)
        self.assertEqual([p["pid"] for p in ev["peers"]], [b.pid])
        self.assertGreaterEqual(ev["peers"][0]["given"]["pool_bytes"], 32 * MiB)
        self.assertEqual(a.ask("check"), "intact")
        self.assertEqual(b.ask("alloc 16 async").split()[0], "ok", "B goes on working")

    def test_an_idle_peer_that_opted_in_sleeps_when_caches_are_not_enough(self):
        """GPURECLAIM_PEERS=ask,give,sleep: a peer holding only live memory, and idle, goes to sleep for an
        allocation that no cache could serve; it wakes intact later. Without sleep in its PEERS it is not asked."""
        b = Proc(self, "b", {"GPURECLAIM_PEERS": "ask,give,sleep"})
        self.assertEqual(b.ask("live 192"), "live")
        st = self.wait_holding(b, b.uuid, 192 * MiB)
        self.assertTrue(st["peer"]["sleep"], st["peer"])
        # A waits for B's whole sleep (a checkpoint can outlast the default 2 s, as under ThreadSanitizer).
        a = Proc(self, "a", {"GPURECLAIM_PEER_TIMEOUT": "60"})
        # B is idle once a second passed without a CUDA call of its own: until then A's allocation fails (a
        # hang guard bounds the retries, no deadline decides).
        guard = time.monotonic() + 60
        while self.timed_alloc(a, 128, timeout=60.0) != "ok":  # A's own peer timeout: the sleep may take long
            self.assertLess(time.monotonic(), guard, "B never slept for A")
            time.sleep(0.2)
        ev = a.events("peer_reclaim")[-1]
        self.assertTrue(ev["retry_succeeded"], ev)
        self.assertGreaterEqual(sum(p["given"]["slept_bytes"] for p in ev["peers"] if "given" in p), 128 * MiB, ev)
        with open(os.path.join(self.rundir, "%d.json" % b.pid)) as f:
            self.assertEqual(json.load(f)["sleep"]["state"], "sleeping")
        self.assertEqual(a.ask("free"), "freed")
        self.assertTrue(self.request(b, "wake")["ok"])
        self.assertEqual(b.ask("check"), "intact")

    def test_a_peer_that_did_not_opt_in_is_not_put_to_sleep(self):
        b = Proc(self, "b")  # default PEERS: ask,give
        self.assertEqual(b.ask("live 192"), "live")
        st = self.wait_holding(b, b.uuid, 192 * MiB)
        self.assertFalse(st["peer"]["sleep"])
        time.sleep(2.5)  # idle long enough that an opted-in peer would sleep: this one must not
        a = Proc(self, "a")
        self.assertEqual(self.timed_alloc(a, 128), "oom")
        with open(os.path.join(self.rundir, "%d.json" % b.pid)) as f:
            self.assertEqual(json.load(f)["sleep"]["state"], "awake")
        self.assertEqual(b.ask("check"), "intact")


class OtherUserTest(Base):
    """Its own CTest test (test_peers_other_user), as it needs root: a skip of it hides no other result."""

    def test_another_users_request_is_refused(self):
        if os.geteuid() != 0:
            self.skipTest("needs root, to run a peer as another user (uid 65534)")
        # B runs as uid 65534 in a run directory of its own; this test (root) is the other user.
        rundir = os.path.join(self.tmp, "nobody")
        os.mkdir(rundir, 0o700)
        os.chown(rundir, 65534, 65534)
        os.chmod(self.tmp, 0o755)

        def become():
            os.setgid(65534)
            os.setuid(65534)

        # Its simulated machine inside its run directory: removed with the test's files (the default one, under
        # /dev/shm, would outlive the test).
        b = Proc(self, "b", {"GPURECLAIM_RUNDIR": rundir, "SIMCUDA_MACHINE": os.path.join(rundir, "sim")},
                 preexec=become, log=os.path.join(rundir, "b.log"))
        self.fill_cache(b)
        far = int(time.clock_gettime(time.CLOCK_MONOTONIC) * 1000) + 60000
        line = "give bytes=%d uuid=%s deadline_ms=%d pid=%d\n" % (128 * MiB, b.uuid, far, os.getpid())
        self.rundir, saved = rundir, self.rundir
        try:
            ans = self.give_line(b, line.encode())
        finally:
            self.rundir = saved
        self.assertEqual(ans, b"", "refused unanswered")
        self.assertEqual(b.stats()["pool_reserved"], 192 * MiB)
        self.assertEqual(b.stats()["gives"], 0)
        refused = b.events("refused")
        self.assertEqual([e["client_uid"] for e in refused], [0], "and logged")


if __name__ == "__main__":
    unittest.main(verbosity=2)

"""Sharing one GPU (issue 31): an allocation that its peers cannot relieve now waits for memory to come
(GPURECLAIM_WAIT), in a queue per GPU that serves waiters first come, first served, those within their guarantee
(GPURECLAIM_GUARANTEE) first; idle peers that opted in to sleep are asked least recently used first, a peer within
its guarantee does not sleep for an asker above its own, and a process just woken keeps the device for
GPURECLAIM_SLEEP_MIN_AWAKE seconds. Real processes (peer_prog) on the simulator, on one 256 MiB GPU per test.

Times are hang guards, or lower bounds that only a broken implementation could miss ("still waiting a second after
the memory it could use appeared", "did not fail before its bound"), never a measure."""
import json
import os
import select
import sys
import tempfile
import threading
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_peers import Base, Proc, MiB  # noqa: E402

# Every test's files (its simulated machine, its run directory, the logs) under the run directory run_test.sh
# gave this test (Base.setUp then points GPURECLAIM_RUNDIR at its own inner one).
tempfile.tempdir = os.environ["GPURECLAIM_RUNDIR"]
HANG = 25  # seconds: a hang guard, never reached by a working implementation


class WaitTest(Base):
    def proc(self, name, **env):
        return Proc(self, name, {k: str(v) for k, v in env.items()})

    def status(self, pr):
        with open(os.path.join(self.rundir, "%d.json" % pr.pid)) as f:
            return json.load(f)

    def until(self, what, pred, guard=HANG):
        t0 = time.monotonic()
        while time.monotonic() - t0 < guard:
            try:
                v = pred()
                if v:
                    return v
            except (OSError, ValueError, KeyError):
                pass
            time.sleep(0.02)
        self.fail("never: " + what)

    def send(self, pr, line):
        pr.p.stdin.write(line + "\n")
        pr.p.stdin.flush()

    def answered(self, pr, within=0.0):
        return bool(select.select([pr.p.stdout], [], [], within)[0])

    def still_waiting(self, pr, secs, why):
        """That pr did not answer within secs (what it answered, and its wait events, if it did)."""
        if self.answered(pr, secs):
            self.fail("%s: it answered %r; its waits: %r; every wait: %r" % (why, pr.p.stdout.readline(), pr.events("wait"), [(p.pid, p.events("wait")) for p in self.procs]))

    def reply(self, pr, guard=HANG):
        self.assertTrue(self.answered(pr, float(guard)), "no answer within the hang guard")
        return pr.p.stdout.readline().split()

    def waiting(self, pr):
        """Until pr's status file shows it waiting (the top-level "wait"); returns that object."""
        return self.until("process %d waits" % pr.pid, lambda: self.status(pr)["wait"])

    def holder(self, name, mib, **env):
        """A process holding mib MiB in use (freed by "free"), awake and askable."""
        b = self.proc(name, GPURECLAIM_WAIT=0, **env)
        self.assertEqual(b.ask("alloc %d alloc" % mib).split()[0], "ok")
        self.wait_holding(b, b.uuid, mib * MiB)
        return b

    # ---- waiting ----

    def test_a_waiter_gets_memory_a_peer_frees(self):
        b = self.holder("b", 192)
        a = self.proc("a", GPURECLAIM_WAIT=HANG)
        self.send(a, "alloc 128 alloc")
        w = self.waiting(a)
        self.assertEqual((w["uuid"], w["bytes"], w["for"]), (b.uuid, 128 * MiB, "alloc"), w)
        self.assertLessEqual(abs(w["since_ms"] - time.time() * 1000), 60000, w)
        self.still_waiting(a, 0.5, "the allocation returned while nothing was freed")
        self.assertEqual(b.ask("free"), "freed")
        self.assertEqual(self.reply(a)[0], "ok")
        ev = a.events("wait")
        self.assertEqual(len(ev), 1, ev)
        self.assertTrue(ev[0]["served"], ev)
        self.assertEqual(ev[0]["for"], "alloc")
        self.until("the status file no longer shows the wait", lambda: self.status(a)["wait"] is None)

    def test_a_waiter_gets_memory_a_peer_leaves_by_exiting(self):
        b = self.holder("b", 192)
        a = self.proc("a", GPURECLAIM_WAIT=HANG)
        self.send(a, "alloc 128 alloc")
        self.waiting(a)
        b.p.stdin.close()
        b.p.wait(timeout=HANG)
        self.assertEqual(self.reply(a)[0], "ok")
        self.assertTrue(a.events("wait")[0]["served"])

    def test_a_waiter_gets_memory_when_a_busy_peer_goes_idle_and_sleeps(self):
        """B opted in to sleep but works (a CUDA call every 100 ms): A waits; once B stops, it is idle a second
        later, the waiting A asks again and B sleeps for it."""
        b = self.holder("b", 192, GPURECLAIM_PEERS="ask,give,sleep")
        a = self.proc("a", GPURECLAIM_WAIT=HANG, GPURECLAIM_PEER_TIMEOUT=20)
        self.send(a, "alloc 128 alloc")
        self.waiting(a)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 2.0:  # B busy: it must not be put to sleep, A must not be served
            self.assertEqual(b.ask("cache 1"), "cached")
            self.still_waiting(a, 0.1, "A got memory while B was busy")
        self.assertEqual(self.status(b)["sleep"]["state"], "awake")
        self.assertEqual(self.reply(a)[0], "ok")
        self.assertEqual(self.status(b)["sleep"]["state"], "sleeping")
        self.assertTrue(a.events("wait")[0]["served"])
        self.assertEqual(a.ask("free"), "freed")
        self.assertEqual(b.ask("free"), "freed")  # its first call wakes it: its memory came back

    def test_a_wait_ends_with_out_of_memory_at_its_bound(self):
        self.holder("b", 192)
        a = self.proc("a", GPURECLAIM_WAIT=2)
        t0 = time.monotonic()
        self.assertEqual(a.ask("alloc 128 alloc").split()[0], "oom")
        self.assertGreaterEqual(time.monotonic() - t0, 2.0, "it failed before its bound")
        ev = a.events("wait")
        self.assertEqual([(e["served"], e["ended"]) for e in ev], [(False, "timeout")], ev)
        self.assertIsNone(self.status(a)["wait"])
        # GPURECLAIM_WAIT=0: no wait at all
        z = self.proc("z", GPURECLAIM_WAIT=0)
        self.assertEqual(z.ask("alloc 128 alloc").split()[0], "oom")
        self.assertEqual(z.events("wait"), [])

    def test_no_wait_when_no_other_process_shares_the_gpu(self):
        a = self.proc("a", GPURECLAIM_WAIT=HANG)
        self.assertEqual(a.ask("alloc 192 alloc").split()[0], "ok")
        t0 = time.monotonic()
        self.assertEqual(a.ask("alloc 128 alloc").split()[0], "oom")
        self.assertLess(time.monotonic() - t0, HANG, "it waited with nobody to free anything")
        self.assertEqual(a.events("wait"), [])

    def test_two_holders_waiting_for_each_other_do_not_both_wait(self):
        """X and Y hold 100 MiB each. X waits for 100 MiB more (the head). Y, asking for as much, would wait for
        X, which waits for Y: Y gives up at once (out-of-memory long before its bound), X waits on, and gets Y's
        memory when Y frees it."""
        x = self.holder("x", 100)
        y = self.holder("y", 100)
        for pr in (x, y):
            pr.p.stdin.close()  # (holder made them with GPURECLAIM_WAIT=0: these two wait)
            pr.p.wait(timeout=HANG)
        x = self.proc("x2", GPURECLAIM_WAIT=HANG)
        y = self.proc("y2", GPURECLAIM_WAIT=HANG)
        self.assertEqual(x.ask("alloc 100 alloc").split()[0], "ok")
        self.assertEqual(y.ask("alloc 100 alloc").split()[0], "ok")
        self.wait_holding(y, y.uuid, 100 * MiB)
        self.send(x, "alloc 100 alloc")
        self.waiting(x)
        self.wait_holding(x, x.uuid, 100 * MiB)
        t0 = time.monotonic()
        self.assertEqual(y.ask("alloc 100 alloc").split()[0], "oom")
        self.assertLess(time.monotonic() - t0, HANG - 5, "Y waited for X, who waits for Y")
        self.assertEqual(y.events("wait"), [])
        self.still_waiting(x, 0.2, "X got memory nobody freed")
        self.assertEqual(y.ask("free"), "freed")
        self.assertEqual(self.reply(x)[0], "ok")

    def test_waiters_are_served_first_come_first_served(self):
        """A1 waits for 100 MiB, then A2 for 60 MiB. B1 frees 60 MiB: A2 would fit, A1 not; A2 must not pass A1
        (it is still waiting a second later). B2 frees the rest: A1 first, then A2."""
        b1 = self.holder("b1", 60)
        b2 = self.holder("b2", 160)
        a1 = self.proc("a1", GPURECLAIM_WAIT=HANG)
        a2 = self.proc("a2", GPURECLAIM_WAIT=HANG)
        self.send(a1, "alloc 100 alloc")
        self.waiting(a1)
        self.send(a2, "alloc 60 alloc")
        self.waiting(a2)
        self.assertEqual(b1.ask("free"), "freed")
        self.still_waiting(a2, 1.0, "A2 took memory ahead of A1, who waited first")
        self.assertEqual(b2.ask("free"), "freed")
        self.assertEqual(self.reply(a1)[0], "ok")
        self.assertEqual(self.reply(a2)[0], "ok")
        e1, e2 = a1.events("wait")[0], a2.events("wait")[0]
        self.assertLess(e1["ticket"], e2["ticket"])
        self.assertLessEqual(e1["since_ms"] + e1["ms"], e2["since_ms"] + e2["ms"] + 1, (e1, e2))

    def test_a_waiter_within_its_guarantee_is_served_first(self):
        """A1 (no guarantee) waits for 100 MiB first, then A2 within its guarantee of 128 MiB. B1 frees 100 MiB,
        room for one of them: A2's. A1 gets B2's later."""
        b1 = self.holder("b1", 100)
        b2 = self.holder("b2", 100)
        a1 = self.proc("a1", GPURECLAIM_WAIT=HANG)
        a2 = self.proc("a2", GPURECLAIM_WAIT=HANG, GPURECLAIM_GUARANTEE="128M")
        self.send(a1, "alloc 100 alloc")
        self.waiting(a1)
        self.send(a2, "alloc 100 alloc")
        self.waiting(a2)
        self.assertEqual(self.status(a2)["peer"]["gpus"][0]["guarantee_bytes"], 128 * MiB)
        self.assertIsNone(self.status(a1)["peer"]["gpus"][0]["guarantee_bytes"])
        self.assertEqual(b1.ask("free"), "freed")
        self.assertEqual(self.reply(a2)[0], "ok")
        self.still_waiting(a1, 0.2, "A1 got memory meanwhile")
        self.assertEqual(b2.ask("free"), "freed")
        self.assertEqual(self.reply(a1)[0], "ok")
        e1, e2 = a1.events("wait")[0], a2.events("wait")[0]
        self.assertLess(e1["ticket"], e2["ticket"], "A1 came first")
        self.assertTrue(e2["within_guarantee"] and not e1["within_guarantee"], (e1, e2))

    def test_a_wake_short_of_room_waits_in_the_queue(self):
        """A sleeps; B takes the room A needs. A's wake joins the GPU's queue (its status file shows the wait, for
        a wake) and completes once B frees, A's data intact."""
        a = self.proc("a", GPURECLAIM_WAKE_TIMEOUT=HANG)
        self.assertEqual(a.ask("live 96"), "live")
        self.assertTrue(self.request(a, "sleep 10000")["ok"])
        b = self.holder("b", 192)
        woke = []
        t = threading.Thread(target=lambda: woke.append(self.request(a, "wake")))
        t.start()
        try:
            w = self.until("A's wake waits", lambda: (self.status(a)["wait"] or {}).get("for") == "wake" and
                           self.status(a)["wait"])
            self.assertEqual((w["uuid"], w["bytes"]), (a.uuid, 96 * MiB), w)
            time.sleep(0.3)
            self.assertEqual(woke, [], "the wake ended without room")
            self.assertEqual(b.ask("free"), "freed")
        finally:
            t.join(HANG)
        self.assertTrue(woke and woke[0]["ok"], woke)
        ev = a.events("wait")
        self.assertEqual([(e["for"], e["served"]) for e in ev], [("wake", True)], ev)
        self.assertEqual(a.ask("check"), "intact")

    def test_a_wake_with_room_queues_behind_waiters(self):
        """C sleeps (60 MiB). B then holds 192 MiB, and A waits for 100 MiB in the queue. C wakes: 64 MiB are
        free, room for C but not for A; C queues behind A instead of taking it. B frees: A first, then C."""
        c = self.proc("c", GPURECLAIM_WAKE_TIMEOUT=HANG)
        self.assertEqual(c.ask("live 60"), "live")
        self.assertTrue(self.request(c, "sleep 10000")["ok"])
        b = self.holder("b", 192)
        a = self.proc("a", GPURECLAIM_WAIT=HANG)
        self.send(a, "alloc 100 alloc")
        self.waiting(a)
        woke = []
        t = threading.Thread(target=lambda: woke.append(self.request(c, "wake")))
        t.start()
        try:
            self.until("C's wake queues", lambda: (self.status(c)["wait"] or {}).get("for") == "wake")
            time.sleep(0.3)
            self.assertEqual(woke, [], "C took the room ahead of A, who waited first")
            self.assertEqual(b.ask("free"), "freed")
            self.assertEqual(self.reply(a)[0], "ok")
        finally:
            t.join(HANG)
        self.assertTrue(woke and woke[0]["ok"], woke)
        self.assertEqual(c.ask("check"), "intact")

    # ---- who gives ----

    def idle(self, pr):
        return self.until("process %d idle" % pr.pid, lambda: self.status(pr)["sleep"]["idle_since_ms"])

    def test_the_least_recently_used_idle_peer_sleeps(self):
        """Two idle peers that opted in to sleep, 100 MiB each; A needs one of them to sleep. The one idle longer
        sleeps, whatever the pids' order (the one with the higher pid is made the least recently used)."""
        x = self.holder("x", 100, GPURECLAIM_PEERS="ask,give,sleep")
        y = self.holder("y", 100, GPURECLAIM_PEERS="ask,give,sleep")
        old, new = (x, y) if x.pid > y.pid else (y, x)
        t_old = self.idle(old)
        time.sleep(0.3)
        self.assertEqual(new.ask("cache 1"), "cached")  # a CUDA call: new is the more recently used
        t_new = self.until("the recent one idle after its call", lambda: (
            self.status(new)["sleep"]["idle_since_ms"] or 0) > t_old and self.status(new)["sleep"]["idle_since_ms"])
        self.assertLess(t_old, t_new)
        self.assertEqual(self.status(old)["sleep"]["idle_since_ms"], t_old, "old made no call meanwhile")
        a = self.proc("a", GPURECLAIM_WAIT=0, GPURECLAIM_PEER_TIMEOUT=20)
        self.assertEqual(a.ask("alloc 100 alloc").split()[0], "ok")
        self.assertEqual(self.status(old)["sleep"]["state"], "sleeping")
        self.assertEqual(self.status(new)["sleep"]["state"], "awake")

    def test_a_peer_within_its_guarantee_does_not_sleep_for_one_above_its_own(self):
        b = self.holder("b", 192, GPURECLAIM_PEERS="ask,give,sleep", GPURECLAIM_GUARANTEE="256M")
        self.idle(b)
        above = self.proc("above", GPURECLAIM_WAIT=0, GPURECLAIM_PEER_TIMEOUT=20)
        self.assertEqual(above.ask("alloc 128 alloc").split()[0], "oom")
        self.assertEqual(self.status(b)["sleep"]["state"], "awake")
        asked = [p for ev in above.events("peer_reclaim") for p in ev["peers"] if p["pid"] == b.pid]
        self.assertTrue(asked and all(p["given"]["slept_bytes"] == 0 for p in asked), asked)
        # The same request from a process within its own guarantee: B sleeps.
        within = self.proc("within", GPURECLAIM_WAIT=0, GPURECLAIM_PEER_TIMEOUT=20, GPURECLAIM_GUARANTEE="128M")
        self.assertEqual(within.ask("alloc 128 alloc").split()[0], "ok")
        self.assertEqual(self.status(b)["sleep"]["state"], "sleeping")

    def test_a_process_just_woken_is_not_put_to_sleep_again(self):
        """GPURECLAIM_SLEEP_MIN_AWAKE: B woke a moment ago and is idle: a peer's sleep request is not honoured
        within it. C, the same with SLEEP_MIN_AWAKE=0, sleeps."""
        for name, min_awake, expect in (("b", 600, "oom"), ("c", 0, "ok")):
            b = self.holder(name, 192, GPURECLAIM_PEERS="ask,give,sleep", GPURECLAIM_SLEEP_MIN_AWAKE=min_awake)
            self.assertTrue(self.request(b, "sleep 10000")["ok"])
            self.assertTrue(self.request(b, "wake")["ok"])
            self.idle(b)
            a = self.proc("a" + name, GPURECLAIM_WAIT=0, GPURECLAIM_PEER_TIMEOUT=20)
            self.assertEqual(a.ask("alloc 128 alloc").split()[0], expect, name)
            self.assertEqual(self.status(b)["sleep"]["state"], "awake" if expect == "oom" else "sleeping")
            if expect == "oom":
                b.p.stdin.close()
                b.p.wait(timeout=HANG)

    def request(self, pr, line, timeout=60):
        from test_peers import PeerTest
        return PeerTest.request(self, pr, line, timeout)


if __name__ == "__main__":
    unittest.main()

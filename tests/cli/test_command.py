"""The gpureclaim command and the Python helper, end to end: the real library, in programs running on the
simulator. (test_command_fake.py covers formatting, timeouts and refusals against a stand-in process.)

Environment (set by CTest): GR_CMD (the command), GR_HOLD (tests/cli/hold), GR_LAYOUT, GR_PYTHON_DIR,
GR_PRELOAD (what LD_PRELOAD must hold first in sanitizer builds), LD_LIBRARY_PATH (the simulator).
"""
import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
from control import read_all  # noqa: E402

CMD = os.environ["GR_CMD"]
HOLD = os.environ["GR_HOLD"]
MiB = 1024 * 1024
EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples")


def run(*args, env=None, check=None):
    p = subprocess.run([CMD, *args], capture_output=True, text=True, env=env, timeout=60)
    if check is not None:
        assert p.returncode == check, (args, p.returncode, p.stdout, p.stderr)
    return p


def ps_json(*args, env):
    """The processes `ps --json` lists (its object also has the host, the time and the GPU table)."""
    return json.loads(run("ps", "--json", *args, env=env, check=0).stdout)["processes"]


def stop_and_wait(pid):
    """SIGSTOP, then wait until every thread of pid is stopped: kill() returns before the group stop has reached
    them all, and a worker thread still running could take a request up meanwhile."""
    os.kill(pid, signal.SIGSTOP)
    guard = time.monotonic() + 60  # a hang guard, not a deadline that decides
    while time.monotonic() < guard:
        states = []
        for t in os.listdir("/proc/%d/task" % pid):
            try:
                with open("/proc/%d/task/%s/stat" % (pid, t)) as f:
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
            except FileNotFoundError:
                pass
        if states and all(st in "Tt" for st in states):
            return
        time.sleep(0.01)
    raise AssertionError("process %d did not stop" % pid)



class Held:
    """A program holding memory under `gpureclaim run`: 3 MiB live, 64 MiB cached in a pool, a 5 MiB orphan,
    64 KiB pinned."""

    def __init__(self, env, *run_opts, program=HOLD, args=()):
        self.p = subprocess.Popen([CMD, "run", *run_opts, "--", program, *args], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
        line = self.p.stdout.readline()
        assert line.startswith("ready "), (line, self.p.stderr.read() if self.p.poll() is not None else "")
        self.pid = int(line.split()[1])

    def sim(self):
        """The simulator's own view: (live bytes, pool reserved bytes, host bytes)."""
        self.p.stdin.write("sim\n")
        self.p.stdin.flush()
        parts = self.p.stdout.readline().split()
        return tuple(int(x) for x in parts[1:])

    def ask(self, line):
        """Sends a line to hold and returns its answer's words after the first."""
        self.p.stdin.write(line + "\n")
        self.p.stdin.flush()
        return self.p.stdout.readline().split()[1:]

    def close(self):
        self.p.stdin.close()
        self.p.wait(timeout=30)
        self.p.stdout.close()
        self.p.stderr.close()


class CommandTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="grcli")
        self.rundir = os.path.join(self.tmp, "run")
        self.env = dict(os.environ, GPURECLAIM_RUNDIR=self.rundir, GPURECLAIM_LOG=os.path.join(self.tmp, "log"))
        if os.environ.get("GR_PRELOAD"):  # the sanitizer runtime first, then what `run` adds
            self.env["LD_PRELOAD"] = os.environ["GR_PRELOAD"]
        self.held = []

    def tearDown(self):
        for h in self.held:
            h.close()
        # The run directory and log go with a passing test; a failing one keeps them for a look (the path is in
        # its output when it prints the environment) unless GR_KEEP_TMP says otherwise.
        outcome = getattr(self, "_outcome", None)
        failed = outcome is not None and not getattr(outcome, "success", True)
        if not failed and not os.environ.get("GR_KEEP_TMP"):
            shutil.rmtree(self.tmp, ignore_errors=True)

    def hold(self, *opts):
        h = Held(self.env, *opts)
        self.held.append(h)
        return h

    def connect(self, h):
        """A raw connection to h's control socket (docs/PROTOCOL.md)."""
        with open(os.path.join(self.rundir, "%d.json" % h.pid)) as f:
            path = json.load(f)["socket"]
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.settimeout(20)
        s.connect(path)
        return s

    def test_a_limit_end_to_end(self):
        """GPURECLAIM_LIMIT in a real process on the simulator: cuMemGetInfo reports it, an allocation past it
        releases the process's own cache (its 5 MiB orphan) and succeeds when that makes room, and fails with
        out-of-memory when nothing does; ps shows it (table, --json), a process without one shows none, and run
        refuses a malformed value naming what it takes."""
        env = dict(self.env, GPURECLAIM_LIMIT="80M")  # hold's 64 MiB pool block (freed at once) fits
        h = Held(env)
        self.held.append(h)
        rc, fr, tot = (int(x) for x in h.ask("info"))
        self.assertEqual((rc, tot), (0, 80 * MiB), "total: the limit")
        self.assertEqual(fr, 72 * MiB, "free: 80 MiB less 3 MiB live and the 5 MiB orphan (the pool's cache does not count)")
        other = self.hold()  # no limit: the driver's figures
        self.assertGreater(int(other.ask("info")[2]), 1 << 30)
        self.assertEqual(h.ask("alloc 74"), ["0"], "8 + 74 > 80: the orphan goes first, then it fits")
        self.assertEqual(h.sim()[0], 77 * MiB, "3 MiB live + the new 74 MiB, the orphan freed")
        self.assertEqual(h.ask("alloc 4"), ["2"], "77 + 4 > 80 and nothing of its own to release: out of memory")
        self.assertEqual(h.sim()[0], 77 * MiB)
        self.assertEqual(h.ask("info")[1:], [str(3 * MiB), str(80 * MiB)])
        js = {p["pid"]: p for p in ps_json(env=self.env)}
        self.assertEqual(js[h.pid]["limit_bytes"], 80 * MiB)
        self.assertIsNone(js[other.pid]["limit_bytes"])
        with open(os.path.join(self.rundir, "%d.json" % h.pid)) as f:
            rows = json.load(f)["peer"]["gpus"]
        self.assertEqual([r["limit_bytes"] for r in rows], [80 * MiB])
        self.assertIn("on GPU 0: limit 80.0 MiB", run("ps", env=self.env, check=0).stdout)
        # GPURECLAIM_GUARANTEE takes the limit's syntax: a fraction is of the device's memory (the simulator's 80 GiB).
        g = Held(dict(self.env, GPURECLAIM_GUARANTEE="0.25"))
        self.held.append(g)
        rows, deadline = [], time.monotonic() + 20  # the worker lists the GPU in the status file within a tick
        while not rows and time.monotonic() < deadline:
            time.sleep(0.05)
            with open(os.path.join(self.rundir, "%d.json" % g.pid)) as f:
                rows = json.load(f)["peer"]["gpus"]
        self.assertEqual([r["guarantee_bytes"] for r in rows], [20 << 30], "a quarter of 80 GiB")
        js = {p["pid"]: p for p in ps_json(env=self.env)}
        self.assertEqual(js[g.pid]["guarantee_bytes"], 20 << 30)
        self.assertIsNone(js[h.pid]["guarantee_bytes"])
        bad = subprocess.run([CMD, "run", "--", HOLD], env=dict(self.env, GPURECLAIM_LIMIT="1.5"), capture_output=True,
                             text=True, stdin=subprocess.DEVNULL, timeout=60)
        self.assertEqual(bad.returncode, 2)
        self.assertIn("bad value in the environment: GPURECLAIM_LIMIT=1.5 (expected a size (bytes, or K, M, G, T: 8G, 1.5GiB) or a "
                      "fraction of the device in (0, 1] (0.5, 50%); unset: no limit)", bad.stderr)

    def test_ps_lists_the_process_with_its_memory(self):
        h = self.hold()
        out = run("ps", env=self.env, check=0).stdout
        # HELD: 8 MiB live (5 of them orphaned) and the pool's 64 MiB unused.
        self.assertRegex(out, r"(?m)^\s*%d 0\s+72\.0 MiB\s+64\.0 MiB\s+5\.0 MiB\s+64\.0 KiB\s+0 awake\s+- hold$" % h.pid)
        # The GPU, named as nvidia-smi names it, with the driver's figures (the simulator's).
        uuid = re.search(r"(?m)^\s+0 (GPU-[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12})\s+"
                         r"\S+ [KMG]iB\s+80\.0 GiB\s+72\.0 MiB\s+69\.0 MiB\s", out)
        self.assertTrue(uuid, out)
        rows = ps_json(env=self.env)
        self.assertEqual(len(rows), 1)
        r = rows[0]
        self.assertEqual((r["pid"], r["live_bytes"], r["cached_bytes"], r["pinned_bytes"], r["devices"]),
                         (h.pid, 8 * MiB, 64 * MiB, 64 * 1024, [0]))
        self.assertEqual((r["held_bytes"], r["orphan_bytes"], r["releasable_bytes"], r["gpu_uuids"]),
                         (72 * MiB, 5 * MiB, 69 * MiB, [uuid.group(1)]))
        self.assertTrue(r["answered"])
        # The status file names the GPUs it can see the same way (written once CUDA is initialised).
        with open(os.path.join(self.rundir, "%d.json" % h.pid)) as f:
            self.assertEqual(json.load(f)["gpus"][0], {"device": 0, "uuid": uuid.group(1)})
        # Selected by that UUID; another GPU selects nothing.
        self.assertEqual(len(ps_json("-i", uuid.group(1), env=self.env)), 1)
        self.assertEqual(ps_json("-i", "1", env=self.env), [])

    def nvml_uuids(self):
        """The simulated machine's GPUs as its NVML numbers them (the simulator's libnvidia-ml.so.1, asked
        directly: what nvidia-smi would list), index -> UUID."""
        import ctypes
        nvml = ctypes.CDLL("libnvidia-ml.so.1")
        self.assertEqual(nvml.nvmlInit_v2(), 0)
        count = ctypes.c_uint()
        self.assertEqual(nvml.nvmlDeviceGetCount_v2(ctypes.byref(count)), 0)
        out = {}
        for i in range(count.value):
            h, buf = ctypes.c_void_p(), ctypes.create_string_buffer(96)
            self.assertEqual(nvml.nvmlDeviceGetHandleByIndex_v2(i, ctypes.byref(h)), 0)
            self.assertEqual(nvml.nvmlDeviceGetUUID(h, buf, 96), 0)
            out[i] = buf.value.decode()
        return out

    def test_gpus_are_numbered_as_nvidia_smi_numbers_them(self):
        """Two simulated GPUs; one process on GPU 0, one started with CUDA_VISIBLE_DEVICES=1 (its own ordinal 0
        is the machine's GPU 1). Both were shown as GPU 0, ps -i 1 missed the second, and release -g 1 too: GPUs
        are numbered as NVML numbers them (nvidia-smi's numbers), the process's own ordinal kept beside."""
        uuids = self.nvml_uuids()
        self.assertEqual(len(uuids), 2)
        h0 = self.hold()
        h1 = Held(dict(self.env, CUDA_VISIBLE_DEVICES="1"))
        self.held.append(h1)
        obj = json.loads(run("ps", "--json", env=self.env, check=0).stdout)
        self.assertEqual(obj["gpu_numbering"], "nvidia-smi")
        self.assertEqual([(g["index"], g["uuid"], g["held_bytes"], g["processes"]) for g in obj["gpus"]],
                         [(0, uuids[0], 72 * MiB, 1), (1, uuids[1], 72 * MiB, 1)])
        rows = {r["pid"]: r for r in obj["processes"]}
        self.assertEqual((rows[h0.pid]["gpus"], rows[h0.pid]["devices"], rows[h0.pid]["gpu_uuids"]), ([0], [0], [uuids[0]]))
        self.assertEqual((rows[h1.pid]["gpus"], rows[h1.pid]["devices"], rows[h1.pid]["gpu_uuids"]), ([1], [0], [uuids[1]]))
        table = run("ps", env=self.env, check=0).stdout
        self.assertRegex(table, r"(?m)^\s+1 %s\s+\S+ [KMG]?i?B\s+80\.0 GiB\s+72\.0 MiB\s" % uuids[1])
        self.assertRegex(table, r"(?m)^\s*%d 1\s+72\.0 MiB\s" % h1.pid)
        q = run("ps", "-q", "pid,gpu,cuda_device,gpu_uuid", "--format", "csv,noheader", "-i", "1", env=self.env, check=0)
        self.assertEqual(q.stdout, "%d,1,0,%s\n" % (h1.pid, uuids[1]))
        self.assertEqual([r["pid"] for r in ps_json("-i", "1", env=self.env)], [h1.pid])
        self.assertEqual([r["pid"] for r in ps_json("-i", "0", env=self.env)], [h0.pid])
        # Prometheus: the process's ordinal (device), nvidia-smi's number (gpu) and the UUID, to join with DCGM's.
        prom = run("ps", "--prometheus", "-", env=self.env, check=0).stdout
        self.assertIn('gpureclaim_live_bytes{pid="%d",device="0",gpu="1",uuid="%s",command="hold"} %d'
                      % (h1.pid, uuids[1], 8 * MiB), prom)
        # release -g 1: the process on the machine's GPU 1 only.
        out = json.loads(run("release", "-g", "1", "--json", env=self.env, check=0).stdout)
        self.assertEqual([x["pid"] for x in out], [h1.pid])
        self.assertEqual((h0.sim()[1], h1.sim()[1]), (64 * MiB, 0), "GPU 0's process was released")
        # A GPU the machine does not have is an error, naming those it has.
        p = run("ps", "-i", "2", env=self.env, check=2)
        self.assertIn("no GPU 2 on this machine: its GPUs are 0 to 1", p.stderr)

    def test_a_process_started_elsewhere_is_found(self):
        """A job started from cron, Slurm, nohup, su or systemd has another XDG_RUNTIME_DIR than the user's shell
        (or none), so another run directory: ps showed nothing, and release PID said "not running gpureclaim
        (no status file in ...: started without it, ...)", none of which was true. ps reads every run
        directory where a process of yours has its control socket, and says which; release PID looks where the
        process's environment and socket say."""
        job_xdg, shell_xdg = os.path.join(self.tmp, "job-xdg"), os.path.join(self.tmp, "shell-xdg")
        os.mkdir(job_xdg, 0o700)
        os.mkdir(shell_xdg, 0o700)
        job_env = dict(self.env, XDG_RUNTIME_DIR=job_xdg)
        job_env.pop("GPURECLAIM_RUNDIR")
        h = Held(job_env)
        self.held.append(h)
        job_dir = os.path.join(job_xdg, "gpureclaim")
        self.assertTrue(os.path.exists(os.path.join(job_dir, "%d.json" % h.pid)))
        shell = dict(self.env, XDG_RUNTIME_DIR=shell_xdg)
        shell.pop("GPURECLAIM_RUNDIR")
        obj = json.loads(run("ps", "--json", env=shell, check=0).stdout)
        self.assertEqual(obj["rundirs"][0], os.path.join(shell_xdg, "gpureclaim"), "its own directory first")
        self.assertIn(job_dir, obj["rundirs"])
        mine = [r for r in obj["processes"] if r["pid"] == h.pid]
        self.assertEqual([(r["rundir"], r["held_bytes"]) for r in mine], [(job_dir, 72 * MiB)])
        self.assertIn("Run directories read: %s (yours),\n  %s (processes started elsewhere)\n" % (os.path.join(shell_xdg, "gpureclaim"), job_dir),
                      run("ps", env=shell, check=0).stdout)
        out = run("release", str(h.pid), env=shell, check=0).stdout
        self.assertIn("%d (hold): released 69.0 MiB" % h.pid, out)
        self.assertEqual(h.sim()[1], 0, "its pool was not trimmed")
        # With GPURECLAIM_RUNDIR set, ps reads that directory only; a pid given is still found where it is.
        self.assertEqual(ps_json(env=self.env), [])
        self.assertEqual([r["pid"] for r in ps_json(str(h.pid), env=self.env)], [h.pid])
        self.assertIn("pid %d: 3 live blocks" % h.pid, run("snapshot", str(h.pid), env=self.env, check=0).stdout)
        # The reasons given for a process without a status file are now true ones.
        plain = subprocess.Popen(["sleep", "30"])
        try:
            p = run("release", str(plain.pid), env=shell, check=3)
            self.assertIn("process %d is not running gpureclaim: libgpureclaim is not loaded in it: start it with "
                          "gpureclaim run" % plain.pid, p.stderr)
        finally:
            plain.kill()
            plain.wait()
        quiet = self.hold("--no-status")
        p = run("release", str(quiet.pid), env=self.env, check=3)
        self.assertIn("it runs with GPURECLAIM_STATUS=0: no status file, no control socket", p.stderr)

    def test_a_launcher_and_its_workers(self):
        """gpureclaim run -- torchrun (accelerate, a wrapper script): the launcher never uses CUDA, its workers
        do. release $! said "not running gpureclaim" with no hint; it names the children that do, and --tree
        releases the launcher's whole tree."""
        h = Held(self.env, program="sh", args=("-c", HOLD + "; true"))  # sh forks hold: its worker
        self.held.append(h)
        launcher = h.p.pid  # gpureclaim run exec'd sh
        self.assertNotEqual(launcher, h.pid)
        p = run("release", str(launcher), env=self.env, check=3)
        self.assertIn("process %d is not running gpureclaim" % launcher, p.stderr)
        self.assertIn("its child process %d (hold) runs gpureclaim: --tree acts on %d and every process under it"
                      % (h.pid, launcher), p.stderr)
        out = json.loads(run("release", "--tree", str(launcher), "--json", env=self.env, check=0).stdout)
        self.assertEqual([(x["pid"], x["ok"], x["report"]["pool_bytes"]) for x in out], [(h.pid, True, 64 * MiB)])
        self.assertEqual(h.sim()[1], 0, "the worker's pool was not trimmed")
        run("release", "--tree", "--all", env=self.env, check=2)
        plain = subprocess.Popen(["sleep", "30"])
        try:
            p = run("release", "--tree", str(plain.pid), env=self.env, check=3)
            self.assertIn("libgpureclaim is not loaded in it", p.stderr)
        finally:
            plain.kill()
            plain.wait()

    def test_without_nvml_gpus_are_named_by_uuid(self):
        """Where NVML cannot be loaded (no driver, a container given the compute libraries only), ps works and
        says so: GPUs named by UUID, numbers each process's own."""
        h = self.hold()
        lib = os.path.join(self.tmp, "lib")
        os.mkdir(lib)
        for name in ("libcuda.so.1", "libcudart.so.13"):  # the simulator without its NVML
            os.symlink(os.path.join(os.environ["LD_LIBRARY_PATH"].split(":")[0], name), os.path.join(lib, name))
        env = dict(self.env, LD_LIBRARY_PATH=lib)
        obj = json.loads(run("ps", "--json", env=env, check=0).stdout)
        self.assertEqual(obj["gpu_numbering"], "cuda_ordinals")
        self.assertIn("libnvidia-ml.so.1", obj["nvml_error"])
        self.assertEqual([(g["index"], g["held_bytes"]) for g in obj["gpus"]], [(None, 72 * MiB)])
        self.assertEqual(obj["processes"][0]["gpus"], [0])
        table = run("ps", env=env, check=0).stdout
        self.assertRegex(table, r"(?m)^\s+- GPU-[0-9a-f-]+\s")
        self.assertIn("GPU numbers are each process's own CUDA ordinals", table)
        self.assertEqual(h.pid, obj["processes"][0]["pid"])

    def test_ps_shows_a_framework_cache_and_a_release_gives_it_back(self):
        """A framework's cache (examples/simframework.py, PyTorch's stand-in on the simulator): ps counts its
        releasable part in CACHED before any release, and a release gives back exactly that."""
        code = ("import os, sys; sys.path.insert(0, %r); import simframework as f\n"
                "keep = [f.Tensor(1 << 20) for _ in range(4)]\n"
                "gone = [f.Tensor(2 << 20) for _ in range(3)]; del gone\n"
                "print('ready', os.getpid(), flush=True); sys.stdin.read()\n") % EXAMPLES
        h = Held(self.env, program=sys.executable, args=("-c", code))
        self.held.append(h)
        r = ps_json(env=self.env)[0]
        self.assertEqual(r["frameworks"], [{"framework": "simframework", "device": 0, "gpu": 0, "reserved_bytes": 10 * MiB,
                                            "in_use_bytes": 4 * MiB, "releasable_bytes": 6 * MiB,
                                            "non_releasable_bytes": 0}])
        self.assertEqual((r["cached_bytes"], r["held_bytes"]), (6 * MiB, 10 * MiB))
        out = run("ps", env=self.env, check=0).stdout
        self.assertIn("simframework on GPU 0: 10.0 MiB reserved = 4.0 MiB in use + 6.0 MiB releasable", out)
        rep = json.loads(run("release", str(h.pid), "--json", env=self.env, check=0).stdout)[0]["report"]
        self.assertEqual(rep["framework_bytes"], r["cached_bytes"])
        r = ps_json(env=self.env)[0]
        self.assertEqual((r["cached_bytes"], r["held_bytes"]), (0, 4 * MiB))

    def test_sleep_and_wake(self):
        """gpureclaim sleep: cached and orphaned memory released, the live 3 MiB moved to the host; ps shows the
        state and the bytes on the host; a release is refused while asleep; gpureclaim wake and a CUDA call of
        the program (through a pointer from cuGetProcAddress) wake it; every sleep and wake is logged."""
        h = self.hold()
        out = json.loads(run("sleep", str(h.pid), "--json", env=self.env, check=0).stdout)
        self.assertTrue(out["ok"], out)
        rep = out["report"]
        self.assertEqual((rep["slept"], rep["released_bytes"], rep["moved_bytes"], rep["left_bytes"]),
                         (True, 69 * MiB, 3 * MiB, 0))
        self.assertEqual(rep["trigger"], "command")
        self.assertIsNone(rep["reason"])
        r = ps_json(env=self.env)[0]
        self.assertEqual((r["state"], r["host_bytes"]), ("sleeping", 3 * MiB))
        self.assertEqual(r["devices"], [0], "asleep, the process still uses GPU 0 only (it listed every GPU)")
        self.assertRegex(run("ps", env=self.env, check=0).stdout, r"(?m)^\s*%d .* sleeping\s+3\.0 MiB hold$" % h.pid)
        again = run("sleep", str(h.pid), env=self.env, check=0)
        self.assertEqual(again.stdout, "%d: already asleep (3.0 MiB on the host)\n" % h.pid,
                         "a process already asleep is said so, and only so")
        asleep = run("release", str(h.pid), env=self.env, check=0)  # not a failure: nothing is on the device
        self.assertEqual(asleep.stdout, "%d (hold): asleep, nothing on the device to release (3.0 MiB kept in host "
                                        "memory; gpureclaim wake %d or its next CUDA call brings it back)\n"
                                        % (h.pid, h.pid))
        self.assertEqual(json.loads(run("release", "--all", "--json", env=self.env, check=0).stdout),
                         [{"pid": h.pid, "ok": True, "via": "socket", "asleep": True, "host_bytes": 3 * MiB,
                           "report": None}])
        t = ps_json(env=self.env)[0]
        self.assertEqual((t["held_bytes"], t["host_bytes"]), (0, 3 * MiB), "asleep, it holds nothing on the GPU")
        gpu = json.loads(run("ps", "--json", env=self.env, check=0).stdout)["gpus"][0]
        self.assertEqual(gpu["held_bytes"], 0, "the GPU table counted a sleeping process's memory as HELD")
        woke = run("wake", str(h.pid), env=self.env, check=0)
        self.assertRegex(woke.stdout, r"^%d: awake: 3\.0 MiB back on the device" % h.pid)
        self.assertEqual(ps_json(env=self.env)[0]["state"], "awake")
        self.assertEqual(run("wake", str(h.pid), env=self.env, check=0).stdout, "%d: already awake\n" % h.pid,
                         "an awake process is said so, and only so")
        # Asleep again; the program's next CUDA call wakes it.
        run("sleep", str(h.pid), env=self.env, check=0)
        h.p.stdin.write("touch\n")
        h.p.stdin.flush()
        self.assertEqual(h.p.stdout.readline(), "touched 0\n")
        self.assertEqual(ps_json(env=self.env)[0]["state"], "awake")
        with open(self.env["GPURECLAIM_LOG"]) as f:
            events = [json.loads(line)["event"] for line in f if line.strip()]
        self.assertEqual([e for e in events if e in ("sleep", "wake")], ["sleep", "wake", "sleep", "wake"])

    def test_idle_sleep_is_logged_as_idle(self):
        """GPURECLAIM_SLEEP_IDLE=1: a second without a CUDA call puts the process to sleep, and the logged sleep
        report names its trigger "idle" (the sleep writer once had its own table of trigger names, without
        "peer", and wrote "call" here)."""
        self.env["GPURECLAIM_SLEEP_IDLE"] = "1"
        h = self.hold()
        state = None
        for _ in range(1000):
            state = ps_json(env=self.env)[0]["state"]
            if state == "sleeping":
                break
            time.sleep(0.02)
        self.assertEqual(state, "sleeping")
        with open(self.env["GPURECLAIM_LOG"]) as f:
            sleeps = [e["report"] for e in map(json.loads, filter(str.strip, f)) if e["event"] == "sleep"]
        self.assertEqual([r["trigger"] for r in sleeps], ["idle"])
        self.assertTrue(sleeps[0]["slept"], sleeps[0])

    def test_signal_puts_it_to_sleep(self):
        """GPURECLAIM_ON_SIGNAL=sleep (run --on-signal sleep): the status file says so, the release signal puts the
        process to sleep, and release --signal refuses it (its signal would not release)."""
        h = self.hold("--on-signal", "sleep")
        with open(os.path.join(self.rundir, "%d.json" % h.pid)) as f:
            self.assertEqual(json.load(f)["on_signal"], "sleep")
        refused = run("release", "--signal", str(h.pid), env=self.env)
        self.assertEqual(refused.returncode, 1, refused)
        self.assertIn("GPURECLAIM_ON_SIGNAL=sleep", refused.stdout + refused.stderr)
        os.kill(h.pid, signal.SIGUSR1)
        state = None
        for _ in range(500):
            state = ps_json(env=self.env)[0]["state"]
            if state == "sleeping":
                break
            time.sleep(0.02)
        self.assertEqual(state, "sleeping")
        h.p.stdin.write("touch\n")
        h.p.stdin.flush()
        self.assertEqual(h.p.stdout.readline(), "touched 0\n")

    def test_sleep_of_a_stopped_process_gives_up_and_is_not_begun_later(self):
        """A stopped process does not answer: sleep -t 1 gives up after about that (it waited ten minutes), and the
        request it left behind is not served once the process runs again (the process went to sleep)."""
        h = self.hold()
        stop_and_wait(h.pid)
        try:
            # (run's 60 s hang guard fails the test if the command waits past it, as it did)
            r = run("sleep", "-t", "1", str(h.pid), env=self.env)
            self.assertNotEqual(r.returncode, 0, r)
        finally:
            os.kill(h.pid, signal.SIGCONT)
        h.p.stdin.write("touch\n")  # the process runs again, and its worker has read the withdrawn request
        h.p.stdin.flush()
        self.assertEqual(h.p.stdout.readline(), "touched 0\n")
        for _ in range(50):
            self.assertEqual(ps_json(env=self.env)[0]["state"], "awake",
                             "a sleep its client gave up on was begun")
            time.sleep(0.02)

    def test_sleep_usage(self):
        self.assertEqual(run("sleep", env=self.env).returncode, 2)
        self.assertEqual(run("sleep", "1", "--timeout", "x", env=self.env).returncode, 2)
        self.assertEqual(run("wake", "nope", env=self.env).returncode, 2)
        self.assertEqual(run("sleep", "999999999", env=self.env).returncode, 3)
        self.assertIn("--timeout", run("sleep", "--help", env=self.env, check=0).stdout)
        self.assertIn("GPURECLAIM_WAKE_TIMEOUT", run("wake", "--help", env=self.env, check=0).stdout)

    def test_release_reports_what_the_driver_gave_back(self):
        h = self.hold()
        live0, pool0, _ = h.sim()
        out = json.loads(run("release", str(h.pid), "--json", env=self.env, check=0).stdout)
        live1, pool1, _ = h.sim()
        rep = out[0]["report"]
        self.assertTrue(out[0]["ok"])
        self.assertEqual(rep["pool_bytes"], pool0 - pool1)
        self.assertEqual(rep["orphaned_bytes"], live0 - live1)
        self.assertEqual((rep["pool_bytes"], rep["orphaned_bytes"], pool1), (64 * MiB, 5 * MiB, 0))
        self.assertEqual(rep["trigger"], "command")
        dev = rep["devices"][0]
        self.assertEqual(dev["free_after"] - dev["free_before"], 69 * MiB)
        # Human output, and --what.
        h2 = self.hold()
        text = run("release", str(h2.pid), "--what", "orphaned", env=self.env, check=0).stdout
        self.assertIn("%d (" % h2.pid, text)
        self.assertIn("released 5.0 MiB", text)
        self.assertEqual(h2.sim()[1], 64 * MiB, "--what orphaned leaves the pool alone")

    def test_release_by_signal_and_all(self):
        h = self.hold()
        out = run("release", "--signal", str(h.pid), env=self.env, check=0).stdout
        self.assertIn("released 69.0 MiB", out)
        with open(os.path.join(self.rundir, "%d.json" % h.pid)) as f:
            st = json.load(f)
        self.assertEqual((st["releases"], st["last_release"]["trigger"]), (1, "signal"))
        h2 = self.hold()
        out = json.loads(run("release", "--all", "--json", env=self.env, check=0).stdout)
        self.assertEqual(sorted(x["pid"] for x in out), sorted([h.pid, h2.pid]))
        self.assertTrue(all(x["ok"] for x in out))

    def test_release_by_gpu(self):
        """release --gpu: every process on that GPU (by index or UUID prefix), none on another."""
        h, h2 = self.hold(), self.hold()
        with open(os.path.join(self.rundir, "%d.json" % h.pid)) as f:
            uuid = json.load(f)["gpus"][0]["uuid"]
        out = json.loads(run("release", "--gpu", uuid[:12], "--json", env=self.env, check=0).stdout)
        self.assertEqual(sorted(x["pid"] for x in out), sorted([h.pid, h2.pid]))
        self.assertTrue(all(x["ok"] and x["report"]["pool_bytes"] == 64 * MiB for x in out), out)
        self.assertEqual(h.sim()[1], 0, "its pool was trimmed")
        out = json.loads(run("release", "-g", "0", "--json", env=self.env, check=0).stdout)
        self.assertEqual(sorted(x["pid"] for x in out), sorted([h.pid, h2.pid]))
        self.assertIn("no process of yours is using GPU 1", run("release", "--gpu", "1", env=self.env, check=0).stdout)
        self.assertEqual(json.loads(run("release", "--gpu", "1", "--json", env=self.env, check=0).stdout), [])
        for bad in (["--gpu", "a b"], ["--gpu", "0", "--all"], ["--gpu", "0", str(h.pid)], ["--gpu", ""]):
            run("release", *bad, env=self.env, check=2)

    def test_status_file_peer_object(self):
        """run --peers/--peer-timeout reach the library; the status file says what peers may ask of it, per
        GPU UUID (docs/PROTOCOL.md)."""
        h = self.hold("--peers", "ask", "--peer-timeout", "0.5")
        path = os.path.join(self.rundir, "%d.json" % h.pid)
        # The worker rewrites the file within half a second of a change: a file written when the context came
        # up (the GPU listed, nothing held yet) may still be there when the program says it is ready.
        deadline = time.time() + 20  # a hang guard
        while True:
            with open(path) as f:
                st = json.load(f)
            gpus = st["peer"]["gpus"]
            if (gpus and gpus[0]["held_bytes"] == 72 * MiB) or time.time() > deadline:
                break
            time.sleep(0.05)
        peer = st["peer"]
        self.assertEqual((peer["ask"], peer["give"], peer["oom"], peer["last_gave_ms"]), (True, False, False, 0))
        g = peer["gpus"][0]
        self.assertEqual((g["uuid"], g["device"]), (st["gpus"][0]["uuid"], 0))
        self.assertEqual((g["held_bytes"], g["pool_cached_bytes"], g["orphan_bytes"]), (72 * MiB, 64 * MiB, 5 * MiB))
        for bad in (["--peers", "sometimes"], ["--peer-timeout", "0"], ["--peer-timeout", "61"]):
            run("run", *bad, "--", "true", env=self.env, check=2)

    def test_a_client_that_half_closes_is_still_served(self):
        """Only a client that hung up withdraws its release: one that shut down its writing half (socat, nc -U)
        still reads the answer."""
        h = self.hold()
        s = self.connect(h)
        s.sendall(b"release orphaned\n")
        s.shutdown(socket.SHUT_WR)
        ans = json.loads(read_all(s))
        self.assertTrue(ans["ok"], ans)
        self.assertEqual(ans["report"]["orphaned_bytes"], 5 * MiB)

    def test_a_silent_client_is_dropped_unanswered(self):
        h = self.hold()
        s = self.connect(h)
        self.assertEqual(s.recv(65536), b"", "a client that said nothing got an answer")
        s.close()
        # One deadline for the whole line: a byte every 0.4 s does not buy more time.
        s = self.connect(h)
        try:
            for ch in b"ping\n":
                s.sendall(bytes([ch]))
                time.sleep(0.4)
        except OSError:
            pass  # the server closed meanwhile
        self.assertEqual(s.recv(65536), b"", "a client dripping its line got more than its second")
        s.close()
        # A line longer than the protocol's 255 bytes gets an error answer, readable without a reset.
        s = self.connect(h)
        s.sendall(b"x" * 300 + b"\n")
        self.assertEqual(json.loads(read_all(s)), {"ok": False, "error": "request line longer than 255 bytes"})
        self.assertTrue(ps_json(env=self.env)[0]["answered"])

    def test_a_release_that_timed_out_is_withdrawn(self):
        h = self.hold()
        before = h.sim()
        stop_and_wait(h.pid)
        try:
            p = run("release", str(h.pid), "--timeout", "0.5", env=self.env, check=1)
            self.assertIn("the request is withdrawn", p.stderr)
        finally:
            os.kill(h.pid, signal.SIGCONT)
        # The worker serves its clients in turn: once a ping made now is answered, the withdrawn request was
        # dealt with before it. (No deadline decides: ps's 2 s for an answer could pass under load.)
        s = self.connect(h)
        s.settimeout(120)  # a hang guard
        s.sendall(b"ping\n")
        self.assertTrue(json.loads(read_all(s))["ok"])
        with open(os.path.join(self.rundir, "%d.json" % h.pid)) as f:
            self.assertEqual(json.load(f)["releases"], 0, "a release the command gave up on happened anyway")
        self.assertEqual(h.sim(), before, "memory was released after the command said it was not")

    def test_snapshot_and_leaks(self):
        h = self.hold()
        text = run("snapshot", str(h.pid), env=self.env, check=0).stdout
        self.assertIn("4 live blocks, 8.0 MiB live (peak 67.0 MiB), 1 orphan (5.0 MiB), pools hold 64.0 MiB, "
                      "64.0 KiB pinned host memory", text)
        self.assertRegex(text, r"(?m)^0\s+0x[0-9a-f]+\s+device\s+hold\s+4\s+1\s+8\.0 MiB$")
        self.assertRegex(text, r"(?m)^host\s+\S+\s+host\s+hold\s+1\s+0\s+64\.0 KiB$")
        snap = json.loads(run("snapshot", str(h.pid), "--json", env=self.env, check=0).stdout)
        self.assertEqual(sum(b["bytes"] for b in snap["blocks"] if b["kind"] == "device"), 8 * MiB)
        self.assertEqual([b["state"] for b in snap["blocks"] if b["bytes"] == 5 * MiB], ["orphan"])
        leaks = run("snapshot", str(h.pid), "--leaks", env=self.env, check=0).stdout
        self.assertIn("gpureclaim: pid %d: 5 blocks (8.1 MiB) were never freed" % h.pid, leaks)
        self.assertIn("Device 0: 4 blocks, 8.0 MiB", leaks)
        self.assertRegex(leaks, r"(?m)^1 block, 5\.0 MiB \(device\) allocated by hold at 0x[0-9a-f]+")
        lj = json.loads(run("snapshot", str(h.pid), "--leaks", "--json", env=self.env, check=0).stdout)
        self.assertEqual((lj["pid"], lj["blocks"]), (h.pid, 5))
        self.assertEqual([g["bytes"] for g in lj["groups"]], sorted((g["bytes"] for g in lj["groups"]), reverse=True))
        self.assertEqual({g["library"] for g in lj["groups"]}, {"hold"})

    def test_top_one_frame(self):
        h = self.hold()
        out = run("top", "--iterations", "1", env=self.env, check=0).stdout
        self.assertIn("gpureclaim top", out)
        self.assertRegex(out, r"(?m)^\s*%d\s" % h.pid)

    def test_prometheus_to_stdout_and_through_a_link(self):
        h = self.hold()
        out = run("ps", "--prometheus", "-", env=self.env, check=0).stdout
        self.assertRegex(out, r'(?m)^gpureclaim_up\{pid="%d",command="hold"\} 1$' % h.pid)
        self.assertFalse(os.path.exists("-"), "'-' is standard output, not a file named -")
        target = os.path.join(self.tmp, "real.prom")
        link = os.path.join(self.tmp, "link.prom")
        os.symlink(target, link)
        run("ps", "--prometheus", link, env=self.env, check=0)
        self.assertTrue(os.path.islink(link), "the link was replaced by a file")
        with open(target) as f:
            self.assertIn('gpureclaim_up{pid="%d"' % h.pid, f.read())
        # /dev/stdout is the command's standard output, at its offset: a shell's >> keeps what the file had.
        log = os.path.join(self.tmp, "appended.log")
        with open(log, "w") as f:
            f.write("first line\n")
        subprocess.run("%s ps --prometheus /dev/stdout >> %s" % (CMD, log), shell=True, env=self.env, check=True)
        with open(log) as f:
            text = f.read()
        self.assertTrue(text.startswith("first line\n"), text[:200])
        self.assertIn('gpureclaim_up{pid="%d"' % h.pid, text)
        r = run("ps", "--prometheus", self.tmp, env=self.env, check=None)
        self.assertEqual(r.returncode, 1)
        self.assertIn("Is a directory", r.stderr)

    def test_prometheus_textfile(self):
        h = self.hold()
        path = os.path.join(self.tmp, "gpureclaim.prom")
        run("ps", "--prometheus", path, env=self.env, check=0)
        with open(path) as f:
            lines = f.read().splitlines()
        # Per device: the process's ordinal, nvidia-smi's number and the UUID (DCGM's exporter's gpu and UUID).
        sample = re.compile(r'^(gpureclaim_[a-z_]+)\{pid="(\d+)",(?:device="(\d+)",gpu="\3",uuid="GPU-[0-9a-f-]{36}",)?'
                            r'command="hold"\} (\d+)$')
        helps, types, values = set(), set(), {}
        for line in lines:
            if line.startswith("# HELP "):
                helps.add(line.split()[2])
            elif line.startswith("# TYPE "):
                name, kind = line.split()[2:4]
                self.assertIn(kind, ("gauge", "counter"))
                types.add(name)
            else:
                m = sample.match(line)
                self.assertIsNotNone(m, "not a sample line: %r" % line)
                self.assertEqual(int(m.group(2)), h.pid)
                values[(m.group(1), m.group(3))] = int(m.group(4))
        self.assertEqual(helps, types)
        self.assertEqual({name for name, _ in values}, types)
        live, pool, host = h.sim()
        self.assertEqual(values[("gpureclaim_live_bytes", "0")], live)
        self.assertEqual(values[("gpureclaim_pool_reserved_bytes", "0")], pool)
        self.assertEqual(values[("gpureclaim_cached_bytes", "0")], 64 * MiB)
        self.assertEqual(values[("gpureclaim_host_pinned_bytes", None)], host)
        self.assertEqual(values[("gpureclaim_up", None)], 1)

    def test_a_process_without_status_file_and_a_finished_one(self):
        h = self.hold("--no-status")
        p = run("release", str(h.pid), env=self.env, check=3)
        self.assertIn("not running gpureclaim", p.stderr)
        self.assertIn("GPURECLAIM_STATUS=0", p.stderr)
        # A process that exits normally removes its status file and socket.
        h2 = self.hold()
        files = {"%d.json" % h2.pid, "%d.sock" % h2.pid}
        self.assertLessEqual(files, set(os.listdir(self.rundir)))
        h2.close()
        self.held.remove(h2)
        self.assertFalse(files & set(os.listdir(self.rundir)))
        # One killed leaves them behind; the command removes them, with a note.
        h3 = self.hold()
        h3.p.kill()
        h3.p.wait()
        p = run("ps", env=self.env, check=0)
        self.assertIn("removed the stale status file of pid %d (the process is gone)" % h3.pid, p.stderr)
        self.assertFalse({"%d.json" % h3.pid, "%d.sock" % h3.pid} & set(os.listdir(self.rundir)))

    def test_a_process_that_exec_d_another_program_is_left_alone(self):
        """After exec the pid and start time stay, and so do the status file and the socket file; the new
        program (sleep) has no handler for the release signal, which would kill it."""
        h = self.hold()
        h.p.stdin.write("exec\n")
        h.p.stdin.flush()
        deadline = time.monotonic() + 10
        while os.readlink("/proc/%d/exe" % h.pid) == os.path.realpath(HOLD) and time.monotonic() < deadline:
            time.sleep(0.01)
        self.assertTrue({"%d.json" % h.pid, "%d.sock" % h.pid} <= set(os.listdir(self.rundir)))
        try:
            for args in (("release", str(h.pid)), ("release", "--signal", str(h.pid)), ("release", "--all")):
                p = run(*args, env=self.env)
                if args[1] != "--all":  # --all: the stale files are gone, and nothing else runs
                    self.assertNotEqual(p.returncode, 0, (args, p.stdout, p.stderr))
                time.sleep(0.2)
                self.assertIsNone(h.p.poll(), ("killed by", args, p.stderr))
            p = run("release", str(h.pid), env=self.env, check=3)
            self.assertIn("not running gpureclaim", p.stderr)
            self.assertEqual(ps_json(env=self.env), [])
            self.assertFalse({"%d.json" % h.pid, "%d.sock" % h.pid} & set(os.listdir(self.rundir)))
        finally:
            h.p.kill()
            h.p.wait()
            self.held.remove(h)
            h.p.stdout.close()
            h.p.stderr.close()
            h.p.stdin.close()

    def exec_self(self):
        """A held program that exec'd its own binary (same pid, start time and exe), whose new image does not use
        CUDA and catches SIGUSR1 with a handler of its own; its old status and socket files stay behind."""
        h = self.hold()
        h.p.stdin.write("exec-self\n")
        h.p.stdin.flush()
        self.assertEqual(h.p.stdout.readline(), "exec'd %d\n" % h.pid)
        self.assertTrue({"%d.json" % h.pid, "%d.sock" % h.pid} <= set(os.listdir(self.rundir)))
        return h

    def signals_received(self, h):
        """How many SIGUSR1 the program's own handler counted: a signal sent before is handled before it reads
        the request."""
        h.p.stdin.write("signals\n")
        h.p.stdin.flush()
        line = h.p.stdout.readline()
        self.assertTrue(line.startswith("signals "), line)
        return int(line.split()[1])

    def test_a_process_that_exec_d_its_own_binary_is_left_alone(self):
        """The status file is recognisably stale: the library records where the AT_RANDOM bytes are, which
        every exec moves; the command compares with /proc/PID/auxv. The release signal fell back to the new
        image's own handler."""
        h = self.exec_self()
        p = run("release", str(h.pid), env=self.env, check=3)
        self.assertIn("removed the stale status file of pid %d (the process exec'd since it wrote it)" % h.pid,
                      p.stderr)
        self.assertFalse({"%d.json" % h.pid, "%d.sock" % h.pid} & set(os.listdir(self.rundir)))
        self.assertEqual(self.signals_received(h), 0)

    def test_a_socket_nobody_listens_on_means_the_writer_is_gone(self):
        """The same, where the exec cannot be told from the status file (exec_id made to match, as it would
        without address-space randomisation): the control socket file is there but refuses connections, so
        the gpureclaim that wrote the file no longer runs in the process, and no signal is sent."""
        h = self.exec_self()
        with open("/proc/%d/auxv" % h.pid, "rb") as f:
            auxv = f.read()
        words = [int.from_bytes(auxv[i:i + 8], sys.byteorder) for i in range(0, len(auxv) - 7, 8)]
        at_random = dict(zip(words[0::2], words[1::2]))[25]
        path = os.path.join(self.rundir, "%d.json" % h.pid)
        with open(path) as f:
            st = json.load(f)
        self.assertIn("exec_id", st)
        st["exec_id"] = at_random
        with open(path, "w") as f:
            json.dump(st, f)
        for args in (("release", str(h.pid)), ("release", "--signal", str(h.pid)), ("release", "--all")):
            p = run(*args, env=self.env, check=1)
            self.assertIn("no longer runs the gpureclaim that wrote its status file", p.stderr, args)
        self.assertEqual(self.signals_received(h), 0, "the new image's handler got the release signal")

    def test_a_program_that_replaced_the_handler_is_not_signalled(self):
        """release --signal sent a signal gpureclaim would never see, then waited its whole timeout."""
        h = self.hold()
        h.p.stdin.write("handler\n")
        h.p.stdin.flush()
        self.assertEqual(h.p.stdout.readline(), "handler\n")
        why = "handler for its release signal is not installed"
        # Asked over the socket, which answers with the live state.
        p = run("release", "--signal", "--timeout", "600", str(h.pid), env=self.env, check=1)
        self.assertIn(why, p.stderr)
        # The status file says so too, once the worker noticed (it looks every 2 s): for a socket it cannot reach.
        path = os.path.join(self.rundir, "%d.json" % h.pid)
        deadline = time.monotonic() + 60  # a hang guard
        while True:
            with open(path) as f:
                if json.load(f)["signal_caught"] is False:
                    break
            self.assertLess(time.monotonic(), deadline, "the status file never said the handler was replaced")
            time.sleep(0.05)
        sock = os.path.join(self.rundir, "%d.sock" % h.pid)
        os.rename(sock, sock + ".away")
        try:
            p = run("release", "--signal", "--timeout", "600", str(h.pid), env=self.env, check=1)
            self.assertIn(why, p.stderr)
        finally:
            os.rename(sock + ".away", sock)
        self.assertEqual(self.signals_received(h), 0)
        self.assertIn("released 69.0 MiB", run("release", str(h.pid), env=self.env, check=0).stdout)

    def test_odd_bytes_in_a_command_line(self):
        """Command lines are bytes: JSON and Prometheus output stay UTF-8, tables show no control characters."""
        odd = os.path.join(os.fsencode(self.tmp), b"ho\xffld\x1b[2J")
        os.symlink(HOLD, odd)
        h = Held(self.env, program=odd, args=(b"\xfe\xc3", "caf\u00e9", "line\nbreak", "c\u009b1"))
        self.held.append(h)
        with open(os.path.join(self.rundir, "%d.json" % h.pid), "rb") as f:
            status = json.loads(f.read().decode("utf-8"))  # strict: fails on a stray byte
        self.assertIn("\ufffd", status["cmdline"])
        self.assertIn("caf\u00e9", status["cmdline"])
        p = subprocess.run([CMD, "ps", "--json"], capture_output=True, env=self.env, timeout=60)
        row = [r for r in json.loads(p.stdout.decode("utf-8"))["processes"] if r["pid"] == h.pid][0]
        self.assertIn("\x1b[2J", row["command"])  # escaped in JSON, intact for whoever reads it
        self.assertIn("line\nbreak", row["command"])
        table = subprocess.run([CMD, "ps"], capture_output=True, env=self.env, timeout=60).stdout
        self.assertNotIn(b"\x1b", table)
        lines = [l for l in table.splitlines() if l.strip().startswith(b"%d " % h.pid)]
        self.assertEqual(len(lines), 1, table)  # the newline in an argument does not break the row
        self.assertIn("ho\ufffdld?[2J".encode(), lines[0])  # the escape character is shown as ?
        table.decode("utf-8")
        prom = os.path.join(self.tmp, "x.prom")
        run("ps", "--prometheus", prom, env=self.env, check=0)
        with open(prom, "rb") as f:
            text = f.read().decode("utf-8")
        self.assertIn('command="ho\ufffdld\x1b[2J"', text)
        out = subprocess.run([CMD, "release", str(h.pid)], capture_output=True, env=self.env, timeout=60).stdout
        self.assertNotIn(b"\x1b", out)
        self.assertIn(("%d (ho\ufffdld?[2J \ufffd\ufffd caf\u00e9 line?break c?1)" % h.pid).encode(), out)
        self.assertNotIn("\u009b".encode(), out)  # a C1 control (CSI) is one '?', as one character

    def test_run_maps_options_to_variables(self):
        log = os.path.join(self.tmp, "custom.log")
        h = self.hold("--signal", "USR2", "--log", log)
        with open(os.path.join(self.rundir, "%d.json" % h.pid)) as f:
            self.assertEqual(json.load(f)["signal"], "USR2")
        os.kill(h.pid, signal.SIGUSR2)
        deadline = time.time() + 10
        while time.time() < deadline and not (os.path.exists(log) and os.path.getsize(log)):
            time.sleep(0.02)
        with open(log) as f:
            self.assertIn('"trigger":"signal"', f.read())
        mode = stat.S_IMODE(os.stat(self.rundir).st_mode)
        self.assertEqual(mode, 0o700)


class PythonHelperTest(unittest.TestCase):
    def script(self, code, preload=True, run_opts=()):
        """Runs code in python3, under `gpureclaim run` (as the helper's docstring says to) or without it."""
        env = dict(os.environ, PYTHONPATH=os.environ["GR_PYTHON_DIR"], GPURECLAIM_STATUS="0")
        env.pop("LD_PRELOAD", None)
        argv = [sys.executable, "-c", code]
        if preload:
            if os.environ.get("GR_PRELOAD"):  # sanitizer builds: the runtime before the library
                env["LD_PRELOAD"] = os.environ["GR_PRELOAD"]
            argv = [CMD, "run", *run_opts, "--"] + argv
        return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=60)

    def test_layouts_match_the_header(self):
        c = dict(line.split(None, 1) for line in subprocess.run([os.environ["GR_LAYOUT"]], capture_output=True,
                                                                text=True, check=True).stdout.splitlines())
        p = self.script("import ctypes, gpureclaim as g\n"
                        "print('stats', ctypes.sizeof(g._Stats), g._Stats.pools.offset)\n"
                        "print('report', ctypes.sizeof(g._Report), g._Report.ndevices.offset, g._Report.devices.offset)\n"
                        "print('device_report', ctypes.sizeof(g._DeviceReport))\n"
                        "print('block', ctypes.sizeof(g._Block), g._Block.handle.offset)\n", preload=False)
        py = dict(line.split(None, 1) for line in p.stdout.splitlines())
        self.assertEqual(py, c)

    def test_not_loaded_says_how(self):
        p = self.script("import gpureclaim\n"
                        "try:\n"
                        "    gpureclaim.stats()\n"
                        "except RuntimeError as e:\n"
                        "    print('RuntimeError:', e)\n", preload=False)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("RuntimeError: gpureclaim is not loaded in this process", p.stdout)
        self.assertIn("gpureclaim run -- python", p.stdout)

    def test_against_the_simulator(self):
        code = r'''
import ctypes, json, os, sys, tempfile, gpureclaim
rt = ctypes.CDLL("libcudart.so.13")
rt.cudaMalloc.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t]
p = ctypes.c_void_p()
assert rt.cudaMalloc(ctypes.byref(p), 1 << 20) == 0
assert gpureclaim.stats()["live_bytes"] == 1 << 20, gpureclaim.stats()
assert gpureclaim.stats(device=0)["live_bytes"] == 1 << 20
assert gpureclaim.stats(device=1)["live_bytes"] == 0
with gpureclaim.scope() as s:
    q = ctypes.c_void_p()
    assert rt.cudaMalloc(ctypes.byref(q), 3 << 20) == 0
    assert [b["scope"] for b in gpureclaim.blocks() if b["bytes"] == 3 << 20] == [s]
assert gpureclaim.stats()["orphan_bytes"] == 3 << 20
r = gpureclaim.release("orphaned")
assert r["orphaned_bytes"] == 3 << 20 and r["orphaned_blocks"] == 1 and r["trigger"] == "api", r
assert r["what"] == "orphaned", r  # as the JSON reports write it
for bad in (None, ["cached"], True):
    try:
        gpureclaim.release(bad)
        assert False, "no error for %r" % (bad,)
    except TypeError as e:
        assert "release categories are a str" in str(e), e
try:
    gpureclaim.stats("0")
    assert False, "no error"
except TypeError as e:
    assert "device is an int" in str(e), e
for bad in (1 << 40, -2, 64, 99):  # not truncated to another device; one error whatever the side
    try:
        gpureclaim.stats(bad)
        assert False, "no error for %d" % bad
    except ValueError as e:
        assert "out of range" in str(e), e
assert gpureclaim.stats(63)["live_bytes"] == 0  # the last device the library counts
try:
    gpureclaim.release((1 << 32) | 2)  # not truncated to "orphaned"
    assert False, "no error"
except ValueError as e:
    assert "out of range" in str(e), e
assert r["devices"][0]["free_after"] - r["devices"][0]["free_before"] == 3 << 20, r
assert gpureclaim.stats()["live_bytes"] == 1 << 20

# free_now: gone when the scope ends.
with gpureclaim.scope(free_now=True):
    assert rt.cudaMalloc(ctypes.byref(q), 2 << 20) == 0
st = gpureclaim.stats()
assert (st["live_bytes"], st["orphan_bytes"]) == (1 << 20, 0), st

# A module taking part in releases: its __gpureclaim_release__ is called and its bytes are counted.
class Cache:
    ptrs = []
    def __gpureclaim_release__(self):
        n = 0
        for ptr, size in self.ptrs:
            rt.cudaFree(ctypes.c_void_p(ptr))
            n += size
        self.ptrs.clear()
        return n
import types
mod = types.ModuleType("mycache")
cache = Cache()
mod.__gpureclaim_release__ = cache.__gpureclaim_release__
sys.modules["mycache"] = mod
for _ in range(2):
    x = ctypes.c_void_p()
    assert rt.cudaMalloc(ctypes.byref(x), 4 << 20) == 0
    cache.ptrs.append((x.value, 4 << 20))
r = gpureclaim.release()
assert r["framework_bytes"] == 8 << 20 and r["cached_bytes"] >= 8 << 20, r
assert gpureclaim.stats()["live_bytes"] == 1 << 20

# snapshot(path): the JSON of PROTOCOL.md.
path = os.path.join(tempfile.mkdtemp(), "snap.json")
gpureclaim.snapshot(path)
with open(path) as f:
    snap = json.load(f)
os.unlink(path)
os.rmdir(os.path.dirname(path))
assert snap["pid"] == os.getpid() and snap["total"]["live_bytes"] == 1 << 20, snap
assert [b["bytes"] for b in snap["blocks"]] == [1 << 20], snap["blocks"]
try:
    gpureclaim.snapshot("/nonexistent-dir/snap.json")
    assert False, "no error"
except OSError as e:
    assert "cannot write /nonexistent-dir/snap.json: no such directory: /nonexistent-dir" in str(e), str(e)

assert {b["kind"] for b in gpureclaim.blocks()} == {"device"}
assert all(b["handle"] == 0 for b in gpureclaim.blocks()), "handle: the mapped VMM handle, 0 for other kinds"
try:
    gpureclaim.release("bogus")
    raise SystemExit("no error for a bad category")
except ValueError:
    pass
assert gpureclaim.enabled()

# sleep() and wake(), as the command's sleep and wake: the live 1 MiB to the host and back, contents kept.
ones = ctypes.create_string_buffer(b"\x07" * 4096)
rt.cudaMemcpy.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
assert rt.cudaMemcpy(p, ones, 4096, 1) == 0
assert gpureclaim.state() == {"state": "awake", "host_bytes": 0}, gpureclaim.state()
r = gpureclaim.sleep()
assert r["slept"] and not r["already"] and r["moved_bytes"] == 1 << 20 and r["reason"] is None, r
assert r["trigger"] == "api", r
assert gpureclaim.state() == {"state": "sleeping", "host_bytes": 1 << 20}, gpureclaim.state()
again = gpureclaim.sleep()
assert again["already"] and again["slept"], again
gpureclaim.wake()
assert gpureclaim.state()["state"] == "awake"
back = ctypes.create_string_buffer(4096)
assert rt.cudaMemcpy(back, p, 4096, 2) == 0 and back.raw == ones.raw[:4096]
assert gpureclaim.__version__ == gpureclaim.version()
print("ok", gpureclaim.version())
'''
        p = self.script(code)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("ok 0.1.0", p.stdout)

    def test_pytorch_pinned_host_cache_is_released(self):
        """A release of cached memory also empties PyTorch's pinned host memory cache
        (torch._C._host_emptyCache(), where it exists): a stand-in torch (tests/cli/hoststub) keeps two pinned
        blocks cached."""
        stub = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hoststub")
        code = ("import sys; sys.path.insert(0, %r); import torch, gpureclaim\n"
                "torch.pin_and_cache(1 << 20); torch.pin_and_cache(2 << 20)\n"
                "assert gpureclaim.stats()['host_pinned_bytes'] == 3 << 20, gpureclaim.stats()\n"
                "r = gpureclaim.release('orphaned')\n"
                "assert torch._C.empty_calls == 0, 'emptied on a release of orphans only'\n"
                "r = gpureclaim.release()\n"
                "assert torch._C.empty_calls == 1, torch._C.empty_calls\n"
                "assert gpureclaim.stats()['host_pinned_bytes'] == 0, gpureclaim.stats()\n"
                "assert r['framework_bytes'] == 0, r  # host memory is not device bytes\n"
                "print('ok')\n") % stub
        p = self.script(code)
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertEqual(p.stdout, "ok\n")

    def test_disabled(self):
        p = self.script("import gpureclaim\n"
                        "assert not gpureclaim.enabled()\n"
                        "try:\n"
                        "    gpureclaim.release()\n"
                        "except RuntimeError as e:\n"
                        "    print('RuntimeError:', e)\n", run_opts=("--disable",))
        self.assertEqual(p.returncode, 0, p.stderr)
        self.assertIn("RuntimeError: release: gpureclaim is disabled", p.stdout)


if __name__ == "__main__":
    unittest.main(verbosity=2)

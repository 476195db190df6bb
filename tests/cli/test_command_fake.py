"""The gpureclaim command against fakeproc.py, a stand-in that speaks docs/PROTOCOL.md: parsing, formatting,
JSON and Prometheus output, timeouts, the signal path and every refusal, without the library or a simulator.

Environment (set by CTest): GR_CMD (the command).
"""
import datetime
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

CMD = os.environ["GR_CMD"]
FAKE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fakeproc.py")
GiB, MiB = 1 << 30, 1 << 20


class Fake:
    def __init__(self, rundir, *opts, log=None):
        args = [sys.executable, FAKE, rundir, *opts] + (["--log", log] if log else [])
        self.p = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        line = self.p.stdout.readline()
        assert line.startswith("ready "), line
        self.pid = int(line.split()[1])

    def close(self):
        self.p.stdin.close()
        self.p.stdout.close()
        self.p.wait(timeout=10)


class FakeTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="grfake")
        self.rundir = os.path.join(self.tmp, "run")
        self.log = os.path.join(self.tmp, "requests")
        self.env = dict(os.environ, GPURECLAIM_RUNDIR=self.rundir)
        self.env.pop("XDG_RUNTIME_DIR", None)
        self.fakes = []

    def tearDown(self):
        for f in self.fakes:
            f.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def fake(self, *opts):
        f = Fake(self.rundir, *opts, log=self.log)
        self.fakes.append(f)
        return f

    def cmd(self, *args, check=None, env=None, timeout=60):
        p = subprocess.run([CMD, *args], capture_output=True, text=True, env=env or self.env, timeout=timeout)
        self.assertNotIn("Sanitizer", p.stderr)  # sanitizer builds: a leak or error in the command itself
        if check is not None:
            self.assertEqual(p.returncode, check, (args, p.stdout, p.stderr))
        return p

    def ps_json(self, *args):
        """The processes of `ps --json` (one object: the host, the time, the GPU table and the processes)."""
        return json.loads(self.cmd("ps", "--json", *args, check=0).stdout)["processes"]

    def received(self):
        try:
            with open(self.log) as f:
                return f.read().splitlines()
        except FileNotFoundError:
            return []

    # ---- ps, top, Prometheus ----

    def ps_on_a_terminal(self, cols):
        """ps's standard output on a terminal cols columns wide (a pseudo-terminal of that size)."""
        import fcntl, pty, struct, termios
        master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, cols, 0, 0))
        try:
            p = subprocess.run([CMD, "ps"], stdout=slave, stderr=subprocess.PIPE, env=self.env, timeout=60)
            os.close(slave)
            slave = -1
            out = b""
            while True:
                try:
                    chunk = os.read(master, 65536)
                except OSError:  # EIO: the terminal's other end is closed and all was read
                    break
                if not chunk:
                    break
                out += chunk
        finally:
            if slave >= 0:
                os.close(slave)
            os.close(master)
        self.assertEqual(p.returncode, 0, p.stderr)
        return out.decode().replace("\r\n", "\n")

    def test_ps_on_80_columns_shows_the_command(self):
        """docs/COMMAND.md's 80-column example: PINNED and HOST make way for COMMAND, which the wide layout began past
        column 80 (so it was cut off); STATE stays, before the command (after it, a sleeping process's marker was
        cut off: "python3 nb.py [sl"). A wide terminal keeps every column."""
        f = self.fake()
        g = self.fake("--sleeping", "--program", "a-program-with-a-name-long-enough-to-be-cut-at-80-columns")
        lines = self.ps_on_a_terminal(80).splitlines()
        header = next(l for l in lines if l.lstrip().startswith("PID"))
        self.assertEqual(header, "    PID GPU         HELD     CACHED     ORPHAN  REL STATE    COMMAND")
        row = next(l for l in lines if l.lstrip().startswith(str(f.pid)))
        self.assertRegex(row, r"^\s*%d 0,1\s+4\.5 GiB\s+1\.0 GiB\s+512\.0 MiB\s+0 awake\s+fakeproc train" % f.pid)
        row = next(l for l in lines if l.lstrip().startswith(str(g.pid)))
        self.assertRegex(row, r"^\s*%d 0,1\s+0 B\s+0 B\s+0 B\s+0 sleeping a-program-with" % g.pid)
        self.assertTrue(all(len(l) <= 80 for l in lines), lines)
        wide = self.ps_on_a_terminal(120).splitlines()
        self.assertIn("STATE", next(l for l in wide if l.lstrip().startswith("PID")).split())

    def test_ps_table_in_binary_units(self):
        f = self.fake()
        out = self.cmd("ps", check=0).stdout
        lines = out.splitlines()
        # Per GPU: the driver's used and total memory, what gpureclaim's processes hold (live + pools' unused) and
        # could give back (cached + orphaned), and the rest of what the driver counts.
        self.assertEqual(lines[0].split(), ["GPU", "UUID", "USED", "TOTAL", "HELD", "RELEASABLE", "OTHER"])
        # Without NVML (none here) a GPU has no number of nvidia-smi's: "-", its UUID names it.
        self.assertRegex(lines[1], r"^\s+- GPU-11111111-2222-4333-8444-555555555555\s+10\.0 GiB\s+80\.0 GiB"
                                   r"\s+4\.0 GiB\s+1\.5 GiB\s+6\.0 GiB$")
        self.assertRegex(lines[2], r"^\s+- GPU-aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee\s+1\.0 GiB\s+80\.0 GiB"
                                   r"\s+512\.0 MiB\s+0 B\s+512\.0 MiB$")
        self.assertEqual(lines[3], "")
        self.assertEqual(lines[4].split(), ["PID", "GPU", "HELD", "CACHED", "ORPHAN", "PINNED", "REL", "STATE", "HOST",
                                            "COMMAND"])
        self.assertRegex(lines[5], r"^\s*%d 0,1\s+4\.5 GiB\s+1\.0 GiB\s+512\.0 MiB\s+2\.0 MiB\s+0 awake\s+- "
                                   r"fakeproc train\.py --fake \"quoted\" --out=/tmp/x$" % f.pid)
        # Why the numbers are not nvidia-smi's, said under the table.
        self.assertIn("context's own memory", out)
        self.assertIn("not started under gpureclaim", out)
        self.cmd("release", str(f.pid), check=0)
        row = self.cmd("ps", check=0).stdout.splitlines()[5]
        self.assertRegex(row, r"\s1 awake\s+- fakeproc")

    def test_ps_framework_cache_split(self):
        """A PyTorch process: CACHED counts what empty_cache() would give back, and its cache is split as
        torch.cuda.memory_summary() splits it."""
        f = self.fake("--framework")
        out = self.cmd("ps", check=0).stdout
        self.assertRegex(out, r"(?m)^\s*%d 0,1\s+4\.5 GiB\s+1\.5 GiB\s+512\.0 MiB\s" % f.pid)
        self.assertRegex(out, r"(?m)^\s+pytorch on GPU 0: 2\.0 GiB reserved = 1\.2 GiB in use \+ 512\.0 MiB "
                              r"releasable \+ 256\.0 MiB non-releasable$")
        r = self.ps_json()[0]
        self.assertEqual((r["cached_bytes"], r["pool_cached_bytes"], r["releasable_bytes"]),
                         (GiB + 512 * MiB, GiB, 2 * GiB))
        self.assertEqual(r["frameworks"], [{"framework": "pytorch", "device": 0, "gpu": 0, "reserved_bytes": 2 * GiB,
                                            "in_use_bytes": GiB + 256 * MiB, "releasable_bytes": 512 * MiB,
                                            "non_releasable_bytes": 256 * MiB}])
        # -i 1: the cache is on GPU 0, so neither it nor its line is shown.
        out = self.cmd("ps", "-i", "1", check=0).stdout
        self.assertNotIn("pytorch", out)
        self.assertRegex(out, r"(?m)^\s*%d 1\s+512\.0 MiB\s+0 B\s+0 B\s+2\.0 MiB\s" % f.pid)

    def test_a_gpu_filter_with_no_process_running_is_no_error(self):
        """With no process of the user's running gpureclaim, nothing says which GPUs exist: ps -i and release -g
        say that no process uses the GPU, exit 0 (an unknown GPU is an error only while some process runs)."""
        for args in (("ps", "-i", "5"), ("release", "-g", "9")):
            p = self.cmd(*args)
            self.assertEqual(p.returncode, 0, (args, p.stdout, p.stderr))
            self.assertIn("no process of yours", p.stdout)

    def test_ps_sorts_and_filters_gpus(self):
        small, big = self.fake(), self.fake("--scale", "2")
        def pids(*args):
            return [r["pid"] for r in self.ps_json(*args)]
        self.assertEqual(pids(), [big.pid, small.pid], "largest first")
        self.assertEqual(pids("--sort", "pid"), sorted([big.pid, small.pid]))
        self.assertEqual(pids("-S", "orphan"), [big.pid, small.pid])
        self.assertEqual(self.cmd("ps", "--sort", "bogus", check=2).stdout, "")
        # One hint, naming the command run (ps's printed its hint twice, top's pointed at ps and at top).
        for cmd in ("ps", "top"):
            err = self.cmd(cmd, "-S", "bogus", check=2).stderr
            self.assertEqual(err.count("(see gpureclaim"), 1, err)
            self.assertIn("(see gpureclaim %s --help)" % cmd, err)
            # -s is --signal in run and release: here it is refused, naming the sort's own short option.
            err = self.cmd(cmd, "-s", "held", check=2).stderr
            self.assertIn("%s: unknown option: -s (did you mean -S or --sort?)" % cmd, err)
        # -t 0: refused by every command that takes it, with the same true range.
        for cmd in ("sleep", "wake", "release", "snapshot"):
            for t in ("0", "-1", "86401"):
                err = self.cmd(cmd, "-t", t, "1", check=2).stderr
                self.assertIn("bad timeout %s (seconds, more than 0 and at most 86400)" % t, err)
        err = self.cmd("run", "--oom-retry", "99", "--", "true", check=2).stderr
        self.assertIn("(see gpureclaim run --help)", err)
        # -i/--gpu: by ordinal, by UUID or a prefix of one (with or without GPU-), several at once.
        for sel in ("1", "GPU-aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee", "GPU-aaaa", "aaaaaaaa", "1,GPU-aaaa"):
            rows = self.ps_json("--gpu", sel)
            self.assertEqual([(r["pid"], r["devices"], r["held_bytes"]) for r in rows],
                             [(big.pid, [1], GiB), (small.pid, [1], 512 * MiB)], sel)
            self.assertEqual(rows[0]["gpu_uuids"], ["GPU-aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee"])
        table = self.cmd("ps", "-i", "1", check=0).stdout.splitlines()
        self.assertRegex(table[1], r"^\s+- GPU-aaaa")
        self.assertEqual(table[2], "", "GPU 0 is not shown")
        # A GPU no process reports is an error, as nvidia-smi -i has it; so is a prefix of two UUIDs, for ps
        # and release alike (exit status 2, nothing released).
        for cmd in ("ps", "release"):
            for sel in ("5", "zzz", "1,7"):
                p = self.cmd(cmd, "--gpu", sel, check=2)
                self.assertIn("no GPU %s: no process of yours running gpureclaim can see it" % sel.split(",")[-1],
                              p.stderr)
                self.assertEqual(p.stdout, "")
            p = self.cmd(cmd, "-i" if cmd == "ps" else "-g", "GPU-", check=2)
            self.assertIn("GPU GPU- is ambiguous: it begins GPU-11111111-2222-4333-8444-555555555555 and "
                          "GPU-aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee", p.stderr)
        self.assertFalse([line for line in self.received() if "release" in line], "nothing was released")
        for bad in ("", "1,", ",1", "a b", "x/y"):
            self.cmd("ps", "--gpu", bad, check=2)

    def test_ps_query_and_csv(self):
        f = self.fake("--framework")
        mute = self.fake("--mode", "close")
        out = self.cmd("ps", "--query", "pid,gpu,gpu_uuid,held,cached,orphan,answered", "--format", "csv",
                       check=0).stdout
        lines = out.splitlines()
        self.assertEqual(lines[0], "pid,gpu,gpu_uuid,held,cached,orphan,answered")
        self.assertEqual(lines[1], '%d,"0,1","GPU-11111111-2222-4333-8444-555555555555,GPU-aaaaaaaa-bbbb-4ccc-8ddd-'
                                   'eeeeeeeeeeee",%d,%d,%d,yes' % (f.pid, 4 * GiB + 512 * MiB, GiB + 512 * MiB,
                                                                    512 * MiB))
        self.assertEqual(lines[2], "%d,,,,,,no" % mute.pid, "unknown figures are empty")
        self.assertEqual(len(lines), 3)
        noheader = self.cmd("ps", "-q", "pid,releasable", "-f", "csv,noheader", "-i", "0", check=0).stdout
        self.assertEqual(noheader.splitlines()[0], "%d,%d" % (f.pid, 2 * GiB))
        # --format csv alone: every field, in a header a program can read back with csv.
        import csv, io
        rows = list(csv.DictReader(io.StringIO(self.cmd("ps", "--format", "csv", check=0).stdout)))
        self.assertEqual(rows[0]["command"], '/usr/bin/fakeproc /srv/jobs/train.py --fake "quoted" --out=/tmp/x')
        self.assertEqual(int(rows[0]["framework_releasable"]), 512 * MiB)
        # As JSON, and as a table in binary units.
        js = json.loads(self.cmd("ps", "-q", "pid,cached,answered", "--json", check=0).stdout)
        self.assertEqual(js, [{"pid": f.pid, "cached": GiB + 512 * MiB, "answered": True},
                              {"pid": mute.pid, "cached": None, "answered": False}])
        table = self.cmd("ps", "-q", "pid,cached", check=0).stdout.splitlines()
        self.assertEqual(table[0].split(), ["PID", "CACHED"])
        self.assertRegex(table[1], r"^\s*%d\s+1\.5 GiB$" % f.pid)
        self.assertIn("unknown field in --query: bogus", self.cmd("ps", "-q", "pid,bogus", check=2).stderr)
        self.cmd("ps", "--format", "xml", check=2)
        self.cmd("ps", "--json", "--format", "csv", check=2)
        self.cmd("ps", "extra", check=2)

    def test_nvidia_smi_habits(self):
        """What nvidia-smi users type: --format=csv,noheader,nounits (any order, any case), --query with spaces,
        ps PID, a logging loop (-l, as nvidia-smi -l) with a timestamp field."""
        f, g = self.fake(), self.fake("--scale", "2")
        p = self.cmd("ps", "--query", "pid, held", "--format=csv,noheader,nounits", str(f.pid), check=0)
        self.assertEqual(p.stdout, "%d,%d\n" % (f.pid, 4 * GiB + 512 * MiB))
        self.assertEqual(self.cmd("ps", "-q", " pid ,held", "-f", "CSV", check=0).stdout.splitlines()[0], "pid,held")
        table = self.cmd("ps", "-q", "pid,held", "-f", "nounits,table", str(g.pid), check=0).stdout.splitlines()
        self.assertEqual(table[1].split(), [str(g.pid), str(2 * (4 * GiB + 512 * MiB))])
        self.assertEqual(self.cmd("ps", "-q", "pid", "-f", "noheader", str(g.pid), check=0).stdout.split(), [str(g.pid)])
        for bad in ("csv,json", "xml", "csv,,noheader,foo"):
            self.assertIn("unknown --format", self.cmd("ps", "-q", "pid", "-f", bad, check=2).stderr, bad)
        self.assertIn("unknown field in --query: helt (did you mean held?)", self.cmd("ps", "-q", "pid,helt", check=2).stderr)
        # ps PID: those processes only; one that runs no gpureclaim is said so (exit 3), as release says it.
        self.assertEqual([r["pid"] for r in self.ps_json(str(g.pid))], [g.pid])
        self.assertEqual([r["pid"] for r in self.ps_json(str(g.pid), str(f.pid))], [g.pid, f.pid])
        plain = subprocess.Popen(["sleep", "30"])
        try:
            p = self.cmd("ps", str(f.pid), str(plain.pid), check=3)
            self.assertIn("process %d is not running gpureclaim: libgpureclaim is not loaded in it" % plain.pid, p.stderr)
            self.assertRegex(p.stdout, r"(?m)^\s*%d 0,1\s" % f.pid)
        finally:
            plain.kill()
            plain.wait()
        self.assertIn("no such process: 2147483647", self.cmd("ps", "2147483647", check=3).stderr)
        self.cmd("ps", "12x", check=2)
        # The loop: the header once, a row per process per round, each round's time; ^C ends it, exit status 0.
        lp = subprocess.Popen([CMD, "ps", "-l", "0.1", "-q", "timestamp,pid", "-f", "csv", str(f.pid)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=self.env)
        lines = [lp.stdout.readline() for _ in range(4)]
        lp.send_signal(signal.SIGINT)
        rest, err = lp.communicate(timeout=60)
        self.assertEqual(lp.returncode, 0, err)
        self.assertEqual(lines[0], "timestamp,pid\n")
        stamps = []
        for line in lines[1:] + rest.splitlines(True):
            stamp, pid = line.rstrip("\n").split(",")
            self.assertEqual(int(pid), f.pid)
            stamps.append(datetime.datetime.fromisoformat(stamp))
        self.assertEqual(stamps, sorted(stamps))
        self.assertLess(stamps[0], stamps[-1])
        self.assertIn("bad --loop 0", self.cmd("ps", "-l", "0", check=2).stderr)

    def test_prometheus_labels(self):
        """ps --prometheus --label NAME=VALUE: labels that say whose file it is (a pod's: pids repeat across pod
        namespaces, and node_exporter refuses a scrape with two identical series)."""
        f = self.fake()
        out = self.cmd("ps", "--prometheus", "-", "--label", "pod=train-0", "--label", 'namespace=m"l', check=0).stdout
        samples = [l for l in out.splitlines() if not l.startswith("#")]
        self.assertTrue(samples)
        for line in samples:
            self.assertRegex(line, r'command="fakeproc",pod="train-0",namespace="m\\"l"\} \d+$')
        self.assertIn('gpureclaim_live_bytes{pid="%d",device="1",uuid="GPU-aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee",'
                      'command="fakeproc",pod="train-0"' % f.pid, out)
        for bad in ("pid=1", "gpu=0", "1x=2", "__a=1", "noequals", "=v", "a-b=1"):
            self.assertIn("bad --label", self.cmd("ps", "--prometheus", "-", "--label", bad, check=2).stderr, bad)
        self.cmd("ps", "--prometheus", "-", "--label", "a=1", "--label", "a=2", check=2)
        self.assertIn("give --prometheus FILE too", self.cmd("ps", "--label", "pod=x", check=2).stderr)

    def test_ps_query_every_field(self):
        """Every --query field, each from its own figure: pool cache, framework reserved, in use and releasable,
        live, pinned, releases and bytes released, the last release with its `all` part, the sleep state and the
        bytes on the host, the signal, the program, and the error of a process that does not answer. (A field
        showing another's figure, or a constant, went unseen but for the few fields test_ps_query_and_csv reads.)"""
        import csv, io
        f = self.fake("--framework", "--signal", "USR2", "--program", "trainer")
        self.cmd("release", "--what", "all", str(f.pid), check=0)  # one release: 1 GiB + 512 MiB + 256 MiB
        z = self.fake("--sleeping")  # asleep, 3 GiB on the host: it holds nothing on the device
        mute = self.fake("--mode", "close")
        names = ["pid", "command", "program", "answered", "gpu", "gpu_uuid", "held", "live", "cached",
                 "pool_cached", "framework_reserved", "framework_in_use", "framework_releasable", "orphan",
                 "releasable", "pinned", "releases", "released", "last_release", "signal", "state", "host", "error"]
        out = self.cmd("ps", "--query", ",".join(names), "--format", "csv", check=0).stdout
        rows = {int(r["pid"]): r for r in csv.DictReader(io.StringIO(out))}
        self.assertEqual(list(rows[f.pid]), names)
        self.assertEqual(rows[f.pid], {k: str(v) for k, v in {
            "pid": f.pid, "command": '/usr/bin/trainer /srv/jobs/train.py --fake "quoted" --out=/tmp/x',
            "program": "trainer", "answered": "yes", "gpu": "0,1",
            "gpu_uuid": "GPU-11111111-2222-4333-8444-555555555555,GPU-aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee",
            "held": 4 * GiB + 512 * MiB, "live": 3 * GiB + 512 * MiB, "cached": GiB + 512 * MiB, "pool_cached": GiB,
            "framework_reserved": 2 * GiB, "framework_in_use": GiB + 256 * MiB, "framework_releasable": 512 * MiB,
            "orphan": 512 * MiB, "releasable": 2 * GiB, "pinned": 2 * MiB, "releases": 1,
            "released": GiB + 768 * MiB, "last_release": GiB + 768 * MiB, "signal": "USR2", "state": "awake",
            "host": 0, "error": ""}.items()})
        self.assertEqual((rows[z.pid]["state"], rows[z.pid]["host"], rows[z.pid]["held"]), ("sleeping", str(3 * GiB), "0"))
        self.assertEqual((rows[mute.pid]["answered"], rows[mute.pid]["state"], rows[mute.pid]["releases"]),
                         ("no", "awake", "0"))
        self.assertIn("closed the connection", rows[mute.pid]["error"])

        # ps --json: every key, each its own figure.
        js = {r["pid"]: r for r in self.ps_json()}
        self.maxDiff = None
        got = dict(js[f.pid])
        last = got.pop("last_release")
        self.assertEqual((last["seq"], last["what"], last["all_bytes"]), (1, "all", 256 * MiB), last)
        self.assertEqual(got, {
            "pid": f.pid, "command": '/usr/bin/trainer /srv/jobs/train.py --fake "quoted" --out=/tmp/x',
            "program": "trainer", "answered": True, "devices": [0, 1],
            "gpu_uuids": ["GPU-11111111-2222-4333-8444-555555555555", "GPU-aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee"],
            "live_blocks": 4, "live_bytes": 3 * GiB + 512 * MiB, "held_bytes": 4 * GiB + 512 * MiB,
            "cached_bytes": GiB + 512 * MiB, "pool_cached_bytes": GiB, "orphan_bytes": 512 * MiB,
            "releasable_bytes": 2 * GiB, "pinned_bytes": 2 * MiB, "released_bytes": GiB + 768 * MiB,
            "frameworks": [{"framework": "pytorch", "device": 0, "gpu": 0, "reserved_bytes": 2 * GiB,
                            "in_use_bytes": GiB + 256 * MiB, "releasable_bytes": 512 * MiB,
                            "non_releasable_bytes": 256 * MiB}],
            "gpus": [0, 1], "rundir": self.rundir, "stopped": False,
            "state": "awake", "host_bytes": 0, "releases": 1, "signal": "USR2",
            "limit_bytes": None, "guarantee_bytes": None, "wait": None})
        self.assertEqual((js[z.pid]["state"], js[z.pid]["host_bytes"], js[z.pid]["held_bytes"]), ("sleeping", 3 * GiB, 0))

        # --prometheus: every sample of the process, each its own figure.
        text = self.cmd("ps", "--prometheus", "-", check=0).stdout
        samples, asleep = {}, {}
        for line in text.splitlines():
            m = re.match(r'^(gpureclaim_[a-z_]+)\{pid="(\d+)"(?:,device="(\d+)")?[^}]*\} (\d+)$', line)
            if m and int(m.group(2)) == f.pid:
                samples[(m.group(1), m.group(3))] = int(m.group(4))
            elif m and int(m.group(2)) == z.pid and m.group(1) in ("gpureclaim_sleeping", "gpureclaim_sleep_host_bytes"):
                asleep[m.group(1)] = int(m.group(4))
        self.assertEqual(asleep, {"gpureclaim_sleeping": 1, "gpureclaim_sleep_host_bytes": 3 * GiB})
        want = {"live_bytes": (3 * GiB, 512 * MiB), "live_blocks": (3, 1), "peak_bytes": (4 * GiB, 512 * MiB),
                "pool_reserved_bytes": (3 * GiB // 2, 0), "pool_used_bytes": (GiB // 2, 0),
                "cached_bytes": (GiB + 512 * MiB, 0), "orphan_bytes": (512 * MiB, 0)}
        expect = {("gpureclaim_" + k, str(d)): v[d] for k, v in want.items() for d in (0, 1)}
        expect.update({("gpureclaim_" + k, None): v for k, v in {
            "host_pinned_bytes": 2 * MiB, "releases_total": 1, "released_bytes_total": GiB + 768 * MiB,
            "peer_reclaims_total": 3, "peer_reclaim_successes_total": 2, "peer_received_bytes_total": 5 * MiB,
            "peer_gives_total": 4, "peer_given_bytes_total": 7 * MiB, "up": 1, "sleeping": 0,
            "sleep_host_bytes": 0, "waiting": 0, "waiting_bytes": 0}.items()})
        self.assertEqual(samples, expect)

    def test_limit_guarantee_and_wait_shown_everywhere(self):
        """A process's limit and guarantee per GPU and its wait for memory (its status file's `peer` rows and
        `wait`): the table's STATE and the lines under the row, ps --json, --query (table, CSV, JSON), Prometheus,
        top's frame, and -i (a GPU filter) keeping only what is on the GPUs selected."""
        import csv, io
        f = self.fake("--sharing")
        plain = self.fake()  # none of them: null, empty, "-", 0
        table = self.cmd("ps", check=0).stdout
        row = next(l for l in table.splitlines() if l.lstrip().startswith(str(f.pid) + " "))
        self.assertIn(" waiting ", row)
        self.assertIn("on GPU 0: limit 6.0 GiB (holds 4.0 GiB), guarantee 2.0 GiB", table)
        self.assertIn("on GPU 1: guarantee 1.0 GiB", table)
        m = re.search(r"waiting (\d+\.\d) s for 768\.0 MiB on GPU 1 \(an allocation\)", table)
        self.assertIsNotNone(m, table)
        self.assertGreaterEqual(float(m.group(1)), 2.4)
        prow = next(l for l in table.splitlines() if l.lstrip().startswith(str(plain.pid) + " "))
        self.assertNotIn("waiting", prow)
        self.assertEqual(table.count("limit "), 1, table)

        js = {r["pid"]: r for r in self.ps_json()}
        self.assertEqual((js[f.pid]["limit_bytes"], js[f.pid]["guarantee_bytes"]), (6 * GiB, 3 * GiB))
        w = js[f.pid]["wait"]
        self.assertEqual((w["uuid"], w["bytes"], w["for"]), ("GPU-aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee", 768 * MiB, "alloc"))
        self.assertLess(abs(w["since_ms"] - (time.time() * 1000 - 2500)), 60000)
        self.assertEqual((js[plain.pid]["limit_bytes"], js[plain.pid]["guarantee_bytes"], js[plain.pid]["wait"]),
                         (None, None, None))
        # GPU 0 only: its limit and guarantee, and no wait (that is on GPU 1)
        g0 = {r["pid"]: r for r in self.ps_json("-i", "0")}
        self.assertEqual((g0[f.pid]["limit_bytes"], g0[f.pid]["guarantee_bytes"], g0[f.pid]["wait"]),
                         (6 * GiB, 2 * GiB, None))
        g1 = {r["pid"]: r for r in self.ps_json("-i", "1")}
        self.assertEqual((g1[f.pid]["limit_bytes"], g1[f.pid]["guarantee_bytes"], g1[f.pid]["wait"]["bytes"]),
                         (None, GiB, 768 * MiB))

        out = self.cmd("ps", "--query", "pid,limit,guarantee,waiting,state", "--format", "csv", check=0).stdout
        rows = {int(r["pid"]): r for r in csv.DictReader(io.StringIO(out))}
        self.assertEqual(rows[f.pid], {"pid": str(f.pid), "limit": str(6 * GiB), "guarantee": str(3 * GiB),
                                       "waiting": str(768 * MiB), "state": "awake"})
        self.assertEqual(rows[plain.pid], {"pid": str(plain.pid), "limit": "", "guarantee": "", "waiting": "0",
                                           "state": "awake"})
        q = {r["pid"]: r for r in json.loads(self.cmd("ps", "--query", "pid,limit,guarantee,waiting", "--format",
                                                      "json", check=0).stdout)}
        self.assertEqual(q[plain.pid], {"pid": plain.pid, "limit": None, "guarantee": None, "waiting": 0})
        self.assertEqual(q[f.pid]["limit"], 6 * GiB)
        qt = self.cmd("ps", "--query", "pid,limit", check=0).stdout
        self.assertRegex(qt, r"(?m)^\s*%d\s+6\.0 GiB$" % f.pid)
        self.assertRegex(qt, r"(?m)^\s*%d\s+-$" % plain.pid)

        text = self.cmd("ps", "--prometheus", "-", check=0).stdout
        def sample(name, pid, device=None):
            m = re.search(r'(?m)^%s\{pid="%d"%s[^}]*\} (\d+)$' % (name, pid, ',device="%d"' % device if device is not None else ""), text)
            return int(m.group(1)) if m else None
        self.assertEqual(sample("gpureclaim_limit_bytes", f.pid, 0), 6 * GiB)
        self.assertIsNone(sample("gpureclaim_limit_bytes", f.pid, 1))
        self.assertEqual(sample("gpureclaim_guarantee_bytes", f.pid, 0), 2 * GiB)
        self.assertEqual(sample("gpureclaim_guarantee_bytes", f.pid, 1), GiB)
        self.assertEqual((sample("gpureclaim_waiting", f.pid), sample("gpureclaim_waiting_bytes", f.pid)), (1, 768 * MiB))
        self.assertEqual((sample("gpureclaim_waiting", plain.pid), sample("gpureclaim_waiting_bytes", plain.pid)), (0, 0))
        self.assertIsNone(sample("gpureclaim_limit_bytes", plain.pid, 0))

        frame = json.loads(self.cmd("top", "--json", "--iterations", "1", check=0).stdout.splitlines()[0])
        self.assertRegex(self.cmd("top", "--iterations", "1", check=0).stdout, r"waiting \d+\.\d s for 768\.0 MiB on GPU 1")
        tp = {r["pid"]: r for r in frame["processes"]}
        self.assertEqual(tp[f.pid]["wait"]["bytes"], 768 * MiB)

    def test_a_process_waiting_to_wake(self):
        f = self.fake("--sharing", "--wait-for", "wake")
        table = self.cmd("ps", check=0).stdout
        self.assertRegex(table, r"waiting \d+\.\d s for 768\.0 MiB on GPU 1 \(to wake up\)")
        self.assertEqual(self.ps_json()[0]["wait"]["for"], "wake")

    def test_ps_json(self):
        f = self.fake()
        obj = json.loads(self.cmd("ps", "--json", check=0).stdout)
        # One object: the machine, the time, how GPUs are numbered, the directories read, the GPU table, the
        # processes (it was a bare array of processes: no GPU table, host or time).
        self.assertEqual(obj["host"], socket.gethostname())
        when = datetime.datetime.fromisoformat(obj["time"])
        self.assertEqual(int(when.timestamp() * 1000), obj["time_ms"])
        self.assertEqual(obj["gpu_numbering"], "cuda_ordinals", "no NVML here")
        self.assertIn("libnvidia-ml.so.1", obj["nvml_error"])
        self.assertEqual(obj["rundirs"], [self.rundir])
        self.assertEqual([(g["index"], g["uuid"], g["used_bytes"], g["total_bytes"], g["held_bytes"],
                           g["releasable_bytes"], g["other_bytes"], g["processes"]) for g in obj["gpus"]],
                         [(None, "GPU-11111111-2222-4333-8444-555555555555", 10 * GiB, 80 * GiB, 4 * GiB,
                           GiB + 512 * MiB, 6 * GiB, 1),
                          (None, "GPU-aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee", GiB, 80 * GiB, 512 * MiB, 0, 512 * MiB, 1)])
        rows = obj["processes"]
        self.assertEqual(len(rows), 1)
        self.assertEqual((rows[0]["gpus"], rows[0]["rundir"], rows[0]["stopped"]), ([0, 1], self.rundir, False))
        r = rows[0]
        self.assertEqual(r["pid"], f.pid)
        self.assertEqual(r["command"], '/usr/bin/fakeproc /srv/jobs/train.py --fake "quoted" --out=/tmp/x')
        self.assertEqual(r["program"], "fakeproc")
        self.assertEqual((r["answered"], r["devices"], r["live_blocks"], r["live_bytes"], r["cached_bytes"],
                          r["pinned_bytes"], r["orphan_bytes"], r["releases"], r["signal"], r["last_release"]),
                         (True, [0, 1], 4, 3 * GiB + 512 * MiB, GiB, 2 * MiB, 512 * MiB, 0, "USR1", None))

    def test_output_that_cannot_be_written_fails(self):
        self.fake()
        for args in (("ps", "--json"), ("ps",), ("--version",), ("ps", "--help")):
            with open("/dev/full", "w") as full:
                p = subprocess.run([CMD, *args], stdout=full, stderr=subprocess.PIPE, text=True, env=self.env,
                                   timeout=60)
            self.assertEqual(p.returncode, 1, args)
            self.assertIn("gpureclaim: cannot write the output: No space left on device", p.stderr, args)
        # top stops at the first frame it cannot write, rather than running on.
        for args in (("top", "--interval", "0.1"), ("top", "--interval", "0.1", "--json")):
            with open("/dev/full", "w") as full:
                p = subprocess.run([CMD, *args], stdout=full, stderr=subprocess.PIPE, text=True, env=self.env,
                                   timeout=20)
            self.assertEqual(p.returncode, 1, args)
            self.assertEqual(p.stderr, "gpureclaim: cannot write the output: No space left on device\n", args)
        p = subprocess.run("%s top --interval 0.1 | head -c 1 >/dev/null; echo ${PIPESTATUS[0]}" % CMD, shell=True,
                           executable="/bin/bash", capture_output=True, text=True, env=self.env, timeout=20)
        self.assertIn(p.stdout.strip(), ("0", "141"), p.stderr)
        # A reader that stops early is not an error of the command's.
        p = subprocess.run("%s ps --json | head -c 1 >/dev/null; echo ${PIPESTATUS[0]}" % CMD, shell=True,
                           executable="/bin/bash", capture_output=True, text=True, env=self.env, timeout=60)
        self.assertIn(p.stdout.strip(), ("0", "141"), p.stderr)
        self.assertNotIn("cannot write", p.stderr)

    def test_ps_lists_a_process_that_does_not_answer(self):
        f = self.fake("--mode", "close", "--old-status")  # a status file without the GPUs' figures
        out = self.cmd("ps", check=0).stdout
        self.assertRegex(out, r"(?m)^\s*%d \?\s+\?\s+\?\s+\?\s+\?\s+0 silent\s+- fakeproc.* \[not answering: " % f.pid)
        r = self.ps_json()[0]
        self.assertEqual((r["answered"], r["live_bytes"], r["devices"]), (False, None, None))
        self.assertIn("without answering", r["error"])
        self.assertNotIn("last_known", r)

    def test_a_silent_or_stopped_process_shows_its_last_figures(self):
        """A process that does not answer showed "?" everywhere and its GPU left the table; its status file has
        its figures per GPU as of its last change (`peer`): shown, and said to be that. A stopped one is not
        asked at all: it cannot answer until it continues (every ps took 2 s)."""
        f = self.fake("--mode", "close")
        out = self.cmd("ps", check=0).stdout
        self.assertRegex(out, r"(?m)^\s*%d 0,1\s+4\.5 GiB\s+1\.0 GiB\s+512\.0 MiB\s+\?\s+0 silent\s+- fakeproc.*"
                              r"\[not answering: it closed the connection without answering; figures of its status "
                              r"file, \d+ s old\]$" % f.pid)
        self.assertRegex(out, r"(?m)^\s+- GPU-11111111-2222-4333-8444-555555555555\s+\?\s+\?\s+4\.0 GiB\s+1\.5 GiB",
                         "its GPU stays in the table, with its figures")
        self.assertIn("A stopped or silent process shows its status file's last figures.", out)
        r = self.ps_json()[0]
        self.assertEqual((r["answered"], r["held_bytes"]), (False, None), "--json: null, as the process did not say")
        self.assertEqual(r["last_known"]["held_bytes"], 4 * GiB + 512 * MiB)
        self.assertEqual(r["last_known"]["gpu_uuids"], ["GPU-11111111-2222-4333-8444-555555555555",
                                                        "GPU-aaaaaaaa-bbbb-4ccc-8ddd-eeeeeeeeeeee"])
        g = self.fake("--log-connects")
        os.kill(g.pid, signal.SIGSTOP)
        try:
            # (wait for the stop to take: kill() returns first)
            deadline = time.monotonic() + 60
            while open("/proc/%d/stat" % g.pid).read().rsplit(")", 1)[1].split()[0] != "T":
                self.assertLess(time.monotonic(), deadline)
                time.sleep(0.01)
            os.unlink(self.log)
            r = [x for x in self.ps_json() if x["pid"] == g.pid][0]
            self.assertEqual((r["answered"], r["stopped"]), (False, True))
            self.assertIn("it is stopped (SIGSTOP, ^Z or a debugger)", r["error"])
            out = self.cmd("ps", check=0).stdout
            self.assertRegex(out, r"(?m)^\s*%d 0,1\s+4\.5 GiB\s.* stopped\s" % g.pid)
        finally:
            os.kill(g.pid, signal.SIGCONT)
        # It was never asked: it accepts connections in order, so once a request made now is answered, any the
        # command made while it was stopped is in the log.
        self.cmd("snapshot", str(g.pid), check=0)
        self.assertEqual(self.received().count("connect %d" % g.pid), 1, "the stopped process was asked")

    def test_top_one_frame_and_json_frames(self):
        f = self.fake()
        out = self.cmd("top", "--iterations", "1", check=0).stdout
        self.assertTrue(out.startswith("gpureclaim top - "), out)  # piped: no terminal escape codes
        self.assertNotIn("\033", out)
        self.assertIn("1 process (every 2.0s, sorted by held)", out)
        self.assertRegex(out, r"(?m)^\s*%d 0,1\s.*fakeproc" % f.pid)
        t0 = time.monotonic()
        frames = self.cmd("top", "--json", "--iterations", "3", "--interval", "0.2", check=0).stdout.splitlines()
        self.assertGreaterEqual(time.monotonic() - t0, 0.4)
        self.assertEqual(len(frames), 3)
        times = []
        for fr in frames:  # each frame ps --json's object: the time it was taken, the GPU table, the processes
            frame = json.loads(fr)
            self.assertEqual([r["pid"] for r in frame["processes"]], [f.pid])
            self.assertEqual(len(frame["gpus"]), 2)
            times.append(frame["time_ms"])
        self.assertEqual(times, sorted(times))
        self.assertLess(times[0], times[-1])
        self.assertEqual(self.cmd("top", "--interval", "0").returncode, 2)
        self.assertEqual(self.cmd("top", "--iterations", "0").returncode, 2)

    def test_prometheus_textfile_line_by_line(self):
        f = self.fake("--program", 'we"ird\\name')
        f2 = self.fake("--mode", "close")
        path = os.path.join(self.tmp, "gpureclaim.prom")
        with open(path, "w") as old:
            old.write("stale\n")
        inode = os.stat(path).st_ino
        self.assertEqual(self.cmd("ps", "--prometheus", path, check=0).stdout, "")
        self.assertNotEqual(os.stat(path).st_ino, inode, "written to a new file and renamed into place")
        self.assertEqual(os.listdir(self.tmp).count("gpureclaim.prom"), 1)
        self.assertFalse([n for n in os.listdir(self.tmp) if n.endswith(".tmp")])
        with open(path) as fh:
            text = fh.read()
        self.assertTrue(text.endswith("\n"))
        name_re = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
        label_re = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\["\\n])*"'
        sample = re.compile(r"^(%s)\{(%s(?:,%s)*)\} (-?\d+)$" % (name_re, label_re, label_re))
        helps, types, samples = {}, {}, []
        current = None
        for line in text.splitlines():
            if line.startswith("# HELP "):
                name = line.split()[2]
                self.assertNotIn(name, helps, "one HELP per family")
                helps[name] = line
                current = name
            elif line.startswith("# TYPE "):
                _, _, name, kind = line.split()
                self.assertEqual(name, current, "TYPE follows its HELP")
                self.assertIn(kind, ("gauge", "counter"))
                self.assertEqual(kind == "counter", name.endswith("_total"))
                types[name] = kind
            else:
                m = sample.match(line)
                self.assertIsNotNone(m, "not a sample line: %r" % line)
                self.assertEqual(m.group(1), current, "a sample belongs to the family declared above it")
                labels = dict(re.findall(r'([a-zA-Z_]+)="((?:[^"\\]|\\.)*)"', m.group(2)))
                samples.append((m.group(1), labels, int(m.group(3))))
        self.assertEqual(set(helps), set(types))

        def value(name, pid, device=None):
            hits = [v for n, lab, v in samples if n == name and lab["pid"] == str(pid) and lab.get("device") == device]
            self.assertEqual(len(hits), 1, (name, pid, device, samples))
            return hits[0]

        self.assertEqual(value("gpureclaim_live_bytes", f.pid, "0"), 3 * GiB)
        self.assertEqual(value("gpureclaim_live_bytes", f.pid, "1"), 512 * MiB)
        self.assertEqual(value("gpureclaim_cached_bytes", f.pid, "0"), GiB)
        self.assertEqual(value("gpureclaim_pool_reserved_bytes", f.pid, "0"), 3 * GiB // 2)
        self.assertEqual(value("gpureclaim_orphan_bytes", f.pid, "0"), 512 * MiB)
        self.assertEqual(value("gpureclaim_host_pinned_bytes", f.pid), 2 * MiB)
        self.assertEqual(value("gpureclaim_releases_total", f.pid), 0)
        self.assertEqual(value("gpureclaim_up", f.pid), 1)
        self.assertEqual(value("gpureclaim_up", f2.pid), 0)
        self.assertFalse([s for s in samples if s[1]["pid"] == str(f2.pid) and s[0] != "gpureclaim_up"])
        commands = {lab["command"] for n, lab, v in samples if lab["pid"] == str(f.pid)}
        self.assertEqual(commands, {'we\\"ird\\\\name'}, "the program name, escaped")
        # Not writable: exit 1, and nothing half-written.
        self.assertEqual(self.cmd("ps", "--prometheus", os.path.join(self.tmp, "nodir", "x.prom")).returncode, 1)

    # ---- release ----

    def test_release_over_the_socket(self):
        f = self.fake()
        out = self.cmd("release", str(f.pid), check=0).stdout
        self.assertEqual(out.splitlines()[0],
                         '%d (fakeproc train.py --fake "quoted" --out=/tmp/x): released 1.5 GiB in 12.50 ms (cached 1.0 GiB: pools '
                         "1.0 GiB, frameworks 0 B, releasers 0 B; orphaned 512.0 MiB in 1 block)" % f.pid)
        self.assertEqual(out.splitlines()[1].strip(), "device 0: free 10.0 GiB -> 11.5 GiB of 80.0 GiB")
        self.cmd("release", str(f.pid), "--what", "orphaned", check=0)
        self.assertEqual(self.received(), ["request release-begun", "request release-begun orphaned"])

    def test_release_from_an_older_library(self):
        """A library without release-begun answers "unknown request": the command asks with release then."""
        f = self.fake("--old-library")
        out = self.cmd("release", str(f.pid), "--what", "orphaned", check=0).stdout
        self.assertIn("released 1.5 GiB", out)
        self.assertEqual(self.received(), ["request release-begun orphaned", "request release orphaned"])
    def test_release_json_round_trips_the_report(self):
        f = self.fake()
        out = json.loads(self.cmd("release", "--json", str(f.pid), check=0).stdout)
        sys.path.insert(0, os.path.dirname(FAKE))
        sys.dont_write_bytecode = True  # nothing written into the source tree
        import fakeproc
        self.assertEqual(out, [{"pid": f.pid, "ok": True, "via": "socket",
                                "report": fakeproc.report(1, "command", "cached,orphaned")}])

    def test_release_all_and_several_pids(self):
        a, b = self.fake(), self.fake()
        out = json.loads(self.cmd("release", "--all", "--json", check=0).stdout)
        self.assertEqual(sorted(x["pid"] for x in out), sorted([a.pid, b.pid]))
        out = json.loads(self.cmd("release", "--json", str(a.pid), str(b.pid), check=0).stdout)
        self.assertEqual([x["report"]["seq"] for x in out], [2, 2])

    def test_a_silent_process_times_out(self):
        f = self.fake("--mode", "silent")  # it says nothing for 60 s, then closes: only --timeout says "timed out"
        p = self.cmd("release", "--timeout", "1", str(f.pid), check=1)
        self.assertIn("%d did not release: timed out" % f.pid, p.stderr)
        r = json.loads(self.cmd("release", "--timeout", "0.5", "--json", str(f.pid), check=1).stdout)
        self.assertFalse(r[0]["ok"])
        # It never said it began: withdrawn (the real library drops a request whose client withdrew).
        self.assertTrue(r[0]["error"].startswith("timed out before the process took the request up"), r[0]["error"])
        self.assertIn("the request is withdrawn: the process will not run it", r[0]["error"])

    def wait_for_zombie(self, pid):
        """Until pid is a zombie whose threads are all gone: the fake is multi-threaded, and a zombie leader whose
        threads are still exiting is rightly a process that still runs."""
        deadline = time.monotonic() + 60  # a hang guard
        while True:
            with open("/proc/%d/stat" % pid) as st:
                zombie = st.read().rsplit(")", 1)[1].split()[0] == "Z"
            if zombie and len(os.listdir("/proc/%d/task" % pid)) <= 1:
                return
            self.assertLess(time.monotonic(), deadline, "pid %d never became a zombie" % pid)
            time.sleep(0.01)

    def test_a_zombie_is_a_process_that_is_gone(self):
        f = self.fake()
        f.p.kill()  # not reaped yet: a zombie, its status file still there
        self.wait_for_zombie(f.pid)
        p = self.cmd("release", str(f.pid), check=3)
        self.assertIn("no such process: %d" % f.pid, p.stderr)
        # The command that finds the process gone removes its files (README), not only ps.
        self.assertIn("removed the stale status file of pid %d (the process is gone)" % f.pid, p.stderr)
        for ext in (".json", ".sock"):
            self.assertFalse(os.path.exists(os.path.join(self.rundir, "%d%s" % (f.pid, ext))), ext)
        p = self.cmd("ps", check=0)
        self.assertNotIn(" %d " % f.pid, p.stdout)
        f.p.wait()

    def test_a_process_that_exits_during_a_release_by_signal(self):
        """The command waited its whole --timeout (kill(pid, 0) succeeds on a zombie) instead of saying that the
        process exited; exit status 3. The hang guard is the subprocess's timeout, far below --timeout."""
        for args in ((), ("--signal",)):
            f = self.fake("--no-socket", "--die-on-signal")
            p = self.cmd("release", *args, "--timeout", "3600", str(f.pid), check=3, timeout=120)
            self.assertIn("%d did not release: the process exited" % f.pid, p.stderr)
            self.assertIn("signal 10", self.received())
            f.p.wait()
            self.fakes.remove(f)
            f.p.stdin.close()
            f.p.stdout.close()

    def test_a_process_asleep_is_no_failure_of_a_release(self):
        """release -a, -g and PID exited 1 whenever a process was asleep, so a cron job failed whenever idle
        sleep was on: a process asleep has nothing on the device to release, and says so, exit status 0."""
        awake, asleep, racing = self.fake(), self.fake("--sleeping", "--log-connects"), self.fake("--goes-to-sleep")
        for args in (("--all",), ("-g", "1"), (str(asleep.pid),), (str(racing.pid), str(awake.pid))):
            p = self.cmd("release", *args, check=0)
            self.assertEqual(p.stderr, "", args)
        p = self.cmd("release", str(asleep.pid), check=0)
        self.assertEqual(p.stdout, "%d (fakeproc train.py --fake \"quoted\" --out=/tmp/x): asleep, nothing on the device "
                                   "to release (3.0 GiB kept in host memory; gpureclaim wake %d or its next CUDA call "
                                   "brings it back)\n" % (asleep.pid, asleep.pid))
        out = json.loads(self.cmd("release", "--all", "--json", check=0).stdout)
        by = {x["pid"]: x for x in out}
        self.assertEqual((by[asleep.pid]["ok"], by[asleep.pid]["asleep"], by[asleep.pid]["report"]), (True, True, None))
        self.assertEqual((by[racing.pid]["ok"], by[racing.pid]["asleep"]), (True, True))
        self.assertTrue(by[awake.pid]["ok"])
        self.assertNotIn("asleep", by[awake.pid])
        # The one asleep by its status file is not asked to release: once a snapshot asked now is answered, every
        # connection made before is in its log (it accepts them in order): -g's stats request, and the snapshot.
        self.cmd("snapshot", str(asleep.pid), check=0)
        self.assertEqual(self.received().count("connect %d" % asleep.pid), 2)

    def test_a_process_that_exits_during_a_release_over_its_socket(self):
        """It exited with status 1 ("closed the connection without answering") where --help says 3."""
        f = self.fake("--die-on-release")
        p = self.cmd("release", str(f.pid), check=3)
        self.assertIn("%d did not release: the process exited" % f.pid, p.stderr)
        f.p.wait()
        self.fakes.remove(f)
        f.p.stdin.close()
        f.p.stdout.close()

    def test_ps_asks_processes_at_once(self):
        """Each --barrier fake answers only once every fake has its request: asked one after another, the first
        would wait for the others until ps gave up on it. (No measured time decides.)"""
        silent = self.fake("--mode", "silent")
        waiting = [self.fake("--barrier", "5") for _ in range(4)]
        rows = self.ps_json()
        by_pid = {r["pid"]: r for r in rows}
        self.assertEqual([by_pid[f.pid]["answered"] for f in waiting], [True] * 4)
        self.assertFalse(by_pid[silent.pid]["answered"])

    def test_release_asks_processes_at_once(self):
        """The fake asked first answers only once all four have their request: one after another, it would time
        out before the others were asked."""
        first = self.fake("--barrier", "4")
        silent = [self.fake("--mode", "silent") for _ in range(3)]
        pids = [str(first.pid)] + [str(f.pid) for f in silent]
        out = json.loads(self.cmd("release", "--timeout", "10", "--json", *pids, check=1, timeout=120).stdout)
        self.assertEqual([r["pid"] for r in out], [int(p) for p in pids], "reported in the order given")
        self.assertEqual([r["ok"] for r in out], [True, False, False, False], out)
        self.assertTrue(all(r["error"].startswith("timed out") for r in out[1:]), out)
        os.unlink(self.log)
        p = self.cmd("release", "--all", "--timeout", "10", check=1, timeout=120)
        self.assertIn("released 1.5 GiB", p.stdout)
        self.assertEqual(p.stderr.count("did not release: timed out"), 3, p.stderr)

    def test_one_failure_fails_the_whole_command(self):
        good, bad = self.fake(), self.fake("--mode", "close")
        p = self.cmd("release", str(good.pid), str(bad.pid), check=1)
        self.assertIn("released 1.5 GiB", p.stdout)
        self.assertIn("%d did not release: it closed the connection without answering" % bad.pid, p.stderr)

    def test_garbage_and_refusals_from_the_process(self):
        f = self.fake("--mode", "garbage")
        self.assertIn("not a JSON object", self.cmd("release", str(f.pid), check=1).stderr)
        self.assertIn("not a JSON object", self.cmd("snapshot", str(f.pid), check=1).stderr)
        g = self.fake("--mode", "refuse")
        self.assertIn("gpureclaim is disabled in this process", self.cmd("release", str(g.pid), check=1).stderr)

    def test_release_by_signal_when_nothing_listens(self):
        for opt in ("--no-socket", "--socket-gone"):
            f = self.fake(opt)
            p = self.cmd("release", str(f.pid), check=0)
            self.assertIn("released 1.5 GiB", p.stdout)
            self.assertIn("using its release signal", p.stderr)
            self.assertIn("signal 10", self.received())
            out = json.loads(self.cmd("release", "--json", str(f.pid), check=0).stdout)
            self.assertEqual((out[0]["via"], out[0]["report"]["trigger"], out[0]["report"]["seq"]),
                             ("signal", "signal", 2))
            f.close()
            self.fakes.remove(f)
            os.unlink(self.log)

    def test_release_by_signal_on_request(self):
        f = self.fake("--signal", "USR2")
        out = json.loads(self.cmd("release", "--signal", "--json", str(f.pid), check=0).stdout)
        self.assertEqual(out[0]["via"], "signal")
        # The status file's signal; over the socket only a ping, whose answer would say whether gpureclaim's
        # handler is still installed (the fake's does not say: taken as installed, as from an older library).
        self.assertEqual(self.received(), ["request ping", "signal 12"])
        # --what must match what the process's signal releases.
        p = self.cmd("release", "--signal", "--what", "orphaned", str(f.pid), check=1)
        self.assertIn("GPURECLAIM_ON_SIGNAL", p.stderr)
        self.cmd("release", "--signal", "--what", "orphaned,cached", str(f.pid), check=0)

    def test_release_by_signal_waits_for_the_signals_own_release(self):
        f = self.fake("--other-release-first")
        out = json.loads(self.cmd("release", "--signal", "--json", str(f.pid), check=0).stdout)
        rep = out[0]["report"]
        self.assertEqual((rep["trigger"], rep["seq"], rep["what"]), ("signal", 2, "cached,orphaned"),
                         "not the command release that ended first")
        # A library that does not count signal releases: the first release to end is all the command can see.
        g = self.fake("--other-release-first", "--old-status")
        out = json.loads(self.cmd("release", "--signal", "--json", str(g.pid), check=0).stdout)
        self.assertEqual(out[0]["report"]["seq"], 1)

    def test_a_deaf_process_times_out_by_signal(self):
        f = self.fake("--no-socket", "--deaf")  # it never releases: only --timeout ends the wait
        p = self.cmd("release", "--timeout", "0.5", str(f.pid), check=1)
        self.assertIn("timed out waiting for its status file", p.stderr)
        self.assertIn("a signal cannot be withdrawn", p.stderr)
        self.assertEqual(self.received(), ["signal 10"])
        os.unlink(self.log)
        g = self.fake("--no-socket", "--signal", "off")
        self.assertIn("release signal is off (GPURECLAIM_SIGNAL=off) and nothing listens on its control socket",
                      self.cmd("release", str(g.pid), check=1).stderr)
        self.assertIn("release signal is off (GPURECLAIM_SIGNAL=off) and it has no control socket",
                      self.cmd("release", "--signal", str(g.pid), check=1).stderr)
        self.assertNotIn("signal 10", self.received())
        h = self.fake("--signal", "off")  # it listens: --signal alone is the wrong way to ask it
        self.assertIn("ask over its control socket (without --signal)",
                      self.cmd("release", "--signal", str(h.pid), check=1).stderr)
        self.cmd("release", str(h.pid), check=0)

    def test_the_release_signal_only_reaches_a_process_that_catches_it(self):
        """A process that exec'd another program keeps its pid and start time, and its status file and socket
        file stay behind: nothing listens, and its release signal would kill the new program."""
        self.fake()  # the run directory exists
        victim = subprocess.Popen(["sleep", "30"])
        try:
            with open("/proc/%d/stat" % victim.pid) as fh:
                ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
            sock = os.path.join(self.rundir, "%d.sock" % victim.pid)
            s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            s.bind(sock)
            s.close()  # the file stays: connecting is refused
            with open(os.path.join(self.rundir, "%d.json" % victim.pid), "w") as fh:
                json.dump({"pid": victim.pid, "uid": os.geteuid(), "start_ticks": ticks,
                           "exe": os.readlink("/proc/%d/exe" % victim.pid), "cmdline": "sleep 30",
                           "signal": "USR1", "on_signal": "cached,orphaned", "socket": sock, "releases": 0,
                           "last_release": None, "signal_releases": 0, "last_signal_release": None}, fh)
            for args in (("release", str(victim.pid)), ("release", "--signal", str(victim.pid))):
                p = self.cmd(*args, check=1)
                self.assertIn("nothing listens on its control socket any more: the process no longer runs the "
                              "gpureclaim that wrote its status file", p.stderr, args)
            os.unlink(sock)  # gone (a cleaner of old files): the signal is the way, if the process catches it
            for args in (("release", str(victim.pid)), ("release", "--signal", str(victim.pid))):
                p = self.cmd(*args, check=1)
                self.assertIn("it does not catch its release signal: it no longer runs gpureclaim (exec?) or "
                              "ignores the signal", p.stderr, args)
            out = json.loads(self.cmd("release", "--all", "--json", check=1).stdout)
            mine = [x for x in out if x["pid"] == victim.pid][0]
            self.assertFalse(mine["ok"])
            self.assertIn("does not catch its release signal", mine["error"])
            time.sleep(0.2)
            self.assertIsNone(victim.poll(), "the program was killed by the release signal")
        finally:
            victim.kill()
            victim.wait()
        g = self.fake("--no-socket", "--ignore-signal")
        self.assertIn("does not catch its release signal", self.cmd("release", str(g.pid), check=1).stderr)

    def test_a_status_file_of_another_program_is_stale(self):
        """The same pid and start time but another executable than the status file's: the process exec'd."""
        self.fake()
        victim = subprocess.Popen(["sleep", "30"])
        try:
            with open("/proc/%d/stat" % victim.pid) as fh:
                ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
            path = os.path.join(self.rundir, "%d.json" % victim.pid)
            status = {"pid": victim.pid, "uid": os.geteuid(), "start_ticks": ticks, "exe": sys.executable + "-x",
                      "cmdline": "python3 train.py", "signal": "USR1", "socket": None, "releases": 0}
            with open(path, "w") as fh:
                json.dump(status, fh)
            p = self.cmd("ps", "--json", check=0)
            self.assertNotIn(victim.pid, [r["pid"] for r in json.loads(p.stdout)["processes"]])
            self.assertIn("removed the stale status file of pid %d (the process now runs another program (exec))"
                          % victim.pid, p.stderr)
            self.assertFalse(os.path.exists(path))
            with open(path, "w") as fh:
                json.dump(status, fh)
            self.assertIn("not running gpureclaim", self.cmd("release", str(victim.pid), check=3).stderr)
            # The same program, its binary replaced since it started: not an exec.
            status["exe"] = os.readlink("/proc/%d/exe" % victim.pid) + " (deleted)"
            with open(path, "w") as fh:
                json.dump(status, fh)
            self.assertIn(victim.pid, [r["pid"] for r in self.ps_json()])
            self.assertIsNone(victim.poll())
        finally:
            victim.kill()
            victim.wait()

    # ---- snapshot ----

    def test_snapshot_groups_largest_first(self):
        f = self.fake()
        out = self.cmd("snapshot", str(f.pid), check=0).stdout.splitlines()
        self.assertEqual(out[0], "pid %d: 4 live blocks, 3.5 GiB live (peak 4.5 GiB), 1 orphan (512.0 MiB), "
                                 "pools hold 1.5 GiB, 2.0 MiB pinned host memory" % f.pid)
        rows = [line.split() for line in out[3:]]
        self.assertEqual(rows, [["0", "-", "async", "libmodel.so", "1", "1", "3.0", "GiB"],
                                ["0", "0xc0", "device", "libtorch_cuda.so", "2", "0", "2.0", "GiB"],
                                ["1", "0xc1", "device", "libmodel.so", "1", "0", "512.0", "MiB"]])
        snap = json.loads(self.cmd("snapshot", "--json", str(f.pid), check=0).stdout)
        self.assertEqual(len(snap["blocks"]), 4)
        self.assertEqual(snap["blocks"][2]["address"], "0x7f0080000000")

    def test_snapshot_leaks(self):
        f = self.fake()
        out = self.cmd("snapshot", str(f.pid), "--leaks", check=0).stdout
        self.assertIn("gpureclaim: pid %d: 3 blocks (3.5 GiB) were never freed" % f.pid, out)
        self.assertIn("Device 0: 2 blocks, 3.0 GiB\nDevice 1: 1 block, 512.0 MiB\n", out)
        self.assertIn("2 blocks, 3.0 GiB (async) allocated by libmodel.so at 0x5678 (load_model+0x4c)\n"
                      "    #0 0x5678 (libmodel.so+0x678)\n    #1 0x9999 (libmodel.so+0x999)\n", out)
        self.assertIn("    #0 0x9abc\n", out, "an older library's report has no locations")
        leaks = json.loads(self.cmd("snapshot", str(f.pid), "--leaks", "--json", check=0).stdout)
        self.assertEqual([g["bytes"] for g in leaks["groups"]], [3 * GiB, 512 * MiB])

    # ---- refusals ----

    def test_unknown_pid_and_a_process_without_gpureclaim(self):
        self.fake()  # the run directory exists
        p = self.cmd("release", "2147483647", check=3)
        self.assertIn("no such process: 2147483647", p.stderr)
        self.cmd("snapshot", "2147483647", check=3)
        plain = subprocess.Popen(["sleep", "30"])
        try:
            p = self.cmd("release", str(plain.pid), check=3)
            self.assertIn("is not running gpureclaim", p.stderr)
            self.cmd("snapshot", str(plain.pid), check=3)
            # --json lists every pid asked for, in order, the ones not found with why.
            f = self.fake()
            out = json.loads(self.cmd("release", "--json", "2147483647", str(f.pid), str(plain.pid), check=3).stdout)
            self.assertEqual([(x["pid"], x["ok"]) for x in out], [(2147483647, False), (f.pid, True), (plain.pid, False)])
            self.assertEqual((out[0]["error"], out[0]["via"]), ("no such process: 2147483647", None))
            self.assertIn("is not running gpureclaim", out[2]["error"])
        finally:
            plain.kill()
            plain.wait()

    @staticmethod
    def foreign_pid():
        """A live process of another user, if any can be seen."""
        for name in os.listdir("/proc"):
            try:
                if name.isdigit() and os.stat("/proc/" + name).st_uid != os.geteuid():
                    return int(name)
            except OSError:
                pass
        return None

    def test_another_users_process_is_refused(self):
        other = subprocess.Popen(["sleep", "30"], user=65534) if os.geteuid() == 0 else None
        try:
            pid = other.pid if other else self.foreign_pid()
            if pid is None:
                self.skipTest("no process of another user to try")
            p = self.cmd("release", str(pid), check=3)
            self.assertRegex(p.stderr, r"process %d belongs to \S+.*: refused" % pid)
            self.cmd("snapshot", str(pid), check=3)
        finally:
            if other:
                other.kill()
                other.wait()

    def test_a_status_file_claiming_another_user_is_never_acted_on(self):
        f = self.fake("--uid", "4242")
        p = self.cmd("release", str(f.pid), check=3)
        self.assertIn("says it belongs to", p.stderr)
        self.assertIn("refused", p.stderr)
        self.cmd("release", "--signal", str(f.pid), check=3)
        self.cmd("snapshot", str(f.pid), check=3)
        ps = self.cmd("ps", "--json", check=0)
        self.assertEqual(json.loads(ps.stdout)["processes"], [])
        self.assertIn("ignoring the status file of pid %d" % f.pid, ps.stderr)
        self.assertEqual(json.loads(self.cmd("release", "--all", "--json", check=0).stdout), [])
        self.assertEqual(self.received(), [], "no request and no signal reached it")

    def test_a_status_file_without_start_ticks_or_uid_is_never_acted_on(self):
        self.fake()
        victim = subprocess.Popen(["sleep", "30"])
        try:
            path = os.path.join(self.rundir, "%d.json" % victim.pid)
            with open("/proc/%d/stat" % victim.pid) as fh:
                ticks = int(fh.read().rsplit(")", 1)[1].split()[19])
            for st in ({"pid": victim.pid},
                       {"pid": victim.pid, "uid": os.geteuid()},
                       {"pid": victim.pid, "start_ticks": ticks}):
                with open(path, "w") as fh:
                    json.dump(st, fh)
                ps = self.cmd("ps", "--json", check=0)
                self.assertNotIn(victim.pid, [r["pid"] for r in json.loads(ps.stdout)["processes"]], st)
                self.assertIn("ignoring %s: not a valid status file" % path, ps.stderr)
                self.assertNotIn(victim.pid, [r.get("pid") for r in
                                              json.loads(self.cmd("release", "--all", "--json", check=0).stdout)])
                p = self.cmd("release", str(victim.pid), check=3)
                self.assertIn("is not a valid status file", p.stderr)
                self.cmd("release", "--signal", str(victim.pid), check=3)
                self.assertIsNone(victim.poll(), "the process named by the file was signalled")
        finally:
            victim.kill()
            victim.wait()

    def test_stale_and_reused_status_files_are_removed(self):
        self.fake()
        gone = subprocess.Popen(["true"])
        gone.wait()
        stale = os.path.join(self.rundir, "%d.json" % gone.pid)
        with open(stale, "w") as fh:
            json.dump({"pid": gone.pid, "uid": os.geteuid(), "start_ticks": 1, "releases": 0, "socket": None}, fh)
        open(os.path.join(self.rundir, "%d.sock" % gone.pid), "w").close()
        reused = subprocess.Popen(["sleep", "30"])
        try:
            other = os.path.join(self.rundir, "%d.json" % reused.pid)
            with open(other, "w") as fh:
                json.dump({"pid": reused.pid, "uid": os.geteuid(), "start_ticks": 1, "releases": 0,
                           "socket": None}, fh)
            p = self.cmd("ps", check=0)
            self.assertIn("removed the stale status file of pid %d (the process is gone)" % gone.pid, p.stderr)
            self.assertIn("removed the stale status file of pid %d (the pid now belongs to another program)"
                          % reused.pid, p.stderr)
            self.assertFalse(os.path.exists(stale) or os.path.exists(other))
            self.assertFalse(os.path.exists(os.path.join(self.rundir, "%d.sock" % gone.pid)))
            self.assertIsNone(reused.poll(), "the program that reused the pid was not signalled")
            self.assertEqual(self.cmd("release", str(reused.pid), check=3).returncode, 3)
        finally:
            reused.kill()
            reused.wait()

    def test_a_status_file_that_is_not_a_regular_file_hangs_nothing(self):
        """A FIFO named <pid>.json (for a live pid) was opened for reading and waited for a writer forever: ps, top,
        release --all and release PID hung. A directory, too, is refused with a warning, never opened."""
        f = self.fake()
        other = subprocess.Popen(["sleep", "60"])
        try:
            os.mkfifo(os.path.join(self.rundir, "%d.json" % os.getpid()))
            os.mkdir(os.path.join(self.rundir, "%d.json" % other.pid))
            for args in (("ps",), ("ps", "--json"), ("top", "--iterations", "1"), ("release", "--all")):
                p = self.cmd(*args, check=0, timeout=60)  # the timeout guards the hang
                self.assertIn("%d.json: not a regular file" % os.getpid(), p.stderr, args)
                self.assertIn("%d.json: not a regular file" % other.pid, p.stderr, args)
                self.assertIn(str(f.pid), p.stdout, args)
            for pid in (os.getpid(), other.pid):
                p = self.cmd("release", str(pid), check=3, timeout=60)
                self.assertIn("is not a regular file", p.stderr)
            self.assertIsNone(other.poll(), "a process behind a refused status file was signalled")
        finally:
            other.kill()
            other.wait()

    def test_temporary_files_of_processes_that_are_gone_are_removed(self):
        """A process killed while it wrote its status file leaves the temporary file behind (outfile.c's
        PATH.PID.TID.N.tmp); the command removes it once its writer is gone, as it removes stale status files."""
        f = self.fake()
        gone = subprocess.Popen(["true"])
        gone.wait()
        names = {"gone": "%d.json.%d.77.0.tmp" % (gone.pid, gone.pid),
                 "live": "%d.json.%d.77.0.tmp" % (f.pid, f.pid),       # being written right now
                 "reused": "%d.json.%d.78.3.tmp" % (f.pid, f.pid),     # older than the process with its pid
                 "other": "notes.json.tmp"}                             # not gpureclaim's: left alone
        for n in names.values():
            with open(os.path.join(self.rundir, n), "w") as fh:
                fh.write('{"pid": ')
        hour_ago = time.time() - 3600
        os.utime(os.path.join(self.rundir, names["reused"]), (hour_ago, hour_ago))
        p = self.cmd("ps", check=0)
        left = set(os.listdir(self.rundir))
        self.assertNotIn(names["gone"], left)
        self.assertNotIn(names["reused"], left)
        self.assertIn(names["live"], left)
        self.assertIn(names["other"], left)
        self.assertIn("a temporary file of pid %d, which is gone" % gone.pid, p.stderr)
        self.assertIn(str(f.pid), p.stdout)

    def test_an_unsafe_run_directory_is_refused(self):
        f = self.fake()
        os.chmod(self.rundir, 0o755)
        for args in (("ps",), ("ps", "--json"), ("release", "--all"), ("top", "--iterations", "1")):
            p = self.cmd(*args, check=1)
            self.assertIn("is not a directory private to you", p.stderr)
            self.assertIn("refusing to use it: fix it with chmod 700 %s\n" % self.rundir, p.stderr, "the fix")
            self.assertEqual(p.stdout.strip("[]\n"), "", args)
        # A pid given: exit 1 as well (--help), not 3: whether it runs gpureclaim cannot be told.
        for args in (("release", str(f.pid)), ("release", "--signal", str(f.pid)), ("snapshot", str(f.pid))):
            p = self.cmd(*args, check=1)
            self.assertIn("not a directory private to you", p.stderr, args)
            self.assertNotIn("not running gpureclaim", p.stderr, args)
        out = json.loads(self.cmd("release", "--json", str(f.pid), check=1).stdout)
        self.assertEqual((out[0]["ok"], out[0]["via"]), (False, None))
        self.assertIn("run directory %s is refused" % self.rundir, out[0]["error"])
        self.assertEqual(self.received(), [])
        for mode in (0o750, 0o707, 0o710, 0o701):  # any group or other bit, readable or not
            os.chmod(self.rundir, mode)
            self.assertIn("is not a directory private to you", self.cmd("ps", check=1).stderr, oct(mode))
            self.assertIn("not a directory private to you", self.cmd("release", str(f.pid), check=1).stderr,
                          oct(mode))
        self.assertEqual(self.received(), [])
        os.chmod(self.rundir, 0o700)
        if os.geteuid() == 0:  # someone else's directory, even private, is not ours to trust
            os.chown(self.rundir, 65534, 65534)
            err = self.cmd("ps", check=1).stderr
            self.assertIn("owner uid 65534", err)
            self.assertIn("it belongs to uid 65534; set GPURECLAIM_RUNDIR to a directory of yours", err)
            os.chown(self.rundir, 0, 0)
        link = os.path.join(self.tmp, "link")
        os.symlink(self.rundir, link)
        self.assertIn("it is a symbolic link", self.cmd("ps", check=1, env=dict(self.env, GPURECLAIM_RUNDIR=link)).stderr)

    def test_no_run_directory_yet(self):
        self.assertIn("no process of yours", self.cmd("ps", check=0).stdout)
        self.assertEqual(self.ps_json(), [])
        self.cmd("release", "--all", check=0)

    # ---- usage ----

    def test_usage_and_exit_statuses(self):
        h = self.cmd("--help", check=0).stdout
        for word in ("run", "ps", "release", "snapshot", "top", "--prometheus", "Exit status", "3  no such process"):
            self.assertIn(word, h)
        # Subcommands with options of their own print their own help (test_usage.py checks each).
        self.assertIn("usage: gpureclaim release", self.cmd("release", "--help", check=0).stdout)
        self.assertEqual(self.cmd("--version", check=0).stdout, "gpureclaim 0.1.0\n")
        self.cmd(check=2)
        self.cmd("frobnicate", check=2)
        self.cmd("release", check=2)
        self.cmd("release", "--all", "1", check=2)
        self.cmd("release", "12x", check=2)
        self.cmd("release", "--what", "bogus", "1", check=2)
        self.cmd("release", "--timeout", "-1", "1", check=2)
        self.cmd("release", "--timeout", "0", "1", check=2)
        self.cmd("snapshot", check=2)
        self.cmd("snapshot", "1", "2", check=2)
        self.cmd("ps", "--bogus", check=2)
        self.cmd("ps", "--prometheus", check=2)
        # Each mistake is named for what it is.
        for args, says in ((("release",), "give the pids to release, or --all"),
                           (("release", "--all", "1"), "give pids or --all, not both"),
                           (("release", "--bogus", "1"), "unknown option: --bogus"),
                           (("release", "12x"), "not a pid: 12x"),
                           (("release", "--timeout", "1e9", "1"), "at most 86400"),
                           (("snapshot", "123", "--bogus"), "unknown option: --bogus"),
                           (("snapshot", "abc"), "not a pid: abc"),
                           (("snapshot", "1", "2"), "one pid at a time"),
                           (("ps", "--prometheus="), "--prometheus needs a file"),
                           (("ps", "--json", "--prometheus", "x.prom"), "--json and --prometheus are two formats")):
            self.assertIn(says, self.cmd(*args, check=2).stderr, args)

    # ---- run ----

    def dummy_library(self):
        """A file named like the library with an ELF header and nothing else: the loader skips it with a
        warning, so any program runs."""
        d = os.path.join(self.tmp, "lib")
        os.makedirs(d, exist_ok=True)
        path = os.path.join(d, "libgpureclaim.so.0")
        with open(path, "wb") as f:
            f.write(b"\x7fELF")
        return path

    def run_env(self, *run_args, preload=None, extra=None):
        env = dict(self.env, GPURECLAIM_LIBRARY=self.dummy_library(), **(extra or {}))
        env.pop("LD_PRELOAD", None)
        if preload is not None:
            env["LD_PRELOAD"] = preload
        p = self.cmd("run", *run_args, "--", "sh", "-c", "env", env=env, check=0)
        return dict(line.split("=", 1) for line in p.stdout.splitlines() if "=" in line)

    def test_run_maps_options_to_variables(self):
        rundir = os.path.join(self.tmp, "newrun")  # new, in an existing directory: the library can create it
        log = os.path.join(self.tmp, "y.log")
        env = self.run_env("--signal", "RTMIN+2", "--on-signal", "all", "--oom-retry", "3", "--log", log,
                           "--rundir", rundir, "--leak-report", "--backtrace", "--verbose=2", "--no-status",
                           "--disable")
        self.assertEqual({k: v for k, v in env.items() if k.startswith("GPURECLAIM_") and k != "GPURECLAIM_LIBRARY"},
                         {"GPURECLAIM_SIGNAL": "RTMIN+2", "GPURECLAIM_ON_SIGNAL": "all", "GPURECLAIM_OOM_RETRY": "3",
                          "GPURECLAIM_LOG": log, "GPURECLAIM_RUNDIR": rundir,
                          "GPURECLAIM_LEAK_REPORT": "1", "GPURECLAIM_BACKTRACE": "1", "GPURECLAIM_VERBOSE": "2",
                          "GPURECLAIM_STATUS": "0", "GPURECLAIM_DISABLE": "1"})
        self.assertEqual(self.run_env("--signal=off")["GPURECLAIM_SIGNAL"], "off")
        self.assertEqual(self.run_env("--verbose=01")["GPURECLAIM_VERBOSE"], "01", "a valid spelling runs CMD")
        self.assertEqual(self.run_env("--rundir=" + self.rundir)["GPURECLAIM_RUNDIR"], self.rundir, "an existing one")
        open_dir = os.path.join(self.tmp, "open")
        os.mkdir(open_dir, 0o755)
        os.chmod(open_dir, 0o755)
        for bad in (["--signal", "USR7"], ["--on-signal", "everything"], ["--oom-retry", "17"],
                    ["--rundir", "relative"], ["--rundir", open_dir], ["--rundir", "/nonexistent/parent/run"],
                    ["--rundir", self.dummy_library()], ["--verbose=3"], ["--verbose=x"], ["--bogus"], ["--log"],
                    ["--log", "/nonexistent/dir/x.log"], ["--log", self.tmp + "/nodir/x.log"], ["--log", self.tmp]):
            p = self.cmd("run", *bad, "--", "true")
            self.assertEqual(p.returncode, 2, bad)
            self.assertTrue("bad value for" in p.stderr or "unknown option" in p.stderr or "needs a value" in p.stderr,
                            (bad, p.stderr))
        self.assertIn("expected 0, 1 or 2", self.cmd("run", "--verbose=3", "--", "true").stderr)
        self.assertIn("mode 0700", self.cmd("run", "--rundir", open_dir, "--", "true").stderr)
        self.assertIn("fix it with chmod 700 %s)" % open_dir, self.cmd("run", "--rundir", open_dir, "--", "true").stderr)
        self.assertIn("a file you can write", self.cmd("run", "--log", "/nonexistent/x", "--", "true").stderr)
        self.assertEqual(self.run_env("--log", "/dev/null")["GPURECLAIM_LOG"], "/dev/null", "a device is a file")
        # The same values in the environment reach the program too: refused the same way.
        for var, val in (("GPURECLAIM_RUNDIR", open_dir), ("GPURECLAIM_VERBOSE", "7"),
                         ("GPURECLAIM_LOG", "/nonexistent/dir/x.log"), ("GPURECLAIM_SIGNAL", "USR7")):
            p = self.cmd("run", "--", "sh", "-c", "echo ran", env=dict(self.env, **{var: val}), check=2)
            self.assertIn("bad value in the environment: %s=%s" % (var, val), p.stderr)
            self.assertNotIn("ran", p.stdout)
        # A misspelt variable would be ignored by the library without a word: refused, named. The command's own
        # GPURECLAIM_LIBRARY is not the library's, and is fine.
        for var in ("GPURECLAIM_LEAK_REPORTS", "GPURECLAIM_", "GPURECLAIM_" + "X" * 80):
            p = self.cmd("run", "--", "sh", "-c", "echo ran", env=dict(self.env, **{var: "1"}), check=2)
            self.assertIn("unknown variable in the environment: %s" % var, p.stderr)
            self.assertNotIn("ran", p.stdout)
        self.assertEqual(self.run_env(extra={"GPURECLAIM_LEAK_REPORT": "1"})["GPURECLAIM_LEAK_REPORT"], "1")
        # The default run directory is judged as a given one: refused if the library would refuse it, fine if
        # it does not exist yet (the library creates it) or is not used.
        xdg = os.path.join(self.tmp, "xdg")
        os.mkdir(xdg, 0o700)
        default = os.path.join(xdg, "gpureclaim")
        os.mkdir(default, 0o755)
        os.chmod(default, 0o755)
        denv = dict(self.env, XDG_RUNTIME_DIR=xdg, GPURECLAIM_LIBRARY=self.dummy_library())
        denv.pop("GPURECLAIM_RUNDIR")
        denv.pop("LD_PRELOAD", None)
        p = self.cmd("run", "--", "sh", "-c", "echo ran", env=denv, check=2)
        self.assertIn("bad run directory %s (the default; GPURECLAIM_RUNDIR is not set)" % default, p.stderr)
        self.assertIn("mode 0755", p.stderr)
        self.assertIn("fix it with chmod 700 %s" % default, p.stderr)
        self.assertNotIn("ran", p.stdout)
        self.assertEqual(self.cmd("run", "--no-status", "--", "sh", "-c", "echo ran", env=denv, check=0).stdout,
                         "ran\n")
        os.chmod(default, 0o700)
        self.assertEqual(self.cmd("run", "--", "sh", "-c", "echo ran", env=denv, check=0).stdout, "ran\n")
        os.rmdir(default)
        self.assertEqual(self.cmd("run", "--", "sh", "-c", "echo ran", env=denv, check=0).stdout, "ran\n")
        # A relative log is the user's, not the program's working directory's.
        wd = os.path.join(self.tmp, "wd")
        os.mkdir(wd)
        env = dict(self.env, GPURECLAIM_LIBRARY=self.dummy_library())
        env.pop("LD_PRELOAD", None)
        p = subprocess.run([CMD, "run", "--log", "rel.log", "--", "sh", "-c", "cd / && echo $GPURECLAIM_LOG"],
                           capture_output=True, text=True, env=env, cwd=wd, timeout=60)
        self.assertEqual(p.stdout.strip(), os.path.join(os.path.realpath(wd), "rel.log"), p.stderr)
        # Standard error as the library spells it (src/base/options.c): not a file named "-" in the cwd. An
        # unwritable cwd (for all but root) shows it too: a file there would be refused.
        os.chmod(wd, 0o500)
        try:
            for spelling in ("-", "STDERR", "Stderr", "stderr"):
                for how in (["--log", spelling], ["--log=" + spelling]):
                    p = subprocess.run([CMD, "run", *how, "--", "sh", "-c", "echo $GPURECLAIM_LOG"],
                                       capture_output=True, text=True, env=env, cwd=wd, timeout=60)
                    self.assertEqual((p.returncode, p.stdout.strip()), (0, spelling), (how, p.stderr))
                p = subprocess.run([CMD, "run", "--", "sh", "-c", "echo $GPURECLAIM_LOG"], capture_output=True,
                                   text=True, env=dict(env, GPURECLAIM_LOG=spelling), cwd=wd, timeout=60)
                self.assertEqual((p.returncode, p.stdout.strip()), (0, spelling), (spelling, p.stderr))
        finally:
            os.chmod(wd, 0o700)
        # Not a library: refused before the program runs, rather than a loader warning and a run without it.
        env = dict(self.env, GPURECLAIM_LIBRARY="/etc/passwd")
        p = self.cmd("run", "--", "sh", "-c", "echo ran", env=env, check=1)
        self.assertIn("/etc/passwd is not a shared library", p.stderr)
        self.assertNotIn("ran", p.stdout)
        fifo = os.path.join(self.tmp, "lib.fifo")  # nobody writes it: refused, not waited on
        os.mkfifo(fifo)
        p = self.cmd("run", "--", "true", env=dict(self.env, GPURECLAIM_LIBRARY=fifo), check=1, timeout=20)
        self.assertIn("%s is not a shared library" % fifo, p.stderr)
        # "--option=value" is accepted wherever "--option value" is; a missing value is named.
        self.cmd("release", "--timeout=0.5", "--what=cached", "2147483647", check=3)
        self.assertIn("--what needs a value", self.cmd("release", "1", "--what", check=2).stderr)
        self.assertIn("--timeout needs a value", self.cmd("snapshot", "1", "--timeout", check=2).stderr)
        self.cmd("top", "--iterations=1", "--interval=0.1", check=0)
        self.cmd("run", check=2)
        self.cmd("run", "--leak-report", "--", check=2)

    def test_run_prepends_the_library_to_ld_preload(self):
        lib = self.dummy_library()
        real = os.path.join(os.path.realpath(os.path.dirname(lib)), "libgpureclaim.so.0")
        self.assertEqual(self.run_env()["LD_PRELOAD"], real)
        self.assertEqual(self.run_env(preload="libfoo.so libbar.so")["LD_PRELOAD"], real + ":libfoo.so:libbar.so")
        self.assertEqual(self.run_env(preload="/usr/lib/libasan.so.8:libfoo.so")["LD_PRELOAD"],
                         "/usr/lib/libasan.so.8:" + real + ":libfoo.so", "sanitizer runtimes stay first")
        self.assertEqual(self.run_env(preload="libfoo.so:" + real)["LD_PRELOAD"], real + ":libfoo.so",
                         "a nested run does not preload it twice")
        self.assertEqual(self.run_env(preload="/opt/other/libgpureclaim.so.0:libfoo.so:./libgpureclaim.so")["LD_PRELOAD"],
                         real + ":libfoo.so", "nor another copy preloaded by hand")
        self.assertEqual(self.run_env(preload="/x/libgpureclaim.so.0:/usr/lib/libasan.so.8:libfoo.so")["LD_PRELOAD"],
                         "/usr/lib/libasan.so.8:" + real + ":libfoo.so", "a dropped copy does not push it before ASan")
        self.assertEqual(self.run_env(preload="libgpureclaimx.so:/x/libgpureclaim")["LD_PRELOAD"],
                         real + ":libgpureclaimx.so:/x/libgpureclaim", "other names stay")

    def test_run_without_dashes_and_its_exit_status(self):
        env = dict(self.env, GPURECLAIM_LIBRARY=self.dummy_library())
        self.assertEqual(self.cmd("run", "sh", "-c", "exit 7", env=env).returncode, 7)
        self.assertEqual(self.cmd("run", "--", "/nonexistent/program", env=env).returncode, 127)
        p = self.cmd("run", "--", "true", env=dict(self.env, GPURECLAIM_LIBRARY="/nonexistent/libgpureclaim.so.0"))
        self.assertEqual(p.returncode, 1)
        self.assertIn("GPURECLAIM_LIBRARY", p.stderr)

    def test_run_finds_the_library_beside_the_command(self):
        """The installed layout, <prefix>/bin/gpureclaim and <prefix>/lib*/libgpureclaim.so.0, built here."""
        prefix = os.path.join(self.tmp, "prefix")
        os.makedirs(os.path.join(prefix, "bin"))
        os.makedirs(os.path.join(prefix, "lib"))
        shutil.copy(CMD, os.path.join(prefix, "bin", "gpureclaim"))
        with open(os.path.join(prefix, "lib", "libgpureclaim.so.0.1.0"), "wb") as f:
            f.write(b"\x7fELF")  # an ELF header: enough for the command, skipped by the loader
        os.symlink("libgpureclaim.so.0.1.0", os.path.join(prefix, "lib", "libgpureclaim.so.0"))
        env = dict(self.env)
        env.pop("GPURECLAIM_LIBRARY", None)
        env.pop("LD_PRELOAD", None)
        p = subprocess.run([os.path.join(prefix, "bin", "gpureclaim"), "run", "--", "sh", "-c", "echo $LD_PRELOAD"],
                           capture_output=True, text=True, env=env, timeout=30)
        self.assertEqual(p.stdout.strip(), os.path.join(os.path.realpath(prefix), "lib", "libgpureclaim.so.0"),
                         p.stderr)
        os.unlink(os.path.join(prefix, "lib", "libgpureclaim.so.0"))
        p = subprocess.run([os.path.join(prefix, "bin", "gpureclaim"), "run", "--", "true"], capture_output=True,
                           text=True, env=env, timeout=30)
        self.assertEqual(p.returncode, 1)
        self.assertIn("cannot find libgpureclaim.so.0", p.stderr)


if __name__ == "__main__":
    unittest.main(verbosity=2)

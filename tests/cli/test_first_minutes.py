"""What a new user meets first: each subcommand's --help and its refusal of a bad option, a relative
GPURECLAIM_RUNDIR refused by the command and by the library, a library quiet on the program's stderr unless
asked, one "two copies" warning only where CUDA starts, and a `release --timeout` that says truthfully whether
the release was withdrawn or goes on (and shows its progress on a terminal). (`run` without a CUDA driver:
test_no_driver.sh.)

Environment (set by CTest): GR_CMD (the command), GR_HOLD (tests/cli/hold), GR_LIB (libgpureclaim.so.0),
GR_PRELOAD (what LD_PRELOAD must hold first in sanitizer builds), LD_LIBRARY_PATH (the simulator).
"""
import json
import os
import pty
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "common"))
import control  # noqa: E402

CMD = os.environ["GR_CMD"]
HOLD = os.environ["GR_HOLD"]
LIB = os.environ["GR_LIB"]
SAN = os.environ.get("GR_PRELOAD", "")


def run(*args, env=None, check=None, **kw):
    p = subprocess.run([CMD, *args], capture_output=True, text=True, env=env, timeout=120, **kw)
    if check is not None:
        assert p.returncode == check, (args, p.returncode, p.stdout, p.stderr)
    return p


def preload(*libs):
    return ":".join(x for x in (SAN, *libs) if x)


class Held:
    """tests/cli/hold under `gpureclaim run` (or started as given): memory held until its stdin closes."""

    def __init__(self, env, argv=None):
        argv = argv or [CMD, "run", "--", HOLD]
        self.p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                  text=True, env=env)
        line = self.p.stdout.readline()
        assert line.startswith("ready "), (line, self.p.stderr.read() if self.p.poll() is not None else "")
        self.pid = int(line.split()[1])

    def close(self):
        """Ends it; returns its standard error."""
        if self.p.poll() is None:
            self.p.stdin.close()
        self.p.wait(timeout=60)
        err = self.p.stderr.read()
        self.p.stdout.close()
        self.p.stderr.close()
        return err


class FirstMinutes(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="grfirst")
        self.rundir = os.path.join(self.tmp, "run")
        self.env = dict(os.environ, GPURECLAIM_RUNDIR=self.rundir)
        self.env.pop("GPURECLAIM_LOG", None)
        self.env.pop("GPURECLAIM_VERBOSE", None)
        if SAN:
            self.env["LD_PRELOAD"] = SAN
        self.held = []

    def tearDown(self):
        for h in self.held:
            if h.p.poll() is None:
                h.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def hold(self, env=None, argv=None):
        h = Held(env or self.env, argv)
        self.held.append(h)
        return h

    def status(self, h):
        with open(os.path.join(self.rundir, "%d.json" % h.pid)) as f:
            return json.load(f)

    def served_all_before(self, h):
        """Returns once h's worker answered a ping made now: it serves clients in turn, so every request made
        before has been dealt with. (No deadline decides.)"""
        data = control.request(self.status(h)["socket"], b"ping\n", 120)  # 120 s: a hang guard
        self.assertTrue(json.loads(data)["ok"])

    # ---- --help and bad options ----

    def test_each_subcommand_has_its_help(self):
        for sub, says in (("run", ["--signal SIG", "--rundir DIR", "--verbose[=N]", "-l, --log PATH"]),
                          ("release", ["--all", "-t, --timeout S", "withdrawn", "--what WHAT"]),
                          ("snapshot", ["--leaks", "-t, --timeout S", "-j, --json"])):
            for args in ((sub, "--help"), (sub, "-h"), ("help", sub)):
                p = run(*args, check=0)
                self.assertTrue(p.stdout.startswith("usage: gpureclaim %s" % sub), (args, p.stdout))
                self.assertIn("Exit status", p.stdout, args)
                for word in says:
                    self.assertIn(word, p.stdout, (args, word))
                self.assertEqual(p.stderr, "", args)
        # `run`'s own options end at the program, whose --help is its own.
        p = run("run", "--", "sh", "-c", 'echo "$1"', "sh", "--help", check=0, env=self.env)
        self.assertEqual(p.stdout, "--help\n")

    def test_a_bad_option_is_refused_and_named(self):
        for args, says in ((("run", "--bogus", "true"), "run: unknown option: --bogus"),
                           (("run", "-x", "true"), "run: unknown option: -x"),
                           (("run", "--log"), "run: --log needs a value"),
                           (("run", "--disable=1", "true"), "run: --disable takes no value"),
                           (("release", "--bogus", "1"), "release: unknown option: --bogus"),
                           (("release", "-jx", "1"), "release: unknown option: -x"),
                           (("release", "1", "-t"), "release: -t needs a value"),
                           (("release", "1", "--timeout"), "release: --timeout needs a value"),
                           (("snapshot", "1", "--leaks=yes"), "snapshot: --leaks takes no value"),
                           (("snapshot", "--bogus", "1"), "snapshot: unknown option: --bogus")):
            p = run(*args, check=2)
            self.assertIn(says, p.stderr, args)
            self.assertIn("(see gpureclaim %s --help)" % args[0], p.stderr, args)
            self.assertEqual(p.stdout, "", args)
        # What was maybe meant, said with the refusal: a subcommand, --version, an option, a variable.
        for args, says in ((("rel", "1"), "unknown command: rel (did you mean gpureclaim release?)"),
                           (("relase",), "unknown command: relase (did you mean gpureclaim release?)"),
                           (("version",), "(did you mean gpureclaim --version?)"),
                           (("-V",), "(did you mean gpureclaim --version?)"),
                           (("release", "--tiemout", "1", "1"), "release: unknown option: --tiemout (did you mean -t "
                                                               "or --timeout?)"),
                           (("ps", "-s", "held"), "ps: unknown option: -s (did you mean -S or --sort?)")):
            p = run(*args, check=2)
            self.assertIn(says, p.stderr, args)
        p = run("run", "--", "true", check=2, env=dict(self.env, GPURECLAIM_LEAK_REPORTS="1"))
        self.assertIn("unknown variable in the environment: GPURECLAIM_LEAK_REPORTS (did you mean "
                      "GPURECLAIM_LEAK_REPORT?", p.stderr)
        self.assertIn("gpureclaim run --help lists every variable", p.stderr)
        # ... and run --help does list every variable either reads (those without an option too).
        h = run("run", "--help", check=0).stdout
        for var in ("GPURECLAIM_PYTHON", "GPURECLAIM_SLEEP", "GPURECLAIM_WAKE_TIMEOUT", "GPURECLAIM_SLEEP_IDLE",
                    "GPURECLAIM_LIBRARY", "GPURECLAIM_SIGNAL", "GPURECLAIM_PEERS"):
            self.assertIn(var, h)
        # `run --verbose 2 CMD` ran a program named "2": the level goes after "=", and that is what it says.
        marker = os.path.join(self.tmp, "ran")
        for args in (("--verbose", "2"), ("-v", "1")):
            p = run("run", *args, "sh", "-c", "touch " + marker, check=2, env=self.env)
            self.assertIn("run: --verbose takes its value after \"=\": give --verbose=%s" % args[1], p.stderr)
            self.assertFalse(os.path.exists(marker))
        p = run("run", "--verbose=1", "--", "sh", "-c", "echo $GPURECLAIM_VERBOSE", check=0, env=self.env)
        self.assertEqual(p.stdout.strip(), "1")
        # GNU conventions: short options, clusters, --opt=value, options after operands, abbreviations.
        run("release", "-aj", check=0, env=self.env)
        self.assertEqual(json.loads(run("release", "-a", "--json", check=0, env=self.env).stdout), [])
        run("snapshot", "2147483647", "-jl", "--tim=1", check=3, env=self.env)
        run("release", "2147483647", "-t", "1", "-w", "cached", check=3, env=self.env)

    # ---- a relative run directory ----

    def test_a_relative_rundir_is_refused_by_the_command(self):
        env = dict(self.env, GPURECLAIM_RUNDIR="run")
        for args in (("ps",), ("release", "--all"), ("snapshot", "1"), ("top", "--iterations", "1"),
                     ("run", "--", "true")):
            p = run(*args, env=env, check=2, cwd=self.tmp)
            self.assertIn("GPURECLAIM_RUNDIR=run is not an absolute path", p.stderr, args)
        p = run("run", "--rundir", "run", "--", "true", env=self.env, check=2)
        self.assertIn("bad value for GPURECLAIM_RUNDIR: run", p.stderr)

    def test_a_relative_rundir_is_refused_by_the_library(self):
        # The default directory holds another job's status file: nothing there may be touched, and this
        # process must not be listed there.
        xdg = os.path.join(self.tmp, "xdg")
        default = os.path.join(xdg, "gpureclaim")
        os.makedirs(default, 0o700)
        os.chmod(xdg, 0o700)
        os.chmod(default, 0o700)
        other = os.path.join(default, "999999.json")
        with open(other, "w") as f:
            f.write("{}")
        wd = os.path.join(self.tmp, "wd")
        os.mkdir(wd)
        env = dict(self.env, GPURECLAIM_RUNDIR="rel", XDG_RUNTIME_DIR=xdg)
        h = Held(env, [HOLD])  # linked with the library: no `run` (which refuses it, as tested above)
        self.held.append(h)
        h.p.stdin.close()
        err = h.close()
        self.assertEqual(h.p.returncode, 0, err)
        self.assertIn('GPURECLAIM_RUNDIR="rel" is not valid (expected an absolute directory path); refusing it', err)
        self.assertEqual(err.count("GPURECLAIM_RUNDIR"), 1, err)
        self.assertEqual(os.listdir(default), ["999999.json"], "the default directory was used")
        self.assertFalse(os.path.exists(os.path.join(wd, "rel")))
        self.assertFalse(os.path.exists(os.path.join(os.getcwd(), "rel")))

    # ---- quiet by default ----

    def release_and_close(self, env):
        h = self.hold(env)
        p = run("release", str(h.pid), env=self.env, check=0)
        self.assertIn("released 69.0 MiB", p.stdout)
        return h.close()

    def test_the_library_is_quiet_unless_asked(self):
        err = self.release_and_close(self.env)
        self.assertEqual(err, "", "a release wrote on the program's stderr without being asked")
        # Asked: JSON lines on stderr, or in a file; one human line at GPURECLAIM_VERBOSE=1.
        err = self.release_and_close(dict(self.env, GPURECLAIM_LOG="stderr"))
        lines = [json.loads(x) for x in err.splitlines() if x.startswith("{")]
        self.assertEqual([(x["event"], x["report"]["cached_bytes"]) for x in lines], [("release", 64 << 20)], err)
        log = os.path.join(self.tmp, "releases.log")
        err = self.release_and_close(dict(self.env, GPURECLAIM_LOG=log))
        self.assertEqual(err, "")
        with open(log) as f:
            self.assertEqual([json.loads(x)["event"] for x in f], ["release"])
        err = self.release_and_close(dict(self.env, GPURECLAIM_VERBOSE="1"))
        released = [x for x in err.splitlines() if "released" in x]
        self.assertEqual(len(released), 1, err)
        self.assertRegex(released[0], r"^gpureclaim\[\d+\]: released 69\.0 MiB in [0-9.]+ ms \(cached 64\.0 MiB, "
                                      r"orphaned 5\.0 MiB in 1 block\), asked by the gpureclaim command$")
        self.assertNotIn("{", err)

    def test_two_copies_are_said_once_where_cuda_starts(self):
        copy_dir = os.path.join(self.tmp, "copy")
        os.mkdir(copy_dir)
        copy = os.path.join(copy_dir, "libgpureclaim.so.0")
        shutil.copy(LIB, copy)
        env = dict(self.env, LD_PRELOAD=preload(LIB, copy))
        p = subprocess.run(["true"], env=env, capture_output=True, text=True, timeout=60)
        self.assertEqual((p.returncode, p.stderr), (0, ""), "a program that never uses CUDA heard of it")
        p = subprocess.run(["sh", "-c", "true"], env=env, capture_output=True, text=True, timeout=60)
        self.assertEqual((p.returncode, p.stderr), (0, ""))
        # Where CUDA starts: once, naming both (hold is linked with the library too: it comes after both).
        h = Held(env, [HOLD])
        self.held.append(h)
        err = h.close()
        self.assertEqual(err.count("two copies of libgpureclaim"), 1, err)
        self.assertIn("passes every call through", err)

    # ---- release --timeout ----

    def gated(self):
        gate = os.path.join(self.tmp, "gate")
        open(gate, "w").close()
        return gate, self.hold(dict(self.env, GR_HOLD_GATE=gate))

    def test_a_timeout_after_the_release_began_says_it_goes_on(self):
        gate, h = self.gated()
        p = run("release", str(h.pid), "--timeout", "0.5", env=self.env, check=1)
        self.assertIn("the release had begun", p.stderr)
        self.assertIn("the process finishes it", p.stderr)
        self.assertNotIn("withdrawn", p.stderr)
        self.assertEqual(self.status(h)["releases"], 0)
        os.unlink(gate)
        self.served_all_before(h)
        self.assertEqual(self.status(h)["releases"], 1, "the release the command said goes on did not happen")
        self.assertIsNone(h.p.poll(), "the answer to a client that had left ended the program")
        # With --json, the same words.
        open(gate, "w").close()
        out = json.loads(run("release", str(h.pid), "--timeout", "0.5", "--json", env=self.env, check=1).stdout)
        self.assertIn("the release had begun", out[0]["error"])
        os.unlink(gate)
        self.served_all_before(h)
        self.assertEqual(self.status(h)["releases"], 2)

    def test_a_timeout_before_the_release_began_withdraws_it(self):
        h = self.hold()
        os.kill(h.pid, signal.SIGSTOP)
        # kill() returns before the group stop has reached every thread: wait until all are stopped, or the
        # worker could still take the request up (a hang guard, not a deadline that decides).
        guard = time.monotonic() + 60
        while time.monotonic() < guard and not all(
                open("/proc/%d/task/%s/stat" % (h.pid, t)).read().rsplit(")", 1)[1].split()[0] in "Tt"
                for t in os.listdir("/proc/%d/task" % h.pid)):
            time.sleep(0.01)
        try:
            p = run("release", str(h.pid), "--timeout", "0.5", env=self.env, check=1)
        finally:
            os.kill(h.pid, signal.SIGCONT)
        self.assertIn("the request is withdrawn: the process will not run it", p.stderr)
        self.served_all_before(h)
        self.assertEqual(self.status(h)["releases"], 0, "a release the command said was withdrawn happened")

    def test_a_long_wait_shows_progress_on_a_terminal(self):
        gate, h = self.gated()
        # On a terminal: a line redrawn in place (every 0.2 s once a second has passed), erased at the end. The
        # release waits on the gate until the command gave up: its wait is the whole 4 s whatever the load.
        pid, fd = pty.fork()
        if pid == 0:
            os.execve(CMD, [CMD, "release", str(h.pid), "--timeout", "4"], self.env)
        out = b""
        while True:
            r, _, _ = select.select([fd], [], [], 120)
            if not r:
                break
            try:
                chunk = os.read(fd, 4096)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
        _, st = os.waitpid(pid, 0)
        os.close(fd)
        text = out.decode(errors="replace")
        self.assertEqual(os.waitstatus_to_exitcode(st), 1, text)
        self.assertRegex(text, r"\rgpureclaim: waiting for %d: [1-4] s of 4 s \(its release has begun\)\x1b\[K" % h.pid)
        self.assertIn("\r\x1b[K", text)
        self.assertIn("the release had begun", text)
        os.unlink(gate)
        self.served_all_before(h)
        # Not on a terminal: nothing but the result.
        open(gate, "w").close()
        p = run("release", str(h.pid), "--timeout", "1.5", env=self.env, check=1)
        self.assertIn("the release had begun", p.stderr)
        self.assertNotIn("waiting for", p.stderr)
        os.unlink(gate)
        self.served_all_before(h)

if __name__ == "__main__":
    unittest.main(verbosity=2)

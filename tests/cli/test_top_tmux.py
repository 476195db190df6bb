"""`gpureclaim top` as a person sees it, in a real terminal: tmux runs it in an 80x24 pane, keys are sent with
`send-keys` and the screen is read back with `capture-pane`. Against a program holding memory on the simulator
(tests/cli/hold under `gpureclaim run`).

Environment (set by CTest): as test_command.py. Skips, saying why, only where tmux is not installed
(scripts/deps.sh installs it, so CI has it).
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unicodedata
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_command import CMD, HOLD, Held  # noqa: E402

TMUX = shutil.which("tmux")


class TopInTmux(unittest.TestCase):
    def setUp(self):
        if not TMUX:
            self.skipTest("tmux is not installed (scripts/deps.sh installs it)")
        self.tmp = tempfile.mkdtemp(prefix="grtop")
        self.rundir = os.path.join(self.tmp, "run")
        self.env = dict(os.environ, GPURECLAIM_RUNDIR=self.rundir, GPURECLAIM_LOG=os.path.join(self.tmp, "log"))
        if os.environ.get("GR_PRELOAD"):
            self.env["LD_PRELOAD"] = os.environ["GR_PRELOAD"]
        self.held = Held(self.env)
        self.sock = os.path.join(self.tmp, "tmux.sock")  # a server of this test's own, never the user's
        # tmux itself gets no preload; the command, inside the pane, gets the run directory and the simulator.
        self.tmux_env = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "TMUX")}
        self.tmux_env["TERM"] = "xterm"

    def tearDown(self):
        if not TMUX:
            return
        subprocess.run([TMUX, "-S", self.sock, "kill-server"], capture_output=True, env=self.tmux_env)
        self.held.close()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def tmux(self, *args):
        p = subprocess.run([TMUX, "-S", self.sock, *args], capture_output=True, text=True, env=self.tmux_env,
                           timeout=30)
        self.assertEqual(p.returncode, 0, (args, p.stderr))
        return p.stdout

    def start(self, *top_args, width=80, height=24, command="top", extra_env=()):
        inner = ["env", "GPURECLAIM_RUNDIR=" + self.rundir, "LD_LIBRARY_PATH=" + os.environ.get("LD_LIBRARY_PATH", ""),
                 "LC_ALL=C.UTF-8", "ASAN_OPTIONS=detect_leaks=1",  # sanitizer builds: a leak in top fails
                 *extra_env, CMD, command, *top_args]
        # The shell survives ^C (a trap: top, exec'd, gets the default action back), then says how top ended and
        # whether the terminal is back in its normal mode (canonical, echoing).
        shell = ("trap : INT; " + " ".join("'%s'" % a.replace("'", "'\\''") for a in inner) +
                 "; echo TOP-EXITED $?; stty -a | grep -q -- ' icanon' && stty -a | grep -q -- ' echo ' &&"
                 " echo TERMINAL-RESTORED; sleep 600")
        self.tmux("-u", "-f", "/dev/null", "new-session", "-d", "-x", str(width), "-y", str(height), "-c", self.tmp,
                  "sh", "-c", shell)

    def screen(self):
        """The pane's lines, a line the terminal wrapped joined back (-J): one longer than the pane wrapped."""
        return self.tmux("capture-pane", "-p", "-J").rstrip("\n").split("\n")

    def wait_for(self, text, why):
        """The screen once it shows text; fails after 60 s (a bound for a stuck program, not a timing check)."""
        deadline = time.monotonic() + 60
        while True:
            lines = self.screen()
            if any(text in line for line in lines):
                return lines
            if time.monotonic() > deadline:
                self.fail("%s: %r never appeared on the screen:\n%s" % (why, text, "\n".join(lines)))
            time.sleep(0.05)

    def check_fits(self, lines, width, top=True):
        for line in lines:
            cells = sum(2 if unicodedata.east_asian_width(c) in "WF" else 1 for c in line.rstrip())
            self.assertLessEqual(cells, width, "wrapped: %r" % line)
        if top:  # the header stays on the first line
            self.assertTrue(lines[0].startswith("gpureclaim top"), lines[0])

    def test_keys_release_snapshot_sort_quit(self):
        pid = self.held.pid
        self.start("--interval", "0.2")
        lines = self.wait_for("%d 0 " % pid, "the process's row")
        self.check_fits(lines, 80)
        self.assertIn("sorted by held", lines[0])
        self.assertTrue(any(l.split()[:2] == ["GPU", "UUID"] for l in lines), lines)
        self.assertTrue(any(l.split()[:3] == ["PID", "GPU", "HELD"] for l in lines), lines)
        self.assertIn("q quit", lines[-1])
        # Sort: the next key, then back.
        self.tmux("send-keys", ">")
        self.wait_for("sorted by cached", "the sort after >")
        self.tmux("send-keys", "<")
        self.wait_for("sorted by held", "the sort after <")
        # Release the selected process: the simulator's pool is given back, and the screen says how much.
        self.assertEqual(self.held.sim()[1], 64 << 20)
        self.tmux("send-keys", "r")
        lines = self.wait_for("%d released 69.0 MiB (cached 64.0 MiB, orphaned 5.0 MiB)" % pid, "the release")
        self.assertEqual(self.held.sim()[1], 0, "the pool was not trimmed")
        self.check_fits(lines, 80)
        # Snapshot it: a file in the current directory, the process's snapshot.
        self.tmux("send-keys", "s")
        self.wait_for("snapshot of %d written to gpureclaim-snapshot-%d-" % (pid, pid), "the snapshot")
        snaps = [n for n in os.listdir(self.tmp) if n.startswith("gpureclaim-snapshot-%d-" % pid)]
        self.assertEqual(len(snaps), 1, os.listdir(self.tmp))
        with open(os.path.join(self.tmp, snaps[0])) as f:
            snap = json.load(f)
        self.assertEqual(snap["pid"], pid)
        self.assertTrue(any(b["kind"] == "device" for b in snap["blocks"]))
        # Quit: top ends, exit status 0, and the terminal is the shell's again.
        self.tmux("send-keys", "q")
        self.wait_for("TOP-EXITED 0", "top ending on q")
        self.wait_for("TERMINAL-RESTORED", "the terminal's mode after q")

    def test_a_process_that_ends_leaves_the_screen_intact(self):
        """A listed process killed (its status file stays behind): top removes the file and says so on its message
        line. The note went to standard error, under ncurses: the terminal scrolled a line and every later frame
        landed a row off ("U7ED", the dead process still listed), for good."""
        other = Held(self.env)
        try:
            self.start("--interval", "0.2")
            self.wait_for(" 2 processes ", "both processes in the title")
            lines = self.wait_for("%d 0 " % other.pid, "the second process's row")
            os.kill(other.pid, signal.SIGKILL)
            other.p.wait(timeout=60)
            note = "removed the stale status file of pid %d (the process is gone)" % other.pid
            lines = self.wait_for(note, "the note on the message line")
            lines = self.wait_for(" 1 process ", "the title once the process is gone")
            self.assertTrue(lines[0].startswith("gpureclaim top - "), lines)
            self.assertEqual(lines[1], "")
            self.assertEqual(lines[2].split(), ["GPU", "UUID", "USED", "TOTAL", "HELD", "RELEASABLE", "OTHER"], lines)
            i = 3
            while lines[i].strip():
                self.assertRegex(lines[i], r"^\s*\d+ GPU-[0-9a-f]+\s+\S+ [KMG]?i?B\s", lines)
                i += 1
            self.assertEqual(lines[i + 1].split()[:3], ["PID", "GPU", "HELD"], lines)
            self.assertRegex(lines[i + 2], r"^\s*%d 0\s+72\.0 MiB\s" % self.held.pid, lines)
            self.assertFalse([l for l in lines if l.lstrip().startswith("%d " % other.pid)], lines)
            self.assertIn(note, lines[-1])
            self.assertEqual(len(lines), 24, "the pane scrolled")
            self.check_fits(lines, 80)
            # The next frames stay intact too (a space refreshes at once).
            self.tmux("send-keys", " ")
            lines = self.wait_for("q quit", "the key line after the note")
            self.assertTrue(lines[0].startswith("gpureclaim top - "), lines)
            self.assertEqual(lines[2].split()[:2], ["GPU", "UUID"], lines)
        finally:
            other.close()
        self.tmux("send-keys", "q")
        self.wait_for("TOP-EXITED 0", "top ending on q")

    def screen_escapes(self):
        """The pane with its attributes (colours) as escape sequences."""
        return self.tmux("capture-pane", "-p", "-e", "-J").rstrip("\n").split("\n")

    def test_help_key_scroll_and_colour(self):
        """h and ? show the keys (they said "unknown key"); Left/Right scroll the tables sideways, showing every
        column; a sleeping process's row is coloured, and NO_COLOR turns colour off; prose lines are cut at a
        word's end."""
        pid = self.held.pid
        self.start("--interval", "0.2", width=80, height=24)
        self.wait_for("%d 0 " % pid, "the process's row")
        for key in ("?", "h"):
            self.tmux("send-keys", key)
            lines = self.wait_for("scroll the tables sideways", "the help after %s" % key)
            self.assertIn("Keys", lines[2])
            self.check_fits(lines, 80)
            self.tmux("send-keys", "x")  # any key closes it
            self.wait_for("PID", "the table after the help")
        # At 80 columns PINNED and HOST are left out; scrolled, every column is there, from the 9th on.
        lines = self.screen()
        header = next(l for l in lines if l.split()[:2] == ["PID", "GPU"])
        self.assertNotIn("PINNED", header)
        self.tmux("send-keys", "Right")
        lines = self.wait_for("gpureclaim top (scrolled; Home: back) - ", "the title when scrolled")
        header = next(l for l in lines if "HELD" in l and "CACHED" in l)
        self.assertIn("PINNED", header)
        self.assertIn("HOST", header)
        self.check_fits(lines, 80)
        self.tmux("send-keys", "Home")
        self.wait_for("q quit", "the key line once back")
        lines = self.screen()
        self.assertNotIn("scrolled", lines[0])
        # Asleep: coloured (blue, 34); the key line cut at a word's end, not in the middle of one.
        subprocess.run([CMD, "sleep", str(pid)], env=self.env, check=True, capture_output=True, timeout=60)
        lines = self.wait_for(" sleeping ", "the sleeping row")
        row = next(l for l in self.screen_escapes() if "%d " % pid in l and "sleeping" in l)
        self.assertRegex(row, r"\x1b\[[0-9;]*34[;m]", "no colour on the sleeping row: %r" % row)
        self.tmux("send-keys", "q")
        self.wait_for("TOP-EXITED 0", "top ending on q")

    def test_no_colour_and_words_kept_whole(self):
        self.env["NO_COLOR"] = "1"
        subprocess.run([CMD, "sleep", str(self.held.pid)], env=self.env, check=True, capture_output=True, timeout=60)
        self.start("--interval", "0.2", width=50, height=16, extra_env=["NO_COLOR=1"])
        lines = self.wait_for(" sleeping", "the sleeping row")
        row = next(l for l in self.screen_escapes() if "%d " % self.held.pid in l)
        self.assertNotRegex(row, r"\x1b\[[0-9;]*3[0-7][;m]", "colour with NO_COLOR set: %r" % row)
        last = lines[-1].rstrip()
        self.assertTrue(last.endswith(" ..."), last)
        words = set("q quit  h help  r release  s snapshot  </> sort  up/down select  left/right scroll".split())
        self.assertTrue(set(last[:-4].split()) <= words, "a word cut in the middle: %r" % last)

    def test_fits_a_narrow_terminal_and_follows_a_resize(self):
        # A command line that is not ASCII: drawn as characters, and cut without wrapping either.
        name = os.path.join(self.tmp, "hold-\u8bad\u7ec3-" + "\u00e9" * 40)
        os.symlink(HOLD, name)
        wide = Held(self.env, program=name)
        try:
            self.start("--interval", "0.2", width=60, height=12)
            lines = self.wait_for("%d 0 " % self.held.pid, "the process's row")
            self.check_fits(lines, 60)
            self.assertIn("GPU-", "\n".join(lines))
            self.tmux("resize-window", "-x", "100", "-y", "30")
            lines = self.wait_for("hold-\u8bad\u7ec3-\u00e9", "the UTF-8 command line")
            self.check_fits(lines, 100)
        finally:
            wide.close()
        # Wider: the UUID is shown whole.
        lines = self.wait_for("GPU-", "the GPU line")
        deadline = time.monotonic() + 60
        while not any(len(w) == 40 and w.startswith("GPU-") for l in lines for w in l.split()):
            self.assertLess(time.monotonic(), deadline, "the whole UUID never appeared:\n" + "\n".join(lines))
            time.sleep(0.05)
            lines = self.screen()
        self.check_fits(lines, 100)
        # Smaller again: nothing of the wider frame is left behind (every cell is drawn anew on a resize).
        self.tmux("resize-window", "-x", "70", "-y", "14")
        deadline = time.monotonic() + 60
        while True:
            lines = self.screen()
            if len(lines) == 14 and lines[0].startswith("gpureclaim top") and lines[2].startswith("GPU UUID  "):
                break
            self.assertLess(time.monotonic(), deadline, "no frame at 70x14:\n" + "\n".join(lines))
            time.sleep(0.05)
        self.check_fits(lines, 70)
        self.assertFalse([l for l in lines if len(l.split()) > 0 and "GPU-" in l and len(l.rstrip()) > 70], lines)
        self.assertNotIn("HOST", "\n".join(lines), "a column of the wider frame was left behind")
        # ^C quits as q does.
        self.tmux("send-keys", "C-c")
        self.wait_for("TOP-EXITED 0", "top ending on ^C")
        self.wait_for("TERMINAL-RESTORED", "the terminal's mode after ^C")

    def test_ps_fits_80_columns(self):
        """ps on a terminal: every line, the footnote included, within its width."""
        self.start(command="ps")
        lines = self.wait_for("TOP-EXITED 0", "ps ending")
        self.assertTrue(any(l.lstrip().startswith("%d 0 " % self.held.pid) for l in lines), lines)
        self.assertTrue(any("context's own memory" in l for l in lines), lines)
        self.check_fits(lines, 80, top=False)


if __name__ == "__main__":
    unittest.main(verbosity=2)

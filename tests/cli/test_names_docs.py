#!/usr/bin/env python3
"""What C cannot generate, checked against the lists C is made from (src/base/names.h, src/base/options.h), as
tests/cli/layout.c prints them (`layout names`):

- docs/PROTOCOL.md's lists of kinds, block and sleep states and triggers;
- the name tables of python/gpureclaim/ and of the GPU tests (tests/gpu/: grshim.py's ctypes shim, the
  DEVICE_KINDS of the framework tests): the same numbers for the same names;
- docs/LIBRARY.md's table of variables: one row per option, none for a variable that is not one, its default first;
- gpureclaim(7): an entry per variable, none for one that is not (but the command's own GPURECLAIM_LIBRARY);
- gpureclaim(1): an entry per `run` option, naming the variable it sets;
- the bash and zsh completions: every `run` option, and exactly the ones that take a value as taking one (bash
  takes the word after any other for the program to run).

A new option or name missing from one of them fails here. Environment (set by CTest): GR_LAYOUT, GR_SOURCE_DIR.
"""
import importlib.util
import os
import re
import subprocess
import sys
import unittest

SRC = os.environ["GR_SOURCE_DIR"]


def layout_names():
    out = subprocess.run([os.environ["GR_LAYOUT"], "names"], capture_output=True, text=True, check=True).stdout
    lists, options = {}, {}
    for line in out.splitlines():
        f = line.split()
        if f[0] == "option":
            options[f[1]] = {"default": None if f[2] == "-" else f[2], "run": None if f[3] == "-" else f[3],
                             "how": f[4]}
        else:
            lists.setdefault(f[0], {})[int(f[1])] = f[2]
    return lists, options


LISTS, OPTIONS = layout_names()
RUN = {o["run"]: (name, o["how"]) for name, o in OPTIONS.items() if o["run"]}


def load(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)  # neither loads the library on import
    return mod


def read(*path):
    with open(os.path.join(SRC, *path)) as f:
        return f.read()


class NamesTest(unittest.TestCase):
    def test_lists_are_whole(self):
        self.assertEqual(len(LISTS["kind"]), 8)
        self.assertEqual(len(LISTS["trigger"]), 8)
        self.assertEqual(len(LISTS["state"]), 3)
        self.assertEqual(len(LISTS["sleep_state"]), 3)
        self.assertGreaterEqual(len(LISTS["api"]), 17)
        self.assertGreaterEqual(len(OPTIONS), 16)

    def check_module(self, mod, prefix):
        self.assertEqual(getattr(mod, prefix + "KINDS"), LISTS["kind"])
        self.assertEqual(getattr(mod, prefix + "STATES"), LISTS["state"])
        self.assertEqual(getattr(mod, prefix + "TRIGGERS"), LISTS["trigger"])
        self.assertEqual({n: getattr(mod, n.upper()) for n in LISTS["what"].values()},
                         {n: v for v, n in LISTS["what"].items()})

    def test_python_package(self):
        g = load(os.path.join(SRC, "python", "gpureclaim", "__init__.py"), "gpureclaim")
        self.check_module(g, "_")
        words = {n: v for v, n in LISTS["what"].items()}
        words.update({n: v for v, n in LISTS["what_alias"].items()})
        self.assertEqual(g._WHAT, words)
        self.assertEqual(g._SLEEP_STATES, LISTS["sleep_state"])
        # Its __version__ is the project's (it has no other source at run time: the package is plain files).
        version = re.search(r"project\(gpureclaim VERSION ([0-9.]+)", read("CMakeLists.txt")).group(1)
        self.assertEqual(g.__version__, version)

    def test_gpu_tests(self):
        self.check_module(load(os.path.join(SRC, "tests", "gpu", "grshim.py"), "grshim"), "")
        # The framework tests' DEVICE_KINDS: kinds that exist.
        found = 0
        for name in sorted(os.listdir(os.path.join(SRC, "tests", "gpu"))):
            if name.endswith(".py"):
                for m in re.finditer(r"(?m)^DEVICE_KINDS = \(([^)]*)\)", read("tests", "gpu", name)):
                    kinds = re.findall(r'"([a-z_]+)"', m.group(1))
                    self.assertTrue(kinds and set(kinds) <= set(LISTS["kind"].values()), (name, kinds))
                    found += 1
        self.assertGreaterEqual(found, 3)

    def test_protocol(self):
        """docs/PROTOCOL.md's lists of the names a program reads: every kind, block state and sleep state, and
        only triggers that exist."""
        text = re.sub(r"\s+", " ", read("docs", "PROTOCOL.md"))

        def words(start, end):
            i = text.index(start) + len(start)
            return set(re.findall(r"`([a-z_]+)`", text[i:text.index(end, i)]))

        self.assertEqual(words("`kind` is one of", ";"), set(LISTS["kind"].values()))
        self.assertEqual(words("`state` one of", "."), set(LISTS["state"].values()))
        self.assertEqual(words("`sleep` (also in the `stats` answer): `state` is", ";"),
                         set(LISTS["sleep_state"].values()))
        releases = words("`trigger` is one of", "(")
        sleeps = words("`trigger` is `api`,", ".") | {"api"}  # the sleep report's
        self.assertGreaterEqual(len(releases), 6)
        self.assertGreaterEqual(len(sleeps), 4)
        self.assertLessEqual(releases | sleeps, set(LISTS["trigger"].values()))


class OptionDocsTest(unittest.TestCase):
    def test_readme_table(self):
        text = read("docs", "LIBRARY.md")
        section = text[text.index("\n## Configuration\n"):]
        section = section[:section.index("\n## ", 1)]
        rows = dict(re.findall(r"(?m)^\| `(GPURECLAIM_[A-Z_]+)` \| ([^|]*) \|", section))
        self.assertEqual(sorted(rows), sorted(OPTIONS), "docs/LIBRARY.md's table of variables")
        for name, o in OPTIONS.items():
            if o["default"] is not None:
                self.assertTrue(rows[name].startswith("`%s`" % o["default"]),
                                "docs/LIBRARY.md: %s's default is %r, the table says %r" % (name, o["default"], rows[name]))

    def test_man7_entries(self):
        entries = set(re.findall(r"(?m)^\.B (GPURECLAIM_[A-Z_]+)$", read("docs", "man", "gpureclaim.7")))
        self.assertEqual(sorted(entries - {"GPURECLAIM_LIBRARY"}), sorted(OPTIONS), "gpureclaim(7)'s entries")

    def test_man1_run_options(self):
        man = read("docs", "man", "gpureclaim.1")
        run = man[man.index("\n.BR run "):]
        run = run[:run.index("\n.B ps ")]
        paragraphs = run.split("\n.TP\n")[1:]
        for opt, (var, how) in RUN.items():
            esc = "\\-\\-" + opt.replace("-", "\\-")
            # .BI \-\-opt " value", or with its short option first: .BR \-s ", " \-\-opt " \fIvalue\fR"
            para = [p for p in paragraphs if re.match(r'\.B[IR]? (\\-\w ", " )?%s(\s|\[|$)' % re.escape(esc), p)]
            self.assertEqual(len(para), 1, "gpureclaim(1): no entry (.TP) for run --%s" % opt)
            self.assertIn(var, para[0], "gpureclaim(1): run --%s does not name %s" % (opt, var))

    def test_bash_completion(self):
        text = read("completions", "gpureclaim.bash")
        run = text[text.index("\n  run)\n"):]
        run = run[:run.index(";;")]
        opts = set(re.search(r'opts="([^"]*)"', run).group(1).split())
        valued = set(re.search(r'valued="([^"]*)"', run).group(1).split())
        program = set(re.search(r'&& " (--[^"]*) " != \*', run).group(1).split())
        want_valued = {"--" + o for o, (_, how) in RUN.items() if how == "value"}
        self.assertEqual(valued, want_valued, "bash: run's valued options")
        self.assertEqual(program, want_valued, "bash: the options after which a word is a value, not the program")
        want = {"--" + o for o in RUN} | {"--%s=" % o for o, (_, h) in RUN.items() if h == "optional"} | {"--help"}
        self.assertEqual(opts, want, "bash: run's options")

    def test_zsh_completion(self):
        text = read("completions", "_gpureclaim")
        run = text[text.index("\n  run)\n"):]
        run = run[:run.index(";;")]
        # '--opt=[...' or, with a short option, '(-o --opt)'{-o,--opt=}'[...'
        named = {o: k.replace("}'", "") for o, k in re.findall(r"--([a-z-]+)(=-\[|=\[|\[|=\}'\[|\}'\[)", run)}
        named.pop("help", None)
        want = {o: {"value": "=[", "flag": "[", "optional": "=-["}[how] for o, (_, how) in RUN.items()}
        self.assertEqual(named, want, "zsh: run's options (=[ takes a value, =-[ an optional one after =)")


if __name__ == "__main__":
    unittest.main(verbosity=2)

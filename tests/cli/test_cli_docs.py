#!/usr/bin/env python3
"""The command's options, written once (each subcommand's table in tools/, which makes its getopt tables and
every help text), against everything that lists them again: `gpureclaim --help`, gpureclaim(1) (its synopsis
and each command's entry), README.md's table of commands, docs/COMMAND.md, and the bash and zsh completions.
Each must name every option of every subcommand and no option the subcommand lacks (they disagreed in 16 places:
the top-level help omitted ps -i/-s/--query/--format, release -g, top -i/-s, run --peers/--peer-timeout, ...).

Also: ps's --query fields (ps --help, the CSV header of every field, docs/PROTOCOL.md), the variables (run --help,
gpureclaim(7), docs/LIBRARY.md's table), and the C examples of the documents (every structure that may grow
given its .size, every call's return checked).

Environment (set by CTest): GR_CMD, GR_SOURCE_DIR.
"""
import os
import re
import subprocess
import unittest

CMD = os.environ["GR_CMD"]
SRC = os.environ["GR_SOURCE_DIR"]
SUBS = ["run", "ps", "top", "release", "snapshot", "sleep", "wake"]


def read(*path):
    with open(os.path.join(SRC, *path), encoding="utf-8") as f:
        return f.read()


def cmd(*args):
    p = subprocess.run([CMD, *args], capture_output=True, text=True, timeout=60,
                       env=dict(os.environ, GPURECLAIM_RUNDIR=os.path.join(os.environ.get("TMPDIR", "/tmp"), "nodir")))
    assert p.returncode == 0, (args, p.stdout, p.stderr)
    return p.stdout


def options(sub):
    """A subcommand's options, from its --help: {long: (short or None, takes: "none" | "value" | "optional")}."""
    out = {}
    for line in cmd(sub, "--help").splitlines():
        m = re.match(r"^  (?:-([A-Za-z]), |    )--([a-z][a-z-]*)(\[=\S*\]| \S+)?(?:\s|$)", line)
        if m:
            takes = "optional" if (m.group(3) or "").startswith("[=") else "value" if m.group(3) else "none"
            out[m.group(2)] = (m.group(1), takes)
    out.pop("help")
    return out


OPTS = {sub: options(sub) for sub in SUBS}


def mentioned(text):
    """The long options a text names (--word), man's \\-\\- escapes included."""
    return set(re.findall(r"(?<![\w-])--([a-z][a-z-]*[a-z])", text.replace("\\-", "-")))


class OptionsEverywhere(unittest.TestCase):
    def test_the_subcommands_have_options(self):
        self.assertEqual(set(OPTS["ps"]) >= {"gpu", "sort", "json", "query", "format", "prometheus", "label", "loop"},
                         True, OPTS["ps"])
        self.assertIn("tree", OPTS["release"])
        self.assertEqual(OPTS["ps"]["sort"][0], "S", "ps sorts with -S: -s is --signal elsewhere")
        self.assertGreaterEqual(sum(len(o) for o in OPTS.values()), 35)

    def test_top_level_help(self):
        """gpureclaim --help: each subcommand's block lists all its options, short and long."""
        text = cmd("--help")
        blocks = {}
        current = None
        for line in text.splitlines():
            m = re.match(r"^  ([a-z]+) ", line)
            if m and m.group(1) in SUBS:
                current = m.group(1)
                blocks[current] = ""
            elif line.startswith("      ") and current:
                blocks[current] += line + "\n"
            else:
                current = None
        self.assertEqual(sorted(blocks), sorted(SUBS))
        for sub, opts in OPTS.items():
            self.assertEqual(mentioned(blocks[sub]), set(opts), "gpureclaim --help, %s's block" % sub)
            for name, (short, _) in opts.items():
                if short:
                    self.assertIn("-%s/--%s" % (short, name), blocks[sub], (sub, name))

    def man_sections(self):
        man = read("docs", "man", "gpureclaim.1")
        synopsis = man[man.index(".SH SYNOPSIS"):man.index(".SH DESCRIPTION")]
        syn = {}
        for block in synopsis.split(".SY gpureclaim\n")[1:]:
            m = re.match(r"\.BR? (\w+)", block)
            if m and m.group(1) in SUBS:
                syn[m.group(1)] = block
        commands = man[man.index(".SH COMMANDS"):man.index(".SH EXIT STATUS")]
        entries = {}
        head = r"(?m)^\.TP\n\.(?:B|BR|BI) %s\b"  # an entry: a tagged paragraph whose tag is the command
        for sub in SUBS:
            m = re.search(head % sub, commands)
            self.assertIsNotNone(m, "gpureclaim(1) has no entry for %s" % sub)
            rest = commands[m.end():]
            nxt = [re.search(head % s, rest) for s in SUBS if s != sub]
            ends = [x.start() for x in nxt if x] + [len(rest)]
            entries[sub] = rest[:min(ends)]
        return syn, entries

    def test_man1(self):
        syn, entries = self.man_sections()
        self.assertEqual(sorted(syn), sorted(SUBS), "gpureclaim(1)'s SYNOPSIS")
        for sub, opts in OPTS.items():
            text = syn[sub].replace("\\-", "-")
            if sub != "run":  # run's synopsis says [options]: its options are in its entry
                for name, (short, _) in opts.items():
                    self.assertTrue(re.search(r"(?<![\w-])--%s\b" % name, text) or
                                    (short and re.search(r"(?<![\w-])-%s\b" % short, text)),
                                    "gpureclaim(1): the SYNOPSIS of %s lacks --%s" % (sub, name))
                self.assertLessEqual(mentioned(syn[sub]), set(opts), "gpureclaim(1): the SYNOPSIS of %s" % sub)
            self.assertEqual(mentioned(entries[sub]) - {"help"}, set(opts),
                             "gpureclaim(1): the options %s's entry names" % sub)
            for name, (short, _) in opts.items():
                if short:
                    self.assertIn("\\-%s" % short, entries[sub], "gpureclaim(1): %s's -%s" % (sub, short))

    def test_readme_table_of_commands(self):
        """README.md's table of commands: one row per subcommand, naming all its options."""
        text = read("README.md")
        rows = dict(re.findall(r"(?m)^\| `(\w+)[^`]*`[^|]*\| (.*) \|$", text))
        rows = {k: v for k, v in rows.items() if k in SUBS}
        self.assertEqual(sorted(rows), sorted(SUBS), "README.md's table of commands")
        for sub, opts in OPTS.items():
            row = re.search(r"(?m)^\| `%s\b.*$" % sub, text).group(0)
            self.assertEqual(mentioned(row), set(opts), "README.md's row of %s" % sub)

    def test_command_md(self):
        """docs/COMMAND.md: a section per subcommand, naming all its options and no other's."""
        text = read("docs", "COMMAND.md")
        for sub, opts in OPTS.items():
            m = re.search(r"(?m)^### `gpureclaim %s\b.*$" % sub, text)
            self.assertIsNotNone(m, "docs/COMMAND.md has no section for %s" % sub)
            rest = text[m.end():]
            end = re.search(r"(?m)^##", rest)
            section = rest[:end.start() if end else len(rest)]
            self.assertEqual(mentioned(section) - {"help"}, set(opts), "docs/COMMAND.md's section on %s" % sub)

    def test_bash_completion(self):
        text = read("completions", "gpureclaim.bash")
        for sub, opts in OPTS.items():
            m = re.search(r"(?ms)^  (?:\w+ \| )*%s(?: \| \w+)*\)(.*?);;" % sub, text)
            self.assertIsNotNone(m, "bash: no case for %s" % sub)
            body = m.group(1)
            got = set(re.search(r'opts="([^"]*)"', body).group(1).split())
            valued = set(re.search(r'valued="([^"]*)"', body).group(1).split())
            want = {"--" + o for o in opts} | {"--%s=" % o for o, (_, t) in opts.items() if t == "optional"}
            self.assertEqual(got, want | {"--help"}, "bash: %s's options" % sub)
            self.assertEqual(valued, {"--" + o for o, (_, t) in opts.items() if t == "value"}, "bash: %s" % sub)

    def test_zsh_completion(self):
        text = read("completions", "_gpureclaim")
        for sub, opts in OPTS.items():
            m = re.search(r"(?ms)^  (?:\w+ \| )*%s(?: \| \w+)*\)(.*?);;" % sub, text)
            self.assertIsNotNone(m, "zsh: no case for %s" % sub)
            named = set(re.findall(r"--([a-z][a-z-]*)(?:=-?\[|\[|\}|=\})", m.group(1))) - {"help"}
            self.assertEqual(named, set(opts), "zsh: %s's options" % sub)
            for name, (short, _) in opts.items():
                if short and sub != "run":
                    self.assertIn("-%s," % short, m.group(1), "zsh: %s's -%s" % (sub, short))


class ListsEverywhere(unittest.TestCase):
    def test_query_fields(self):
        """ps --query's fields: ps --help, the header of --format csv (every field), docs/PROTOCOL.md."""
        h = cmd("ps", "--help")
        listed = h[h.index("only these fields"):h.index("-f, --format")]
        listed = re.findall(r"\b([a-z_]+)(?=,|\s*$)", listed[listed.index(":") + 1:], re.M)
        header = cmd("ps", "--format", "csv").splitlines()[0].split(",")
        self.assertEqual(listed, header, "ps --help's fields and the CSV's, in order")
        proto = re.sub(r"\s+", " ", read("docs", "PROTOCOL.md"))
        i = proto.index("`gpureclaim ps --query FIELDS` prints only the fields named (")
        fields = re.findall(r"`([a-z_]+)`", proto[i:proto.index(")", i + 60)])
        self.assertEqual(fields, header, "docs/PROTOCOL.md's list of --query fields")

    def test_variables(self):
        """Every variable: run --help lists it, gpureclaim(7) has an entry, docs/LIBRARY.md's table a row."""
        h = cmd("run", "--help")
        in_help = set(re.findall(r"\b(GPURECLAIM_[A-Z_]+)\b", h)) - {"GPURECLAIM_"}
        man7 = set(re.findall(r"(?m)^\.B (GPURECLAIM_[A-Z_]+)$", read("docs", "man", "gpureclaim.7")))
        self.assertEqual(in_help, man7)
        lib = read("docs", "LIBRARY.md")
        section = lib[lib.index("\n## Configuration\n"):]
        section = section[:section.index("\n## ", 1)]
        table = set(re.findall(r"(?m)^\| `(GPURECLAIM_[A-Z_]+)` \|", section))
        self.assertEqual(table | {"GPURECLAIM_LIBRARY"}, man7)
        self.assertGreaterEqual(len(man7), 17)


class CExamples(unittest.TestCase):
    def blocks(self):
        """Every C example of the documents: fenced c blocks of README.md and docs/, gpureclaim(3)'s EXAMPLES,
        and examples/*.c."""
        out = []
        for path in ["README.md"] + ["docs/" + n for n in sorted(os.listdir(os.path.join(SRC, "docs")))
                                     if n.endswith(".md")]:
            out += [(path, b) for b in re.findall(r"(?ms)^```c\n(.*?)^```", read(path))]
        man = read("docs", "man", "gpureclaim.3")
        out += [("gpureclaim.3", b.replace("\\-", "-").replace("\\e", "\\"))
                for b in re.findall(r"(?ms)^\.EX\n(.*?)^\.EE", man)]
        for n in sorted(os.listdir(os.path.join(SRC, "examples"))):
            if n.endswith(".c"):
                out.append(("examples/" + n, read("examples", n)))
        return out

    def test_size_set_and_returns_checked(self):
        """A structure that may grow with no .size gets -EINVAL; a call whose return is ignored then reads zeros."""
        found = 0
        for path, code in self.blocks():
            for m in re.finditer(r"gpureclaim_(stats|report|sleep_report|block)_t\s+(\w+)\s*(=\s*\{[^;]*\})?;", code):
                found += 1
                self.assertRegex(m.group(3) or "", r"\.size\s*=\s*sizeof\s*\(?%s\)?" % m.group(2),
                                 "%s: %s without .size" % (path, m.group(0)))
            for m in re.finditer(r"(?m)^\s*(gpureclaim_(?:stats|release|release_context|sleep|wake)\s*\(.*)$", code):
                self.fail("%s: the return of %s is not checked" % (path, m.group(1).strip()))
        self.assertGreaterEqual(found, 4, "no C example found: did the documents move?")


if __name__ == "__main__":
    unittest.main(verbosity=2)

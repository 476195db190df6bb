#!/usr/bin/env python3
"""tests/README.md's table "Where each module is tested": every source file of src/ (.c, .S) has a row, every
row names a source file that exists and at least one test file, and every test file it names exists. A new
module without a row, or a test renamed without its row, fails here. Environment (set by CTest): GR_SOURCE_DIR.
"""
import os
import re
import unittest

SRC = os.environ["GR_SOURCE_DIR"]


def table_rows():
    text = open(os.path.join(SRC, "tests", "README.md"), encoding="utf-8").read()
    section = text.split("## Where each module is tested", 1)[1]
    rows = {}
    for line in section.splitlines():
        m = re.match(r"\|\s*`(src/[^`]+)`\s*\|(.*)\|\s*$", line)
        if m:
            rows[m.group(1)] = re.findall(r"`([^`]+)`", m.group(2))
    return rows


def source_files():
    out = []
    for root, _, files in os.walk(os.path.join(SRC, "src")):
        for f in files:
            if f.endswith((".c", ".S")):
                out.append(os.path.relpath(os.path.join(root, f), SRC))
    return sorted(out)


class TestMap(unittest.TestCase):
    def test_the_table_is_there(self):
        self.assertGreater(len(table_rows()), 20, "tests/README.md lost its table of modules")

    def test_every_source_file_has_a_row(self):
        rows = table_rows()
        missing = [f for f in source_files() if f not in rows]
        self.assertEqual(missing, [], "source files without a row in tests/README.md")

    def test_every_row_names_an_existing_source_and_tests(self):
        for src, tests in table_rows().items():
            self.assertTrue(os.path.exists(os.path.join(SRC, src)), f"{src}: no such source file")
            self.assertTrue(tests, f"{src}: names no test")
            for t in tests:
                self.assertTrue(t.startswith("tests/"), f"{src}: {t} is not under tests/")
                self.assertTrue(os.path.exists(os.path.join(SRC, t)), f"{src}: {t} does not exist")


if __name__ == "__main__":
    unittest.main(verbosity=2)

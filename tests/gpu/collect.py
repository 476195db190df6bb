#!/usr/bin/env python3
"""Collects the results of tests/gpu/run.sh.

  collect.py test OUT NAME RC ELAPSED LIMIT   prints PASS|FAIL|SKIP lines for logs/NAME.log, stores results.d/NAME.json
  collect.py summary OUT ELAPSED              merges results.d/ into OUT/results.json and OUT/results.txt

A test program reports each check as a line `GPUTEST {"name", "status", "detail", "data"}`; the release reports
it caused are the lines of reports/NAME.jsonl (GPURECLAIM_LOG), attached to its results.
"""
import glob
import json
import os
import sys


def read_lines(path):
    try:
        with open(path, errors="replace") as f:
            return f.read().splitlines()
    except OSError:
        return []


def one_line(s, limit=300):
    s = " ".join(str(s).split())
    return s if len(s) <= limit else s[:limit - 3] + "..."


def cmd_test(out, name, rc, elapsed, limit):
    rc = int(rc)
    lines = read_lines(os.path.join(out, "logs", name + ".log"))
    results = []
    for line in lines:
        if line.startswith("GPUTEST "):
            try:
                r = json.loads(line[len("GPUTEST "):])
            except ValueError:
                results.append({"name": name, "status": "FAIL", "detail": "unparsable result line: " + line[:200]})
                continue
            results.append(r)
    reports = []
    for line in read_lines(os.path.join(out, "reports", name + ".jsonl")):
        line = line.strip()
        if not line:
            continue
        try:
            reports.append(json.loads(line))
        except ValueError:
            reports.append({"unparsed": line[:500]})
    tail = lines[-25:]
    extra = None
    if rc in (124, 137):
        extra = {"name": name, "status": "FAIL", "detail": "timed out after %ss (limit %ss); log tail: %s"
                 % (elapsed, limit, one_line(" | ".join(tail[-4:])))}
    elif rc != 0 and not any(r.get("status") == "FAIL" for r in results):
        extra = {"name": name, "status": "FAIL", "detail": "exited with status %d; log tail: %s"
                 % (rc, one_line(" | ".join(tail[-4:])))}
    elif not results:
        extra = {"name": name, "status": "FAIL", "detail": "reported no result; log tail: %s"
                 % one_line(" | ".join(tail[-4:]))}
    if extra:
        results.append(extra)
    for r in results:
        print("%s %s: %s" % (r.get("status", "FAIL"), r.get("name", name), one_line(r.get("detail", ""), 400)))
    doc = {"test": name, "exit_status": rc, "seconds": int(elapsed), "limit_s": int(limit), "results": results,
           "release_reports": reports, "log": "logs/%s.log" % name, "log_tail": tail}
    with open(os.path.join(out, "results.d", name + ".json"), "w") as f:
        json.dump(doc, f, indent=1)


def cmd_summary(out, elapsed):
    tests = []
    for path in sorted(glob.glob(os.path.join(out, "results.d", "*.json")), key=os.path.getmtime):
        try:
            with open(path) as f:
                tests.append(json.load(f))
        except (OSError, ValueError) as e:
            tests.append({"test": os.path.basename(path), "results": [
                {"name": os.path.basename(path), "status": "FAIL", "detail": "unreadable: %s" % e}]})
    for line in reversed(read_lines(os.path.join(out, "results.d", "_shell.tsv"))):
        parts = line.split("\t", 2)
        if len(parts) == 3:
            tests.insert(0, {"test": parts[1], "results": [{"name": parts[1], "status": parts[0], "detail": parts[2]}]})
    flat = [r for t in tests for r in t.get("results", [])]
    counts = {s: sum(1 for r in flat if r.get("status") == s) for s in ("PASS", "FAIL", "SKIP")}
    benches = {}
    for name in ("bench_overhead", "bench_release"):
        p = os.path.join(out, name + ".json")
        if os.path.exists(p):
            try:
                with open(p) as f:
                    benches[name] = json.load(f)
            except (OSError, ValueError) as e:
                benches[name] = {"error": str(e)}
    env = "\n".join(read_lines(os.path.join(out, "environment.txt")))
    doc = {"skipped": False, "seconds": int(elapsed), "counts": counts, "ok": counts["FAIL"] == 0,
           "environment": env, "tests": tests, "benchmarks": benches}
    with open(os.path.join(out, "results.json"), "w") as f:
        json.dump(doc, f, indent=1)
    with open(os.path.join(out, "results.txt"), "w") as f:
        for r in flat:
            f.write("%s %s: %s\n" % (r.get("status"), r.get("name"), one_line(r.get("detail", ""), 1000)))
        f.write("summary: %d passed, %d failed, %d skipped in %ss\n"
                % (counts["PASS"], counts["FAIL"], counts["SKIP"], elapsed))


def main(argv):
    if len(argv) >= 7 and argv[1] == "test":
        cmd_test(*argv[2:7])
    elif len(argv) >= 4 and argv[1] == "summary":
        cmd_summary(argv[2], argv[3])
    else:
        sys.stderr.write(__doc__)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

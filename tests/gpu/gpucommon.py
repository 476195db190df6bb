"""Helpers shared by the Python GPU tests: result lines, the status file, the report log, the signal.

Every check prints one line `GPUTEST {json}` with name, status (PASS/FAIL/SKIP), detail and data (the
measured numbers); tests/gpu/collect.py turns those into the summary and results.json.
"""
import json
import os
import subprocess
import sys
import time

import grshim

MiB = 1 << 20
GiB = 1 << 30

_failed = False


def result(name, ok, detail, **data):
    """ok: True (PASS), False (FAIL) or None (SKIP)."""
    global _failed
    status = "SKIP" if ok is None else ("PASS" if ok else "FAIL")
    if ok is False:
        _failed = True
    line = {"name": name, "status": status, "detail": detail, "data": data}
    sys.stdout.write("GPUTEST " + json.dumps(line, default=str) + "\n")
    sys.stdout.flush()
    return ok


def info(msg):
    sys.stdout.write("  " + msg + "\n")
    sys.stdout.flush()


def exit_code():
    return 1 if _failed else 0


def mib(n):
    return "%.1f MiB" % (n / MiB)


def status_file():
    rundir = os.environ.get("GPURECLAIM_RUNDIR")
    if not rundir:
        return None
    path = os.path.join(rundir, "%d.json" % os.getpid())
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def log_reports(pid=None):
    """The release report lines of GPURECLAIM_LOG written by this process (or pid)."""
    pid = os.getpid() if pid is None else pid
    path = os.environ.get("GPURECLAIM_LOG")
    out = []
    if not path or not os.path.exists(path):
        return out
    with open(path, errors="replace") as f:
        for line in f:
            line = line.strip()
            if not line.startswith("{"):
                continue
            try:
                obj = json.loads(line)
            except ValueError:
                continue
            if obj.get("pid") == pid:
                out.append(obj)
    return out


def signal_from_other_process(sig="USR1"):
    """Sends the signal to this process from a separate process (kill(1) through sh, without the preload)."""
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    p = subprocess.run(["sh", "-c", "kill -%s %d" % (sig, os.getpid())], env=env, timeout=20)
    return p.returncode


def wait_for(pred, timeout=20.0, step=0.05):
    """Polls pred() (sleeping, so the GIL is free for gpureclaim's worker) until truthy or timeout."""
    t0 = time.monotonic()
    while True:
        v = pred()
        if v:
            return v, time.monotonic() - t0
        if time.monotonic() - t0 >= timeout:
            return v, time.monotonic() - t0
        time.sleep(step)


def preload_ok(name):
    """Emits a FAIL result and returns False when gpureclaim is not loaded."""
    if not grshim.loaded():
        result(name, False, "libgpureclaim not loaded (LD_PRELOAD=%s)" % os.environ.get("LD_PRELOAD"))
        return False
    return True


def new_blocks(before, after):
    """Blocks in after whose address (and kind) was not in before."""
    seen = {(b["address"], b["kind"]) for b in before}
    return [b for b in after if (b["address"], b["kind"]) not in seen]


_maps_cache = {}


def library_paths(basename):
    """Full paths of the objects mapped in this process whose file name is basename (a block's `library`)."""
    if not basename or basename == "?":
        return []
    if basename not in _maps_cache:
        paths = set()
        try:
            with open("/proc/self/maps") as f:
                for line in f:
                    parts = line.split(None, 5)
                    if len(parts) == 6:
                        path = parts[5].strip()
                        if path.startswith("/") and os.path.basename(path) == basename:
                            paths.add(path)
        except OSError:
            pass
        _maps_cache[basename] = sorted(paths)
    return _maps_cache[basename]


# Where each framework's own libraries live (matched against the full path of a block's calling library) and
# what their file names contain. Only the framework's package directories: a virtual environment's own path
# (/opt/torch/.venv on the reference machine) may contain a framework's name.
FRAMEWORKS = {
    "pytorch": (("/site-packages/torch/", "/dist-packages/torch/"), ("libc10_cuda", "libtorch")),
    "cupy": (("/site-packages/cupy/", "/site-packages/cupy_backends/", "/dist-packages/cupy/",
              "/dist-packages/cupy_backends/"), ("cupy",)),
    "xla": (("/site-packages/jaxlib/", "/site-packages/jax_plugins/", "/site-packages/jax_cuda",
             "/site-packages/jax/", "/dist-packages/jaxlib/", "/dist-packages/jax_plugins/"), ("xla", "jax")),
}


def attributed_to(block, owner):
    """How a block is attributed to a framework: "owner" when its owner field names it, "library" when the calling
    library is one of the framework's (by file name or by where it was loaded from), else None."""
    if block.get("owner") == owner:
        return "owner"
    path_markers, name_markers = FRAMEWORKS[owner]
    lib = block.get("library")
    if lib and lib != "?":
        if any(m in lib for m in name_markers):
            return "library"
        for p in library_paths(lib):
            if any(m in p for m in path_markers):
                return "library"
    return None


def attribution_check(blocks, owner):
    """(ok, detail, data) for "every block is attributed to the framework's library": each block's owner is
    `owner`, or its owner is unset and its library belongs to the framework. A block whose owner names another
    framework fails. The detail says how many carry the owner field, which is what keeps framework blocks from
    ever becoming orphans."""
    how = [attributed_to(b, owner) for b in blocks]
    wrong = [b for b in blocks if b.get("owner") not in (None, owner)]
    n_owner = sum(1 for h in how if h == "owner")
    n_lib = sum(1 for b, h in zip(blocks, how) if h == "library" and b.get("owner") is None)
    bad = [b for b, h in zip(blocks, how) if h is None or b.get("owner") not in (None, owner)]
    libs = sorted({str(b["library"]) for b in blocks})
    paths = {lib: library_paths(lib) for lib in libs}
    ok = bool(blocks) and not bad
    detail = ("%d device blocks (%s): %d with owner \"%s\", %d more attributed by library only, %d with the owner "
              "of another framework (%s), %d not attributed at all; libraries: %s" % (
                  len(blocks), mib(sum(b["bytes"] for b in blocks)), n_owner, owner, n_lib, len(wrong),
                  ", ".join(sorted({str(b.get("owner")) for b in wrong})) or "-",
                  len(bad) - len(wrong), ", ".join(libs)))
    if n_lib:
        detail += " [NOTE: owner field unset on %d framework block(s): a scope would orphan them]" % n_lib
    data = {"blocks": owners_summary(blocks), "owner_field": n_owner, "library_only": n_lib,
            "wrong_owner": len(wrong),
            "not_attributed": [{k: b[k] for k in ("kind", "bytes", "api", "library", "owner")} for b in bad[:20]],
            "library_paths": paths}
    return ok, detail, data


def owners_summary(blocks):
    out = {}
    for b in blocks:
        key = "%s|%s|%s|%s" % (b["kind"], b["owner"], b["api"], b["library"])
        ent = out.setdefault(key, [0, 0])
        ent[0] += 1
        ent[1] += b["bytes"]
    return {k: {"blocks": v[0], "bytes": v[1]} for k, v in sorted(out.items())}


def wait_signal_report(st_releases_before, timeout=5.0):
    """Waits until the status file counts a new release and GPURECLAIM_LOG holds a report with trigger "signal"
    (the status file is rewritten just after the release, so it may trail the in-process counters).
    Returns (status file or None, every report line of this process, those with trigger signal)."""
    def cond():
        st = status_file()
        sig = [r for r in log_reports() if r.get("report", {}).get("trigger") == "signal"]
        return bool(st and st.get("releases", 0) > st_releases_before and sig
                    and isinstance(st.get("last_release"), dict))
    wait_for(cond, timeout=timeout, step=0.05)
    reports = log_reports()
    return status_file(), reports, [r for r in reports if r.get("report", {}).get("trigger") == "signal"]

"""The CPython path of a release: a signal makes gpureclaim's worker thread take the GIL and call the
framework's own release (here the PyTorch stand-in in python/torch) while the main thread runs Python code,
plus a module that takes part through __gpureclaim_release__; and none of it with GPURECLAIM_PYTHON=0 (a child
process). Run under LD_PRELOAD with the simulator."""
import ctypes
import io
import json
import os
import signal
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "python"))
import torch  # the stand-in

MiB = 1024 * 1024


class SimStats(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t)] + [(n, ctypes.c_uint64) for n in (
        "live_blocks", "live_bytes", "pool_reserved_bytes", "pool_used_bytes", "vmm_handles", "vmm_phys_bytes",
        "vmm_mappings", "va_reserved_bytes", "host_blocks", "host_bytes", "used_bytes", "capacity_bytes",
        "contexts", "vmm_mapped_bytes")]


def sim_live_bytes():
    cuda = ctypes.CDLL("libcuda.so.1")
    s = SimStats(size=ctypes.sizeof(SimStats))
    assert cuda.simcuda_stats(-1, None, ctypes.byref(s)) == 0
    return s.live_bytes


def signal_report(log, nth=1):
    """This process's nth report of a signal-triggered release, or None (the log may not exist yet)."""
    try:
        with open(log) as f:
            lines = f.readlines()
    except FileNotFoundError:
        return None
    found = [ev["report"] for ev in map(json.loads, lines) if ev.get("event") == "release" and
             ev.get("pid") == os.getpid() and ev["report"]["trigger"] == "signal"]
    return found[nth - 1] if len(found) >= nth else None


def wait_report(nth):
    deadline = time.time() + 20
    report = None
    while report is None and time.time() < deadline:
        time.sleep(0.01)
        report = signal_report(os.environ["GPURECLAIM_LOG"], nth)
    return report


class Extra:
    """A library taking part in releases through the module-level hook."""
    calls = 0


# Modules whose hook fails, registered before extra_cache: each is reported and skipped, and the modules
# after it are still called and counted.
broken = type(sys)("broken_cache")
def _broken_release():
    return 1 // 0
broken.__gpureclaim_release__ = _broken_release
sys.modules["broken_cache"] = broken
negative = type(sys)("negative_cache")
negative.__gpureclaim_release__ = lambda: -5
sys.modules["negative_cache"] = negative
exiting = type(sys)("exiting_cache")  # sys.exit() in a hook must not end the program
exiting.__gpureclaim_release__ = lambda: sys.exit(3)
sys.modules["exiting_cache"] = exiting
huge = type(sys)("huge_cache")  # more than 64 bits: an error, not a count that wipes out the others
huge.__gpureclaim_release__ = lambda: 1 << 64
sys.modules["huge_cache"] = huge
boolean = type(sys)("boolean_cache")  # True is not one byte
boolean.__gpureclaim_release__ = lambda: True
sys.modules["boolean_cache"] = boolean

extra = type(sys)("extra_cache")
def _extra_release():
    Extra.calls += 1
    return 12345
extra.__gpureclaim_release__ = _extra_release
sys.modules["extra_cache"] = extra


def main():
    me = ctypes.CDLL(None)
    if not hasattr(me, "gpureclaim_version"):
        print("not running under gpureclaim", file=sys.stderr)
        return 1
    # The log is this test's own; an earlier run's lines could carry this run's pid (pids wrap), and their
    # report be taken for this one's before this release has even run.
    try:
        os.unlink(os.environ["GPURECLAIM_LOG"])
    except FileNotFoundError:
        pass
    blocks = [torch.cuda.alloc(MiB) for _ in range(10)]
    for p in blocks:
        torch.cuda.free(p)  # cached, as PyTorch's allocator does
    assert torch.cuda.memory_reserved() == 10 * MiB
    assert sim_live_bytes() == 10 * MiB
    captured = io.StringIO()  # the worker thread writes its warnings to sys.stderr
    real_stderr, sys.stderr = sys.stderr, captured
    os.kill(os.getpid(), signal.SIGUSR1)
    # The main thread keeps running Python while the worker thread does the release. The report line is
    # written once the whole release is over (every framework called), so wait for it before checking:
    # the cache can read empty while the worker, between GIL switches, has yet to call the other modules.
    deadline = time.time() + 20
    spins = 0
    report = None
    while report is None and time.time() < deadline:
        spins += sum(i * i for i in range(1000)) > 0
        report = signal_report(os.environ["GPURECLAIM_LOG"])
    sys.stderr = real_stderr
    assert report is not None, "no release report"
    warnings = captured.getvalue()
    assert "broken_cache.__gpureclaim_release__() failed (below); it is skipped" in warnings, warnings
    assert "ZeroDivisionError" in warnings, warnings
    assert "negative_cache.__gpureclaim_release__() failed" in warnings, warnings
    assert "returned -5, not a number of bytes" in warnings, warnings
    assert "exiting_cache.__gpureclaim_release__() failed" in warnings and "SystemExit" in warnings
    assert "huge_cache.__gpureclaim_release__() failed" in warnings and "returned %d" % (1 << 64) in warnings
    assert "boolean_cache.__gpureclaim_release__() failed" in warnings and "returned True" in warnings
    assert spins > 0, "the main thread did not run while waiting"
    assert torch.cuda.memory_reserved() == 0, "the cache was not emptied"
    assert torch.cuda.empty_cache_calls == 1
    assert threading.get_ident() not in torch.cuda.empty_cache_threads, "emptied on the main thread"
    assert Extra.calls == 1, "__gpureclaim_release__ was not called"
    assert sim_live_bytes() == 0, "the driver still holds the memory"
    # The report line says what the frameworks gave back.
    assert report["framework_bytes"] == 10 * MiB + 12345, report
    # Again with no usable sys.stderr: the failing hooks cannot be reported, the others still count.
    blocks = [torch.cuda.alloc(MiB) for _ in range(3)]
    for p in blocks:
        torch.cuda.free(p)
    real_stderr, sys.stderr = sys.stderr, None
    os.kill(os.getpid(), signal.SIGUSR1)
    second = wait_report(2)
    sys.stderr = real_stderr
    assert second is not None, "no second release report"
    assert second["framework_bytes"] == 3 * MiB + 12345, second
    assert Extra.calls == 2
    # GPURECLAIM_PYTHON=0: a process that says so gets no release through CPython at all (options are read once
    # per process: a child of this script's, the same code).
    import subprocess
    child = subprocess.run([sys.executable, os.path.abspath(__file__), "--python-off"], capture_output=True,
                           text=True, timeout=120, env=dict(os.environ, GPURECLAIM_PYTHON="0"))
    assert child.returncode == 0, (child.returncode, child.stdout, child.stderr)
    assert "python off: ok" in child.stdout, child.stdout
    print("test_python_release: ok", report["framework_bytes"], "bytes from the frameworks")
    return 0


def python_off():
    """Under GPURECLAIM_PYTHON=0 a release of cached memory calls no framework: PyTorch's cache and the module
    hooks are left alone, and the report gives 0 framework bytes."""
    blocks = [torch.cuda.alloc(MiB) for _ in range(4)]
    for p in blocks:
        torch.cuda.free(p)
    assert torch.cuda.memory_reserved() == 4 * MiB
    os.kill(os.getpid(), signal.SIGUSR1)
    report = wait_report(1)
    assert report is not None, "no release report"
    assert report["framework_bytes"] == 0, report
    assert torch.cuda.empty_cache_calls == 0, "empty_cache was called with GPURECLAIM_PYTHON=0"
    assert Extra.calls == 0, "__gpureclaim_release__ was called with GPURECLAIM_PYTHON=0"
    assert torch.cuda.memory_reserved() == 4 * MiB and sim_live_bytes() == 4 * MiB, "the cache went"
    print("python off: ok")
    return 0


if __name__ == "__main__":
    sys.exit(python_off() if sys.argv[1:] == ["--python-off"] else main())

"""The CPython path of a release: a signal makes gpureclaim's worker thread take the GIL and call the
framework's own release (here the PyTorch stand-in in python/torch) while the main thread runs Python code,
plus a module that takes part through __gpureclaim_release__. Run under LD_PRELOAD with the simulator."""
import ctypes
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
        "contexts")]


def sim_live_bytes():
    cuda = ctypes.CDLL("libcuda.so.1")
    s = SimStats(size=ctypes.sizeof(SimStats))
    assert cuda.simcuda_stats(-1, None, ctypes.byref(s)) == 0
    return s.live_bytes


class Extra:
    """A library taking part in releases through the module-level hook."""
    calls = 0


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
    blocks = [torch.cuda.alloc(MiB) for _ in range(10)]
    for p in blocks:
        torch.cuda.free(p)  # cached, as PyTorch's allocator does
    assert torch.cuda.memory_reserved() == 10 * MiB
    assert sim_live_bytes() == 10 * MiB
    os.kill(os.getpid(), signal.SIGUSR1)
    # The main thread keeps running Python while the worker thread does the release.
    deadline = time.time() + 20
    spins = 0
    while torch.cuda.memory_reserved() and time.time() < deadline:
        spins += sum(i * i for i in range(1000)) > 0
    assert torch.cuda.memory_reserved() == 0, "the cache was not emptied"
    assert spins > 0, "the main thread did not run while waiting"
    assert torch.cuda.empty_cache_calls == 1
    assert threading.get_ident() not in torch.cuda.empty_cache_threads, "emptied on the main thread"
    assert Extra.calls == 1, "__gpureclaim_release__ was not called"
    deadline = time.time() + 5
    while sim_live_bytes() and time.time() < deadline:
        time.sleep(0.01)
    assert sim_live_bytes() == 0, "the driver still holds the memory"
    # The report line says what the frameworks gave back.
    deadline = time.time() + 5
    report = None
    while report is None and time.time() < deadline:
        with open(os.environ["GPURECLAIM_LOG"]) as f:
            for line in f:
                ev = json.loads(line)
                if ev.get("event") == "release" and ev["report"]["trigger"] == "signal":
                    report = ev["report"]
        time.sleep(0.01)
    assert report is not None, "no release report"
    assert report["framework_bytes"] == 10 * MiB + 12345, report
    print("test_python_release: ok", report["framework_bytes"], "bytes from the frameworks")
    return 0


if __name__ == "__main__":
    sys.exit(main())

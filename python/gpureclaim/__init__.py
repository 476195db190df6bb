"""gpureclaim from Python: give GPU memory back without restarting the interpreter.

Works when the script runs under gpureclaim (``gpureclaim run -- python script.py``, or with
``LD_PRELOAD=.../libgpureclaim.so.0``); otherwise every call raises :class:`NotLoaded`, saying how to start it.
Pure ctypes, no build step::

    import gpureclaim
    gpureclaim.release()                  # cached and orphaned memory; returns the report as a dict
    gpureclaim.stats()["live_bytes"]      # what gpureclaim tracks now
    with gpureclaim.scope():              # blocks this thread allocates inside are abandoned at the end:
        load_model()                      # the next release frees those still live (framework-owned ones excepted)

Installed with pip (``pip install .`` in the source tree), the package also carries the library and the
``gpureclaim`` command: ``python -m gpureclaim run -- python train.py`` (or the ``gpureclaim`` script pip puts
on PATH) starts a script under gpureclaim, and :data:`LIBRARY` names the library inside the package.

Libraries take part in releases by defining a module-level ``__gpureclaim_release__()`` that frees their own
cache and returns the bytes it freed: gpureclaim calls it (holding the GIL, from its own thread) on every
release of cached memory, after PyTorch's ``torch.cuda.empty_cache()`` and CuPy's pools.
"""
import contextlib
import ctypes
import errno
import os

__all__ = ["NotLoaded", "version", "enabled", "stats", "release", "release_context", "scope", "blocks",
           "snapshot", "leak_report", "sleep", "wake", "state", "CACHED", "ORPHANED", "ALL", "__version__"]

# This package's version: gpureclaim's (CMakeLists.txt's project version; the tests hold them together).
# version() is the loaded library's, which may differ when the package and the library come apart.
__version__ = "0.1.0"

CACHED, ORPHANED, ALL = 0x1, 0x2, 0x4
FREE_NOW = 0x1
_WHAT = {"cached": CACHED, "orphaned": ORPHANED, "orphans": ORPHANED, "all": ALL}
_KINDS = {1: "device", 2: "pitch", 3: "managed", 4: "async", 5: "vmm", 6: "vmm_mapping", 7: "va", 8: "host"}
_STATES = {1: "live", 2: "orphan", 3: "released"}
_TRIGGERS = {1: "api", 2: "signal", 3: "oom", 4: "command", 5: "scope", 6: "peer", 7: "idle", 8: "call"}
_SLEEP_STATES = {0: "awake", 1: "sleeping", 2: "waking"}
MAX_DEVICES = 16

_u64 = ctypes.c_uint64

# The library a pip install puts inside the package (gpureclaim/lib/), next to the command (gpureclaim/bin/),
# which finds it there by itself; None in the source tree and in a CMake install (the command is on PATH there).
_HERE = os.path.dirname(os.path.abspath(__file__))
LIBRARY = os.path.join(_HERE, "lib", "libgpureclaim.so.0")
if not os.path.isfile(LIBRARY):
    LIBRARY = None


class NotLoaded(RuntimeError):
    """gpureclaim is not running in this process."""


class _Stats(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t)] + [(n, _u64) for n in (
        "live_blocks", "live_bytes", "peak_bytes", "total_allocs", "total_frees", "pool_reserved_bytes",
        "pool_used_bytes", "host_pinned_blocks", "host_pinned_bytes", "va_reserved_bytes", "vmm_mapped_bytes",
        "orphan_blocks", "orphan_bytes", "ctx_destroyed_blocks", "ctx_destroyed_bytes", "untracked_frees",
        "late_frees", "untracked_routes", "releases", "released_bytes", "oom_retries", "oom_retry_successes",
        "table_bytes", "contexts", "pools", "peer_reclaims", "peer_reclaim_successes", "peer_received_bytes",
        "peer_gives", "peer_given_bytes")]


class _DeviceReport(ctypes.Structure):
    _fields_ = [("device", ctypes.c_int)] + [(n, _u64) for n in (
        "pool_bytes", "orphaned_bytes", "orphaned_blocks", "all_bytes", "all_blocks", "free_before", "free_after",
        "total")]


class _Report(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("seq", _u64), ("what", ctypes.c_uint), ("trigger", ctypes.c_int)] + [
        (n, _u64) for n in ("cached_bytes", "pool_bytes", "framework_bytes", "releaser_bytes", "orphaned_bytes",
                            "orphaned_blocks", "all_bytes", "all_blocks", "failed_blocks", "duration_ns")] + [
        ("ndevices", ctypes.c_int), ("devices", _DeviceReport * MAX_DEVICES), ("peer_pid", ctypes.c_int)]


class _SleepReport(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("slept", ctypes.c_int), ("trigger", ctypes.c_int)] + [(n, _u64) for n in (
        "released_bytes", "moved_bytes", "left_bytes", "host_available_bytes", "device_freed_bytes",
        "duration_ns")] + [("reason", ctypes.c_char * 192)]


class _Block(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t), ("address", _u64), ("bytes", _u64), ("kind", ctypes.c_int),
                ("state", ctypes.c_int), ("device", ctypes.c_int), ("thread_id", ctypes.c_uint32),
                ("context", ctypes.c_void_p), ("pool", ctypes.c_void_p), ("scope", _u64),
                ("alloc_time_ms", _u64), ("caller", ctypes.c_void_p), ("library", ctypes.c_char_p),
                ("api", ctypes.c_char_p), ("owner", ctypes.c_char_p), ("handle", _u64)]


_lib = None


def _load():
    global _lib
    if _lib is None:
        me = ctypes.CDLL(None)  # the process itself: a preloaded or linked libgpureclaim is visible here
        if not hasattr(me, "gpureclaim_version"):
            raise NotLoaded("gpureclaim is not loaded in this process: start the script with "
                            "`python -m gpureclaim run -- python script.py` (or LD_PRELOAD=%s); "
                            "loading it later cannot see allocations made before"
                            % (LIBRARY or "/path/to/libgpureclaim.so.0"))
        me.gpureclaim_version.restype = ctypes.c_char_p
        me.gpureclaim_scope_begin.restype = _u64
        me.gpureclaim_scope_end.argtypes = [_u64, ctypes.c_uint]
        me.gpureclaim_scope_current.restype = _u64
        me.gpureclaim_release.argtypes = [ctypes.c_uint, ctypes.POINTER(_Report)]
        me.gpureclaim_release_context.argtypes = [ctypes.c_void_p, ctypes.POINTER(_Report)]
        me.gpureclaim_stats.argtypes = [ctypes.c_int, ctypes.POINTER(_Stats)]
        me.gpureclaim_snapshot.argtypes = [ctypes.c_char_p]
        me.gpureclaim_leak_report.argtypes = [ctypes.c_char_p, ctypes.c_int]
        if hasattr(me, "gpureclaim_sleep"):  # a library with sleep and wake
            me.gpureclaim_sleep.argtypes = [ctypes.POINTER(_SleepReport)]
            me.gpureclaim_sleep_state.argtypes = [ctypes.POINTER(_u64)]
        _lib = me
    return _lib


def _check(rc, what, path=None):
    if rc < 0:
        code = -rc
        if code == errno.ENOTSUP:
            raise RuntimeError("%s: gpureclaim is disabled (GPURECLAIM_DISABLE) or the process has not used CUDA yet"
                               % what)
        if code == errno.EBUSY and what == "release":
            raise OSError(code, "release: a CUDA graph is being captured: the driver forbids the frees and "
                                "synchronizations a release makes until the capture ends; call again then")
        if code == errno.EIO and path is not None:  # the library's one code for "could not write the file"
            d = os.path.dirname(os.path.abspath(path))
            why = ("no such directory: %s" % d if not os.path.isdir(d) else
                   "no permission to write in %s" % d if not os.access(d, os.W_OK | os.X_OK) else
                   "it is a directory" if os.path.isdir(path) else "the file could not be written")
            raise OSError(code, "%s: cannot write %s: %s" % (what, path, why), path)
        raise OSError(code, "%s: %s" % (what, os.strerror(code)))
    return rc


def _flags(what):
    if isinstance(what, int) and not isinstance(what, bool):
        if not 0 <= what < 1 << 32:
            raise ValueError("release flags out of range: %d" % what)
        return what
    if not isinstance(what, str):
        raise TypeError("release categories are a str (\"cached\", \"orphaned\", \"all\", comma-separated) or "
                        "int flags, not %s" % type(what).__name__)
    flags = 0
    for word in what.split(","):
        word = word.strip().lower()
        if word not in _WHAT:
            raise ValueError("unknown release category %r (expected cached, orphaned, all)" % word)
        flags |= _WHAT[word]
    return flags


def version():
    """The library's version string."""
    return _load().gpureclaim_version().decode()


def enabled():
    """Whether gpureclaim interposes in this process (False with GPURECLAIM_DISABLE=1)."""
    return bool(_load().gpureclaim_enabled())


def stats(device=-1):
    """Counters for one device ordinal (0 to 63), or all devices (-1), as a dict (gpureclaim_stats_t's fields); ValueError
    for another device."""
    if not isinstance(device, int) or isinstance(device, bool):
        raise TypeError("device is an int ordinal, or -1 for all devices, not %s" % type(device).__name__)
    if not -1 <= device <= 63:
        # The library refuses the rest (EINVAL): every device outside its 0..63 is a ValueError here, not an
        # OSError for some and a ValueError for others.
        raise ValueError("device out of range: %d (0 to 63, or -1 for all devices)" % device)
    s = _Stats(size=ctypes.sizeof(_Stats))
    _check(_load().gpureclaim_stats(device, ctypes.byref(s)), "stats")
    return {name: getattr(s, name) for name, _ in _Stats._fields_ if name != "size"}


def _report(r):
    out = {name: getattr(r, name) for name, _ in _Report._fields_ if name not in ("size", "devices", "ndevices")}
    out["trigger"] = _TRIGGERS.get(r.trigger, r.trigger)
    out["what"] = ",".join(n for n in ("cached", "orphaned", "all") if r.what & _WHAT[n])  # as the JSON writes it
    out["ms"] = r.duration_ns / 1e6
    out["devices"] = [{name: getattr(d, name) for name, _ in _DeviceReport._fields_}
                      for d in r.devices[:r.ndevices]]
    return out


def release(what="cached,orphaned"):
    """Releases the categories in `what` ("cached", "orphaned", "all", comma-separated, or flags) and returns
    the report: bytes per category and per device, free memory before and after, milliseconds.
    The GIL is released while it runs (gpureclaim may need it to empty PyTorch's or CuPy's caches).
    Raises OSError (errno.EBUSY) while a CUDA graph is being captured: nothing is released then."""
    r = _Report(size=ctypes.sizeof(_Report))
    _check(_load().gpureclaim_release(_flags(what), ctypes.byref(r)), "release")
    return _report(r)


def release_context(context):
    """Frees every tracked block of one CUDA context (a CUcontext, as an int)."""
    r = _Report(size=ctypes.sizeof(_Report))
    _check(_load().gpureclaim_release_context(ctypes.c_void_p(context), ctypes.byref(r)), "release_context")
    return _report(r)


@contextlib.contextmanager
def scope(free_now=False):
    """Tags the blocks this thread allocates inside the block; when it ends, those still live become orphans,
    freed by the next release (at once with free_now=True). Blocks of framework allocators (PyTorch, CuPy,
    XLA) are theirs and are never orphaned. Yields the scope id."""
    lib = _load()
    sid = lib.gpureclaim_scope_begin()
    if not sid:
        raise RuntimeError("could not open a scope (gpureclaim disabled, or too many scopes)")
    try:
        yield sid
    finally:
        _check(lib.gpureclaim_scope_end(sid, FREE_NOW if free_now else 0), "scope end")


def blocks():
    """Every block tracked now, as a list of dicts."""
    out = []

    @ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(_Block), ctypes.c_void_p)
    def each(b, _arg):
        b = b.contents
        out.append({"address": b.address, "bytes": b.bytes, "kind": _KINDS.get(b.kind, b.kind),
                    "state": _STATES.get(b.state, b.state), "device": b.device, "thread": b.thread_id,
                    "context": b.context, "pool": b.pool, "scope": b.scope, "time_ms": b.alloc_time_ms,
                    "caller": b.caller, "library": (b.library or b"").decode(errors="replace"),
                    "api": (b.api or b"").decode(), "owner": b.owner.decode() if b.owner else None,
                    "handle": b.handle})
        return 0

    _check(_load().gpureclaim_foreach_block(each, None), "blocks")
    return out


def snapshot(path):
    """Writes every live block and the per-context and per-device totals as JSON to path ("-": stdout)."""
    _check(_load().gpureclaim_snapshot(os.fsencode(path)), "snapshot", path)


def leak_report(path="-", json=False):
    """Writes the blocks never freed, grouped by calling library and address, to path ("-": stderr)."""
    _check(_load().gpureclaim_leak_report(os.fsencode(path), 1 if json else 0), "leak_report", path)


def _sleep_lib():
    lib = _load()
    if not hasattr(lib, "gpureclaim_sleep"):
        raise RuntimeError("the loaded gpureclaim (%s) has no sleep and wake: it is older than this package (%s)"
                           % (version(), __version__))
    return lib


def sleep():
    """Puts this process to sleep, as `gpureclaim sleep PID` does: a release of cached and orphaned memory, then
    the rest of its device memory, live memory included, moves to host memory; the next CUDA call (any thread's)
    or wake() brings it back. Returns the report as a dict (slept, released_bytes, moved_bytes, left_bytes,
    device_freed_bytes, ms, reason; already=True when it slept already). Raises OSError when refused (errno.EBUSY:
    a thread inside a CUDA call, IPC, a graph capture; errno.ENOSPC: no host memory for it; errno.ENOTSUP: the
    driver's checkpoint API is missing or refused), with the reason; what the release gave back stays given back.
    The GIL is released while it runs."""
    r = _SleepReport(size=ctypes.sizeof(_SleepReport))
    rc = _sleep_lib().gpureclaim_sleep(ctypes.byref(r))
    out = {name: getattr(r, name) for name, _ in _SleepReport._fields_ if name not in ("size", "reason", "duration_ns")}
    out["slept"] = bool(r.slept) or rc == -errno.EALREADY
    out["trigger"] = _TRIGGERS.get(r.trigger, r.trigger)
    out["ms"] = r.duration_ns / 1e6
    out["reason"] = r.reason.decode(errors="replace") or None
    out["already"] = rc == -errno.EALREADY
    if rc < 0 and rc != -errno.EALREADY:
        raise OSError(-rc, "sleep: %s" % (out["reason"] or os.strerror(-rc)))
    return out


def wake():
    """Wakes this process now (its next CUDA call would too). Raises OSError (errno.ENOMEM) when the device had no
    room within GPURECLAIM_WAKE_TIMEOUT: the process stays asleep and intact."""
    rc = _sleep_lib().gpureclaim_wake()
    if rc == -errno.ENOMEM:
        raise OSError(errno.ENOMEM, "wake: no room on the device within GPURECLAIM_WAKE_TIMEOUT; still asleep")
    _check(rc, "wake")


def state():
    """The sleep state: {"state": "awake" | "sleeping" | "waking", "host_bytes": what it keeps in host memory}."""
    host = _u64()
    st = _sleep_lib().gpureclaim_sleep_state(ctypes.byref(host))
    return {"state": _SLEEP_STATES.get(st, st), "host_bytes": host.value}

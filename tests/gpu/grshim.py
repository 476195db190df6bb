"""Minimal ctypes view of the preloaded libgpureclaim for the GPU acceptance tests.

The structs below mirror include/gpureclaim.h field by field (same order, same C types); the library is
reached through ctypes.CDLL(None), i.e. the symbols already in the process (LD_PRELOAD or -lgpureclaim).
Kept independent of python/gpureclaim/ on purpose: the tests check the C ABI, not the Python package.
"""
import ctypes

CACHED, ORPHANED, ALL = 0x1, 0x2, 0x4
MAX_DEVICES = 16
KINDS = {1: "device", 2: "pitch", 3: "managed", 4: "async", 5: "vmm", 6: "vmm_mapping", 7: "va", 8: "host"}
STATES = {1: "live", 2: "orphan", 3: "released"}
TRIGGERS = {1: "api", 2: "signal", 3: "oom", 4: "command", 5: "scope", 6: "peer", 7: "idle", 8: "call"}

_u64 = ctypes.c_uint64

STATS_FIELDS = ("live_blocks", "live_bytes", "peak_bytes", "total_allocs", "total_frees",
                "pool_reserved_bytes", "pool_used_bytes", "host_pinned_blocks", "host_pinned_bytes",
                "va_reserved_bytes", "vmm_mapped_bytes", "orphan_blocks", "orphan_bytes",
                "ctx_destroyed_blocks", "ctx_destroyed_bytes", "untracked_frees", "late_frees",
                "untracked_routes", "releases", "released_bytes", "oom_retries", "oom_retry_successes",
                "table_bytes", "contexts", "pools")


class Stats(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t)] + [(f, _u64) for f in STATS_FIELDS]


DEVREP_FIELDS = ("pool_bytes", "orphaned_bytes", "orphaned_blocks", "all_bytes", "all_blocks",
                 "free_before", "free_after", "total")


class DeviceReport(ctypes.Structure):
    _fields_ = [("device", ctypes.c_int)] + [(f, _u64) for f in DEVREP_FIELDS]


REPORT_U64 = ("cached_bytes", "pool_bytes", "framework_bytes", "releaser_bytes", "orphaned_bytes",
              "orphaned_blocks", "all_bytes", "all_blocks", "failed_blocks", "duration_ns")


class Report(ctypes.Structure):
    _fields_ = ([("size", ctypes.c_size_t), ("seq", _u64), ("what", ctypes.c_uint), ("trigger", ctypes.c_int)]
                + [(f, _u64) for f in REPORT_U64]
                + [("ndevices", ctypes.c_int), ("devices", DeviceReport * MAX_DEVICES)])


class Block(ctypes.Structure):
    _fields_ = [("size", ctypes.c_size_t),
                ("address", _u64),
                ("bytes", _u64),
                ("kind", ctypes.c_int),
                ("state", ctypes.c_int),
                ("device", ctypes.c_int),
                ("thread_id", ctypes.c_uint32),
                ("context", ctypes.c_void_p),
                ("pool", ctypes.c_void_p),
                ("scope", _u64),
                ("alloc_time_ms", _u64),
                ("caller", ctypes.c_void_p),
                ("library", ctypes.c_char_p),
                ("api", ctypes.c_char_p),
                ("owner", ctypes.c_char_p),
                ("handle", _u64)]


_BLOCK_CB = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(Block), ctypes.c_void_p)


class NotLoaded(RuntimeError):
    pass


_lib = None


def lib():
    """The process's own symbol table, checked to contain gpureclaim."""
    global _lib
    if _lib is None:
        handle = ctypes.CDLL(None)
        try:
            handle.gpureclaim_stats
        except AttributeError:
            raise NotLoaded("libgpureclaim is not loaded in this process (LD_PRELOAD it)") from None
        handle.gpureclaim_version.restype = ctypes.c_char_p
        handle.gpureclaim_version.argtypes = []
        handle.gpureclaim_enabled.restype = ctypes.c_int
        handle.gpureclaim_enabled.argtypes = []
        handle.gpureclaim_stats.restype = ctypes.c_int
        handle.gpureclaim_stats.argtypes = [ctypes.c_int, ctypes.POINTER(Stats)]
        handle.gpureclaim_release.restype = ctypes.c_int
        handle.gpureclaim_release.argtypes = [ctypes.c_uint, ctypes.POINTER(Report)]
        handle.gpureclaim_foreach_block.restype = ctypes.c_int
        handle.gpureclaim_foreach_block.argtypes = [_BLOCK_CB, ctypes.c_void_p]
        handle.gpureclaim_snapshot.restype = ctypes.c_int
        handle.gpureclaim_snapshot.argtypes = [ctypes.c_char_p]
        _lib = handle
    return _lib


def loaded():
    try:
        lib()
        return True
    except NotLoaded:
        return False


def version():
    return lib().gpureclaim_version().decode()


def stats(device=-1):
    s = Stats()
    s.size = ctypes.sizeof(Stats)
    rc = lib().gpureclaim_stats(device, ctypes.byref(s))
    if rc != 0:
        raise OSError(-rc, "gpureclaim_stats(%d) returned %d" % (device, rc))
    return {f: getattr(s, f) for f in STATS_FIELDS}


def report_dict(r):
    out = {"seq": r.seq, "what": r.what, "trigger": TRIGGERS.get(r.trigger, r.trigger)}
    for f in REPORT_U64:
        out[f] = getattr(r, f)
    out["devices"] = []
    for i in range(min(max(r.ndevices, 0), MAX_DEVICES)):
        d = r.devices[i]
        if d.device < 0:
            continue
        dd = {"device": d.device}
        for f in DEVREP_FIELDS:
            dd[f] = getattr(d, f)
        out["devices"].append(dd)
    return out


def release(what=CACHED | ORPHANED):
    if isinstance(what, str):
        names = {"cached": CACHED, "orphaned": ORPHANED, "all": ALL}
        what = sum(names[w.strip()] for w in what.split(",") if w.strip())
    r = Report()
    r.size = ctypes.sizeof(Report)
    rc = lib().gpureclaim_release(what, ctypes.byref(r))
    if rc != 0:
        raise OSError(-rc, "gpureclaim_release(%#x) returned %d" % (what, rc))
    return report_dict(r)


def _s(p):
    return p.decode(errors="replace") if p else None


def blocks():
    """Every block tracked now, as dicts (strings copied inside the callback, as the header requires)."""
    out = []

    def cb(bp, _arg):
        b = bp.contents
        out.append({"address": b.address, "bytes": b.bytes, "kind": KINDS.get(b.kind, b.kind),
                    "state": STATES.get(b.state, b.state), "device": b.device, "thread_id": b.thread_id,
                    "context": b.context or 0, "pool": b.pool or 0, "scope": b.scope,
                    "alloc_time_ms": b.alloc_time_ms, "caller": b.caller or 0, "library": _s(b.library),
                    "api": _s(b.api), "owner": _s(b.owner), "handle": b.handle})
        return 0

    fn = _BLOCK_CB(cb)
    rc = lib().gpureclaim_foreach_block(fn, None)
    if rc != 0:
        raise OSError(-rc if rc < 0 else 0, "gpureclaim_foreach_block returned %d" % rc)
    return out


def snapshot(path):
    rc = lib().gpureclaim_snapshot(path.encode())
    if rc != 0:
        raise OSError(-rc, "gpureclaim_snapshot returned %d" % rc)

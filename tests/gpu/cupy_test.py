"""CuPy under LD_PRELOAD=libgpureclaim.so.

Checks, each printed as a GPUTEST line:
  accounting      across allocate / free / free_all_blocks steps, gpureclaim's live_bytes change by exactly what
                  the default memory pool's total_bytes() says
  owner           the pool's blocks are attributed to CuPy: owner "cupy", or a calling library of CuPy's (the
                  detail says how many carry the owner field)
  signal_release  4 GiB of arrays allocated then deleted (cached in the pool); `kill -USR1` from another
                  process; within 20 s total_bytes() <= 64 MiB and the device's free memory rose by >= 95% of
                  what was cached; an array that stayed alive is intact
  signal_report   the JSON report line in GPURECLAIM_LOG and the status file
  compute         a matmul and an elementwise kernel after the release match NumPy
  routes          untracked_routes == 0
"""
import os
import sys
import time

import gpucommon as gc
import grshim

P = os.environ.get("GPU_TEST_NAME", "cupy")
MiB, GiB = gc.MiB, gc.GiB
DEVICE_KINDS = ("device", "pitch", "managed", "async", "vmm")


def name(check):
    return "%s.%s" % (P, check)


try:
    import cupy
    import numpy
except Exception as e:  # noqa: BLE001
    gc.result(name("import"), None, "cupy not importable: %s: %s" % (type(e).__name__, e))
    sys.exit(0)

try:
    ndev = cupy.cuda.runtime.getDeviceCount()
except Exception as e:  # noqa: BLE001
    gc.result(name("cuda"), False, "cupy.cuda.runtime.getDeviceCount() failed under the preload: %s" % e)
    sys.exit(1)
if not gc.preload_ok(name("loaded")):
    sys.exit(1)

pool = cupy.get_default_memory_pool()
pinned = cupy.get_default_pinned_memory_pool()
gc.info("cupy %s, %d device(s), gpureclaim %s" % (cupy.__version__, ndev, grshim.version()))


def sync():
    cupy.cuda.Device(0).synchronize()


def free_mem():
    return cupy.cuda.runtime.memGetInfo()[0]


x = cupy.empty(1, dtype=cupy.uint8)
del x
sync()
pool.free_all_blocks()

hold = []


def alloc(sizes):
    def f():
        for n in sizes:
            hold.append(cupy.empty(int(n), dtype=cupy.uint8))
    return f


def pop(idxs):
    def f():
        for i in sorted(idxs, reverse=True):
            if i < len(hold):
                hold.pop(i)
    return f


def clear():
    hold.clear()


steps = [
    ("alloc 5 arrays (1..700 MiB)", alloc([1 * MiB, 3 * MiB + 5, 25 * MiB, 100 * MiB, 700 * MiB])),
    ("delete 3 of them (cached)", pop([0, 2, 4])),
    ("alloc 300 small arrays (4..400 KiB)", alloc([4096 * (1 + (i % 100)) for i in range(300)])),
    ("delete all", clear),
    ("free_all_blocks", pool.free_all_blocks),
    ("alloc 1 GiB + 300 MiB", alloc([GiB, 300 * MiB])),
    ("delete the 1 GiB one", pop([0])),
    ("free_all_blocks (1 GiB goes)", pool.free_all_blocks),
    ("delete all + free_all_blocks", lambda: (clear(), pool.free_all_blocks())),
]

sync()
t0 = pool.total_bytes()
s0 = grshim.stats()
blocks0 = grshim.blocks()
table = []
ok_all = True
new_seen = []
for label, fn in steps:
    fn()
    sync()
    tb = pool.total_bytes()
    s = grshim.stats()
    dt, dg = tb - t0, s["live_bytes"] - s0["live_bytes"]
    row = {"step": label, "pool_total_bytes_delta": dt, "gpureclaim_live_bytes_delta": dg,
           "pool_used_bytes": pool.used_bytes(), "live_blocks": s["live_blocks"], "match": dt == dg}
    ok_all &= row["match"]
    table.append(row)
    gc.info("%-40s pool total_bytes %+12d  gpureclaim live_bytes %+12d  %s" % (
        label, dt, dg, "ok" if row["match"] else "MISMATCH"))
    if label.startswith("alloc 5"):
        new_seen = gc.new_blocks(blocks0, grshim.blocks())
gc.result(name("accounting"), ok_all,
          "%d steps: gpureclaim live_bytes delta == pool.total_bytes() delta at every step: %s" % (
              len(table), "yes" if ok_all else "NO (" + "; ".join(
                  "%s: cupy %+d vs %+d" % (r["step"], r["pool_total_bytes_delta"], r["gpureclaim_live_bytes_delta"])
                  for r in table if not r["match"]) + ")"),
          steps=table)

dev_new = [b for b in new_seen if b["kind"] in DEVICE_KINDS]
gc.info("blocks allocated for the first 5 arrays: %s" % gc.owners_summary(new_seen))
ok_owner, detail, data = gc.attribution_check(dev_new, "cupy")
gc.result(name("owner"), ok_owner, detail, all_new_blocks=gc.owners_summary(new_seen), **data)

# ---------------------------------------------------------------- signal release
N_ELEM = 256 * 1024
keep = cupy.arange(N_ELEM, dtype=cupy.float32)
sync()
big = [cupy.empty(256 * MiB, dtype=cupy.uint8) for _ in range(16)]
sync()
del big
sync()
total_before = pool.total_bytes()
used_before = pool.used_bytes()
cached = total_before - used_before
free_before = free_mem()
rel_before = grshim.stats()["releases"]
st_before = gc.status_file()
st_rel_before = st_before.get("releases", 0) if st_before else 0
gc.info("before the signal: pool total %s, used %s, cached %s, device free %s" % (
    gc.mib(total_before), gc.mib(used_before), gc.mib(cached), gc.mib(free_before)))
krc = gc.signal_from_other_process("USR1")
state = {}


def cond():
    tb = pool.total_bytes()
    f = free_mem()
    state["total"], state["free"] = tb, f
    return tb <= 64 * MiB and (f - free_before) >= 0.95 * cached


ok, waited = gc.wait_for(cond, timeout=20.0)
gc.wait_for(lambda: grshim.stats()["releases"] > rel_before, timeout=5.0 if ok else 0.5)
rose = state.get("free", 0) - free_before
keep_ok = bool((cupy.asnumpy(keep) == numpy.arange(N_ELEM, dtype=numpy.float32)).all())
gc.result(name("signal_release"), bool(ok) and keep_ok and cached >= 4 * GiB and krc == 0,
          "kill -USR1 from another process (rc %d): pool total_bytes %s -> %s, device free rose by %s = %.1f%% of the "
          "%s cached (need >= 95%%, total <= 64 MiB) after %.2f s; live array intact: %s"
          % (krc, gc.mib(total_before), gc.mib(state.get("total", -1)), gc.mib(rose),
             100.0 * rose / cached if cached else 0.0, gc.mib(cached), waited, keep_ok),
          total_before=total_before, total_after=state.get("total"), used_before=used_before, cached=cached,
          free_before=free_before, free_after=state.get("free"), free_rise=rose, seconds=round(waited, 3),
          live_array_intact=keep_ok, kill_rc=krc)

st, reports, sig_reports = gc.wait_signal_report(st_rel_before, timeout=5.0)
st_rel = st.get("releases", 0) if st else None
last = st.get("last_release") if st else None
rep = sig_reports[-1]["report"] if sig_reports else {}
gc.result(name("signal_report"), bool(sig_reports) and st is not None and st_rel > st_rel_before
          and isinstance(last, dict) and last.get("trigger") == "signal",
          "%d report line(s) with trigger signal (last: what=%s cached_bytes=%s framework_bytes=%s ms=%s); status "
          "file releases %s -> %s" % (len(sig_reports), rep.get("what"), rep.get("cached_bytes"),
                                      rep.get("framework_bytes"), rep.get("ms"), st_rel_before, st_rel),
          log_lines=reports, status_file=st)

# ---------------------------------------------------------------- compute afterwards
rng = numpy.random.default_rng(7)
A = rng.standard_normal((1024, 1024)).astype(numpy.float32)
B = rng.standard_normal((1024, 1024)).astype(numpy.float32)
t0 = time.monotonic()
C = cupy.asnumpy(cupy.asarray(A) @ cupy.asarray(B)).astype(numpy.float64)
mm_err = float(numpy.abs(C - A.astype(numpy.float64) @ B.astype(numpy.float64)).max())
ew = cupy.asnumpy(cupy.asarray(A) * 2.0 + 1.0)
ew_err = float(numpy.abs(ew - (A * 2.0 + 1.0)).max())
gc.result(name("compute"), mm_err < 1e-2 and ew_err == 0.0,
          "after the release: 1024^2 matmul max error vs float64 %.2e, elementwise max error %.1e (%.2f s)"
          % (mm_err, ew_err, time.monotonic() - t0), matmul_max_err=mm_err, elementwise_max_err=ew_err)

s = grshim.stats()
gc.result(name("routes"), s["untracked_routes"] == 0,
          "untracked_routes %d, untracked_frees %d, late_frees %d, releases %d, released_bytes %s" % (
              s["untracked_routes"], s["untracked_frees"], s["late_frees"], s["releases"],
              gc.mib(s["released_bytes"])), stats=s)
sys.exit(gc.exit_code())

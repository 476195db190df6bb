"""JAX under LD_PRELOAD=libgpureclaim.so.

    python3 jax_test.py counts      run.sh sets XLA_PYTHON_CLIENT_PREALLOCATE=false
    python3 jax_test.py prealloc    XLA's default preallocation (75% of the device in one region)

Checks, each printed as a GPUTEST line:
  accounting  across array creations and deletions, gpureclaim's live_bytes change by exactly what XLA's own
              counter says (memory_stats()["pool_bytes"]: the BFC allocator's regions; it grows in regions and
              keeps them when arrays are deleted). Without that counter: live_bytes grow by at least the arrays.
              With preallocation both stay flat after start-up: the arrays come out of the preallocated region.
  prealloc    (prealloc only) the preallocated region is one tracked block of at least half the device
  owner       the device blocks XLA's allocator made for the arrays (with preallocation: the preallocated
              region) are attributed to XLA: owner "xla", or no owner and a calling library of JAX/XLA's (the
              detail says how many carry the owner field); an owner naming another framework fails. Blocks
              that libraries XLA uses allocate themselves (cuDNN) are listed, not checked
  release     gpureclaim_release(CACHED | ORPHANED) leaves XLA's blocks alone: they stay tracked and live, the
              arrays keep their values and computation goes on
  helpers     (informational) other processes that wrote a status file into GPURECLAIM_RUNDIR while JAX ran
              (JAX starts helper processes that inherit LD_PRELOAD; only those that initialise CUDA may)
  routes      untracked_routes == 0
"""
import glob
import os
import sys
import time

import gpucommon as gc
import grshim

MODE = sys.argv[1] if len(sys.argv) > 1 else "counts"
P = os.environ.get("GPU_TEST_NAME", "jax" if MODE == "counts" else "jax_" + MODE)
MiB = gc.MiB
DEVICE_KINDS = ("device", "pitch", "managed", "async", "vmm")
T_START = time.time()


def name(check):
    return "%s.%s" % (P, check)


try:
    import jax
    import jax.numpy as jnp
except Exception as e:  # noqa: BLE001
    gc.result(name("import"), None, "jax not importable: %s: %s" % (type(e).__name__, e))
    sys.exit(0)

try:
    gpus = [d for d in jax.devices() if d.platform in ("gpu", "cuda")]
except Exception as e:  # noqa: BLE001
    gpus = []
    gc.info("jax.devices() failed: %s" % e)
if not gpus:
    try:
        seen = [str(d) for d in jax.devices()]
    except Exception as e:  # noqa: BLE001
        seen = "error: %s" % e
    gc.result(name("cuda"), False, "JAX sees no GPU under the preload (devices: %s)" % (seen,))
    sys.exit(1)
if not gc.preload_ok(name("loaded")):
    sys.exit(1)
d0 = gpus[0]
gc.info("jax %s, device %s, XLA_PYTHON_CLIENT_PREALLOCATE=%s, XLA_PYTHON_CLIENT_MEM_FRACTION=%s, gpureclaim %s" % (
    jax.__version__, d0, os.environ.get("XLA_PYTHON_CLIENT_PREALLOCATE"),
    os.environ.get("XLA_PYTHON_CLIENT_MEM_FRACTION"), grshim.version()))


def mstats():
    try:
        return dict(d0.memory_stats() or {})
    except Exception:  # noqa: BLE001
        return {}


warm = jax.device_put(jnp.zeros((1024,), jnp.float32), d0).block_until_ready()
s0 = grshim.stats()
m0 = mstats()
blocks0 = grshim.blocks()
HAVE_POOL = m0.get("pool_bytes") is not None
biggest = None
gc.info("at start: gpureclaim live_bytes %d in %d blocks; XLA memory_stats %s" % (
    s0["live_bytes"], s0["live_blocks"], m0))

# ---------------------------------------------------------------- preallocation (prealloc mode)
if MODE == "prealloc":
    dev_blocks = [b for b in blocks0 if b["kind"] in DEVICE_KINDS and b["device"] in (0, -1)]
    biggest = max(dev_blocks, key=lambda b: b["bytes"]) if dev_blocks else None
    limit = m0.get("bytes_limit") or 0  # what XLA reserves for itself: 75% of the device by default
    env_total = os.environ.get("GPU_MEM_TOTAL_MIB", "")
    dev_total = int(env_total) * MiB if env_total.isdigit() else 0
    ok = biggest is not None and limit > 0 and biggest["bytes"] >= limit // 2
    if dev_total:
        ok = ok and biggest is not None and biggest["bytes"] >= dev_total // 2
    if HAVE_POOL and biggest is not None:
        ok = ok and biggest["bytes"] <= m0["pool_bytes"] <= s0["live_bytes"]
    gc.result(name("prealloc"), ok,
              "preallocated: biggest tracked block %s (owner %s, library %s) of a %s device; XLA pool_bytes %s, "
              "bytes_limit %s; gpureclaim live_bytes %s in %d blocks" % (
                  gc.mib(biggest["bytes"]) if biggest else "none", biggest and biggest["owner"],
                  biggest and biggest["library"], gc.mib(dev_total) if dev_total else "?",
                  gc.mib(m0["pool_bytes"]) if HAVE_POOL else "n/a", gc.mib(limit), gc.mib(s0["live_bytes"]),
                  s0["live_blocks"]),
              biggest={k: biggest[k] for k in ("bytes", "kind", "api", "library", "owner")} if biggest else None,
              device_total=dev_total, bytes_limit=limit, xla_memory_stats=m0, live_bytes=s0["live_bytes"])

# ---------------------------------------------------------------- accounting
arrays = {}
rows = []
ok_acc = True


def step(label, fn):
    global ok_acc
    fn()
    for a in arrays.values():
        a.block_until_ready()
    s = grshim.stats()
    m = mstats()
    dg = s["live_bytes"] - s0["live_bytes"]
    arrays_bytes = sum(a.nbytes for a in arrays.values())
    row = {"step": label, "gpureclaim_live_bytes_delta": dg, "live_blocks": s["live_blocks"],
           "arrays_bytes": arrays_bytes, "xla_bytes_in_use": m.get("bytes_in_use"),
           "xla_pool_bytes": m.get("pool_bytes"), "xla_peak_bytes_in_use": m.get("peak_bytes_in_use")}
    if HAVE_POOL and m.get("pool_bytes") is not None:
        row["xla_pool_bytes_delta"] = m["pool_bytes"] - m0["pool_bytes"]
        row["match"] = row["xla_pool_bytes_delta"] == dg
    else:
        row["match"] = dg >= arrays_bytes if MODE == "counts" else True
    ok_acc &= row["match"]
    rows.append(row)
    gc.info("%-34s XLA pool_bytes %+12s  gpureclaim live_bytes %+12d  arrays %s  %s" % (
        label, row.get("xla_pool_bytes_delta", "n/a"), dg, gc.mib(arrays_bytes),
        "ok" if row["match"] else "MISMATCH"))


def make(key, mib_n, value):
    def f():
        n = mib_n * MiB // 4
        arrays[key] = jax.device_put(jnp.full((n,), float(value), jnp.float32), d0)
    return f


def drop(*keys):
    def f():
        for k in keys:
            a = arrays.pop(k, None)
            if a is not None:
                a.delete()
    return f


step("create 64 MiB", make("a", 64, 1))
step("create 256 MiB", make("b", 256, 2))
step("create 512 MiB", make("c", 512, 3))
step("create 1 GiB", make("d", 1024, 4))
step("delete 256 MiB + 512 MiB", drop("b", "c"))
step("create 128 MiB (fits a freed range)", make("e", 128, 5))
step("create 768 MiB", make("f", 768, 6))
step("delete all but the 64 MiB one", drop("d", "e", "f"))
metric = "memory_stats()['pool_bytes']" if HAVE_POOL else "the arrays' bytes (no pool_bytes in memory_stats)"
gc.result(name("accounting"), ok_acc,
          "%d steps: gpureclaim live_bytes delta %s %s at every step: %s" % (
              len(rows), "==" if HAVE_POOL else ">=", metric, "yes" if ok_acc else "NO (" + "; ".join(
                  "%s: XLA %s vs %+d" % (r["step"], r.get("xla_pool_bytes_delta", "n/a"),
                                         r["gpureclaim_live_bytes_delta"]) for r in rows if not r["match"]) + ")"),
          mode=MODE, steps=rows, xla_memory_stats_start=m0, gpureclaim_start=s0)

# ---------------------------------------------------------------- owner
blocks1 = grshim.blocks()
new = gc.new_blocks(blocks0, blocks1)
dev_new = [b for b in new if b["kind"] in DEVICE_KINDS]
if MODE == "prealloc" and biggest is not None:
    # the arrays come out of the preallocated region: that block is the one XLA's allocator made for them
    dev_new = [b for b in dev_new if b["address"] != biggest["address"]] + [biggest]
others = [b for b in blocks1 if b["kind"] in DEVICE_KINDS and (b["address"], b["kind"]) not in
          {(x["address"], x["kind"]) for x in dev_new}]
gc.info("other device blocks (libraries XLA uses, e.g. cuDNN; not checked): %s" % gc.owners_summary(others))
gc.info("device blocks checked for attribution: %s" % gc.owners_summary(dev_new))
ok_owner, detail, data = gc.attribution_check(dev_new, "xla")
gc.result(name("owner"), ok_owner, detail, other_device_blocks=gc.owners_summary(others), **data)

# ---------------------------------------------------------------- a release leaves XLA alone
mine = {(b["address"], b["kind"]): b["bytes"] for b in blocks1 if b["kind"] in DEVICE_KINDS}
before_xla = sum(mine.values())
try:
    rep = grshim.release(grshim.CACHED | grshim.ORPHANED)
    rel_err = None
except OSError as e:
    rep, rel_err = {}, str(e)
after_xla = sum(b["bytes"] for b in grshim.blocks() if (b["address"], b["kind"]) in mine and b["state"] == "live")
a = arrays["a"]
vals_ok = float(jnp.max(a)) == 1.0 and float(jnp.min(a)) == 1.0
s_inc = (a + 1.0).block_until_ready()
calc_ok = float(jnp.sum(s_inc[:1024])) == 1024 * 2.0
big = jax.device_put(jnp.ones((256 * MiB // 4,), jnp.float32), d0)
calc_ok = calc_ok and float(jnp.sum(big[: 1 << 20])) == float(1 << 20)
gc.result(name("release"), rel_err is None and before_xla > 0 and after_xla == before_xla and vals_ok and calc_ok,
          "gpureclaim_release(CACHED|ORPHANED): rc %s, cached_bytes %s, orphaned_bytes %s; XLA's blocks %s -> %s "
          "(must not change); array intact: %s; computation after: %s" % (
              rel_err or 0, rep.get("cached_bytes"), rep.get("orphaned_bytes"), gc.mib(before_xla),
              gc.mib(after_xla), vals_ok, calc_ok),
          report=rep, xla_bytes_before=before_xla, xla_bytes_after=after_xla, log_lines=gc.log_reports())

# ---------------------------------------------------------------- helper processes (informational)
rundir = os.environ.get("GPURECLAIM_RUNDIR")
others = []
if rundir:
    for p in glob.glob(os.path.join(rundir, "*.json")):
        try:
            pid = int(os.path.basename(p)[:-5])
            if pid != os.getpid() and os.path.getmtime(p) >= T_START - 1:
                others.append(pid)
        except (ValueError, OSError):
            pass
gc.result(name("helpers"), True,
          "%d other process(es) wrote a status file while JAX ran%s (JAX's helper processes inherit LD_PRELOAD; "
          "only those that initialise CUDA should)" % (len(others), (": pids %s" % sorted(others)) if others else ""),
          pids=sorted(others))

s = grshim.stats()
gc.result(name("routes"), s["untracked_routes"] == 0,
          "untracked_routes %d, untracked_frees %d, host_pinned_bytes %s, live_blocks %d, contexts %d" % (
              s["untracked_routes"], s["untracked_frees"], gc.mib(s["host_pinned_bytes"]), s["live_blocks"],
              s["contexts"]), stats=s)
sys.exit(gc.exit_code())

"""PyTorch under LD_PRELOAD=libgpureclaim.so.

    python3 torch_test.py default|expandable|async

run.sh sets PYTORCH_CUDA_ALLOC_CONF for expandable (expandable_segments:True) and async
(backend:cudaMallocAsync). Checks, each printed as a GPUTEST line:
  accounting   across allocate / free / empty_cache steps, gpureclaim's device bytes change by exactly what
               torch.cuda.memory_reserved() says (live_bytes; pool_reserved_bytes for cudaMallocAsync)
  owner        every device block torch allocated is attributed to PyTorch: owner "pytorch", or a calling library
               of PyTorch's (the detail says how many carry the owner field)
  signal       4 GiB of tensors allocated then deleted (cached); `kill -USR1` from another process; within 20 s
               memory_reserved() <= 64 MiB and the device's free memory rose by >= 95% of what was cached;
               a tensor that stayed alive is intact
  report       the release wrote its JSON line to GPURECLAIM_LOG and updated the status file
  training     a small model trained on the GPU with another SIGUSR1 in the middle matches the same training on
               the GPU without the signal (1e-5) and on the CPU (1e-3); a matmul checked against float64
  routes       untracked_routes == 0
"""
import os
import sys
import time

import gpucommon as gc
import grshim

MODE = sys.argv[1] if len(sys.argv) > 1 else "default"
P = os.environ.get("GPU_TEST_NAME", "torch_" + MODE)
MiB, GiB = gc.MiB, gc.GiB
DEVICE_KINDS = ("device", "pitch", "managed", "async", "vmm")


def name(check):
    return "%s.%s" % (P, check)


try:
    import torch
except Exception as e:  # noqa: BLE001
    gc.result(name("import"), None, "torch not importable: %s: %s" % (type(e).__name__, e))
    sys.exit(0)

if not torch.cuda.is_available():
    gc.result(name("cuda"), False, "torch.cuda.is_available() is False under the preload (torch %s)" % torch.__version__)
    sys.exit(1)
if not gc.preload_ok(name("loaded")):
    sys.exit(1)

dev = torch.device("cuda:0")
gc.info("torch %s, CUDA %s, %s, PYTORCH_CUDA_ALLOC_CONF=%r, gpureclaim %s" % (
    torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0),
    os.environ.get("PYTORCH_CUDA_ALLOC_CONF"), grshim.version()))
backend = torch.cuda.get_allocator_backend() if hasattr(torch.cuda, "get_allocator_backend") else "?"
gc.info("allocator backend: %s" % backend)


def sync():
    torch.cuda.synchronize(dev)


def gr_metric(s):
    return s["pool_reserved_bytes"] if MODE == "async" else s["live_bytes"]


GR_METRIC_NAME = "pool_reserved_bytes" if MODE == "async" else "live_bytes"

# ---------------------------------------------------------------- accounting
torch.empty(1, device=dev)
sync()
torch.cuda.empty_cache()
sync()

hold = []


def alloc(sizes):
    def f():
        for n in sizes:
            hold.append(torch.empty(int(n), dtype=torch.uint8, device=dev))
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
    ("alloc 5 tensors (1..700 MiB)", alloc([1 * MiB, 3 * MiB + 5, 25 * MiB, 100 * MiB, 700 * MiB])),
    ("delete 3 of them (cached)", pop([0, 2, 4])),
    ("alloc 300 small tensors (4..400 KiB)", alloc([4096 * (1 + (i % 100)) for i in range(300)])),
    ("alloc 2 x 256 MiB", alloc([256 * MiB, 256 * MiB])),
    ("delete all", clear),
    ("empty_cache", torch.cuda.empty_cache),
    ("alloc 1 GiB + 300 MiB + 3 x 7 MiB", alloc([GiB, 300 * MiB, 7 * MiB, 7 * MiB, 7 * MiB])),
    ("delete the 1 GiB one", pop([0])),
    ("empty_cache (1 GiB segment goes)", torch.cuda.empty_cache),
    ("delete all + empty_cache", lambda: (clear(), torch.cuda.empty_cache())),
]

sync()
t0 = torch.cuda.memory_reserved(dev)
s0 = grshim.stats()
g0 = gr_metric(s0)
a0 = torch.cuda.memory_allocated(dev)
blocks0 = grshim.blocks()
table = []
ok_all = True
new_seen = []
for label, fn in steps:
    fn()
    sync()
    tr = torch.cuda.memory_reserved(dev)
    ta = torch.cuda.memory_allocated(dev)
    s = grshim.stats()
    dt, dg = tr - t0, gr_metric(s) - g0
    row = {"step": label, "torch_reserved_delta": dt, "gpureclaim_delta": dg, "torch_reserved": tr,
           "gpureclaim_" + GR_METRIC_NAME: gr_metric(s), "live_blocks": s["live_blocks"],
           "torch_allocated_delta": ta - a0, "gpureclaim_live_bytes_delta": s["live_bytes"] - s0["live_bytes"],
           "vmm_mapped_bytes": s["vmm_mapped_bytes"], "pool_used_bytes": s["pool_used_bytes"]}
    row["match"] = dt == dg
    if MODE == "async":
        # secondary, reported only: blocks handed out vs what torch says is allocated
        row["allocated_match"] = (ta - a0) == (s["live_bytes"] - s0["live_bytes"])
    ok_all &= row["match"]
    table.append(row)
    gc.info("%-40s torch reserved %+12d  gpureclaim %s %+12d  %s" % (
        label, dt, GR_METRIC_NAME, dg, "ok" if row["match"] else "MISMATCH"))
    if label.startswith("alloc 5"):
        new_seen = gc.new_blocks(blocks0, grshim.blocks())
gc.result(name("accounting"), ok_all,
          "%d steps: gpureclaim %s delta == torch.cuda.memory_reserved() delta at every step: %s; peak %s"
          % (len(table), GR_METRIC_NAME, "yes" if ok_all else
             "NO (" + "; ".join("%s: torch %+d vs %+d" % (r["step"], r["torch_reserved_delta"], r["gpureclaim_delta"])
                                for r in table if not r["match"]) + ")",
             gc.mib(max(r["torch_reserved_delta"] for r in table))),
          mode=MODE, backend=backend, metric=GR_METRIC_NAME, steps=table)

# ---------------------------------------------------------------- owner attribution
dev_new = [b for b in new_seen if b["kind"] in DEVICE_KINDS]
gc.info("blocks allocated for the first 5 tensors: %s" % gc.owners_summary(new_seen))
ok_owner, detail, data = gc.attribution_check(dev_new, "pytorch")
gc.result(name("owner"), ok_owner, detail, all_new_blocks=gc.owners_summary(new_seen), **data)

# ---------------------------------------------------------------- signal release
N_ELEM = 256 * 1024
keep = torch.arange(N_ELEM, dtype=torch.float32, device=dev)  # 1 MiB that stays alive throughout
sync()
big = [torch.empty(256 * MiB, dtype=torch.uint8, device=dev) for _ in range(16)]  # 4 GiB
sync()
del big
sync()
reserved_before = torch.cuda.memory_reserved(dev)
allocated_before = torch.cuda.memory_allocated(dev)
cached = reserved_before - allocated_before
free_before = torch.cuda.mem_get_info(dev)[0]
rel_before = grshim.stats()["releases"]
st_before = gc.status_file()
st_rel_before = st_before.get("releases", 0) if st_before else 0
gc.info("before the signal: reserved %s, allocated %s, cached %s, device free %s" % (
    gc.mib(reserved_before), gc.mib(allocated_before), gc.mib(cached), gc.mib(free_before)))

t_sig = time.monotonic()
krc = gc.signal_from_other_process("USR1")


def released():
    r = torch.cuda.memory_reserved(dev)
    f = torch.cuda.mem_get_info(dev)[0]
    return (r <= 64 * MiB and (f - free_before) >= 0.95 * cached), r, f


state = {}


def cond():
    ok, r, f = released()
    state["reserved"], state["free"] = r, f
    return ok


ok, waited = gc.wait_for(cond, timeout=20.0)
# the report follows the release; give it a moment if the memory came back
gc.wait_for(lambda: grshim.stats()["releases"] > rel_before, timeout=5.0 if ok else 0.5)
reserved_after, free_after = state.get("reserved", -1), state.get("free", -1)
keep_ok = bool(torch.equal(keep.cpu(), torch.arange(N_ELEM, dtype=torch.float32)))
rose = free_after - free_before
gc.result(name("signal_release"), bool(ok) and keep_ok and cached >= 4 * GiB and krc == 0,
          "kill -USR1 from another process (rc %d): reserved %s -> %s, device free rose by %s = %.1f%% of the %s "
          "cached (need >= 95%%, reserved <= 64 MiB) after %.2f s; live tensor intact: %s"
          % (krc, gc.mib(reserved_before), gc.mib(reserved_after), gc.mib(rose),
             100.0 * rose / cached if cached else 0.0, gc.mib(cached), waited, keep_ok),
          reserved_before=reserved_before, reserved_after=reserved_after, allocated_before=allocated_before,
          cached=cached, free_before=free_before, free_after=free_after, free_rise=rose, seconds=round(waited, 3),
          kill_rc=krc, live_tensor_intact=keep_ok)

st, reports, sig_reports = gc.wait_signal_report(st_rel_before, timeout=5.0)
st_rel = st.get("releases", 0) if st else None
last = st.get("last_release") if st else None
rep = sig_reports[-1]["report"] if sig_reports else {}
gc.result(name("signal_report"), bool(sig_reports) and st is not None and st_rel > st_rel_before
          and isinstance(last, dict) and last.get("trigger") == "signal",
          "%d report line(s) with trigger signal in GPURECLAIM_LOG (last: what=%s cached_bytes=%s framework_bytes=%s "
          "pool_bytes=%s ms=%s); status file releases %s -> %s, last_release.trigger=%s"
          % (len(sig_reports), rep.get("what"), rep.get("cached_bytes"), rep.get("framework_bytes"),
             rep.get("pool_bytes"), rep.get("ms"), st_rel_before, st_rel,
             last.get("trigger") if isinstance(last, dict) else None),
          log_lines=reports, status_file=st)

# ---------------------------------------------------------------- training afterwards
torch.backends.cuda.matmul.allow_tf32 = False
torch.backends.cudnn.allow_tf32 = False


def train(device, signal_at=None):
    torch.manual_seed(1234)
    g = torch.Generator().manual_seed(99)
    X = torch.randn(1024, 64, generator=g)
    Y = torch.randint(0, 10, (1024,), generator=g)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256),
                                torch.nn.ReLU(), torch.nn.Linear(256, 10))
    model = model.to(device)
    X, Y = X.to(device), Y.to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for step in range(30):
        if signal_at is not None and step == signal_at:
            gc.signal_from_other_process("USR1")
        # some churn through the allocator, as a real training step has
        scratch = [torch.empty(8 * MiB, dtype=torch.uint8, device=device) for _ in range(4)]
        del scratch
        loss = torch.nn.functional.cross_entropy(model(X), Y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(float(loss.item()))
        if signal_at is not None and step == signal_at:
            time.sleep(0.3)  # leaves the GIL to gpureclaim's worker mid-training
    return losses, [p.detach().cpu() for p in model.parameters()]


l_ref, p_ref = train(dev)  # the same training on the GPU without a signal: the reference for the run with one
sync()
rel_mid = grshim.stats()["releases"]
t0 = time.monotonic()
l_gpu, p_gpu = train(dev, signal_at=10)
sync()
t_train = time.monotonic() - t0
gc.wait_for(lambda: grshim.stats()["releases"] > rel_mid, timeout=5.0)
mid_releases = grshim.stats()["releases"] - rel_mid
l_cpu, p_cpu = train(torch.device("cpu"))


def maxdiff(la, lb, pa, pb):
    return (max(abs(a - b) for a, b in zip(la, lb)), max(float((a - b).abs().max()) for a, b in zip(pa, pb)))


gpu_loss_diff, gpu_param_diff = maxdiff(l_gpu, l_ref, p_gpu, p_ref)  # same kernels: equal but for rounding
max_loss_diff, max_param_diff = maxdiff(l_gpu, l_cpu, p_gpu, p_cpu)  # GPU vs CPU float32: small differences
finite = all(l == l and abs(l) < 1e6 for l in l_gpu)
A = torch.randn(1024, 1024, generator=torch.Generator().manual_seed(5))
B = torch.randn(1024, 1024, generator=torch.Generator().manual_seed(6))
C_gpu = (A.to(dev) @ B.to(dev)).cpu().double()
C_ref = A.double() @ B.double()
mm_err = float((C_gpu - C_ref).abs().max())
train_ok = (finite and gpu_loss_diff <= 1e-5 and gpu_param_diff <= 1e-5 and max_loss_diff <= 1e-3
            and max_param_diff <= 1e-3 and l_gpu[-1] < l_gpu[0] and mm_err < 1e-2 and mid_releases >= 1)
gc.result(name("training"), train_ok,
          "30 SGD steps on the GPU with SIGUSR1 at step 10 (%d release(s) ran): loss %.5f -> %.5f; vs the same "
          "training on the GPU without a signal: max loss diff %.2e, max parameter diff %.2e (tolerance 1e-5); "
          "vs the CPU: %.2e, %.2e (tolerance 1e-3); 1024^2 matmul max error vs float64 %.2e; %.2f s"
          % (mid_releases, l_gpu[0], l_gpu[-1], gpu_loss_diff, gpu_param_diff, max_loss_diff, max_param_diff,
             mm_err, t_train),
          losses_gpu=l_gpu, losses_gpu_reference=l_ref, losses_cpu=l_cpu, gpu_vs_gpu_loss_diff=gpu_loss_diff,
          gpu_vs_gpu_param_diff=gpu_param_diff, max_loss_diff=max_loss_diff, max_param_diff=max_param_diff,
          matmul_max_err=mm_err, releases_during_training=mid_releases)

# ---------------------------------------------------------------- routes
s = grshim.stats()
gc.result(name("routes"), s["untracked_routes"] == 0,
          "untracked_routes %d, untracked_frees %d, late_frees %d, contexts %d, pools %d, releases %d, "
          "released_bytes %s, table_bytes %d" % (
              s["untracked_routes"], s["untracked_frees"], s["late_frees"], s["contexts"], s["pools"],
              s["releases"], gc.mib(s["released_bytes"]), s["table_bytes"]), stats=s)
sys.exit(gc.exit_code())

"""The frameworks without gpureclaim (no LD_PRELOAD): does each one reach the GPU at all?

One check per framework, each in its own process (a crash in one does not hide the others):
  baseline.torch / baseline.cupy / baseline.jax   PASS: imported, allocated on the GPU and computed a sum;
                                                  SKIP: not installed; FAIL: installed but the GPU is unusable.
A framework test that fails under the preload while its baseline passes points at gpureclaim.
"""
import json
import os
import subprocess
import sys
import time

import gpucommon as gc

P = os.environ.get("GPU_TEST_NAME", "baseline")

PROGRAMS = {
    "torch": """
import torch
x = torch.arange(1 << 20, dtype=torch.float64, device="cuda")
s = float(x.sum())
free, total = torch.cuda.mem_get_info()
print(json.dumps({"version": torch.__version__, "cuda": torch.version.cuda, "device": torch.cuda.get_device_name(0),
                  "ok": s == (1 << 20) * ((1 << 20) - 1) / 2, "free": free, "total": total}))
""",
    "cupy": """
import cupy
x = cupy.arange(1 << 20, dtype=cupy.float64)
s = float(x.sum())
free, total = cupy.cuda.runtime.memGetInfo()
print(json.dumps({"version": cupy.__version__, "ok": s == (1 << 20) * ((1 << 20) - 1) / 2, "free": free,
                  "total": total}))
""",
    "jax": """
import jax, jax.numpy as jnp
gpus = [d for d in jax.devices() if d.platform in ("gpu", "cuda")]
if not gpus:
    print(json.dumps({"version": jax.__version__, "ok": False, "devices": [str(d) for d in jax.devices()]}))
else:
    x = jax.device_put(jnp.arange(1 << 20, dtype=jnp.float32), gpus[0])
    s = float(jnp.sum(x[:1000]))
    print(json.dumps({"version": jax.__version__, "device": str(gpus[0]), "ok": s == 999 * 1000 / 2}))
""",
}

env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD" and not k.startswith("GPURECLAIM_")}
env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"
for fw, prog in PROGRAMS.items():
    code = "import json, sys\ntry:\n    import %s\nexcept Exception as e:\n" \
           "    print(json.dumps({'missing': '%%s: %%s' %% (type(e).__name__, e)})); sys.exit(0)\n%s" % (
               "jax" if fw == "jax" else fw, prog)
    t0 = time.monotonic()
    try:
        p = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=90)
        out, err, rc = p.stdout, p.stderr, p.returncode
    except subprocess.TimeoutExpired as e:
        out, err, rc = (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or ""), \
            "timed out after 90 s", -1
    secs = time.monotonic() - t0
    res = None
    for line in reversed(out.strip().splitlines()):
        try:
            res = json.loads(line)
            break
        except ValueError:
            continue
    if res is not None and "missing" in res:
        gc.result("%s.%s" % (P, fw), None, "%s not importable: %s" % (fw, res["missing"]))
    elif res is not None and rc == 0 and res.get("ok"):
        gc.result("%s.%s" % (P, fw), True, "%s %s works without gpureclaim (%.1f s)%s" % (
            fw, res.get("version"), secs,
            "; device free %s of %s" % (gc.mib(res["free"]), gc.mib(res["total"])) if "free" in res else ""),
            seconds=round(secs, 2), result=res)
    else:
        gc.result("%s.%s" % (P, fw), False, "%s fails WITHOUT gpureclaim (exit %s, %.1f s): %s" % (
            fw, rc, secs, " | ".join((err or out).strip().splitlines()[-3:])[:600]), result=res, exit_status=rc)
sys.exit(gc.exit_code())

#!/usr/bin/env bash
# examples/deploy/, exercised against the real command on the simulator:
#  - systemd: the user service and timer pass `systemd-analyze --user verify` without a diagnostic, and the
#    service's ExecStart, run as systemd would (its Environment= and %u), writes the Prometheus file of a live
#    process;
#  - Slurm: the TaskProlog, run with the environment slurmd gives a GPU task, prints the exports that make
#    examples/train.py run under gpureclaim (checked by running it so) with its release log in the step's file;
#    nothing for a task without GPUs; a "print" line for a value gpureclaim refuses; the TaskEpilog removes
#    what a killed task left in the run directory. (The scripts get the environment slurmd would give them;
#    test_slurm runs them under a real slurmd.)
#  - Kubernetes: the pod spec parses as YAML, and its containers' commands run with their env (paths of the
#    volumes mapped to a temporary directory, `python3 train.py` to examples/train.py, the downward API's
#    metadata.name and .namespace given, $(VAR) expanded as Kubernetes expands it); the metrics sidecar writes a
#    file named after its pod, every sample labelled with the pod and namespace (node_exporter fails a scrape
#    with two identical series, and every pod of a node writes into one directory);
#  - Jupyter: install_kernel.py writes a kernel spec naming the interpreter that ran it and the command by their
#    absolute paths (a bare "python3" ran whatever came first on Jupyter's PATH), and its argv runs with a
#    stand-in ipykernel_launcher that reports what the kernel would see: gpureclaim preloaded and loaded, the
#    connection file passed.
# Usage: test_deploy.sh SOURCE_DIR COMMAND HOLD SIM_DIR (the simulator's libcuda)
set -euo pipefail
src="$1" cmd="$2" hold="$3" sim="$4"
deploy="$src/examples/deploy"
tmp="$(mktemp -d)"
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  rm -rf "$tmp"
}
trap cleanup EXIT
fail=0
bad() { echo "test_deploy: $*"; fail=1; }
py=""
for cand in /usr/bin/python3 python3; do
  command -v "$cand" >/dev/null && "$cand" -c 'import yaml' 2>/dev/null && { py="$(command -v "$cand")"; break; }
done
[[ -n "$py" ]] || { echo "test_deploy: no python3 with yaml (scripts/deps.sh installs python3-yaml)"; exit 1; }
mkdir -m 700 "$tmp/run" "$tmp/bin"
ln -s "$cmd" "$tmp/bin/gpureclaim" # the command finds its library from its real path
export PATH="$tmp/bin:$PATH" GPURECLAIM_RUNDIR="$tmp/run" PYTHONPATH="$src/python"
unset GPURECLAIM_LOG

# start_hold: a process holding memory under gpureclaim (tests/cli/hold); sets holdpid.
start_hold() {
  local fifo="$tmp/hold.in.$1" out="$tmp/hold.out.$1"
  mkfifo "$fifo"
  GPURECLAIM_LOG="$tmp/hold.log.$1" "$hold" <"$fifo" >"$out" 2>&1 &
  holdpid=$!
  pids+=("$holdpid")
  # shellcheck disable=SC2034 # the fd keeps hold alive (it exits when stdin closes)
  exec {holdfd}>"$fifo"
  for _ in $(seq 1 600); do grep -q '^ready' "$out" && break; sleep 0.05; done
  grep -q "^ready $holdpid" "$out" || { echo "test_deploy: hold did not start: $(cat "$out")"; exit 1; }
}

# ---- systemd ----
sd="$tmp/systemd"
mkdir -p "$sd"
sed "s|/usr/bin/gpureclaim|$cmd|" "$deploy/systemd/gpureclaim-textfile.service" >"$sd/gpureclaim-textfile.service"
cp "$deploy/systemd/gpureclaim-textfile.timer" "$sd/"
if command -v systemd-analyze >/dev/null; then
  mkdir -m 700 "$tmp/xdg"
  diag="$(XDG_RUNTIME_DIR="$tmp/xdg" systemd-analyze --user verify --man=no "$sd/gpureclaim-textfile.service" \
          "$sd/gpureclaim-textfile.timer" 2>&1)" || bad "systemd-analyze verify failed: $diag"
  [[ -z "$diag" ]] || bad "systemd-analyze verify: $diag"
else
  echo "test_deploy: systemd-analyze is not installed: the units are not verified, only run"
fi
grep -q '^WantedBy=timers.target' "$sd/gpureclaim-textfile.timer" || bad "the timer is not wanted by timers.target"
start_hold sd
prom="$tmp/textfile/gpureclaim-$(id -un).prom"
mkdir -p "$tmp/textfile"
env_line="$(sed -n 's/^Environment=PROM_FILE=//p' "$sd/gpureclaim-textfile.service")"
exec_line="$(sed -n 's/^ExecStart=//p' "$sd/gpureclaim-textfile.service")"
[[ "$env_line" == */gpureclaim-%u.prom && "$exec_line" == *' ps --prometheus ${PROM_FILE}' ]] ||
  bad "unexpected service lines: Environment=PROM_FILE=$env_line ExecStart=$exec_line"
PROM_FILE="$tmp/textfile/gpureclaim-%u.prom"
PROM_FILE="${PROM_FILE//%u/$(id -un)}"
# shellcheck disable=SC2086 # ExecStart is split on spaces, as systemd splits it
${exec_line//'${PROM_FILE}'/$PROM_FILE} || bad "the service's command failed"
grep -q "^gpureclaim_up{pid=\"$holdpid\",command=\"hold\"} 1" "$prom" 2>/dev/null ||
  bad "the service wrote no gpureclaim_up for $holdpid: $(cat "$prom" 2>&1)"
grep -q "^gpureclaim_live_bytes{pid=\"$holdpid\"" "$prom" || bad "no gpureclaim_live_bytes for $holdpid"

# ---- Slurm ----
slurm_env=(SLURM_JOB_ID=4242 SLURM_STEP_ID=0 SLURM_JOB_UID="$(id -u)" SLURM_JOB_USER="$(id -un)"
           SLURM_JOB_GPUS=0 SLURM_STEP_GPUS=0 CUDA_VISIBLE_DEVICES=0 TMPDIR="$tmp")
# A sanitizer build's runtime must come first (GR_PRELOAD): as an LD_PRELOAD the task already has, it stays.
out="$(env "${slurm_env[@]}" LD_PRELOAD="${GR_PRELOAD:-}" sh "$deploy/slurm/gpureclaim-taskprolog.sh")"
grep -q "^export LD_PRELOAD=.*libgpureclaim.so.0" <<<"$out" || bad "the task prolog exports no LD_PRELOAD: $out"
grep -qx "export GPURECLAIM_LOG=$tmp/gpureclaim-4242.0.log" <<<"$out" || bad "the task prolog exports no log: $out"
# The task: the prolog's exports applied, as slurmstepd applies them.
task_env=()
while read -r word rest; do [[ $word == export ]] && task_env+=("$rest"); done <<<"$out"
run="$(env "${slurm_env[@]}" "${task_env[@]}" LD_LIBRARY_PATH="$sim" \
       "$py" "$src/examples/train.py" --steps 2 --width 256 2>&1)" || bad "the task failed: $run"
grep -q 'gpureclaim loaded' <<<"$run" || bad "the task did not run under gpureclaim: $run"
grep -q '"event":"release"' "$tmp/gpureclaim-4242.0.log" 2>/dev/null || bad "no release report in the step's log"
out="$(env SLURM_JOB_ID=4243 SLURM_STEP_ID=0 TMPDIR="$tmp" sh "$deploy/slurm/gpureclaim-taskprolog.sh")"
[[ -z "$out" ]] || bad "the task prolog touched a task without GPUs: $out"
out="$(env "${slurm_env[@]}" GPURECLAIM_SIGNAL=bogus sh "$deploy/slurm/gpureclaim-taskprolog.sh")"
[[ "$out" == "print gpureclaim: not enabled for this task: "* && "$out" != *export* ]] ||
  bad "a refused value: the task prolog printed: $out"
# The epilog: a task killed by Slurm leaves its entries behind; the epilog removes them.
start_hold slurm
kill -9 "$holdpid"
wait "$holdpid" 2>/dev/null || true
[[ -e "$tmp/run/$holdpid.json" ]] || bad "the killed task left no status file (nothing for the epilog to do)"
env "${slurm_env[@]}" sh "$deploy/slurm/gpureclaim-taskepilog.sh" || bad "the task epilog failed"
[[ ! -e "$tmp/run/$holdpid.json" && ! -e "$tmp/run/$holdpid.sock" ]] || bad "the task epilog left $holdpid's entries"
[[ -s "$tmp/gpureclaim-4242.0.log" ]] || bad "the task epilog removed a log with reports"

# ---- Kubernetes and Jupyter: parsed, then their commands run ----
mkdir -p "$tmp/k8s/metrics" "$tmp/jupyter"
cat >"$tmp/jupyter/ipykernel_launcher.py" <<'PY'
import os, sys, gpureclaim
assert sys.argv[1:] == ["-f", os.environ["GR_CONNECTION_FILE"]], sys.argv
maps = open("/proc/self/maps").read()
print("kernel: preloaded" if "libgpureclaim.so" in os.environ.get("LD_PRELOAD", "") else "kernel: NOT PRELOADED")
print("kernel: gpureclaim", gpureclaim.version(), "mapped" if "libgpureclaim.so" in maps else "NOT MAPPED")
PY
GR_SRC="$src" GR_TMP="$tmp" GR_CMD="$cmd" GR_SIM="$sim" GR_PY="$py" GR_HOLD="$hold" GR_CMD_LINK="$tmp/bin/gpureclaim" \
  "$py" - <<'PY' || fail=1
import json, os, re, subprocess, sys, time, yaml
src, tmp, sim = os.environ["GR_SRC"], os.environ["GR_TMP"], os.environ["GR_SIM"]
py = os.environ["GR_PY"]
ok = True

def bad(msg):
    global ok
    ok = False
    print("test_deploy:", msg)

def run(argv, env, what):
    p = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120)
    if p.returncode != 0:
        bad("%s exited %d: %s%s" % (what, p.returncode, p.stdout, p.stderr))
    return p.stdout + p.stderr

with open(os.path.join(src, "examples/deploy/kubernetes/pod.yaml")) as f:
    pod = yaml.safe_load(f)
if pod.get("kind") != "Pod" or pod.get("apiVersion") != "v1":
    bad("pod.yaml is not a v1 Pod")
spec = pod["spec"]
if not spec.get("shareProcessNamespace"):
    bad("the sidecar needs shareProcessNamespace to check pids")
mounts = {v["name"]: v for v in spec["volumes"]}
base_env = dict(os.environ, LD_LIBRARY_PATH=sim, PYTHONPATH=os.path.join(src, "python"),
                LD_PRELOAD=os.environ.get("GR_PRELOAD", ""))  # a sanitizer build's runtime
base_env.pop("GPURECLAIM_RUNDIR", None)
def mapped(path):  # the volumes' mount paths, under the temporary directory
    for prefix in ("/run/gpureclaim", "/metrics"):
        if path.startswith(prefix):
            return os.path.join(tmp, "k8s", prefix.strip("/").replace("/", "_")) + path[len(prefix):]
    return path
os.makedirs(mapped("/run/gpureclaim"), exist_ok=True)
os.makedirs(mapped("/metrics"), exist_ok=True)
for c in spec["containers"]:
    for m in c.get("volumeMounts", []):
        if m["name"] not in mounts:
            bad("container %s mounts an undeclared volume %s" % (c["name"], m["name"]))
    env = dict(base_env)
    meta = {"metadata.name": pod["metadata"]["name"], "metadata.namespace": pod["metadata"].get("namespace", "default")}
    for e in c.get("env", []):
        if "valueFrom" in e:  # the downward API
            env[e["name"]] = meta[e["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            env[e["name"]] = mapped(e["value"])
    # $(VAR) in a command is expanded by Kubernetes from the container's variables.
    argv = [mapped(re.sub(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", lambda m: env.get(m.group(1), m.group(0)), a))
            for a in c["command"]]
    if c["name"] == "train":
        if "nvidia.com/gpu" not in c["resources"]["limits"]:
            bad("the training container asks for no GPU")
        if argv[:3] != ["gpureclaim", "run", "--"]:
            bad("the training container does not start under gpureclaim run: %s" % argv)
        argv = [os.environ["GR_CMD"], "run", "--"] + [py, os.path.join(src, "examples/train.py"),
                                                      "--steps", "2", "--width", "256"]
        out = run(argv, env, "the training container")
        if "gpureclaim loaded" not in out or "after the release: 0.0 MiB reserved" not in out:
            bad("the training container's job did not run under gpureclaim: " + out)
        log = env["GPURECLAIM_LOG"]
        if not os.path.exists(log) or '"event":"release"' not in open(log).read():
            bad("no release report in the pod's GPURECLAIM_LOG")
        if not os.path.isdir(env["GPURECLAIM_RUNDIR"]) or os.stat(env["GPURECLAIM_RUNDIR"]).st_mode & 0o777 != 0o700:
            bad("the library made no 0700 run directory in the shared volume")
    elif c["name"] == "metrics":
        if argv[:2] != ["gpureclaim", "ps"] or "--loop" not in argv:
            bad("the sidecar does not run gpureclaim ps --loop: %s" % argv)
        argv[0] = os.environ["GR_CMD"]
        prom = mapped("/metrics/gpureclaim-default-train.prom")  # its pod's own file
        # A process of the pod for it to see (the training job above has ended): hold, under gpureclaim.
        hold = subprocess.Popen([os.environ["GR_CMD"], "run", "--", os.environ["GR_HOLD"]], env=env,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        ready = hold.stdout.readline()
        side = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 60  # a hang guard: the first round is written at once
        while not os.path.exists(prom) and side.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        side.terminate()  # the loop ends on SIGTERM, as when Kubernetes stops the pod, exit status 0
        out, err = side.communicate(timeout=60)
        hold.stdin.close()
        hold.wait(timeout=60)
        if side.returncode != 0:
            bad("the metrics sidecar exited %s: %s" % (side.returncode, err))
        if not os.path.exists(prom):
            bad("the sidecar wrote no %s: %s" % (prom, os.listdir(mapped("/metrics"))))
        else:
            samples = [l for l in open(prom).read().splitlines() if l and not l.startswith("#")]
            pid = ready.split()[1] if ready.startswith("ready ") else "?"
            if not [l for l in samples if l.startswith('gpureclaim_up{pid="%s",' % pid)]:
                bad("the sidecar's file has no gpureclaim_up of the pod's process %s: %s" % (pid, samples))
            for l in samples:
                if not l.split("} ")[0].endswith(',namespace="default",pod="train"'):
                    bad("a sample without its pod's labels: " + l)
    else:
        bad("unknown container %s" % c["name"])

data = os.path.join(tmp, "jupyter-data")
ienv = dict(base_env, JUPYTER_DATA_DIR=data, PYTHONPATH=os.path.join(tmp, "jupyter"),
            PATH=os.path.dirname(os.environ["GR_CMD_LINK"]) + os.pathsep + os.environ["PATH"])
run([py, os.path.join(src, "examples/deploy/jupyter/install_kernel.py"), "--user"], ienv, "install_kernel.py")
with open(os.path.join(data, "kernels", "python3-gpureclaim", "kernel.json")) as f:
    kernel = json.load(f)
for key in ("argv", "display_name", "language"):
    if key not in kernel:
        bad("kernel.json has no %s" % key)
conn = os.path.join(tmp, "jupyter", "kernel-1.json")
argv = [a.replace("{connection_file}", conn) for a in kernel["argv"]]
if argv[1:3] != ["run", "--"] or "ipykernel_launcher" not in argv or not os.path.isabs(argv[0]):
    bad("kernel.json does not start ipykernel under gpureclaim run, by absolute paths: %s" % argv)
if argv[3] != os.path.abspath(py):
    bad("kernel.json names %s, not the interpreter that installed it (%s)" % (argv[3], py))
if os.path.realpath(argv[0]) != os.path.realpath(os.environ["GR_CMD"]):
    bad("kernel.json names %s, not the gpureclaim command on PATH" % argv[0])
# Without ipykernel for that interpreter the installer refuses, saying which interpreter lacks it.
p = subprocess.run([py, os.path.join(src, "examples/deploy/jupyter/install_kernel.py")], capture_output=True,
                   text=True, env=dict(ienv, PYTHONPATH=""), timeout=60)
if p.returncode == 0 or "has no ipykernel" not in p.stderr:
    bad("install_kernel.py without ipykernel: %s %s" % (p.returncode, p.stderr))
env = dict(base_env, GR_CONNECTION_FILE=conn, GPURECLAIM_RUNDIR=os.path.join(tmp, "run"),
           PYTHONPATH=os.path.join(tmp, "jupyter") + os.pathsep + os.path.join(src, "python"))
env.update(kernel.get("env", {}))
out = run(argv, env, "the kernel")
if "kernel: preloaded" not in out or "mapped" not in out or "NOT" in out:
    bad("the kernel did not start under gpureclaim: " + out)
sys.exit(0 if ok else 1)
PY

((fail == 0)) || exit 1
echo "test_deploy: systemd units, Slurm task prolog/epilog, pod spec and kernel spec ok"

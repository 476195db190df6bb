#!/usr/bin/env bash
# examples/deploy/slurm/ under a real Slurm: a private single-node cluster (munged, slurmctld and slurmd from
# Debian's slurm-wlm packages, run as the current user with every file in a temporary directory and ports
# nobody listens on) whose TaskProlog and TaskEpilog are the example scripts. A step given a GPU
# (CUDA_VISIBLE_DEVICES, as gres/gpu sets it) runs examples/train.py under gpureclaim on the simulator, its
# release report lands in the step's log, and `gpureclaim release` reaches it from outside while it runs; a
# step without a GPU is left alone. Skipped, saying so, where slurm-wlm is not installed (scripts/deps.sh
# installs it). Usage: test_slurm.sh SOURCE_DIR COMMAND SIM_DIR
set -euo pipefail
src="$1" cmd="$2" sim="$3"
for tool in munged munge slurmctld slurmd srun sinfo; do
  command -v "$tool" >/dev/null || [[ -x /usr/sbin/$tool ]] ||
    { echo "test_slurm: skipped: $tool is not installed (scripts/deps.sh installs slurmd, slurmctld, slurm-client, munge)"; exit 77; }
done
export PATH="$PATH:/usr/sbin"
t="$(mktemp -d)"
chmod 700 "$t"
daemons=() # the pids of the daemons this test started (read from their pid files once they are up)
stop() {
  local p
  [[ ${#daemons[@]} -eq 3 ]] && scancel --full -u "$(id -un)" 2>/dev/null # a failed test's steps, in this cluster
  for p in "${daemons[@]}"; do kill "$p" 2>/dev/null || true; done
  for p in "${daemons[@]}"; do # gone before their directory is; SIGKILL after 10 s
    for _ in $(seq 1 200); do kill -0 "$p" 2>/dev/null || break; sleep 0.05; done
    kill -0 "$p" 2>/dev/null && kill -9 "$p" 2>/dev/null || true
  done
  rm -rf "$t"
}
started() { # started NAME: records the daemon's pid
  [[ -s "$t/$1.pid" ]] || { logs; echo "test_slurm: $1 wrote no pid file"; exit 1; }
  daemons+=("$(cat "$t/$1.pid")")
}
trap stop EXIT
logs() { for f in "$t"/*.log; do echo "== $f"; tail -20 "$f"; done; }

dd if=/dev/urandom of="$t/munge.key" bs=1024 count=1 2>/dev/null
chmod 400 "$t/munge.key"
force=""
[[ $(id -u) -eq 0 ]] && force="--force" # munged refuses root unless told
munged $force --socket="$t/munge.sock" --key-file="$t/munge.key" --pid-file="$t/munged.pid" \
  --log-file="$t/munged.log" --seed-file="$t/munge.seed" || { logs; echo "test_slurm: munged did not start"; exit 1; }
started munged

read -r p1 p2 < <(python3 -c 'import socket
s=[socket.socket() for _ in range(2)]
[x.bind(("127.0.0.1", 0)) for x in s]
print(*[x.getsockname()[1] for x in s])')
host="$(hostname -s)" user="$(id -un)"
mkdir -p "$t/state" "$t/spool" "$t/bin"
mkdir -m 700 "$t/run"
cat >"$t/slurm.conf" <<CONF
ClusterName=grtest
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=$p1
SlurmdPort=$p2
AuthType=auth/munge
AuthInfo=socket=$t/munge.sock
CredType=cred/munge
SlurmUser=$user
SlurmdUser=$user
StateSaveLocation=$t/state
SlurmdSpoolDir=$t/spool
SlurmctldPidFile=$t/slurmctld.pid
SlurmdPidFile=$t/slurmd.pid
SlurmctldLogFile=$t/slurmctld.log
SlurmdLogFile=$t/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
TaskProlog=$src/examples/deploy/slurm/gpureclaim-taskprolog.sh
TaskEpilog=$src/examples/deploy/slurm/gpureclaim-taskepilog.sh
NodeName=$host NodeAddr=127.0.0.1 CPUs=1 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
CONF
export SLURM_CONF="$t/slurm.conf"
slurmctld -i || { logs; echo "test_slurm: slurmctld did not start"; exit 1; }
for _ in $(seq 1 200); do [[ -s "$t/slurmctld.pid" ]] && break; sleep 0.05; done
started slurmctld
slurmd || { logs; echo "test_slurm: slurmd did not start"; exit 1; }
for _ in $(seq 1 200); do [[ -s "$t/slurmd.pid" ]] && break; sleep 0.05; done
started slurmd
for _ in $(seq 1 600); do [[ "$(sinfo -h -o %t 2>/dev/null)" == idle ]] && break; sleep 0.05; done
[[ "$(sinfo -h -o %t 2>/dev/null)" == idle ]] || { logs; echo "test_slurm: the node did not become idle"; exit 1; }

# The job's environment: the command on PATH, the simulator, a private run directory, the step logs in $t.
ln -s "$cmd" "$t/bin/gpureclaim"
export PATH="$t/bin:$PATH" LD_LIBRARY_PATH="$sim" GPURECLAIM_RUNDIR="$t/run" TMPDIR="$t" PYTHONPATH="$src/python"
job="--export=ALL,LD_PRELOAD=${GR_PRELOAD:-}" # a sanitizer build's runtime, in the job only: the prolog keeps it first
unset GPURECLAIM_LOG CUDA_VISIBLE_DEVICES SLURM_JOB_GPUS SLURM_STEP_GPUS
py="$(command -v python3)"
fail=0
bad() { echo "test_slurm: $*"; fail=1; }

out="$(CUDA_VISIBLE_DEVICES=0 srun "$job" -N1 -n1 "$py" "$src/examples/train.py" --steps 2 --width 256 2>&1)" ||
  bad "srun failed: $out"
echo "$out"
grep -q 'gpureclaim loaded' <<<"$out" || bad "the GPU step did not run under gpureclaim"
grep -q 'after the release: 0.0 MiB reserved' <<<"$out" || bad "the GPU step's release gave nothing back"
logf="$(ls "$t"/gpureclaim-*.0.log 2>/dev/null | head -1)"
[[ -n "$logf" ]] && grep -q '"event":"release"' "$logf" || bad "no release report in the step's log ($logf)"

out="$(srun "$job" -N1 -n1 "$py" "$src/examples/train.py" --steps 1 --width 256 2>&1)" || bad "srun failed: $out"
grep -q 'gpureclaim not loaded' <<<"$out" || bad "a step without a GPU ran under gpureclaim: $out"

# From outside, while the step runs: the user's own gpureclaim finds and releases it.
CUDA_VISIBLE_DEVICES=0 srun "$job" -N1 -n1 "$py" "$src/examples/train.py" --steps 1 --width 256 --wait 60 \
  >"$t/wait.out" 2>&1 &
srunpid=$!
pid=""
for _ in $(seq 1 600); do
  # "waiting up to" comes once CUDA is up (status file and socket written) and model 1 is trained
  # (the background step's redirection may not have created the file yet: that is no error under set -e)
  pid="$(sed -n 's/^waiting up to .*gpureclaim release \([0-9]*\)`.*/\1/p' "$t/wait.out" 2>/dev/null || true)"
  [[ -n "$pid" && -f "$t/run/$pid.json" && -S "$t/run/$pid.sock" ]] && break
  sleep 0.05
done
if [[ -n "$pid" ]]; then
  rel="$(gpureclaim release "$pid" 2>&1)" || bad "gpureclaim release $pid failed: $rel"
  echo "$rel"
  grep -q "^$pid (.*): released" <<<"$rel" || bad "the release of the running step said: $rel"
else
  bad "the waiting step did not start under gpureclaim: $(cat "$t/wait.out")"
fi
# The release lets the step go on to its end (train.py waits for it); then no job is left when slurmd stops.
wait "$srunpid" || bad "the waiting step failed: $(cat "$t/wait.out")"
for _ in $(seq 1 600); do [[ -z "$(squeue -h 2>/dev/null)" ]] && break; sleep 0.05; done
[[ -z "$(squeue -h)" ]] || { bad "jobs left: $(squeue -h)"; scancel --full "$(squeue -h -o %i)" || true; }

((fail == 0)) || { logs; exit 1; }
echo "test_slurm: TaskProlog/TaskEpilog under slurmd: GPU steps run under gpureclaim, others not; release from outside ok"

#!/bin/sh
# Slurm TaskEpilog (see gpureclaim-taskprolog.sh): runs as the job's user after each task. A task that Slurm
# killed (time limit, scancel) leaves its status file and control socket in the user's gpureclaim run
# directory; `gpureclaim ps` removes the entries of processes that are gone. The step's release log is kept
# when it holds reports, removed when empty.
gpus="${CUDA_VISIBLE_DEVICES:-${SLURM_STEP_GPUS:-${SLURM_JOB_GPUS:-}}}"
[ -n "$gpus" ] && [ "$gpus" != "NoDevFiles" ] || exit 0
command -v gpureclaim >/dev/null 2>&1 || exit 0
gpureclaim ps >/dev/null 2>&1
log="${TMPDIR:-/tmp}/gpureclaim-${SLURM_JOB_ID:-0}.${SLURM_STEP_ID:-0}.log"
[ -f "$log" ] && [ ! -s "$log" ] && rm -f "$log"
exit 0

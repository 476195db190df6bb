#!/bin/sh
# Slurm TaskProlog: runs every task of a GPU job under gpureclaim. slurm.conf on the GPU nodes:
#
#   TaskProlog=/etc/slurm/gpureclaim-taskprolog.sh
#   TaskEpilog=/etc/slurm/gpureclaim-taskepilog.sh
#
# Slurm runs it as the job's user, with the task's environment, before each task, and applies the
# "export NAME=value" lines it prints to the task. It asks `gpureclaim run` which LD_PRELOAD the task needs
# (the library installed beside the command, placed after any sanitizer runtime, an older libgpureclaim
# dropped), so the task runs exactly as under `gpureclaim run`, and the user can then `gpureclaim release` it
# from a shell on the node (`srun --overlap --jobid=JOB --pty bash`). Release reports go to a file per job
# step (GPURECLAIM_LOG) instead of the job's output, unless the job sets GPURECLAIM_LOG itself.
#
# Only tasks that were given GPUs are touched (CUDA_VISIBLE_DEVICES or SLURM_STEP_GPUS/SLURM_JOB_GPUS set).
# A job opts out with `sbatch --export=ALL,GPURECLAIM_DISABLE=1`; a GPURECLAIM_* value that gpureclaim refuses
# leaves the task alone, with a line in the job's output saying why.
gpus="${CUDA_VISIBLE_DEVICES:-${SLURM_STEP_GPUS:-${SLURM_JOB_GPUS:-}}}"
[ -n "$gpus" ] && [ "$gpus" != "NoDevFiles" ] || exit 0
case "${GPURECLAIM_DISABLE:-0}" in 1 | yes | on) exit 0 ;; esac
command -v gpureclaim >/dev/null 2>&1 || exit 0

if ! preload="$(gpureclaim run -- printenv LD_PRELOAD 2>&1)"; then
  echo "print gpureclaim: not enabled for this task: $(echo "$preload" | head -1)"
  exit 0
fi
echo "export LD_PRELOAD=$preload"
if [ -z "${GPURECLAIM_LOG:-}" ]; then
  echo "export GPURECLAIM_LOG=${TMPDIR:-/tmp}/gpureclaim-${SLURM_JOB_ID:-0}.${SLURM_STEP_ID:-0}.log"
fi
exit 0

#!/usr/bin/env bash
# try-requeue.sh: watch SLURM's walltime signal and a self-requeue on the local cluster.
#
# Submits a tiny shell job (--time=1 --signal=USR1@50 --requeue) whose srun step traps
# USR1 and runs `scontrol requeue $SLURM_JOB_ID`; the requeued run sees
# SLURM_RESTART_COUNT=1 and exits. Prints the job's log with timestamps, so you see
# when the signal came and how long the restart took (here: signal 8-27 s after
# start, restart ~15 s after the requeue). Needs the cluster from
# start-local-cluster.sh and SLURM_CONF set. No ringtrain code involved: this is the
# mechanism ringtrain's RequeueCoordinator builds on.
set -euo pipefail
source "$(dirname "$0")/job_state.sh"
: "${SLURM_CONF:=${RINGTRAIN_SLURM_DIR:-/tmp/ringtrain-slurm}/slurm.conf}"
export SLURM_CONF
WORK="$(mktemp -d /tmp/ringtrain-try-requeue.XXXXXX)"
cat >"$WORK/job.sbatch" <<'JOB'
#!/bin/bash
#SBATCH --nodes=1 --ntasks=1 --time=1 --signal=USR1@50 --requeue --open-mode=append
echo "$(date +%T) start, SLURM_RESTART_COUNT=${SLURM_RESTART_COUNT:-0}"
if [[ "${SLURM_RESTART_COUNT:-0}" -ge 1 ]]; then echo "$(date +%T) restarted: done"; exit 0; fi
srun bash -c 'trap "echo \$(date +%T) got USR1; scontrol requeue \$SLURM_JOB_ID; echo \$(date +%T) requeued rc=\$?; exit 0" USR1; for i in $(seq 1 120); do sleep 1; done'
JOB
JOB="$(sbatch --parsable --output="$WORK/job.out" "$WORK/job.sbatch")"
echo "$(date +%T) submitted job $JOB; waiting for it to be signalled, requeued and restarted (about a minute)"
slurm_wait_job "$JOB" 150
state="$JOB_STATE"
restarts="$(slurm_job_field "$JOB" Restarts)"
cat "$WORK/job.out"
echo "final: JobState=$state Restarts=$restarts (log: $WORK/job.out)"
[[ "$state" == COMPLETED && "${restarts:-0}" -ge 1 ]]

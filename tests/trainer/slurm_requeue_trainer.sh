#!/usr/bin/env bash
# The Trainer on the local SLURM cluster (issue 6's proof): a 2-node x 1-task sbatch job
# of the digits demo with a 2-minute walltime and --signal=USR1@110 gets signalled,
# checkpoints, requeues itself, resumes and finishes; its per-step loss sequence must
# equal an uninterrupted run's step for step (CPU, f32), and it must reach the same
# accuracy as the same training under ringrun.
#   slurm_requeue_trainer.sh <ringrun> <digits_ddp>
set -euo pipefail
source "$(dirname "$0")/../../scripts/slurm/job_state.sh"
RINGRUN=$1 DEMO=$2
WORK="$(mktemp -d /tmp/ringtrain-trainer-requeue.XXXXXX)"
trap 'if [[ -n "${JOB:-}" ]]; then scancel "$JOB" 2>/dev/null || true; fi' EXIT
# ~55 s of training: SLURM sends the signal at its first time-limit check (every 30 s) where
# the time left is within lead + 30 s, i.e. at the first check of every run here; 55 s
# leaves room for a late check. The 2-minute limit keeps a late check from killing the job.
ARGS=(--no-progress --epochs 3000 --batch-size 16 --keep-last 2)
fail() { echo "FAIL: $*"; exit 1; }

"$RINGRUN" --nproc-per-node 2 --master-port 29731 "$DEMO" "${ARGS[@]}" --step-log "$WORK/straight.csv" \
  > "$WORK/straight.out"
grep "final test accuracy" "$WORK/straight.out" || fail "the uninterrupted run did not finish"

cat >"$WORK/job.sbatch" <<SBATCH
#!/bin/bash
#SBATCH --job-name=rt-trainer-requeue
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --time=2
#SBATCH --signal=USR1@110
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=$WORK/job.out
echo "batch start \$(date +%s) restart \${SLURM_RESTART_COUNT:-0}"
srun "$DEMO" ${ARGS[*]} --num-nodes 2 --checkpoint-dir "$WORK/ckpt" --step-log "$WORK/job.csv"
SBATCH
t0=$(date +%s)
JOB="$(sbatch --parsable "$WORK/job.sbatch")"
echo "submitted job $JOB (work dir $WORK)"
slurm_wait_job "$JOB" "${RINGTRAIN_REQUEUE_TEST_TIMEOUT:-400}"
state="$JOB_STATE"
echo "---- job.out ----"; cat "$WORK/job.out" || true; echo "-----------------"
echo "final state: $state after $JOB_WAITED s"
[[ "$state" == COMPLETED ]] || fail "job $JOB ended '$state' (expected COMPLETED)"
grep -q "requeued job $JOB" "$WORK/job.out" || fail "rank 0 never ran scontrol requeue"
grep -q "restart 1" "$WORK/job.out" || fail "the job did not come back with SLURM_RESTART_COUNT=1"
grep -q "resumed from" "$WORK/job.out" || fail "the requeued job did not resume from a checkpoint"
cmp "$WORK/straight.csv" "$WORK/job.csv" || fail "the loss sequence differs from the uninterrupted run"
a="$(grep -o 'final test accuracy [0-9.]*%' "$WORK/straight.out")"
b="$(grep -o 'final test accuracy [0-9.]*%' "$WORK/job.out" | tail -1)"
[[ "$a" == "$b" ]] || fail "accuracy differs: ringrun '$a', sbatch '$b'"
echo "PASS: requeued $(grep -c 'requeued job' "$WORK/job.out") time(s); $(wc -l < "$WORK/job.csv") steps identical to the uninterrupted run; $b"
JOB=""
rm -rf "$WORK"

#!/usr/bin/env bash
# requeue_job_test.sh <slurm_requeue_check>: a real walltime requeue on the local cluster.
#
# Submits a 2-node job with --time=1 --signal=USR1@50 --requeue running
# slurm_requeue_check under srun; waits until SLURM reports it COMPLETED; then
# checks the log: the signal led to an agreed decision and a `scontrol requeue`,
# the job came back with SLURM_RESTART_COUNT=1, resumed at the checkpointed step
# (no step lost, none repeated), and finished. Prints the timings it saw.
set -euo pipefail
source "$(dirname "$0")/../../scripts/slurm/job_state.sh"
BIN="$1"
WORK="$(mktemp -d /tmp/ringtrain-requeue.XXXXXX)"
trap 'if [[ -n "${JOB:-}" ]]; then scancel "$JOB" 2>/dev/null || true; fi' EXIT
cat >"$WORK/job.sbatch" <<SBATCH
#!/bin/bash
#SBATCH --job-name=rt-requeue
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --time=1
#SBATCH --signal=USR1@50
#SBATCH --requeue
#SBATCH --open-mode=append
#SBATCH --output=$WORK/job.out
echo "batch start \$(date +%s) restart \${SLURM_RESTART_COUNT:-0}"
srun "$BIN" --state-dir "$WORK/state" --step-ms 500
echo "batch end \$(date +%s)"
SBATCH
t0=$(date +%s)
JOB="$(sbatch --parsable "$WORK/job.sbatch")"
echo "submitted job $JOB (work dir $WORK)"
slurm_wait_job "$JOB" "${RINGTRAIN_REQUEUE_TEST_TIMEOUT:-240}"
state="$JOB_STATE"
t1=$(date +%s)
echo "---- job.out ----"; cat "$WORK/job.out" || true; echo "-----------------"
echo "final state: $state after $((t1 - t0)) s"
fail() { echo "FAIL: $*"; exit 1; }
[[ "$state" == COMPLETED ]] || fail "job $JOB ended $state (expected COMPLETED)"
grep -q "decision checkpoint+requeue" "$WORK/job.out" || fail "no rank decided checkpoint+requeue"
[[ "$(grep -c 'decision checkpoint+requeue' "$WORK/job.out")" -ge 2 ]] || fail "not every rank took the decision"
grep -q "rank 0: .*checkpoint saved, ran .scontrol requeue $JOB." "$WORK/job.out" || fail "rank 0 did not run scontrol requeue $JOB"
grep -q "restart_count 1" "$WORK/job.out" || fail "the job did not come back with SLURM_RESTART_COUNT=1"
grep -q "rank 0 finished at step" "$WORK/job.out" || fail "rank 0 did not finish"
grep -q "rank 1 finished at step" "$WORK/job.out" || fail "rank 1 did not finish"
# steps of rank 0: 0,1,...,k (first run), then k+1.. (resumed): strictly consecutive
steps="$(grep -o '^rank 0 step [0-9]*' "$WORK/job.out" | awk '{print $4}')"
expected=0
for s in $steps; do [[ "$s" -eq "$expected" ]] || fail "rank 0 ran step $s, expected $expected (lost or repeated)"; expected=$((s + 1)); done
starts=( $(grep -o '^batch start [0-9]*' "$WORK/job.out" | awk '{print $3}') )
first_decision="$(grep -o '^rank 0 decision checkpoint+requeue after step [0-9]*' "$WORK/job.out" | head -1 | awk '{print $NF}')"
echo "PASS: requeued and resumed $(( ${#starts[@]} - 1 )) time(s); rank 0 ran steps 0..$((expected - 1)) once each" \
     "(first signal after step $first_decision, ~$(( (first_decision + 1) / 2 )) s of 0.5 s steps);" \
     "starts at +$((starts[0] - t0)) s and +$((starts[1] - t0)) s after submission; done after $((t1 - t0)) s"
JOB=""
rm -rf "$WORK"

#!/usr/bin/env bash
# A run stopped by the requeue signal and resumed from its checkpoint must give the
# same per-step loss sequence as a run that was never stopped (CPU, f32, bitwise).
#   requeue_replay.sh <ringrun> <digits_ddp> <workdir> <port>
set -euo pipefail
ringrun=$1 demo=$2 work=$3 port=$4
rm -rf "$work" && mkdir -p "$work"
common=(--no-progress --epochs 3 --batch-size 16)
"$ringrun" --nproc-per-node 2 --master-port "$port" "$demo" "${common[@]}" --step-log "$work/straight.csv"
# Stop mid-epoch (step 40 of 45 per epoch x 3), then resume with resume=auto.
# Outside SLURM nothing is requeued: digits_ddp exits 3 (checkpoint saved, not finished).
rc=0
"$ringrun" --nproc-per-node 2 --master-port "$port" "$demo" "${common[@]}" --step-log "$work/stopped.csv" \
  --checkpoint-dir "$work/ckpt" --simulate-signal-at-step 40 | tee "$work/first.out" || rc=$?
[ "$rc" -eq 3 ] || { echo "FAIL: the stopped run exited $rc, expected 3"; exit 1; }
grep -q "stopped at step 40" "$work/first.out"
"$ringrun" --nproc-per-node 2 --master-port "$port" "$demo" "${common[@]}" --step-log "$work/stopped.csv" \
  --checkpoint-dir "$work/ckpt" | tee "$work/second.out"
grep -q "resumed from .*ckpt-0000000040" "$work/second.out"
[ "$(wc -l < "$work/straight.csv")" -gt 40 ]
cmp "$work/straight.csv" "$work/stopped.csv"
echo "requeue replay: identical loss sequence over $(wc -l < "$work/straight.csv") steps"

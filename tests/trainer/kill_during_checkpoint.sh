#!/usr/bin/env bash
# kill -9 a training process while it is writing checkpoints (the digits demo saves one
# per epoch, dozens per second), several times at different moments: every time, the
# newest valid checkpoint must load and training must resume from it.
#   kill_during_checkpoint.sh <digits_ddp> <workdir>
set -uo pipefail
demo=$1 work=$2
pid=
trap '[ -n "$pid" ] && kill -9 "$pid" 2>/dev/null' EXIT  # never leave a 100000-epoch run behind
rm -rf "$work" && mkdir -p "$work"
for delay in 0.05 0.2 0.35 0.5 0.65; do
  "$demo" --no-progress --epochs 100000 --checkpoint-dir "$work/ckpt" --keep-last 2 > "$work/run.out" 2>&1 &
  pid=$!
  # The delays count from the first checkpoint on disk, not from the start: a slow start
  # (a loaded machine, a sanitizer build) would otherwise be killed before it wrote one.
  for _ in $(seq 300); do
    compgen -G "$work/ckpt/ckpt-*.json" > /dev/null && break
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.1
  done
  compgen -G "$work/ckpt/ckpt-*.json" > /dev/null || { echo "FAIL: no checkpoint within 30 s"; cat "$work/run.out"; exit 1; }
  sleep "$delay"
  kill -9 "$pid"
  wait "$pid" 2>/dev/null
  "$demo" --no-progress --epochs 100000 --max-steps 1 --checkpoint-dir "$work/ckpt" --keep-last 2 \
    > "$work/resume.out" 2>&1
  rc=$?
  if [ $rc -ne 0 ] || ! grep -q "resumed from" "$work/resume.out"; then
    echo "FAIL after a kill at ${delay}s (rc $rc):"; cat "$work/resume.out"; ls -la "$work/ckpt"; exit 1
  fi
  echo "kill at ${delay}s: $(grep -o 'resumed from [^ ]*' "$work/resume.out")"
  grep "skipped an invalid checkpoint" "$work/resume.out" || true
done
# The resumes above stop at once (max-steps 1 is behind them) and save nothing; one
# more step saves a checkpoint, and every save removes the temporaries of dead writers.
last=$(grep -o 'resumed from [^ ]*' "$work/resume.out" | grep -o '[0-9]*$')
"$demo" --no-progress --epochs 100000 --max-steps $((10#$last + 1)) --checkpoint-dir "$work/ckpt" --keep-last 2 \
  > "$work/final.out" 2>&1 || { echo "FAIL: the run after the last kill"; cat "$work/final.out"; exit 1; }
stale=$(ls -a "$work/ckpt" | grep -c '\.tmp\.' || true)
[ "$stale" -eq 0 ] || { echo "FAIL: $stale temporary files of killed writers were not cleaned up"; ls -la "$work/ckpt"; exit 1; }
echo "kill during checkpoint: the previous checkpoint stayed loadable every time; no stale temporary files"

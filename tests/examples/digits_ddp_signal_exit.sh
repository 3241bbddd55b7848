#!/usr/bin/env bash
# digits_ddp's exit status when a signal stops training before it finishes: 3 when
# --checkpoint-dir holds the state (run the same command to resume), 4 when nothing was
# saved; 0 only when training finished (or the SLURM job was requeued, not tested here:
# tests/trainer/slurm_requeue_trainer.sh). It used to exit 0 in every case, which a
# script reads as "training finished".
#   digits_ddp_signal_exit.sh <digits_ddp> <workdir>
set -uo pipefail
demo=$1 work=$2
fail() { echo "FAIL: $*"; exit 1; }
pid=
trap '[ -n "$pid" ] && kill -9 "$pid" 2>/dev/null' EXIT
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1

"$demo" --no-progress --epochs 2 --simulate-signal-at-step 5 > nothing.out 2>&1
rc=$?
[ $rc -eq 4 ] || { cat nothing.out; fail "stopped with nothing saved: exit $rc, expected 4"; }
grep -q "stopped at step 5 for a signal before finishing; nothing saved" nothing.out || { cat nothing.out; fail "no stop line"; }

"$demo" --no-progress --epochs 2 --simulate-signal-at-step 5 --checkpoint-dir ck > saved.out 2>&1
rc=$?
[ $rc -eq 3 ] || { cat saved.out; fail "stopped with a checkpoint: exit $rc, expected 3"; }
grep -q "run the same command again to resume from ck" saved.out || { cat saved.out; fail "no resume hint"; }
"$demo" --no-progress --epochs 2 --checkpoint-dir ck > resumed.out 2>&1
rc=$?
[ $rc -eq 0 ] || { cat resumed.out; fail "the resumed run that finished: exit $rc, expected 0"; }
grep -q "resumed from ck/ckpt-0000000005" resumed.out || { cat resumed.out; fail "did not resume at step 5"; }

# a real SIGUSR1 outside SLURM: checkpoint, nothing to requeue, exit 3
"$demo" --no-progress --epochs 100000 --checkpoint-dir real > real.out 2>&1 &
pid=$!
for _ in $(seq 300); do
  compgen -G "real/ckpt-*.json" > /dev/null && break
  kill -0 "$pid" 2>/dev/null || break
  sleep 0.1
done
compgen -G "real/ckpt-*.json" > /dev/null || { cat real.out; fail "no checkpoint within 30 s"; }
kill -USR1 "$pid"
for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
kill -0 "$pid" 2>/dev/null && fail "still running 30 s after SIGUSR1"
wait "$pid"
rc=$?
pid=
[ $rc -eq 3 ] || { cat real.out; fail "SIGUSR1 outside SLURM: exit $rc, expected 3"; }
echo "PASS: signal stops exit 4 (nothing saved) and 3 (checkpoint, not requeued); finished runs 0"

#!/usr/bin/env bash
# Kill -9 one rank during training: the other rank must exit non-zero within
# seconds with an error naming the lost rank, and the last checkpoint must still load.
#   kill_rank.sh <digits_ddp> <workdir> <port>
set -uo pipefail
demo=$1 work=$2 port=$3
rm -rf "$work" && mkdir -p "$work"
export MASTER_ADDR=127.0.0.1 MASTER_PORT=$port WORLD_SIZE=2 LOCAL_WORLD_SIZE=2
args=(--no-progress --epochs 100000 --batch-size 16 --checkpoint-dir "$work/ckpt")
RANK=0 LOCAL_RANK=0 "$demo" "${args[@]}" > "$work/rank0.out" 2>&1 &
pid0=$!
RANK=1 LOCAL_RANK=1 "$demo" "${args[@]}" > "$work/rank1.out" 2>&1 &
pid1=$!
# Wait until at least one epoch checkpoint exists, then kill rank 1. (compgen, not
# ls: rotation may delete a file between the glob and ls's stat, and ls then fails.)
for _ in $(seq 1 300); do
  compgen -G "$work/ckpt/*.json" > /dev/null && break
  sleep 0.1
done
compgen -G "$work/ckpt/*.json" > /dev/null || { echo "no checkpoint appeared"; kill -9 $pid0 $pid1; exit 1; }
kill -9 $pid1
start=$(date +%s%N)
wait $pid0
rc=$?
elapsed_ms=$(( ($(date +%s%N) - start) / 1000000 ))
elapsed="$((elapsed_ms / 1000)).$(printf %03d $((elapsed_ms % 1000)))"
echo "rank 0 exited with $rc after ${elapsed}s:"
tail -3 "$work/rank0.out"
[ $rc -ne 0 ] || { echo "FAIL: rank 0 exited 0"; exit 1; }
(( elapsed_ms < 15000 )) || { echo "FAIL: rank 0 took ${elapsed}s to notice"; exit 1; }
grep -qiE "rank 1" "$work/rank0.out" || { echo "FAIL: the error does not name rank 1"; exit 1; }
# The newest checkpoint loads: a single-process resume picks it up and finishes.
unset MASTER_ADDR MASTER_PORT WORLD_SIZE LOCAL_WORLD_SIZE
"$demo" --no-progress --epochs 1 --checkpoint-dir "$work/ckpt" --max-steps 1 > "$work/resume.out" 2>&1 || true
grep -q "resumed from" "$work/resume.out" || { echo "FAIL: checkpoint not loadable"; cat "$work/resume.out"; exit 1; }
echo "kill rank: rank 0 failed in ${elapsed}s naming rank 1; checkpoint loadable"

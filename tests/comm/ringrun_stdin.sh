#!/usr/bin/env bash
# ringrun_stdin.sh RINGRUN PORT: with ringrun's stdin a pipe (not a terminal) that stays
# open, rank 0 reads it and every other rank reads /dev/null: each worker reads a line,
# rank 0 gets "hello", ranks 1 and 2 EOF at once, and ringrun exits 0 within seconds.
# The workers used to share ringrun's stdin: the ranks that did not get the line
# waited on the open pipe for good (and which rank got the line was a race).
set -u
ringrun=$1 port=$2
exec 3< <(echo hello; exec sleep 60)  # the pipe: one line, then open but silent
feeder=$!
trap 'kill "$feeder" 2>/dev/null' EXIT
start=$(date +%s)
out=$(timeout -k 2 15 "$ringrun" --nproc-per-node 3 --master-port "$port" \
        sh -c 'read line; echo "rank $RANK read [$line] status $?"' <&3 2>&1)
status=$?
elapsed=$(( $(date +%s) - start ))
echo "$out"
echo "ringrun exited $status after ${elapsed}s"
[ "$status" -eq 0 ] && [ "$elapsed" -lt 10 ] || { echo "FAIL: a worker blocked reading stdin"; exit 1; }
for expected in "rank 0 read [hello] status 0" "rank 1 read [] status 1" "rank 2 read [] status 1"; do
  grep -qxF "$expected" <<< "$out" || { echo "FAIL: no line '$expected'"; exit 1; }
done
echo PASS

#!/usr/bin/env bash
# ringrun_failure.sh RINGRUN PORT: a worker that exits 7 must make ringrun stop the
# others (which would sleep 60 s) and exit 7 itself, within a few seconds.
set -u
ringrun=$1 port=$2
start=$(date +%s)
"$ringrun" --nproc-per-node 3 --master-port "$port" --stop-timeout 2 \
  sh -c 'if [ "$RANK" = 1 ]; then sleep 0.5; exit 7; fi; sleep 60'
status=$?
elapsed=$(( $(date +%s) - start ))
echo "ringrun exited $status after ${elapsed}s"
[ "$status" -eq 7 ] && [ "$elapsed" -lt 10 ] && echo PASS

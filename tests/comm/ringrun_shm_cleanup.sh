#!/usr/bin/env bash
# ringrun_shm_cleanup.sh RINGRUN PORT WORKER: a rank killed in allocate_symmetric leaves
# no shared memory behind. WORKER (comm_worker) runs 3 ranks in --mode
# symmetric_dead_mapping: rank 1 SIGKILLs itself once its segment is in /dev/shm,
# while the others are still a second away from mapping it, so nobody unlinks the
# name (the others are stopped by ringrun first). Each rank prints its pid; after
# ringrun exits, no /dev/shm/ringtrain-* name may carry any of them (the comm layer
# puts its creator's pid in every name: ...-p<pid> or ...-p<pid>-...). Without
# ringrun's cleanup rank 1's segment stayed there for good.
set -u
ringrun=$1 port=$2 worker=$3
out=$(mktemp)
trap 'rm -f "$out"' EXIT
timeout -k 2 60 "$ringrun" --nproc-per-node 3 --master-port "$port" --stop-timeout 2 \
  "$worker" --mode symmetric_dead_mapping >"$out" 2>&1
status=$?
cat "$out"
pids=$(sed -n 's/^rank [0-9]* pid \([0-9]*\)$/\1/p' "$out" | tr '\n' ' ')
echo "ringrun exited $status; the ranks' pids: $pids"
if [ "$(echo $pids | wc -w)" -ne 3 ]; then echo "FAIL: expected 3 ranks to print their pid"; exit 1; fi
if ! grep -q "victim: SIGKILL now, in allocate_symmetric" "$out"; then
  echo "FAIL: rank 1 did not die in allocate_symmetric"; exit 1
fi
left=""
for pid in $pids; do
  left+=$(ls /dev/shm 2>/dev/null | grep -E "^ringtrain-.*-p$pid(-|\$)" | tr '\n' ' ')
done
if [ -n "$left" ]; then echo "FAIL: left in /dev/shm: $left"; for f in $left; do rm -f "/dev/shm/$f"; done; exit 1; fi
echo PASS

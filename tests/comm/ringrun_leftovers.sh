#!/usr/bin/env bash
# ringrun_leftovers.sh RINGRUN PORT: nothing a worker started outlives ringrun. Each
# worker leaves a background child (its pid in a file); after ringrun exits, every
# such pid must be gone (kill -0 fails; ringrun, the subreaper, has reaped it) within
# 2 s, and ringrun's status must still be the failed worker's, within a few seconds:
#   a) rank 1 exits 5 while its `sleep 300 &` runs: the group of the failed worker was
#      never signalled, and that sleep lived on with parent 1;
#   b) both workers exit 0, leaving a `sleep 300 &` and a double-forked one (its
#      parent, a subshell, exits first): they used to live on too;
#   c) both exit 0, leaving a child that ignores SIGTERM: SIGKILL after --stop-timeout.
set -u
ringrun=$1 port=$2
dir=$(mktemp -d)
trap 'for f in "$dir"/*.pid; do [ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null; done; rm -rf "$dir"' EXIT
failures=0

# run NAME EXPECTED_STATUS WORKER_SCRIPT: runs 2 workers (bounded by timeout), then
# checks the status, the time and that no pid written to $dir/NAME.*.pid survives.
run() {
  local name=$1 expected=$2 worker=$3
  local start status elapsed pids alive
  start=$(date +%s)
  timeout -k 2 30 "$ringrun" --nproc-per-node 2 --master-port "$port" --stop-timeout 1 \
    sh -c "$worker" sh "$dir/$name"
  status=$?
  elapsed=$(( $(date +%s) - start ))
  pids="$(cat "$dir/$name".*.pid 2>/dev/null | tr '\n' ' ')"
  echo "$name: ringrun exited $status after ${elapsed}s; the workers' children: $pids"
  if [ "$status" -ne "$expected" ] || [ "$elapsed" -ge 10 ]; then
    echo "FAIL $name: expected status $expected within 10 s"; failures=$((failures + 1)); return
  fi
  if [ "$(echo $pids | wc -w)" -lt 2 ]; then
    echo "FAIL $name: the workers did not write their children's pids"; failures=$((failures + 1)); return
  fi
  for _ in $(seq 20); do
    alive=""
    for pid in $pids; do kill -0 "$pid" 2>/dev/null && alive="$alive $pid"; done
    [ -z "$alive" ] && return
    sleep 0.1
  done
  echo "FAIL $name: the workers' children$alive still exist 2 s after ringrun exited:"
  for pid in $alive; do ps -o pid=,ppid=,pgid=,stat=,args= -p "$pid"; done
  failures=$((failures + 1))
}

# $1 is the file prefix; pid files are written whole (tmp + mv). In a, rank 1 fails
# once both children run; in c, a worker exits once its child ignores SIGTERM.
run a 5 'sleep 300 & echo $! > "$1.$RANK.tmp"; mv "$1.$RANK.tmp" "$1.$RANK.pid"
         if [ "$RANK" = 1 ]; then
           while [ ! -e "$1.0.pid" ]; do sleep 0.05; done
           exit 5
         fi
         wait'
run b 0 'sleep 300 & echo $! > "$1.$RANK.pid"
         (sleep 300 & echo $! > "$1.$RANK.orphan.pid")
         exit 0'
run c 0 'sh -c "trap \"\" TERM; echo \$\$ > \"$1.$RANK.tmp\"; mv \"$1.$RANK.tmp\" \"$1.$RANK.pid\"; exec sleep 300" &
         while [ ! -e "$1.$RANK.pid" ]; do sleep 0.05; done
         exit 0'

[ "$failures" -eq 0 ] || exit 1
echo PASS

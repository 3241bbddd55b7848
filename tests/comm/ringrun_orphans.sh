#!/usr/bin/env bash
# ringrun_orphans.sh RINGRUN PORT: when ringrun itself is SIGKILLed (nothing left to
# forward signals or stop the workers), its workers must not live on as orphans.
set -u
ringrun=$1 port=$2
dir=$(mktemp -d)
trap 'for f in "$dir"/pid.*; do [ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null; done; rm -rf "$dir"' EXIT
"$ringrun" --nproc-per-node 2 --master-port "$port" \
  sh -c "echo \$\$ > $dir/pid.\$RANK.tmp && mv $dir/pid.\$RANK.tmp $dir/pid.\$RANK; exec sleep 60" &
ringrun_pid=$!
for _ in $(seq 100); do [ -s "$dir/pid.0" ] && [ -s "$dir/pid.1" ] && break; sleep 0.1; done
workers="$(cat "$dir/pid.0" "$dir/pid.1" 2>/dev/null | tr '\n' ' ')"
echo "ringrun $ringrun_pid, workers $workers"
kill -9 "$ringrun_pid"
wait "$ringrun_pid" 2>/dev/null
for _ in $(seq 30); do
  alive=""
  for pid in $workers; do kill -0 "$pid" 2>/dev/null && alive="$alive $pid"; done
  [ -z "$alive" ] && { echo PASS; exit 0; }
  sleep 0.1
done
echo "FAIL: workers$alive still running 3 s after ringrun was killed"
exit 1

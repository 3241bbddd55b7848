#!/usr/bin/env bash
# ringrun_orphans_grandchildren.sh RINGRUN PORT: when ringrun itself is SIGKILLed, what
# its workers started must not live on either. The workers die of PR_SET_PDEATHSIG
# (ringrun_orphans.sh); a process a worker started (a worker that is `bash train.sh`,
# whose program is its child) used to live on. ringrun's guardian kills the workers'
# process groups when ringrun dies.
set -u
ringrun=$1 port=$2
dir=$(mktemp -d)
trap 'for f in "$dir"/child.*; do [ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null; done; rm -rf "$dir"' EXIT
"$ringrun" --nproc-per-node 2 --master-port "$port" \
  sh -c "sleep 60 & echo \$! > $dir/child.\$RANK.tmp && mv $dir/child.\$RANK.tmp $dir/child.\$RANK; wait" &
ringrun_pid=$!
# (written under another name, then renamed: a file that exists is complete)
for _ in $(seq 100); do [ -s "$dir/child.0" ] && [ -s "$dir/child.1" ] && break; sleep 0.1; done
children="$(cat "$dir/child.0" "$dir/child.1" 2>/dev/null | tr '\n' ' ')"
echo "ringrun $ringrun_pid, the workers' children $children"
[ "$(echo $children | wc -w)" -eq 2 ] || { echo "FAIL: the workers did not start their children"; kill -9 "$ringrun_pid"; exit 1; }
kill -9 "$ringrun_pid"
wait "$ringrun_pid" 2>/dev/null
for _ in $(seq 30); do
  alive=""
  for pid in $children; do kill -0 "$pid" 2>/dev/null && alive="$alive $pid"; done
  [ -z "$alive" ] && { echo PASS; exit 0; }
  sleep 0.1
done
echo "FAIL: the workers' children$alive still running 3 s after ringrun was killed"
exit 1

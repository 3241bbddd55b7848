#!/usr/bin/env bash
# ringrun_nohup.sh RINGRUN PORT WORKDIR: a signal ringrun was started with ignored
# stays ignored, as nohup and shells expect. Under nohup (SIGHUP ignored) a SIGHUP
# must neither be forwarded nor stop the job: the workers finish and ringrun exits 0.
# ringrun used to collect it all the same (it blocks the signals it handles, and a
# blocked signal is not discarded as ignored), forward it to workers that ignored it
# too, count it as a stop and SIGKILL them after --signal-timeout (exit 129).
set -u
ringrun=$1 port=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
nohup "$ringrun" --nproc-per-node 2 --master-port "$port" --signal-timeout 1 \
  sh -c 'echo $$ > '"$work"'/pid.$RANK.tmp && mv '"$work"'/pid.$RANK.tmp '"$work"'/pid.$RANK; sleep 8; touch '"$work"'/done.$RANK' > "$work/out" 2>&1 &
launcher=$!
for _ in $(seq 100); do [ -s "$work/pid.0" ] && [ -s "$work/pid.1" ] && break; sleep 0.1; done
kill -HUP $launcher
sleep 2.5  # past --signal-timeout: the workers would have been killed by now
alive=0
for f in "$work"/pid.*; do kill -0 "$(cat "$f")" 2>/dev/null && alive=$((alive + 1)); done
echo "$alive worker(s) alive 2.5 s after the SIGHUP"
wait $launcher
status=$?
echo "ringrun exited $status"
cat "$work/out"
[ "$alive" -eq 2 ] || { echo "FAIL: the workers should ignore the SIGHUP, as under nohup"; exit 1; }
[ -e "$work/done.0" ] && [ -e "$work/done.1" ] || { echo "FAIL: a worker did not finish"; exit 1; }
[ "$status" -eq 0 ] || { echo "FAIL: ringrun should exit 0 when its workers do"; exit 1; }
echo PASS

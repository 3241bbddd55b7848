#!/usr/bin/env bash
# ringrun_ctrl_c_stops_script.sh RINGRUN PORT: Ctrl-C stops a script that runs ringrun
# (for lr in ...; do ringrun ...; done). bash aborts a script on SIGINT only when the
# child it waited for died of SIGINT, so ringrun, after forwarding the SIGINT and
# waiting for its workers, must die of it rather than exit 130. The script runs in a
# session of its own with SIGINT at default (a background job of this script would
# have it ignored); the SIGINT goes to its whole process group, as a terminal sends it.
set -u
ringrun=$1 port=$2
out=$(mktemp)
marks=$(mktemp -d)
trap 'rm -rf "$out" "$marks"' EXIT
python3 -c '
import os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_DFL)
os.setsid()
os.execv("/bin/bash", ["bash", "-c", sys.argv[1], "bash"] + sys.argv[2:])' \
  '"$1" --nproc-per-node 2 --master-port "$2" sh -c "touch \"$3/started.\$RANK\"; exec sleep 30"; echo "continued (ringrun exited $?)"' \
  "$ringrun" "$port" "$marks" > "$out" 2>&1 &
script=$!  # the session's leader: its pid is the process group's id
# Both workers running (so the SIGINT reaches ringrun with workers to stop, not a bash
# that has not started it yet, which would die of it by itself and pass for nothing).
for _ in $(seq 200); do
  [ -e "$marks/started.0" ] && [ -e "$marks/started.1" ] && break
  sleep 0.05
done
[ -e "$marks/started.0" ] && [ -e "$marks/started.1" ] || { cat "$out"; echo "FAIL: the workers did not start"; kill -KILL -- -$script; exit 1; }
kill -INT -- -$script
wait $script
status=$?
cat "$out"
echo "script exited $status"
grep -q continued "$out" && { echo "FAIL: the script went on after Ctrl-C"; exit 1; }
[ "$status" -eq 130 ] || { echo "FAIL: the script should die of SIGINT (130)"; exit 1; }
echo PASS

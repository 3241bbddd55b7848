#!/usr/bin/env bash
# ringrun_sigchld_ignored.sh RINGRUN PORT: ringrun started with SIGCHLD ignored (an
# ignored signal survives exec; some daemons and Python programs leave it so) must
# still see its workers exit. With SIGCHLD ignored the kernel reaps children itself
# and waitpid() never reports them: ringrun used to wait forever.
set -u
ringrun=$1 port=$2
start=$(date +%s)
timeout -s KILL 20 python3 -c '
import os, signal, sys
signal.signal(signal.SIGCHLD, signal.SIG_IGN)
os.execv(sys.argv[1], sys.argv[1:])' \
  "$ringrun" --nproc-per-node 2 --master-port "$port" sh -c 'exit 3'
status=$?
elapsed=$(( $(date +%s) - start ))
echo "ringrun exited $status after ${elapsed}s"
[ "$status" -eq 137 ] && { echo "FAIL: ringrun hung with SIGCHLD ignored (killed after 20 s)"; exit 1; }
[ "$status" -eq 3 ] || { echo "FAIL: ringrun should exit 3, the workers' status"; exit 1; }
[ "$elapsed" -lt 10 ] || { echo "FAIL: ringrun took ${elapsed}s"; exit 1; }
echo PASS

#!/usr/bin/env bash
# ringrun_signal_grace.sh RINGRUN PORT WORKDIR: SIGTERM from outside (scancel, the
# walltime) reaches the workers, and they get --signal-timeout, not the shorter
# --stop-timeout, to finish what they do on SIGTERM (write a checkpoint: here, a
# 2-second "save" and a file). They used to be killed after --stop-timeout.
set -u
ringrun=$1 port=$2 work=$3
rm -rf "$work" && mkdir -p "$work"
"$ringrun" --nproc-per-node 2 --master-port "$port" --stop-timeout 0.5 --signal-timeout 20 \
  bash -c 'trap "sleep 2; touch '"$work"'/saved.\$RANK; exit 0" TERM; sleep 60 & wait' &
launcher=$!
sleep 1  # the workers have installed their traps
kill -TERM $launcher
wait $launcher
status=$?
echo "ringrun exited $status"
ls "$work"
[ -e "$work/saved.0" ] && [ -e "$work/saved.1" ] || { echo "FAIL: a worker was killed before its save"; exit 1; }
# ringrun dies of the SIGTERM once the workers are gone; a shell shows that as 143
# (comm.ringrun.ctrl_c_stops_calling_script checks dying against exiting 128 + sig)
[ "$status" -eq 143 ] || { echo "FAIL: ringrun should die of SIGTERM (143)"; exit 1; }
echo PASS

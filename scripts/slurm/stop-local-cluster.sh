#!/usr/bin/env bash
# stop-local-cluster.sh: stops what start-local-cluster.sh started.
#
# Stops slurmd (both nodes) and slurmctld by the pid files in the private
# directory ($RINGTRAIN_SLURM_DIR, default /tmp/ringtrain-slurm), waiting for each
# to exit; munged is left running (other programs on the host may use it). With
# --keep-state the job state (StateSaveLocation) is kept, otherwise it is wiped so
# that the next start begins with job ids from 1. Safe to run when nothing runs.
set -euo pipefail

DIR="${RINGTRAIN_SLURM_DIR:-/tmp/ringtrain-slurm}"
KEEP_STATE=0
[[ "${1:-}" == "--keep-state" ]] && KEEP_STATE=1

stop_pidfile() {
  local file="$1" pid
  [[ -f "$file" ]] || return 0
  pid="$(cat "$file")"
  if kill -0 "$pid" 2>/dev/null; then
    kill "$pid"
    for _ in $(seq 1 50); do kill -0 "$pid" 2>/dev/null || break; sleep 0.2; done
    if kill -0 "$pid" 2>/dev/null; then kill -9 "$pid" 2>/dev/null || true; fi
  fi
  rm -f "$file"
}
stop_pidfile "$DIR/run/slurmd-node1.pid"
stop_pidfile "$DIR/run/slurmd-node2.pid"
stop_pidfile "$DIR/run/slurmctld.pid"
if [[ $KEEP_STATE -eq 0 && -d "$DIR/state" ]]; then rm -rf "${DIR:?}/state"/*; fi
echo "[stop-local-cluster] stopped (state $( ((KEEP_STATE)) && echo kept || echo wiped))" >&2

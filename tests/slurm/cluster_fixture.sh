#!/usr/bin/env bash
# cluster_fixture.sh start|stop: the ctest fixture around the local SLURM cluster.
# start: brings the cluster up (installing slurm-wlm + munge when missing) and, if no
#        slurmctld of ours was running before, leaves a marker so that stop knows
#        the cluster is the test's to take down.
# stop:  stops the cluster only if the marker says the tests started it (a
#        developer's running cluster is left alone); RINGTRAIN_SLURM_KEEP=1 keeps it.
set -euo pipefail
SCRIPTS="$(cd "$(dirname "$0")/../../scripts/slurm" && pwd)"
DIR="${RINGTRAIN_SLURM_DIR:-/tmp/ringtrain-slurm}"
case "${1:-}" in
  start)
    was_running=0
    if [[ -f "$DIR/run/slurmctld.pid" ]] && kill -0 "$(cat "$DIR/run/slurmctld.pid")" 2>/dev/null; then was_running=1; fi
    "$SCRIPTS/start-local-cluster.sh"
    if [[ $was_running -eq 0 ]]; then touch "$DIR/.started-by-ctest"; fi
    sinfo -N
    ;;
  stop)
    if [[ -f "$DIR/.started-by-ctest" && "${RINGTRAIN_SLURM_KEEP:-0}" != 1 ]]; then
      rm -f "$DIR/.started-by-ctest"
      "$SCRIPTS/stop-local-cluster.sh"
    else
      echo "cluster left running (not started by the tests, or RINGTRAIN_SLURM_KEEP=1)"
    fi
    ;;
  *) echo "usage: $0 start|stop" >&2; exit 2 ;;
esac

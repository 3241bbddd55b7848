#!/usr/bin/env bash
# start-local-cluster.sh: a real two-"node" SLURM cluster on this one host.
#
# What it does, in order (each step is skipped when already done, so running it
# twice is harmless):
#   1. installs slurm-wlm and munge with apt-get when slurmctld/slurmd/munged are
#      missing (needs root, as on CI);
#   2. writes slurm.conf into a private directory ($RINGTRAIN_SLURM_DIR, default
#      /tmp/ringtrain-slurm) following design.md's verified recipe: SlurmUser=root,
#      proctrack/linuxproc, task/none, select/cons_tres, JobRequeue=1, and
#      NodeName=node[1-2] both on this host (127.0.0.1, ports 17001-17002) with the
#      slurmd files named per node with %n;
#   3. starts munged, slurmctld, then `slurmd -N node1` and `slurmd -N node2`;
#   4. waits until `sinfo` shows both nodes idle.
# It also makes the node names node1/node2 resolve to 127.0.0.1 (an /etc/hosts line
# each, when missing), because jobs rendezvous at the first node of their node list.
# It prints the `export SLURM_CONF=...` line the shell needs: srun, sbatch and
# scontrol find this cluster through SLURM_CONF. No systemd is used (CI has none).
#
# Why cred_expire=10: slurmctld holds a requeued job back for "cred_expire"
# seconds (default 120) before it may start again; 10 s keeps the requeue test
# short. Nothing else differs from a normal cluster.
#
# Usage: scripts/slurm/start-local-cluster.sh        # then: export SLURM_CONF=...
#        RINGTRAIN_SLURM_DIR=/some/dir scripts/slurm/start-local-cluster.sh
# Settings: RINGTRAIN_SLURM_DIR (above), RINGTRAIN_SLURMCTLD_PORT (slurmctld's port,
# default 16817), RINGTRAIN_SLURM_CPUS (CPUs each node declares, default 2),
# RINGTRAIN_SLURM_WAIT (seconds to wait for both nodes to be idle, default 60).
set -euo pipefail

DIR="${RINGTRAIN_SLURM_DIR:-/tmp/ringtrain-slurm}"
CONF="$DIR/slurm.conf"
CTLD_PORT="${RINGTRAIN_SLURMCTLD_PORT:-16817}"
CPUS="${RINGTRAIN_SLURM_CPUS:-2}"
log() { echo "[start-local-cluster] $*" >&2; }

# ---- 1. packages ----
if ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v munged >/dev/null; then
  if [[ $(id -u) -ne 0 ]]; then
    log "slurm-wlm/munge are not installed and this is not root: run 'sudo apt-get install slurm-wlm munge'"
    exit 1
  fi
  log "installing slurm-wlm and munge with apt-get (a minute or two)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y slurm-wlm munge >/dev/null 2>&1 || { apt-get update >/dev/null && apt-get install -y slurm-wlm munge >/dev/null; }
fi
if [[ $(id -u) -ne 0 ]]; then
  log "this recipe runs the daemons as root (SlurmUser=root); run it as root"
  exit 1
fi

# ---- 2. slurm.conf ----
mkdir -p "$DIR"/{state,spool,log,run}
HOST="$(hostname -s)"
cat >"$CONF.new" <<CONF
# Written by scripts/slurm/start-local-cluster.sh: two slurmd "nodes" on host $HOST.
ClusterName=ringtrain-local
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=cred_expire=10
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SchedulerType=sched/backfill
SchedulerParameters=bf_interval=5,sched_interval=5
JobRequeue=1
ReturnToService=2
MinJobAge=300
KillWait=5
InactiveLimit=0
SlurmctldTimeout=30
SlurmdTimeout=30
StateSaveLocation=$DIR/state
SlurmctldPidFile=$DIR/run/slurmctld.pid
SlurmctldLogFile=$DIR/log/slurmctld.log
SlurmdSpoolDir=$DIR/spool/%n
SlurmdPidFile=$DIR/run/slurmd-%n.pid
SlurmdLogFile=$DIR/log/slurmd-%n.log
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
NodeName=node[1-2] NodeHostname=$HOST NodeAddr=127.0.0.1 Port=17001-17002 CPUs=$CPUS RealMemory=8000 State=UNKNOWN
PartitionName=debug Nodes=node[1-2] Default=YES MaxTime=INFINITE State=UP
CONF
# No cgroup.conf: slurm 22.05 has no "disabled" cgroup plugin, and with
# proctrack/linuxproc + task/none nothing needs cgroups (a stale one would break slurmd).
rm -f "$DIR/cgroup.conf"
CONF_CHANGED=1
if [[ -f "$CONF" ]] && cmp -s "$CONF" "$CONF.new"; then CONF_CHANGED=0; fi
mv "$CONF.new" "$CONF"
mkdir -p "$DIR/spool/node1" "$DIR/spool/node2"
export SLURM_CONF="$CONF"

alive() { [[ -f "$1" ]] && kill -0 "$(cat "$1")" 2>/dev/null; }

# ---- 2b. node names that resolve ----
# Jobs see SLURM_JOB_NODELIST=node[1-2]; ringtrain's slurm:// rendezvous (like
# Lightning's) meets at the first node of that list, so "node1" must resolve, as node
# names do on a real cluster. Add them to /etc/hosts for 127.0.0.1 when they do not
# (RINGTRAIN_SLURM_HOSTS=0 skips this; then export MASTER_ADDR=127.0.0.1 instead).
if [[ "${RINGTRAIN_SLURM_HOSTS:-1}" != 0 ]]; then
  for node in node1 node2; do
    if ! getent hosts "$node" >/dev/null; then
      if echo "127.0.0.1 $node  # ringtrain local SLURM (scripts/slurm/start-local-cluster.sh)" >>/etc/hosts; then
        log "added $node to /etc/hosts (127.0.0.1)"
      else
        log "cannot write /etc/hosts: $node does not resolve; export MASTER_ADDR=127.0.0.1 for multi-node runs"
      fi
    fi
  done
fi

# ---- 3. daemons ----
if ! pgrep -x munged >/dev/null; then
  mkdir -p /run/munge /var/log/munge /var/lib/munge /etc/munge
  [[ -f /etc/munge/munge.key ]] || { dd if=/dev/urandom bs=1 count=1024 of=/etc/munge/munge.key 2>/dev/null; chmod 400 /etc/munge/munge.key; }
  log "starting munged"
  munged --force
fi
if [[ $CONF_CHANGED -eq 1 ]] && { alive "$DIR/run/slurmctld.pid" || alive "$DIR/run/slurmd-node1.pid"; }; then
  log "slurm.conf changed: restarting the daemons"
  "$(dirname "$0")/stop-local-cluster.sh" --keep-state
fi
if ! alive "$DIR/run/slurmctld.pid"; then
  log "starting slurmctld (port $CTLD_PORT)"
  slurmctld -f "$CONF"
fi
for node in node1 node2; do
  if ! alive "$DIR/run/slurmd-$node.pid"; then
    log "starting slurmd -N $node"
    slurmd -f "$CONF" -N "$node"
  fi
done

# ---- 4. wait for both nodes idle ----
deadline=$((SECONDS + ${RINGTRAIN_SLURM_WAIT:-60}))
while true; do
  states="$(sinfo -h -N -o '%N %t' 2>/dev/null | sort -u || true)"
  if [[ "$(echo "$states" | grep -cE '^node[12] (idle|mix|alloc)$')" -eq 2 ]]; then break; fi
  # nodes left "down"/"drain" by an earlier run come back with an explicit resume
  for node in node1 node2; do
    if echo "$states" | grep -qE "^$node (down|drain|drng|unk)"; then
      scontrol update NodeName="$node" State=RESUME >/dev/null 2>&1 || true
    fi
  done
  if (( SECONDS > deadline )); then
    log "the nodes did not become idle: sinfo says:"; echo "$states" >&2
    log "see $DIR/log/slurmctld.log and $DIR/log/slurmd-node*.log"
    exit 1
  fi
  sleep 1
done
log "cluster up: $(echo "$states" | tr '\n' ' ')"
echo "export SLURM_CONF=$CONF"

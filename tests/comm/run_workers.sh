#!/usr/bin/env bash
# run_workers.sh WORKER NPROC INIT MODE EXPECT MAX_SECONDS [worker args...]
#
# Starts NPROC ranks of WORKER by hand with the environment a real launcher
# would set for INIT (env | tcp | file | slurm; env6 and tcp6: the master at the
# IPv6 loopback ::1, skipped (77) where there is none; env_names and tcp_names: no
# RINGTRAIN_JOB_TOKEN, and rank 1 names the master "localhost" where the others say
# 127.0.0.1, as a hand-written multi-node launch may), waits at most MAX_SECONDS, and
# checks the outcome for MODE:
#   check:            every rank exits 0 and prints "ok"
#   kill|throw|mismatch: every rank except the victim (rank 1) exits non-zero
#                     within MAX_SECONDS and its output matches the regex EXPECT.
#   killed_in_setup:  as kill, with the workers in check mode; the last rank is
#                     never started, so the others wait for it while the ring
#                     mesh forms, and rank 1 is killed (-9) there, once it
#                     listens for its mesh connections. No connection of rank 1's
#                     to the others exists yet: only the store can tell them.
#   offline_in_setup: as killed_in_setup, but rank 1 runs in a network namespace
#                     of its own, joined to this one by a veth pair, and stays
#                     alive: its replies are blackholed instead (a host that drops
#                     off the network: no FIN, no RST). Only the store connection's
#                     keepalive / user timeout can tell; run with a short
#                     RINGTRAIN_TCP_KEEPALIVE_SEC. Exits 77 (skip) where ip(8)
#                     or network namespaces are not available.
#   settings:         as kill, with the workers in check mode and the variables
#                     in RT_VICTIM_ENV (e.g. "RINGTRAIN_RING_CHUNK_BYTES=1024") set
#                     for rank 1 only, so that it cannot join the others
#                     (RT_VICTIM_RANK=R: for rank R instead, and every rank but R
#                     is checked; R=0 is the rank that runs the store).
# RT_DUPLICATE_RANK=R starts the last process as rank R too (a launch script's
# mistake): as settings, with the last process standing in for the victim's twin.
# RT_PRIVATE_SHM_RANK=R starts rank R in a mount namespace of its own with an
# empty tmpfs on /dev/shm: same host name and boot id as the others, but no
# shared memory with them (a container with its own /dev/shm). Exits 77 (skip)
# where unshare(1) or mount(2) is not allowed.
set -u
worker=$1 nproc=$2 init=$3 mode=$4 expect=$5 max_seconds=$6
shift 6
dir=$(mktemp -d)
pids=()
trap 'kill -9 ${pids[*]} 2>/dev/null; rm -rf "$dir"' EXIT
# a port nobody uses right now
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("",0)); print(s.getsockname()[1])')
# slurm: a job id whose derived port (15000 + id % 10000) is free
if [[ $init == slurm ]]; then
  for _ in $(seq 50); do
    jobid=$(( 1000000 + RANDOM % 10000 ))
    if python3 -c "import socket,sys; s=socket.socket(); s.bind(('',15000+$jobid%10000))" 2>/dev/null; then break; fi
  done
fi
token=$(head -c 8 /dev/urandom | od -An -tx1 | tr -d ' \n')
if [[ $init == *6 ]] && ! python3 -c 'import socket; socket.socket(socket.AF_INET6).bind(("::1", 0))' 2>/dev/null; then
  echo "SKIP: no IPv6 loopback on this machine (::1 cannot be bound)"
  exit 77
fi
# offline_in_setup: a network namespace held open by a sleeping process, a veth
# pair between it and this namespace, and the master's address on this side.
master_addr=127.0.0.1
offline=()
if [[ $mode == offline_in_setup ]]; then
  link=rtv$$
  subnet=10.231.$(( $$ % 250 ))
  if ! command -v ip >/dev/null || ! command -v nsenter >/dev/null; then
    echo "SKIP: ip(8) (iproute2) or nsenter(1) is not installed"; exit 77
  fi
  unshare -n sleep 600 & holder=$!
  trap 'kill -9 ${pids[*]} $holder 2>/dev/null; ip link del $link 2>/dev/null; rm -rf "$dir"' EXIT
  # until the holder is in its own namespace (else the veth end would land in ours)
  for ((i = 0; i < 100; i++)); do
    [[ $(readlink "/proc/$holder/ns/net" 2>/dev/null) != "$(readlink /proc/$$/ns/net)" ]] && break
    sleep 0.05
  done
  if ! kill -0 "$holder" 2>/dev/null || [[ $(readlink "/proc/$holder/ns/net") == "$(readlink /proc/$$/ns/net)" ]]; then
    echo "SKIP: cannot make a network namespace here (unshare -n)"; exit 77
  fi
  if ! { ip link add "$link" type veth peer name "${link}p" netns "$holder" &&
         ip addr add "$subnet.1/30" dev "$link" && ip link set "$link" up &&
         nsenter -t "$holder" -n sh -c "ip addr add $subnet.2/30 dev ${link}p && ip link set ${link}p up && ip link set lo up"; } 2>"$dir/ip.err"; then
    echo "SKIP: cannot make a network namespace joined by veth here: $(cat "$dir/ip.err")"; exit 77
  fi
  master_addr=$subnet.1
  offline=(nsenter -t "$holder" -n)
fi
private_shm=()
if [[ -n ${RT_PRIVATE_SHM_RANK:-} ]]; then
  if ! unshare -m sh -c 'mount -t tmpfs -o size=64m tmpfs /dev/shm' 2>"$dir/unshare.err"; then
    echo "SKIP: cannot give a process a private /dev/shm here (unshare -m + mount as root): $(cat "$dir/unshare.err")"
    exit 77
  fi
  private_shm=(unshare -m sh -c 'mount -t tmpfs -o size=64m tmpfs /dev/shm && exec "$@"' sh)
fi
pids=()
victim=1
[[ $mode == settings ]] && victim=${RT_VICTIM_RANK:-1}
worker_mode=$mode
[[ $mode == settings || $mode == *_in_setup ]] && worker_mode=check
started=$nproc
[[ $mode == *_in_setup ]] && started=$((nproc - 1))
for ((rank = 0; rank < started; rank++)); do
  env_args=(RINGTRAIN_JOB_TOKEN=$token)
  master_name=$master_addr
  if [[ $init == *_names ]]; then
    env_args=()
    (( rank == 1 )) && master_name=localhost
  fi
  if (( rank == victim )) && [[ -n ${RT_VICTIM_ENV:-} ]]; then
    read -ra victim_env <<< "$RT_VICTIM_ENV"
    env_args+=("${victim_env[@]}")
  fi
  init_arg=()
  as_rank=$rank
  if (( rank == nproc - 1 )) && [[ -n ${RT_DUPLICATE_RANK:-} ]]; then as_rank=$RT_DUPLICATE_RANK; fi
  case $init in
    env)   env_args+=(MASTER_ADDR=$master_addr MASTER_PORT=$port WORLD_SIZE=$nproc RANK=$as_rank
                     LOCAL_RANK=$as_rank LOCAL_WORLD_SIZE=$nproc) ;;
    tcp)   env_args+=(RANK=$as_rank WORLD_SIZE=$nproc); init_arg=(--init "tcp://127.0.0.1:$port") ;;
    env_names) env_args+=(MASTER_ADDR=$master_name MASTER_PORT=$port WORLD_SIZE=$nproc RANK=$as_rank
                         LOCAL_RANK=$as_rank LOCAL_WORLD_SIZE=$nproc) ;;
    tcp_names) env_args+=(RANK=$as_rank WORLD_SIZE=$nproc); init_arg=(--init "tcp://$master_name:$port") ;;
    tcp6)  env_args+=(RANK=$as_rank WORLD_SIZE=$nproc); init_arg=(--init "tcp://[::1]:$port") ;;
    env6)  env_args+=(MASTER_ADDR=::1 MASTER_PORT=$port WORLD_SIZE=$nproc RANK=$as_rank
                     LOCAL_RANK=$as_rank LOCAL_WORLD_SIZE=$nproc) ;;
    file)  env_args+=(RANK=$as_rank WORLD_SIZE=$nproc); init_arg=(--init "file://$dir/rendezvous") ;;
    slurm) # what srun sets for one task; no MASTER_PORT: the port comes from the job id
           env_args+=(SLURM_PROCID=$as_rank SLURM_NTASKS=$nproc SLURM_LOCALID=$as_rank SLURM_NODEID=0
                      SLURM_JOB_NODELIST="localhost,node[2-3]" SLURM_JOB_ID=$jobid
                      SLURM_TASKS_PER_NODE="$nproc(x1)" SLURM_STEP_ID=0) ;;
    *) echo "unknown init $init"; exit 2 ;;
  esac
  wrap=()
  if [[ ${RT_PRIVATE_SHM_RANK:-} == "$rank" ]]; then wrap=("${private_shm[@]}"); fi
  if [[ $mode == offline_in_setup ]] && (( rank == 1 )); then wrap=("${offline[@]}"); fi
  env -u OMPI_COMM_WORLD_SIZE -u MASTER_ADDR -u MASTER_PORT -u RANK -u WORLD_SIZE "${env_args[@]}" \
    "${wrap[@]}" "$worker" --mode "$worker_mode" "${init_arg[@]}" "$@" >"$dir/out.$rank" 2>&1 &
  pids+=($!)
done
# Does process $1 own a listening TCP socket? (its socket inodes against the TCP
# tables of its own network namespace)
listens() {
  local inode
  for inode in $(find "/proc/$1/fd" -lname 'socket:*' -printf '%l\n' 2>/dev/null | tr -dc '0-9\n'); do
    awk -v ino="$inode" '$4 == "0A" && $10 == ino {found = 1} END {exit !found}' \
      "/proc/$1/net/tcp" "/proc/$1/net/tcp6" 2>/dev/null && return 0
  done
  return 1
}
if [[ $mode == *_in_setup ]]; then
  for ((i = 0; i < 300; i++)); do
    listens "${pids[1]}" && break
    sleep 0.1
  done
  if ! listens "${pids[1]}"; then echo "FAIL: rank 1 never reached the ring mesh setup"; cat "$dir"/out.*; exit 1; fi
  # killed: the process ends; offline: its replies go nowhere (a blackhole route in its
  # namespace), so to this side it is a host that fell silent, with the link still up
  if [[ $mode == killed_in_setup ]]; then
    kill -9 "${pids[1]}"
  elif ! nsenter -t "$holder" -n ip route add blackhole "$master_addr/32"; then
    echo "FAIL: could not cut rank 1 off (ip route add blackhole in its namespace)"; exit 1
  fi
fi
start=$(date +%s)
status=0
for ((rank = 0; rank < started; rank++)); do
  # offline_in_setup: rank 1 is alive behind its dead link; it is stopped below
  if [[ $mode == offline_in_setup ]] && (( rank == 1 )); then continue; fi
  # wait for each rank, but never beyond the overall budget
  while kill -0 "${pids[$rank]}" 2>/dev/null; do
    if (( $(date +%s) - start > max_seconds )); then
      echo "FAIL: rank $rank still running after ${max_seconds}s"; cat "$dir"/out.*; exit 1
    fi
    sleep 0.1
  done
  wait "${pids[$rank]}"; codes[$rank]=$?
done
if [[ $mode == offline_in_setup ]]; then kill -9 "${pids[1]}" 2>/dev/null; wait "${pids[1]}"; codes[1]=$?; fi
elapsed=$(( $(date +%s) - start ))
for ((rank = 0; rank < started; rank++)); do
  echo "--- rank $rank (exit ${codes[$rank]})"; cat "$dir/out.$rank"
done
for ((rank = 0; rank < started; rank++)); do
  if [[ $mode == check ]]; then
    if (( codes[rank] != 0 )) || ! grep -q "ok" "$dir/out.$rank"; then echo "FAIL: rank $rank"; status=1; fi
  elif (( rank != victim )); then
    if (( codes[rank] == 0 )); then echo "FAIL: rank $rank exited 0"; status=1; fi
    if ! grep -Eq "$expect" "$dir/out.$rank"; then echo "FAIL: rank $rank output lacks /$expect/"; status=1; fi
  fi
done
echo "elapsed ${elapsed}s (limit ${max_seconds}s)"
(( status == 0 )) && echo PASS
exit $status

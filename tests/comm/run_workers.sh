#!/usr/bin/env bash
# run_workers.sh WORKER NPROC INIT MODE EXPECT MAX_SECONDS [worker args...]
#
# Starts NPROC ranks of WORKER by hand with the environment a real launcher
# would set for INIT (env | tcp | file | slurm), waits at most MAX_SECONDS, and
# checks the outcome for MODE:
#   check:            every rank exits 0 and prints "ok"
#   kill|throw|mismatch: every rank except the victim (rank 1) exits non-zero
#                     within MAX_SECONDS and its output matches the regex EXPECT.
#   killed_in_setup:  as kill, with the workers in check mode; the last rank is
#                     never started, so the others wait for it while the ring
#                     mesh forms, and rank 1 is killed (-9) there, once it
#                     listens for its mesh connections. No connection of rank 1's
#                     to the others exists yet: only the store can tell them.
#   settings:         as kill, with the workers in check mode and the variables
#                     in RT_VICTIM_ENV (e.g. "RINGTRAIN_RING_CHUNK_BYTES=1024") set
#                     for rank 1 only, so that it cannot join the others.
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
private_shm=()
if [[ -n ${RT_PRIVATE_SHM_RANK:-} ]]; then
  if ! unshare -m sh -c 'mount -t tmpfs -o size=64m tmpfs /dev/shm' 2>"$dir/unshare.err"; then
    echo "SKIP: cannot give a process a private /dev/shm here (unshare -m + mount as root): $(cat "$dir/unshare.err")"
    exit 77
  fi
  private_shm=(unshare -m sh -c 'mount -t tmpfs -o size=64m tmpfs /dev/shm && exec "$@"' sh)
fi
pids=()
worker_mode=$mode
[[ $mode == settings || $mode == killed_in_setup ]] && worker_mode=check
started=$nproc
[[ $mode == killed_in_setup ]] && started=$((nproc - 1))
for ((rank = 0; rank < started; rank++)); do
  env_args=(RINGTRAIN_JOB_TOKEN=$token)
  if (( rank == 1 )) && [[ -n ${RT_VICTIM_ENV:-} ]]; then
    read -ra victim_env <<< "$RT_VICTIM_ENV"
    env_args+=("${victim_env[@]}")
  fi
  init_arg=()
  as_rank=$rank
  if (( rank == nproc - 1 )) && [[ -n ${RT_DUPLICATE_RANK:-} ]]; then as_rank=$RT_DUPLICATE_RANK; fi
  case $init in
    env)   env_args+=(MASTER_ADDR=127.0.0.1 MASTER_PORT=$port WORLD_SIZE=$nproc RANK=$as_rank
                     LOCAL_RANK=$as_rank LOCAL_WORLD_SIZE=$nproc) ;;
    tcp)   env_args+=(RANK=$as_rank WORLD_SIZE=$nproc); init_arg=(--init "tcp://127.0.0.1:$port") ;;
    file)  env_args+=(RANK=$as_rank WORLD_SIZE=$nproc); init_arg=(--init "file://$dir/rendezvous") ;;
    slurm) # what srun sets for one task; no MASTER_PORT: the port comes from the job id
           env_args+=(SLURM_PROCID=$as_rank SLURM_NTASKS=$nproc SLURM_LOCALID=$as_rank SLURM_NODEID=0
                      SLURM_JOB_NODELIST="localhost,node[2-3]" SLURM_JOB_ID=$jobid
                      SLURM_TASKS_PER_NODE="$nproc(x1)" SLURM_STEP_ID=0) ;;
    *) echo "unknown init $init"; exit 2 ;;
  esac
  wrap=()
  if [[ ${RT_PRIVATE_SHM_RANK:-} == "$rank" ]]; then wrap=("${private_shm[@]}"); fi
  env -u OMPI_COMM_WORLD_SIZE -u MASTER_ADDR -u MASTER_PORT -u RANK -u WORLD_SIZE "${env_args[@]}" \
    "${wrap[@]}" "$worker" --mode "$worker_mode" "${init_arg[@]}" "$@" >"$dir/out.$rank" 2>&1 &
  pids+=($!)
done
# Does process $1 own a listening TCP socket? (its socket inodes against /proc/net/tcp*)
listens() {
  local inode
  for inode in $(find "/proc/$1/fd" -lname 'socket:*' -printf '%l\n' 2>/dev/null | tr -dc '0-9\n'); do
    awk -v ino="$inode" '$4 == "0A" && $10 == ino {found = 1} END {exit !found}' \
      /proc/net/tcp /proc/net/tcp6 2>/dev/null && return 0
  done
  return 1
}
if [[ $mode == killed_in_setup ]]; then
  for ((i = 0; i < 300; i++)); do
    listens "${pids[1]}" && break
    sleep 0.1
  done
  if ! listens "${pids[1]}"; then echo "FAIL: rank 1 never reached the ring mesh setup"; cat "$dir"/out.*; exit 1; fi
  kill -9 "${pids[1]}"
fi
start=$(date +%s)
status=0
for ((rank = 0; rank < started; rank++)); do
  # wait for each rank, but never beyond the overall budget
  while kill -0 "${pids[$rank]}" 2>/dev/null; do
    if (( $(date +%s) - start > max_seconds )); then
      echo "FAIL: rank $rank still running after ${max_seconds}s"; cat "$dir"/out.*; exit 1
    fi
    sleep 0.1
  done
  wait "${pids[$rank]}"; codes[$rank]=$?
done
elapsed=$(( $(date +%s) - start ))
for ((rank = 0; rank < started; rank++)); do
  echo "--- rank $rank (exit ${codes[$rank]})"; cat "$dir/out.$rank"
done
for ((rank = 0; rank < started; rank++)); do
  if [[ $mode == check ]]; then
    if (( codes[rank] != 0 )) || ! grep -q "ok" "$dir/out.$rank"; then echo "FAIL: rank $rank"; status=1; fi
  elif (( rank != 1 )); then
    if (( codes[rank] == 0 )); then echo "FAIL: rank $rank exited 0"; status=1; fi
    if ! grep -Eq "$expect" "$dir/out.$rank"; then echo "FAIL: rank $rank output lacks /$expect/"; status=1; fi
  fi
done
echo "elapsed ${elapsed}s (limit ${max_seconds}s)"
(( status == 0 )) && echo PASS
exit $status

#!/usr/bin/env bash
# small_dev_shm.sh SIZE COMMAND...: runs COMMAND in a private mount namespace whose
# /dev/shm is a fresh tmpfs of SIZE (e.g. 8m), as in a container with a small
# --shm-size. Exits 77 (ctest's skip) when the namespace or the mount is not allowed.
set -uo pipefail
size=$1
shift
if ! unshare --mount true 2> /dev/null; then
  echo "SKIP: cannot make a mount namespace here (unshare --mount needs root or user namespaces)"
  exit 77
fi
exec unshare --mount -- bash -c '
  mount -t tmpfs -o size="$0" tmpfs /dev/shm 2> /dev/null || { echo "SKIP: cannot mount a tmpfs on /dev/shm"; exit 77; }
  echo "/dev/shm: $(df -h /dev/shm | tail -1)"
  exec "$@"' "$size" "$@"

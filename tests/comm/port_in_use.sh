#!/usr/bin/env bash
# port_in_use.sh PORT COMMAND...: runs COMMAND with MASTER_PORT=PORT while another
# process listens on PORT, to check the error a launch gives for a port in use.
set -uo pipefail
port=$1
shift
python3 -c '
import socket, sys, time
s = socket.socket()
s.bind(("", int(sys.argv[1])))
s.listen()
print("holding port", sys.argv[1], flush=True)
time.sleep(300)' "$port" &
holder=$!
trap 'kill $holder 2> /dev/null' EXIT
for _ in $(seq 50); do  # until it listens
  (exec 3<> "/dev/tcp/127.0.0.1/$port") 2> /dev/null && break
  sleep 0.1
done
MASTER_PORT=$port "$@"

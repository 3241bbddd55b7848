#!/usr/bin/env bash
# ringrun_master_names.sh RINGRUN PORT COMM_WORKER: two nodes that name the same master
# differently (127.0.0.1 on node 0, localhost on node 1; node1 / node1.cluster / its IP
# on a cluster) are one job. ringrun used to put the master's address in the job token,
# so node 1 was refused by the store ("wrong or missing job token").
set -u
ringrun=$1 port=$2 worker=$3
unset RINGTRAIN_JOB_TOKEN
export RINGTRAIN_RENDEZVOUS_TIMEOUT_SEC=5
"$ringrun" --nnodes 2 --node-rank 0 --master-addr 127.0.0.1 --master-port "$port" "$worker" --mode check &
node0=$!
"$ringrun" --nnodes 2 --node-rank 1 --master-addr localhost --master-port "$port" "$worker" --mode check
status1=$?
wait $node0
status0=$?
echo "node 0 exited $status0, node 1 exited $status1"
[ "$status0" -eq 0 ] && [ "$status1" -eq 0 ] || { echo "FAIL: both nodes should pass"; exit 1; }
echo PASS

#!/usr/bin/env bash
# ringrun_usage_errors.sh RINGRUN: every usage error exits 2 (what ringrun --help and
# docs/comm.md promise; a value CLI11 refused used to exit with CLI11's own code, 105
# for out of range, 114 for an option given twice) with a message naming the option;
# --help exits 0.
set -u
ringrun=$1
status=0
expect() {  # expect CODE REGEX ARGS...
  local code=$1 regex=$2
  shift 2
  local out
  out=$("$ringrun" "$@" 2>&1)
  local got=$?
  if (( got != code )); then echo "FAIL: ringrun $* exited $got, not $code: $out"; status=1; fi
  if ! grep -Eq -- "$regex" <<< "$out"; then echo "FAIL: ringrun $* said '$out', not /$regex/"; status=1; fi
}
expect 2 "--nproc-per-node: Value 0 not in range" --nproc-per-node 0 true
expect 2 "--nproc-per-node: Value abc not in range" --nproc-per-node abc true
expect 2 "--master-port: Value 70000 not in range" --master-port 70000 true
expect 2 "--stop-timeout: Value -1 not in range" --stop-timeout -1 true
expect 2 "--nproc-per-node: At Most 1" --nproc-per-node 2 --nproc-per-node 3 true
expect 2 "--master-addr is empty" --master-addr "" true
expect 2 "--master-addr is empty" --nnodes 2 --node-rank 1 --master-addr "" true
expect 2 "unknown option '--verbose'" --verbose true
expect 2 "no program given" --nproc-per-node 2
expect 0 "--nproc-per-node" --help
(( status == 0 )) && echo PASS
exit $status

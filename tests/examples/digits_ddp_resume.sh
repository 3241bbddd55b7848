#!/usr/bin/env bash
# digits_ddp --resume with a checkpoint's stem as --checkpoint-dir lists it, and a
# resume of a run that had already finished (it must still report its accuracy).
#   digits_ddp_resume.sh <digits_ddp> <workdir>
set -uo pipefail
demo=$1 work=$2
fail() { echo "FAIL: $*"; exit 1; }
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1
args=(--no-progress --epochs 2)
"$demo" "${args[@]}" --checkpoint-dir ck > first.out 2>&1 || { cat first.out; fail "first run"; }
[ -e ck/ckpt-0000000090.json ] || { ls ck; fail "no ckpt-0000000090 after the first run"; }

# a bare stem is found in --checkpoint-dir (it used to fail: "ckpt-0000000090.json:
# checkpoint record not found"); so is one with its .json
"$demo" "${args[@]}" --checkpoint-dir ck --resume ckpt-0000000090 > stem.out 2>&1 || { cat stem.out; fail "--resume ckpt-0000000090"; }
grep -q "resumed from ck/ckpt-0000000090 " stem.out || { cat stem.out; fail "did not resume from ck/ckpt-0000000090"; }
grep -q "final test accuracy" stem.out || { cat stem.out; fail "no final accuracy after --resume STEM"; }
"$demo" "${args[@]}" --checkpoint-dir ck --resume ck/ckpt-0000000090.json > json.out 2>&1 || { cat json.out; fail "--resume ck/ckpt-0000000090.json"; }
grep -q "resumed from ck/ckpt-0000000090 " json.out || { cat json.out; fail "did not resume from ck/ckpt-0000000090"; }

# a stem that is nowhere: the error names both paths it tried, and what the directory holds
"$demo" "${args[@]}" --checkpoint-dir ck --resume ckpt-0000000007 > missing.out 2>&1 && fail "a missing stem was accepted"
grep -q "digits_ddp: --resume ckpt-0000000007: no checkpoint record at ckpt-0000000007.json nor at ck/ckpt-0000000007.json; ck holds ckpt-" missing.out \
  || { cat missing.out; fail "the error does not name the paths tried"; }
"$demo" "${args[@]}" --resume ckpt-0000000090 > nodir.out 2>&1 && fail "--resume STEM without --checkpoint-dir was accepted"
grep -q "needs --checkpoint-dir" nodir.out || { cat nodir.out; fail "no error naming --checkpoint-dir"; }

# resuming the finished run (same --epochs): nothing to train, the restored model is
# evaluated (it used to print no accuracy line at all)
"$demo" "${args[@]}" --checkpoint-dir ck > done.out 2>&1 || { cat done.out; fail "resuming the finished run"; }
grep -q "resumed from ck/ckpt-0000000180" done.out || { cat done.out; fail "did not resume the last checkpoint"; }
want=$(grep -o "final test accuracy [0-9.]*% ([0-9/]*)" json.out)
got=$(grep -o "final test accuracy [0-9.]*% ([0-9/]*)" done.out)
[ -n "$got" ] || { cat done.out; fail "no final accuracy after resuming a finished run"; }
[ "$got" = "$want" ] || fail "the restored model reports '$got', the run that saved it '$want'"
echo "PASS: --resume STEM found in --checkpoint-dir; a finished run resumed reports '$got'"

#!/usr/bin/env bash
# Every checkpoint damaged: digits_train --resume and digits_ddp (resume=auto) stop
# with an error naming them and delete nothing. They used to start fresh, and their
# first saves then rotated the damaged (maybe repairable) checkpoints away.
#   damaged_checkpoints.sh <digits_train> <digits_ddp> <workdir>
set -uo pipefail
train=$1 ddp=$2 work=$3
fail() { echo "FAIL: $*"; exit 1; }
rm -rf "$work" && mkdir -p "$work" && cd "$work" || exit 1

"$train" --epochs 2 --quiet --checkpoint-dir tc > t1.out 2>&1 || { cat t1.out; fail "digits_train first run"; }
for f in tc/*.json; do echo '{garbage' > "$f"; done
before=$(ls tc | sort)
"$train" --epochs 4 --quiet --checkpoint-dir tc --resume > t2.out 2>&1 && { cat t2.out; fail "digits_train --resume started over"; }
grep -q "tc holds .* checkpoint(s) and none is valid" t2.out || { cat t2.out; fail "digits_train: no error naming the damage"; }
[ "$(ls tc | sort)" = "$before" ] || { ls tc; fail "digits_train deleted or wrote checkpoints"; }

"$ddp" --epochs 1 --no-progress --checkpoint-dir dc > d1.out 2>&1 || { cat d1.out; fail "digits_ddp first run"; }
for f in dc/*.json; do echo '{garbage' > "$f"; done
before=$(ls dc | sort)
"$ddp" --epochs 2 --no-progress --checkpoint-dir dc > d2.out 2>&1 && { cat d2.out; fail "digits_ddp started over"; }
grep -q "none is valid" d2.out || { cat d2.out; fail "digits_ddp: no error naming the damage"; }
[ "$(ls dc | sort)" = "$before" ] || { ls dc; fail "digits_ddp deleted or wrote checkpoints"; }
echo "PASS: both refused to start over damaged checkpoints and deleted nothing"

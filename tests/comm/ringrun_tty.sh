#!/usr/bin/env bash
# ringrun_tty.sh RINGRUN PORT: ringrun on a terminal (a pseudo-terminal from util-linux
# `script`; exit 77, skipped, where there is none). The workers run in their own process
# groups, outside the terminal's foreground group, so a read of the terminal stops them
# with SIGTTIN, which ringrun's waitpid did not see: it waited for good.
#   a) each worker reads a line from stdin: rank 0 too must get /dev/null, not the
#      terminal, so both see EOF at once and ringrun exits 0;
#   b) rank 1 reads /dev/tty and is stopped by SIGTTIN all the same: ringrun names it,
#      stops rank 0 (sleep 60) and exits 128 + SIGTTIN (149) within a few seconds.
set -u
ringrun=$1 port=$2
dir=$(mktemp -d)
# script's own stdin: a pipe that stays open and silent (at EOF, some versions of
# script end the session), never the terminal ctest may have been started from.
exec 3< <(exec sleep 120)
feeder=$!
cleanup() {  # a ringrun left waiting (with its workers, by PR_SET_PDEATHSIG)
  kill "$feeder" 2>/dev/null
  local pid; pid=$(cat "$dir/ringrun.pid" 2>/dev/null)
  [ -n "$pid" ] && [ "$(ps -o comm= -p "$pid")" = ringrun ] && kill -9 "$pid"
  rm -rf "$dir"
}
trap cleanup EXIT
command -v script > /dev/null || { echo "SKIP: no util-linux script to make a terminal"; exit 77; }
probe=$(timeout -k 2 10 script -qec 'test -t 0 && test -t 1 && echo on-a-tty' /dev/null <&3 2>&1)
case $probe in *on-a-tty*) ;; *) echo "SKIP: script gives no terminal here: $probe"; exit 77 ;; esac

# on_tty WORKER_SCRIPT: ringrun (its pid in $dir/ringrun.pid, for the cleanup) with 2
# workers on a new terminal; prints ringrun's output, then "status N".
on_tty() {
  printf '%s\n' "$1" > "$dir/worker.sh"
  cat > "$dir/job.sh" <<EOF
echo \$\$ > "$dir/ringrun.pid"
exec "$ringrun" --nproc-per-node 2 --master-port "$port" --stop-timeout 1 --signal-timeout 1 sh "$dir/worker.sh"
EOF
  timeout -k 2 10 script -qec "sh '$dir/job.sh'; echo \"status \$?\"" /dev/null <&3 2>&1 | tr -d '\r'
}

failures=0
start=$(date +%s)
out=$(on_tty 'read line; echo "rank $RANK read [$line] status $?"')
elapsed=$(( $(date +%s) - start ))
printf 'a) after %ss:\n%s\n' "$elapsed" "$out"
for expected in "rank 0 read [] status 1" "rank 1 read [] status 1" "status 0"; do
  grep -qxF "$expected" <<< "$out" || { echo "FAIL a: no line '$expected'"; failures=$((failures + 1)); }
done

start=$(date +%s)
out=$(on_tty 'if [ "$RANK" = 1 ]; then read line < /dev/tty; echo "rank 1 read the terminal"; fi; exec sleep 60')
elapsed=$(( $(date +%s) - start ))
printf 'b) after %ss:\n%s\n' "$elapsed" "$out"
ttin=$(kill -l TTIN)
grep -q "worker rank 1 (pid [0-9]*) was stopped by signal $ttin .*terminal.*stopping the workers" <<< "$out" ||
  { echo "FAIL b: ringrun did not report the stopped rank 1"; failures=$((failures + 1)); }
grep -qxF "status $((128 + ttin))" <<< "$out" ||
  { echo "FAIL b: ringrun's status should be 128 + SIGTTIN"; failures=$((failures + 1)); }
[ "$elapsed" -lt 15 ] || { echo "FAIL b: took ${elapsed}s"; failures=$((failures + 1)); }

[ "$failures" -eq 0 ] || exit 1
echo PASS

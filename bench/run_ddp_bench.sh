#!/usr/bin/env bash
# The DDP benchmark of issue 5, ours and PyTorch's side by side in one run:
#   bash bench/run_ddp_bench.sh [build-dir] [out-dir] [extra flags for both, e.g. --gradient-as-bucket-view]
# Runs bench/ddp_step at 1 and 2 ranks (ring backend) and bench/ddp_step_torch.py
# (torch DDP, gloo) at 1 and 2 ranks, all launched by ringrun, one compute thread
# per rank, REPEATS times (default 3) in alternation (ours np1, torch np1, ours np2,
# torch np2, then again), so that a slow minute of this machine hits both sides;
# then prints the medians over the repeats (and each repeat's ratio), and writes a
# Chrome trace of one 2-rank DDP step (timeline.json) plus its picture (timeline.png).
# Inside each program, local and DDP steps are themselves timed in alternating rounds.
# PYTHON names the interpreter with torch (default /usr/bin/python3, Debian's python3-torch).
set -euo pipefail
python=${PYTHON:-/usr/bin/python3}
build=${1:-build}
out=${2:-bench-out}
shift $(( $# < 2 ? $# : 2 ))
extra=("$@")  # passed to both benchmarks
repeats=${REPEATS:-3}
"$python" -c "import torch" 2>/dev/null || {
  echo "run_ddp_bench.sh: $python cannot import torch; apt-get install python3-torch, or set PYTHON to an interpreter that has it" >&2
  exit 2
}
mkdir -p "$out"
ringrun="$build/comm/ringrun"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
for ((k = 1; k <= repeats; k++)); do
  for np in 1 2; do
    # A failed check (#wrong) exits non-zero: show the output, and why, before stopping.
    status=0
    "$ringrun" --nproc-per-node $np "$build/bench/ddp_step" "${extra[@]}" --json "$out/ours-np$np-$k.json" \
      $([ $np = 2 ] && [ $k = "$repeats" ] && echo --trace "$out/timeline.json") > "$out/ours-np$np-$k.txt" \
      || status=$?
    cat "$out/ours-np$np-$k.txt"
    [ $status = 0 ] || { echo "run_ddp_bench.sh: ddp_step exited $status (see above)" >&2; exit $status; }
    "$ringrun" --nproc-per-node $np "$python" "$(dirname "$0")/ddp_step_torch.py" "${extra[@]}" \
      --json "$out/torch-np$np-$k.json" > "$out/torch-np$np-$k.txt" || status=$?
    [ $status = 0 ] || { cat "$out/torch-np$np-$k.txt"; echo "run_ddp_bench.sh: ddp_step_torch.py exited $status" >&2; exit $status; }
  done
done
python3 - "$out" "$repeats" <<'PY'
import json, statistics, sys
out, repeats = sys.argv[1], int(sys.argv[2])
runs = range(1, repeats + 1)
o = {n: [json.load(open(f"{out}/ours-np{n}-{k}.json")) for k in runs] for n in (1, 2)}
t = {n: [json.load(open(f"{out}/torch-np{n}-{k}.json")) for k in runs] for n in (1, 2)}
def row(j, name): return next(r for r in j["rows"] if r["name"] == name)
def med(values): return statistics.median(values)
def ours(n, name, key): return med([row(j, name)[key] for j in o[n]])
def top(d, n, key): return med([j[key] for j in d[n]])
print(f"\nmedians over {repeats} alternating repeats")
print("\n| ranks | ours local | ours DDP | ours DDP no-overlap | t_comm | comm CPU/step | h | h bound | torch local | torch DDP | ours/torch (DDP) | per repeat | wrong |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for n in (1, 2):
    ddp, torch_ddp = ours(n, "overlap", "step_ms"), top(t, n, "t_ddp_ms")
    h, hb = (f"{top(o, n, 'h'):.2f}", f"{top(o, n, 'h_bound'):.2f}") if n > 1 else ("n/a", "n/a")  # no comm at 1 rank
    per = ", ".join(f"{row(a, 'overlap')['step_ms'] / b['t_ddp_ms']:.2f}" for a, b in zip(o[n], t[n]))
    wrong = sum(j["wrong"] for j in o[n] + t[n])
    print(f"| {n} | {top(o, n, 't_local_ms'):.1f} | {ddp:.1f} | {ours(n, 'no overlap', 'step_ms'):.1f} | "
          f"{ours(n, 'overlap', 't_comm_ms'):.2f} | {ours(n, 'overlap', 'comm_cpu_ms'):.2f} | {h} | {hb} | "
          f"{top(t, n, 't_local_ms'):.1f} | {torch_ddp:.1f} | {ddp / torch_ddp:.2f} | {per} | {wrong} |")
overhead = [100 * (row(j, "overlap")["step_ms"] / j["t_local_ms"] - 1) for j in o[1]]
print(f"\nDDP overhead at 1 rank: {med(overhead):.1f}% (per repeat: {', '.join(f'{v:.1f}' for v in overhead)})")
print(f"scaling efficiency 1 -> 2 ranks (same per-rank batch): ours {ours(1, 'overlap', 'step_ms') / ours(2, 'overlap', 'step_ms'):.2f}, "
      f"torch {top(t, 1, 't_ddp_ms') / top(t, 2, 't_ddp_ms'):.2f}")
print("\nbucket sweep (2 ranks): cap MiB -> buckets, step ms, h (medians over repeats)")
for r in o[2][0]["rows"]:
    if r["name"] == "sweep":
        same = [x for j in o[2] for x in j["rows"] if x["name"] == "sweep" and x["cap_mb"] == r["cap_mb"]]
        print(f"  {r['cap_mb']:>6} -> {r['buckets']} buckets, {med([x['step_ms'] for x in same]):.1f} ms "
              f"(wait {med([x['comm_wait_ms'] for x in same]):.1f} ms), h {med([x['h'] for x in same]):.2f}")
PY
if "$python" -c "import matplotlib" 2>/dev/null; then
  "$python" "$(dirname "$0")/plot_timeline.py" "$out/timeline.json" "$out/timeline.png"
else
  echo "no timeline.png: $python has no matplotlib (apt-get install python3-matplotlib); $out/timeline.json opens in Perfetto"
fi

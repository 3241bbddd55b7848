#!/usr/bin/env bash
# The DDP benchmark of issue 5, ours and PyTorch's side by side in one run:
#   bash bench/run_ddp_bench.sh [build-dir] [out-dir] [extra flags for both, e.g. --gradient-as-bucket-view]
# Runs bench/ddp_step at 1 and 2 ranks (ring backend) and bench/ddp_step_torch.py
# (torch DDP, gloo) at 1 and 2 ranks, all launched by ringrun, one compute thread
# per rank; then prints the table docs/ddp-benchmark.md records, and writes a
# Chrome trace of one 2-rank DDP step (timeline.json) plus its picture (timeline.png).
set -euo pipefail
build=${1:-build}
out=${2:-bench-out}
shift $(( $# < 2 ? $# : 2 ))
extra=("$@")  # passed to both benchmarks
mkdir -p "$out"
ringrun="$build/comm/ringrun"
export OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1
for np in 1 2; do
  "$ringrun" --nproc-per-node $np "$build/bench/ddp_step" "${extra[@]}" --json "$out/ours-np$np.json" \
    $([ $np = 2 ] && echo --trace "$out/timeline.json") > "$out/ours-np$np.txt"
  cat "$out/ours-np$np.txt"
  "$ringrun" --nproc-per-node $np /usr/bin/python3 "$(dirname "$0")/ddp_step_torch.py" "${extra[@]}" --json "$out/torch-np$np.json" \
    > "$out/torch-np$np.txt"
done
python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
o = {n: json.load(open(f"{out}/ours-np{n}.json")) for n in (1, 2)}
t = {n: json.load(open(f"{out}/torch-np{n}.json")) for n in (1, 2)}
def row(n, name): return next(r for r in o[n]["rows"] if r["name"] == name)
print("\n| ranks | ours local | ours DDP | ours DDP no-overlap | t_comm | comm CPU/step | h | h bound | torch local | torch DDP | ours/torch (DDP) | wrong |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for n in (1, 2):
    ov, no = row(n, "overlap"), row(n, "no overlap")
    h, hb = (f"{o[n]['h']:.2f}", f"{o[n]['h_bound']:.2f}") if n > 1 else ("n/a", "n/a")  # no comm at 1 rank
    print(f"| {n} | {o[n]['t_local_ms']:.1f} | {ov['step_ms']:.1f} | {no['step_ms']:.1f} | {ov['t_comm_ms']:.2f} | "
          f"{ov['comm_cpu_ms']:.2f} | {h} | {hb} | {t[n]['t_local_ms']:.1f} | {t[n]['t_ddp_ms']:.1f} | {ov['step_ms'] / t[n]['t_ddp_ms']:.2f} | "
          f"{o[n]['wrong'] + t[n]['wrong']} |")
ov1, ov2 = row(1, "overlap"), row(2, "overlap")
print(f"\nDDP overhead at 1 rank: {100 * (ov1['step_ms'] / o[1]['t_local_ms'] - 1):.1f}%")
print(f"scaling efficiency 1 -> 2 ranks (same per-rank batch): ours {ov1['step_ms'] / ov2['step_ms']:.2f}, "
      f"torch {t[1]['t_ddp_ms'] / t[2]['t_ddp_ms']:.2f}")
print("\nbucket sweep (2 ranks): cap MiB -> buckets, step ms")
for r in o[2]["rows"]:
    if r["name"] == "sweep":
        print(f"  {r['cap_mb']:>6} -> {r['buckets']} buckets, {r['step_ms']:.1f} ms (wait {r['comm_wait_ms']:.1f} ms)")
PY
if /usr/bin/python3 -c "import matplotlib" 2>/dev/null; then
  /usr/bin/python3 "$(dirname "$0")/plot_timeline.py" "$out/timeline.json" "$out/timeline.png"
fi

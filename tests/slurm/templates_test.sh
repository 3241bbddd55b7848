#!/usr/bin/env bash
# templates_test.sh <slurm_rendezvous_check> <ringtrain-grid>: the shipped sbatch
# templates and the grid submitter, submitted for real to the local cluster.
#
# The templates run RINGTRAIN_PROGRAM = the rendezvous check (it accepts and ignores
# the training flags), so each job does a real 2-rank slurm:// rendezvous and
# allreduce through the template's own srun line. The GPU templates get the local
# cluster's shape on the command line (no GPUs: --gres=none, 2 tasks). Then
# ringtrain-grid submits a 2-run grid with the same program and the ids it
# reports must be the jobs that ran and completed.
set -euo pipefail
source "$(dirname "$0")/../../scripts/slurm/job_state.sh"
CHECK="$1"; GRID="$2"
TEMPLATES="$(cd "$(dirname "$0")/../../scripts/slurm/templates" && pwd)"
WORK="$(mktemp -d /tmp/ringtrain-templates.XXXXXX)"
cd "$WORK"
export RINGTRAIN_PROGRAM="$CHECK" RINGTRAIN_CHECKPOINT_DIR="$WORK/ckpt"
fail() { echo "FAIL: $*"; for f in "$WORK"/*.out; do echo "== $f"; cat "$f"; done; exit 1; }
# Since Slurm 22.05 srun does not inherit sbatch's --cpus-per-task: without SRUN_CPUS_PER_TASK
# each task of a cluster with task/affinity or task/cgroup gets one CPU for its N threads.
# (The local cluster uses task/none, so only the template text can show it.)
for t in "$TEMPLATES"/*.sbatch; do
  if grep -q -- '--cpus-per-task' "$t"; then
    grep -q '^export SRUN_CPUS_PER_TASK=' "$t" || fail "$(basename "$t") sets --cpus-per-task but not SRUN_CPUS_PER_TASK"
  fi
done
sbatch --wait --time=2 "$TEMPLATES/cpu.sbatch" >/dev/null || fail "cpu.sbatch job failed"
sbatch --wait --time=2 --gres=none --ntasks-per-node=2 --cpus-per-task=1 --mem=100 \
  "$TEMPLATES/single_node_gpus.sbatch" >/dev/null || fail "single_node_gpus.sbatch job failed"
sbatch --wait --time=2 --gres=none --nodes=2 --ntasks-per-node=1 --cpus-per-task=1 --mem=100 \
  "$TEMPLATES/multi_node_gpus.sbatch" >/dev/null || fail "multi_node_gpus.sbatch job failed"
for t in cpu 1node multinode; do
  grep -q "rank 1 of 2 .*allreduce ok" ringtrain-$t-*.out || fail "template $t: no allreduce ok line"
done
echo "templates: cpu, single_node_gpus, multi_node_gpus ran their srun line and allreduced"

"$GRID" --output-root "$WORK/grid" --job-name rt-grid --nodes 2 --time 00:02:00 \
  --command "$CHECK --expect-world 2" --param lr=0.1,0.01 >"$WORK/grid.txt" || fail "ringtrain-grid failed: $(cat "$WORK/grid.txt")"
cat "$WORK/grid.txt"
ids=( $(awk '/^job /{print $2}' "$WORK/grid.txt") )
[[ ${#ids[@]} -eq 2 ]] || fail "ringtrain-grid reported ${#ids[@]} job ids, expected 2"
for id in "${ids[@]}"; do
  slurm_wait_job "$id" 60
  state="$JOB_STATE"
  [[ "$state" == COMPLETED ]] || fail "grid job $id ended $state"
done
grep -q "allreduce ok" "$WORK"/grid/000_lr-0.1/slurm-"${ids[0]}".out || fail "grid run 0 log has no allreduce ok"
grep -q '"job_id": "'"${ids[1]}"'"' "$WORK/grid/grid.json" || fail "grid.json does not record job ${ids[1]}"
echo "PASS: templates and grid (jobs ${ids[*]}) completed"
rm -rf "$WORK"

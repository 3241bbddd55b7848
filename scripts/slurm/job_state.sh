# job_state.sh: shell helpers for watching a SLURM job, sourced by the local-cluster
# scripts and tests (source "$(dirname "$0")/.../scripts/slurm/job_state.sh").
#
#   slurm_job_field JOB FIELD   prints FIELD of `scontrol show job JOB` (JobState,
#                               Restarts, ...), or nothing when SLURM no longer knows the job
#   slurm_wait_job JOB SECONDS  waits until JOB reaches a final state or SECONDS pass;
#                               sets JOB_STATE to the last state seen (UNKNOWN... when
#                               scontrol stops knowing the job) and JOB_WAITED to the
#                               seconds waited. A requeued job passes through PENDING and
#                               RUNNING again, so this returns only when its last run ends.

slurm_job_field() {
  scontrol show job "$1" -o 2>/dev/null | grep -o "$2=[^ ]*" | cut -d= -f2 || true
}

slurm_wait_job() {
  local job="$1" seconds="$2" t0 unknown=0
  t0=$(date +%s)
  JOB_STATE=""
  while (( $(date +%s) < t0 + seconds )); do
    JOB_STATE="$(slurm_job_field "$job" JobState)"
    case "$JOB_STATE" in
      COMPLETED|FAILED|CANCELLED|TIMEOUT|NODE_FAIL|OUT_OF_MEMORY|BOOT_FAIL|DEADLINE) break ;;
    esac
    # polled every second, a job is never purged (MinJobAge) before we see it end:
    # ten polls without it mean the controller lost it (restarted with its state wiped)
    if [[ -z "$JOB_STATE" ]]; then
      (( ++unknown < 10 )) || { JOB_STATE="UNKNOWN (scontrol no longer knows job $job)"; break; }
    else
      unknown=0
    fi
    sleep 1
  done
  JOB_WAITED=$(( $(date +%s) - t0 ))
}

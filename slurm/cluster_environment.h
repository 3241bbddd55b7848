// cluster_environment.h: which launcher started this process, and where it sits in the job.
//
// defines: Launcher, ClusterEnvironment, detect_cluster_environment.
//
// A training program is started by one of four things, and each says who we are
// in its own variables:
//
//   launcher   | how to recognise it                    | rank / size / local / node
//   -----------+----------------------------------------+---------------------------------------
//   torchrun   | MASTER_ADDR + RANK + WORLD_SIZE         | RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE
//   (ringrun)  |                                        | GROUP_RANK|NODE_RANK, GROUP_WORLD_SIZE
//   Open MPI   | OMPI_COMM_WORLD_SIZE (or PMI_SIZE,     | OMPI_COMM_WORLD_RANK/_SIZE/_LOCAL_RANK/
//   (mpirun)   | PMIX_RANK)                             | _LOCAL_SIZE
//   SLURM task | SLURM_PROCID + SLURM_NTASKS + a step   | SLURM_PROCID SLURM_NTASKS SLURM_LOCALID
//   (srun)     | (SLURM_STEP_ID / SLURM_STEPID)         | SLURM_NODEID SLURM_NNODES
//   local      | none of the above                      | rank 0 of 1
//
// The order is exactly comm::detect_init_method's (RINGTRAIN_INIT_METHOD first,
// then env://, mpi://, slurm://, single), so what this reports is what
// comm::init_process_group will do: `srun torchrun ...` is a torchrun launch
// inside a SLURM job, `srun --mpi=pmix mpi_prog` an MPI launch. The rank fields
// come from comm::resolve_launch itself; nothing here re-parses them.
//
// One trap: a batch script (sbatch) and an interactive `salloc` shell live inside
// a SLURM job but are NOT tasks of it. In a batch script SLURM sets SLURM_PROCID=0
// and SLURM_NTASKS=<all tasks> (verified on the local cluster), so a program run
// there without srun would wait for ranks that never start. A SLURM task has a
// step id (SLURM_STEP_ID, set by srun), the batch shell has none: without one
// comm::detect_init_method picks "single", and we report Launcher::kLocal with
// `note` saying why.
//
// The SLURM job facts (job id, the id to requeue, restart count, node list) are
// filled in whenever the process is inside a SLURM job, whatever the launcher.
#pragma once

#include <string>
#include <vector>

#include "comm/launch_env.h"

namespace ringtrain::slurm {

enum class Launcher { kLocal, kSlurm, kTorchrun, kOpenMpi };
const char* launcher_name(Launcher launcher);  // "local", "slurm", "torchrun", "mpi"

struct ClusterEnvironment {
  Launcher launcher = Launcher::kLocal;
  std::string init_method = "single";  // what to pass to comm::InitOptions::init_method

  int rank = 0;              // global rank
  int world_size = 1;        // processes in the job
  int local_rank = 0;        // rank on this node: picks the GPU
  int local_world_size = 1;  // processes on this node
  int node_rank = 0;         // this node's index
  int num_nodes = 1;         // nodes in the job
  std::string master_addr;   // rendezvous host (empty: found at run time, e.g. mpi://)
  int master_port = 0;       // rendezvous port (0: any free port)

  // ---- SLURM job facts (set whenever SLURM_JOB_ID is, even in a batch shell) ----
  bool in_slurm_job = false;       // SLURM_JOB_ID is set
  std::string job_id;              // SLURM_JOB_ID (for an array task: its own job id)
  std::string array_job_id;        // SLURM_ARRAY_JOB_ID; empty outside job arrays
  std::string array_task_id;       // SLURM_ARRAY_TASK_ID
  std::string requeue_id;          // what `scontrol requeue` takes: "<array>_<task>" or job_id
  int restart_count = 0;           // SLURM_RESTART_COUNT: how often this job was requeued
  std::vector<std::string> nodes;  // SLURM_JOB_NODELIST expanded (comm::expand_nodelist)
  std::string job_name;            // SLURM_JOB_NAME
  // srun --gpus-per-task=k: SLURM_GPUS_PER_TASK, which srun sets only with that option
  // and which then binds each task to k GPUs of its own (the only GPUs it sees). Read
  // for an srun task only (Launcher::kSlurm): the batch shell, and processes that
  // torchrun/ringrun/mpirun start inside one task, inherit it without being bound.
  // 0: not given. "a100:2" (a typed request) counts 2.
  int gpus_per_task = 0;

  std::string note;  // why a launcher was NOT used when it looked present (empty otherwise)

  bool is_distributed() const { return world_size > 1; }
  bool is_global_zero() const { return rank == 0; }
  // One line: "slurm rank 1/4 (local 1/2, node 0/2) job 123 requeue-id 123 restarts 0"
  // (with " gpus-per-task k" after the ranks when srun bound GPUs per task).
  std::string describe() const;
};

// Reads `env` (tests pass the exact variables a launcher sets). Throws SlurmError
// naming the variable, its value, and the fix when one is missing or malformed.
ClusterEnvironment detect_cluster_environment(const comm::EnvMap& env);
// The same for this process's environment.
ClusterEnvironment detect_cluster_environment();

}  // namespace ringtrain::slurm

// launch_env.h: what the launcher told this process, read from the environment.
//
// defines: EnvMap, LaunchInfo, expand_nodelist (SLURM "node[1-3,7]" syntax),
//          expand_tasks_per_node ("2(x3),1"), the parsers of each init method
//          (env://, slurm://, mpi://, tcp://, file://), detect_init_method and
//          resolve_launch (the detection order, documented in docs/comm.md).
//
// These are pure functions of an EnvMap so that unit tests can feed them the
// exact environment a real launcher sets; init_process_group passes the
// process environment. Every error names the variable, the value it got, and
// what would fix it.
#pragma once

#include <limits>
#include <map>
#include <string>
#include <vector>

namespace ringtrain::comm {

using EnvMap = std::map<std::string, std::string>;
EnvMap current_environment();

struct LaunchInfo {
  std::string method;     // "env", "slurm", "mpi", "tcp", "file" or "single"
  int rank = 0;           // this process's rank in the world
  int world_size = 1;
  int local_rank = 0;     // rank among the processes on this node (GPU choice)
  int local_world_size = 1;
  int node_rank = 0;
  std::string master_addr;  // store host; empty for mpi and file (found at run time)
  int master_port = 0;      // store port; 0 for mpi and file (any free port)
  std::string file_path;    // file:// only
  std::string token;        // job token; empty: rank 0 makes one and shares it (mpi, file)
};

// "node[1-3,7],login01,gpu[08-09]" -> node1 node2 node3 node7 login01 gpu08 gpu09.
// Zero padding of ranges is kept. Throws CommError on malformed input.
std::vector<std::string> expand_nodelist(const std::string& nodelist);
// SLURM_TASKS_PER_NODE: "2(x3),1" -> 2 2 2 1.
std::vector<int> expand_tasks_per_node(const std::string& text);

LaunchInfo parse_env_method(const EnvMap& env);
LaunchInfo parse_slurm_method(const EnvMap& env);
// The store port slurm:// takes when MASTER_PORT is not set: 15000 + job id % 10000 for
// the first step (Lightning's), 25000 + 7 (job id % 1000) + (step id - 1) % 7 for later ones.
int slurm_derived_port(long long job_id, long long step_id);
LaunchInfo parse_mpi_method(const EnvMap& env);
// tcp://host:port and file:///path. rank / world_size < 0: read RANK and WORLD_SIZE
// (or the SLURM / Open MPI equivalents) from env.
LaunchInfo parse_url_method(const std::string& url, const EnvMap& env, int rank, int world_size);

// The method auto-detection picks: RINGTRAIN_INIT_METHOD if set, else "env://"
// (MASTER_ADDR, RANK and WORLD_SIZE set: ringrun, torchrun), else "mpi://" (Open MPI's
// OMPI_COMM_WORLD_SIZE, or PMI_SIZE / PMIX_RANK), else "slurm://" (SLURM_PROCID and
// SLURM_NTASKS in an srun task, i.e. with SLURM_STEP_ID or SLURM_STEPID), else
// "single" (one process, world size 1). An sbatch script or salloc shell has
// SLURM_PROCID=0 and SLURM_NTASKS=<all tasks> but no step id: it is not a task of the
// job, and a program started there without srun runs as a single process instead
// of waiting for ranks that never start. RANK or WORLD_SIZE set without MASTER_ADDR
// (other than RANK=0 WORLD_SIZE=1) also means "env://", whose parser then names the
// missing variable: such processes were meant to be one job, not N jobs of one.
std::string detect_init_method(const EnvMap& env);
// init_method: "auto", "env://", "slurm://", "mpi://", "tcp://host:port", "file:///path", "single".
LaunchInfo resolve_launch(const std::string& init_method, const EnvMap& env, int rank = -1,
                          int world_size = -1);

// Reads an integer variable in [min, max]; throws naming it when missing or bad.
int env_int(const EnvMap& env, const std::string& name, int min, int max, const std::string& hint);
// A size setting from this process's environment (RINGTRAIN_SHM_SLOT_BYTES, ...):
// `fallback` when unset or empty, else a whole number in [min, max]; throws naming
// the variable when it is anything else.
size_t env_size(const char* name, size_t fallback, size_t min,
                size_t max = std::numeric_limits<size_t>::max());

}  // namespace ringtrain::comm

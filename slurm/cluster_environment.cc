// cluster_environment.cc: launcher detection on top of comm's launch parsing.
//
// The work is split so that nothing is parsed twice: comm::detect_init_method picks
// the launcher, comm::resolve_launch reads rank/size/local/node and the rendezvous
// address, comm::expand_nodelist expands SLURM's host list. What is added here:
// the batch-shell guard, num_nodes, and the SLURM job facts used for requeue.
// comm reports its errors as CommError; they are rethrown as SlurmError with the
// launcher named, keeping comm's text (it already names the variable and the fix).
#include "slurm/cluster_environment.h"

#include <sstream>

#include "comm/types.h"
#include "slurm/subprocess.h"

namespace ringtrain::slurm {
namespace {

bool has(const comm::EnvMap& env, const std::string& name) {
  auto it = env.find(name);
  return it != env.end() && !it->second.empty();
}

std::string get(const comm::EnvMap& env, const std::string& name) {
  auto it = env.find(name);
  return it == env.end() ? std::string() : it->second;
}

int env_int(const comm::EnvMap& env, const std::string& name, int min, const std::string& hint) {
  try {
    return comm::env_int(env, name, min, 1 << 24, hint);
  } catch (const comm::CommError& e) {
    throw SlurmError(e.what());
  }
}

// True for a plain decimal id: "123".
bool is_number(const std::string& text) {
  return !text.empty() && text.find_first_not_of("0123456789") == std::string::npos;
}

void fill_slurm_job_facts(const comm::EnvMap& env, ClusterEnvironment* out) {
  std::string job = has(env, "SLURM_JOB_ID") ? get(env, "SLURM_JOB_ID") : get(env, "SLURM_JOBID");
  if (job.empty()) return;
  out->in_slurm_job = true;
  if (!is_number(job)) {
    throw SlurmError("environment variable SLURM_JOB_ID='" + job +
                     "' is not a job number; it is set by SLURM itself: unset it outside a SLURM job");
  }
  out->job_id = job;
  out->job_name = get(env, "SLURM_JOB_NAME");
  const bool array_job = has(env, "SLURM_ARRAY_JOB_ID");
  const bool array_task = has(env, "SLURM_ARRAY_TASK_ID");
  if (array_job != array_task) {
    throw SlurmError(std::string("environment variable ") +
                     (array_job ? "SLURM_ARRAY_TASK_ID" : "SLURM_ARRAY_JOB_ID") +
                     " is not set although " + (array_job ? "SLURM_ARRAY_JOB_ID" : "SLURM_ARRAY_TASK_ID") +
                     " is; SLURM sets both for a job array task (sbatch --array): set or unset them together");
  }
  if (array_job) {
    out->array_job_id = get(env, "SLURM_ARRAY_JOB_ID");
    out->array_task_id = get(env, "SLURM_ARRAY_TASK_ID");
    if (!is_number(out->array_job_id) || !is_number(out->array_task_id)) {
      throw SlurmError("SLURM_ARRAY_JOB_ID='" + out->array_job_id + "' / SLURM_ARRAY_TASK_ID='" +
                       out->array_task_id + "' are not job/task numbers (expected e.g. 1200 and 3)");
    }
    // scontrol requeue of the array's own job id would requeue every task of the
    // array; "<array job>_<task>" names just this one.
    out->requeue_id = out->array_job_id + "_" + out->array_task_id;
  } else {
    out->requeue_id = job;
  }
  if (has(env, "SLURM_RESTART_COUNT")) {
    out->restart_count = env_int(env, "SLURM_RESTART_COUNT", 0,
                                 "SLURM sets it to how often the job was requeued; unset it to mean 0");
  }
  std::string nodelist_var = has(env, "SLURM_JOB_NODELIST") ? "SLURM_JOB_NODELIST" : "SLURM_NODELIST";
  if (has(env, nodelist_var)) {
    try {
      out->nodes = comm::expand_nodelist(get(env, nodelist_var));
    } catch (const comm::CommError& e) {
      throw SlurmError(nodelist_var + ": " + e.what());
    }
  }
}

// SLURM_GPUS_PER_TASK as srun writes it: "[type:]count", several types comma-separated
// ("a100:1,v100:1" counts 2). Anything else is named with the fix.
int parse_gpus_per_task(const std::string& text) {
  int total = 0;
  size_t start = 0;
  while (true) {
    const size_t comma = text.find(',', start);
    const std::string item = text.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const size_t colon = item.rfind(':');
    const std::string count = colon == std::string::npos ? item : item.substr(colon + 1);
    if (!is_number(count) || count.size() > 6 || std::stoi(count) < 1) {
      throw SlurmError("environment variable SLURM_GPUS_PER_TASK='" + text +
                       "' is not a GPU count per task (srun sets it from --gpus-per-task=[type:]N, e.g. 1 or "
                       "a100:2); unset it, or pass --gpus-per-task=N to srun");
    }
    total += std::stoi(count);
    if (comma == std::string::npos) return total;
    start = comma + 1;
  }
}

}  // namespace

const char* launcher_name(Launcher launcher) {
  switch (launcher) {
    case Launcher::kLocal: return "local";
    case Launcher::kSlurm: return "slurm";
    case Launcher::kTorchrun: return "torchrun";
    case Launcher::kOpenMpi: return "mpi";
  }
  return "?";
}

std::string ClusterEnvironment::describe() const {
  std::ostringstream os;
  os << launcher_name(launcher) << " rank " << rank << "/";
  if (world_size > 0) os << world_size;
  else os << "?";  // PMIx-only launch: MPI tells the size at init
  os << " (local " << local_rank << "/"
     << local_world_size << ", node " << node_rank << "/" << num_nodes << ")";
  if (gpus_per_task > 0) os << " gpus-per-task " << gpus_per_task;
  if (in_slurm_job) {
    os << " job " << job_id << " requeue-id " << requeue_id << " restarts " << restart_count;
  }
  if (!note.empty()) os << " [" << note << "]";
  return os.str();
}

ClusterEnvironment detect_cluster_environment(const comm::EnvMap& env) {
  ClusterEnvironment out;
  fill_slurm_job_facts(env, &out);

  const std::string method = comm::detect_init_method(env);
  const bool has_step = has(env, "SLURM_STEP_ID") || has(env, "SLURM_STEPID");
  if (method == "single" && has(env, "SLURM_PROCID") && !has_step) {
    // A batch script or salloc shell: inside the job, but not one of its tasks
    // (detect_init_method chose single for that reason; say so).
    out.note = "SLURM_PROCID is set but no SLURM_STEP_ID: this is the batch/salloc shell, not an "
               "srun task; running as a single process (start the program with srun for " +
               get(env, "SLURM_NTASKS") + " tasks)";
  }

  comm::LaunchInfo info;
  try {
    info = comm::resolve_launch(method, env);
  } catch (const comm::CommError& e) {
    throw SlurmError(std::string("cannot read the launch environment (") + method + "): " + e.what());
  }
  out.init_method = method;
  out.rank = info.rank;
  out.world_size = info.world_size;
  out.local_rank = info.local_rank;
  out.local_world_size = info.local_world_size;
  out.node_rank = info.node_rank;
  out.master_addr = info.master_addr;
  out.master_port = info.master_port;

  auto nodes_from_sizes = [&] {
    return out.local_world_size > 0 && out.world_size > 0
               ? (out.world_size + out.local_world_size - 1) / out.local_world_size
               : 1;
  };
  if (info.method == "slurm") {
    out.launcher = Launcher::kSlurm;
    if (has(env, "SLURM_GPUS_PER_TASK")) out.gpus_per_task = parse_gpus_per_task(get(env, "SLURM_GPUS_PER_TASK"));
    if (has(env, "SLURM_NNODES")) {
      out.num_nodes = env_int(env, "SLURM_NNODES", 1, "srun sets it to the number of nodes of the step");
    } else if (has(env, "SLURM_JOB_NUM_NODES")) {
      out.num_nodes = env_int(env, "SLURM_JOB_NUM_NODES", 1, "SLURM sets it to the job's node count");
    } else if (!out.nodes.empty()) {
      out.num_nodes = static_cast<int>(out.nodes.size());
    } else {
      out.num_nodes = nodes_from_sizes();
    }
  } else if (info.method == "env") {
    out.launcher = Launcher::kTorchrun;
    out.num_nodes = has(env, "GROUP_WORLD_SIZE")
                        ? env_int(env, "GROUP_WORLD_SIZE", 1, "torchrun sets it to the number of nodes")
                        : nodes_from_sizes();
  } else if (info.method == "mpi") {
    out.launcher = Launcher::kOpenMpi;
    if (out.world_size < 0) {
      // PMIx gives the rank only; MPI_Init will tell the size.
      out.world_size = -1;
      out.num_nodes = 1;
    } else {
      out.num_nodes = nodes_from_sizes();
    }
  } else if (info.method == "single") {
    out.launcher = Launcher::kLocal;
    out.num_nodes = 1;
  } else {
    // tcp:// or file:// chosen with RINGTRAIN_INIT_METHOD: ranks from RANK/WORLD_SIZE
    // (or the SLURM / Open MPI equivalents); count it as torchrun-style.
    out.launcher = Launcher::kTorchrun;
    out.num_nodes = nodes_from_sizes();
  }
  if (out.num_nodes < 1 || (out.world_size > 0 && out.node_rank >= out.num_nodes)) {
    throw SlurmError("node rank " + std::to_string(out.node_rank) + " is not below the node count " +
                     std::to_string(out.num_nodes) + " (" + launcher_name(out.launcher) +
                     " launch); check SLURM_NODEID/SLURM_NNODES, GROUP_RANK/GROUP_WORLD_SIZE or NODE_RANK");
  }
  return out;
}

ClusterEnvironment detect_cluster_environment() {
  return detect_cluster_environment(comm::current_environment());
}

}  // namespace ringtrain::slurm

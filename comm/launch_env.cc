#include "comm/launch_env.h"

#include <unistd.h>

#include <cstdlib>
#include <limits>
#include <regex>

#include "comm/types.h"

extern char** environ;

namespace ringtrain::comm {

EnvMap current_environment() {
  EnvMap env;
  for (char** entry = environ; entry && *entry; ++entry) {
    std::string text = *entry;
    size_t eq = text.find('=');
    if (eq != std::string::npos) env[text.substr(0, eq)] = text.substr(eq + 1);
  }
  return env;
}

namespace {

bool has(const EnvMap& env, const std::string& name) {
  auto it = env.find(name);
  return it != env.end() && !it->second.empty();
}

std::string get(const EnvMap& env, const std::string& name) {
  auto it = env.find(name);
  return it == env.end() ? std::string() : it->second;
}

// Parses a whole string as a base-10 integer: an optional '-' and digits, nothing
// else (strtoll alone would also take " 1" and "+1"); false when it does not fit.
bool to_int(const std::string& text, long long* value) {
  const size_t digits = text.rfind('-', 0) == 0 ? 1 : 0;
  if (text.size() == digits || text.find_first_not_of("0123456789", digits) != std::string::npos) {
    return false;
  }
  char* end = nullptr;
  errno = 0;
  *value = std::strtoll(text.c_str(), &end, 10);
  return errno == 0 && end && *end == '\0';
}

std::string require(const EnvMap& env, const std::string& name, const std::string& hint) {
  if (!has(env, name)) {
    throw CommError(detail::concat("environment variable ", name, " is not set; ", hint));
  }
  return get(env, name);
}

void check_rank(int rank, int size, const std::string& rank_var, const std::string& size_var) {
  if (rank >= size) {
    throw CommError(detail::concat(rank_var, "=", rank, " is not below ", size_var, "=", size,
                                   "; ranks count from 0 to ", size_var, "-1"));
  }
}

}  // namespace

int env_int(const EnvMap& env, const std::string& name, int min, int max, const std::string& hint) {
  std::string text = require(env, name, hint);
  long long value = 0;
  if (!to_int(text, &value) || value < min || value > max) {
    throw CommError(detail::concat("environment variable ", name, "='", text,
                                   "' is not an integer in [", min, ", ", max, "]; ", hint));
  }
  return static_cast<int>(value);
}

size_t env_size(const char* name, size_t fallback, size_t min, size_t max) {
  const char* text = std::getenv(name);
  if (!text || !*text) return fallback;
  long long value = 0;
  if (!to_int(text, &value) || value < 0 || static_cast<unsigned long long>(value) < min ||
      static_cast<unsigned long long>(value) > max) {
    throw CommError(detail::concat(name, "='", text, "' is not a whole number ",
                                   max == std::numeric_limits<size_t>::max()
                                       ? detail::concat(">= ", min)
                                       : detail::concat("in [", min, ", ", max, "]"),
                                   "; unset it or give one such as ", fallback));
  }
  return static_cast<size_t>(value);
}

std::vector<std::string> expand_nodelist(const std::string& nodelist) {
  std::vector<std::string> hosts;
  auto fail = [&](const std::string& why) {
    throw CommError(detail::concat("cannot parse node list '", nodelist, "': ", why,
                                   " (expected SLURM syntax like node[1-3,7],login01)"));
  };
  size_t i = 0;
  while (i < nodelist.size()) {
    // one item: a prefix, optionally one bracket group, optionally a suffix, up to a top-level comma
    size_t start = i;
    int depth = 0;
    while (i < nodelist.size() && (depth > 0 || nodelist[i] != ',')) {
      if (nodelist[i] == '[') ++depth;
      if (nodelist[i] == ']') --depth;
      if (depth < 0 || depth > 1) fail("unbalanced brackets");
      ++i;
    }
    if (depth != 0) fail("unbalanced brackets");
    std::string item = nodelist.substr(start, i - start);
    // skip the comma; one that ends the list leaves an empty name behind it
    if (++i == nodelist.size() && nodelist.back() == ',') fail("empty host name after the last comma");
    if (item.empty()) fail("empty host name");
    size_t open = item.find('[');
    if (open == std::string::npos) {
      hosts.push_back(item);
      continue;
    }
    size_t close = item.find(']', open);
    std::string prefix = item.substr(0, open);
    std::string suffix = item.substr(close + 1);
    if (suffix.find('[') != std::string::npos) fail("more than one bracket group in one name");
    std::string ranges = item.substr(open + 1, close - open - 1);
    if (ranges.empty()) fail("empty brackets");
    size_t pos = 0;
    while (pos <= ranges.size()) {
      size_t comma = ranges.find(',', pos);
      if (comma == std::string::npos) comma = ranges.size();
      std::string range = ranges.substr(pos, comma - pos);
      pos = comma + 1;
      static const std::regex kRange(R"((\d+)(?:-(\d+))?)");
      std::smatch match;
      if (!std::regex_match(range, match, kRange)) fail("bad range '" + range + "'");
      const std::string& low_text = match[1].str();
      long long low = 0;
      long long high = 0;
      if (!to_int(low_text, &low) || (match[2].matched && !to_int(match[2].str(), &high))) {
        fail("a number in range '" + range + "' is too large");
      }
      if (!match[2].matched) high = low;
      if (high < low) fail("range '" + range + "' goes backwards");
      if (high - low > 100000) fail("range '" + range + "' is too large");
      size_t width = low_text.size();  // "08" keeps its zero
      for (long long n = low; n <= high; ++n) {
        std::string number = std::to_string(n);
        if (number.size() < width) number = std::string(width - number.size(), '0') + number;
        hosts.push_back(prefix + number + suffix);
      }
      if (comma == ranges.size()) break;
    }
  }
  if (hosts.empty()) fail("no hosts");
  return hosts;
}

std::vector<int> expand_tasks_per_node(const std::string& text) {
  std::vector<int> counts;
  static const std::regex kItem(R"((\d+)(?:\(x(\d+)\))?)");
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    std::string item = text.substr(pos, comma - pos);
    std::smatch match;
    if (!std::regex_match(item, match, kItem)) {
      throw CommError("cannot parse SLURM_TASKS_PER_NODE='" + text + "' (expected e.g. 2(x3),1)");
    }
    // Tasks per node and repeats are at least 1 (0 tasks, or "(x0)", would leave nodes
    // without ranks or no list at all); bounded like every rank count here.
    long long count = 0;
    long long repeat = 1;
    if (!to_int(match[1].str(), &count) || count < 1 || count > (1 << 20) ||
        (match[2].matched && (!to_int(match[2].str(), &repeat) || repeat < 1 || repeat > (1 << 20)))) {
      throw CommError(detail::concat("SLURM_TASKS_PER_NODE='", text, "': '", item,
                                     "' needs a task count and a repeat count in [1, ", 1 << 20,
                                     "] (expected e.g. 2(x3),1)"));
    }
    counts.insert(counts.end(), static_cast<size_t>(repeat), static_cast<int>(count));
    pos = comma + 1;
    if (comma == text.size()) break;
  }
  return counts;
}

LaunchInfo parse_env_method(const EnvMap& env) {
  const std::string hint =
      "env:// expects the variables ringrun and torchrun set (MASTER_ADDR, MASTER_PORT, "
      "WORLD_SIZE, RANK, LOCAL_RANK, LOCAL_WORLD_SIZE); start the program with ringrun, or set them";
  // torchrun's static rendezvous (and, in torch 2.x, c10d unless
  // TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1) serves its own TCPStore on MASTER_PORT and tells
  // its workers to join that store as clients. Ours speaks another protocol and would find
  // the port taken, with advice ("set MASTER_PORT to a free port") torchrun does not allow.
  if (has(env, "TORCHELASTIC_USE_AGENT_STORE") && get(env, "TORCHELASTIC_USE_AGENT_STORE") == "True") {
    throw CommError(
        "env://: torchrun's agent already serves its own TCPStore on MASTER_ADDR:MASTER_PORT "
        "(TORCHELASTIC_USE_AGENT_STORE=True), and ringtrain's store cannot share that port or speak "
        "its protocol. Start the program with ringrun (the same --nproc-per-node, --nnodes, "
        "--node-rank, --master-addr and --master-port), or use a torchrun setup whose agent leaves "
        "MASTER_PORT free (torch 2.x: --rdzv-backend=c10d with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1)");
  }
  LaunchInfo info;
  info.method = "env";
  info.master_addr = require(env, "MASTER_ADDR", hint);
  info.master_port = env_int(env, "MASTER_PORT", 1, 65535, hint);
  info.world_size = env_int(env, "WORLD_SIZE", 1, 1 << 20, hint);
  info.rank = env_int(env, "RANK", 0, 1 << 20, hint);
  check_rank(info.rank, info.world_size, "RANK", "WORLD_SIZE");
  info.local_world_size =
      has(env, "LOCAL_WORLD_SIZE") ? env_int(env, "LOCAL_WORLD_SIZE", 1, 1 << 20, hint) : info.world_size;
  // Without LOCAL_RANK, ranks fill the nodes in order (as ringrun and torchrun number them).
  info.local_rank = has(env, "LOCAL_RANK") ? env_int(env, "LOCAL_RANK", 0, 1 << 20, hint)
                                           : info.rank % info.local_world_size;
  check_rank(info.local_rank, info.local_world_size, "LOCAL_RANK", "LOCAL_WORLD_SIZE");
  info.node_rank = has(env, "GROUP_RANK")  ? env_int(env, "GROUP_RANK", 0, 1 << 20, hint)
                   : has(env, "NODE_RANK") ? env_int(env, "NODE_RANK", 0, 1 << 20, hint)
                                           : info.rank / info.local_world_size;
  // The token tells this job's connections from another's on the same port. MASTER_ADDR
  // is left out: every rank that reaches the store reached the same host, whatever name
  // or address it was given for it (node1, node1.cluster, 10.0.0.1), and spellings that
  // differ between ranks must not look like another job. The ring mesh adds a nonce
  // of rank 0's (peer_mesh.cc), so two jobs whose masters share only the port stay apart.
  info.token = has(env, "RINGTRAIN_JOB_TOKEN")
                   ? get(env, "RINGTRAIN_JOB_TOKEN")
                   : detail::concat("env:", info.master_port, ":", info.world_size, ":",
                                    get(env, "TORCHELASTIC_RUN_ID"));
  return info;
}

LaunchInfo parse_slurm_method(const EnvMap& env) {
  const std::string hint =
      "slurm:// expects the variables srun sets for each task (SLURM_PROCID, SLURM_NTASKS, "
      "SLURM_LOCALID, SLURM_NODEID, SLURM_JOB_NODELIST, SLURM_JOB_ID); launch with srun";
  LaunchInfo info;
  info.method = "slurm";
  info.rank = env_int(env, "SLURM_PROCID", 0, 1 << 20, hint);
  info.world_size = env_int(env, has(env, "SLURM_NTASKS") ? "SLURM_NTASKS" : "SLURM_NPROCS", 1,
                            1 << 20, hint);
  check_rank(info.rank, info.world_size, "SLURM_PROCID", "SLURM_NTASKS");
  info.local_rank = env_int(env, "SLURM_LOCALID", 0, 1 << 20, hint);
  info.node_rank = env_int(env, "SLURM_NODEID", 0, 1 << 20, hint);
  std::string local_size_var = "SLURM_NTASKS";
  // The step's own layout first: srun sets it for every step, and a step may use part
  // of the allocation (sbatch --ntasks-per-node=4, then srun -n 2: the job's
  // SLURM_NTASKS_PER_NODE=4 is still in the step's environment, but 2 tasks run).
  const bool step_layout = has(env, "SLURM_STEP_TASKS_PER_NODE");
  if (!step_layout && has(env, "SLURM_NTASKS_PER_NODE") &&
      get(env, "SLURM_NTASKS_PER_NODE").find_first_not_of("0123456789") == std::string::npos) {
    local_size_var = "SLURM_NTASKS_PER_NODE";
    info.local_world_size = env_int(env, "SLURM_NTASKS_PER_NODE", 1, 1 << 20, hint);
  } else if (step_layout || has(env, "SLURM_TASKS_PER_NODE")) {
    local_size_var = step_layout ? "SLURM_STEP_TASKS_PER_NODE" : "SLURM_TASKS_PER_NODE";
    std::vector<int> counts = expand_tasks_per_node(get(env, local_size_var));
    info.local_world_size = info.node_rank < static_cast<int>(counts.size()) ? counts[info.node_rank]
                                                                             : counts.back();
  } else {
    info.local_world_size = info.world_size;
  }
  if (info.local_rank >= info.local_world_size) {
    throw CommError(detail::concat("SLURM_LOCALID=", info.local_rank, " is not below the ",
                                   info.local_world_size, " tasks on node ", info.node_rank,
                                   " that ", local_size_var, "='", get(env, local_size_var),
                                   "' gives; launch with srun, or set them consistently"));
  }
  // The step's nodes first: a step that runs on part of the allocation (srun -N1 -w node2
  // inside a 2-node job) has no task on the job's first node, so no store there.
  const std::string nodelist_var = has(env, "SLURM_STEP_NODELIST")  ? "SLURM_STEP_NODELIST"
                                   : has(env, "SLURM_JOB_NODELIST") ? "SLURM_JOB_NODELIST"
                                                                    : "SLURM_NODELIST";
  if (has(env, "MASTER_ADDR")) {
    info.master_addr = get(env, "MASTER_ADDR");
  } else {
    info.master_addr = expand_nodelist(require(env, nodelist_var, hint)).front();
  }
  std::string job = has(env, "SLURM_JOB_ID") ? get(env, "SLURM_JOB_ID") : get(env, "SLURM_JOBID");
  if (has(env, "MASTER_PORT")) {
    info.master_port = env_int(env, "MASTER_PORT", 1, 65535, "set MASTER_PORT to a free TCP port");
  } else {
    long long job_id = 0;
    if (!to_int(job, &job_id) || job_id < 0) {
      throw CommError(detail::concat("SLURM_JOB_ID='", job, "' is not a job number, so no port can ",
                                     "be derived from it; set MASTER_PORT to a free TCP port"));
    }
    long long step_id = 0;
    if (has(env, "SLURM_STEP_ID") && (!to_int(get(env, "SLURM_STEP_ID"), &step_id) || step_id < 0)) step_id = 0;
    info.master_port = slurm_derived_port(job_id, step_id);
  }
  info.token = has(env, "RINGTRAIN_JOB_TOKEN")
                   ? get(env, "RINGTRAIN_JOB_TOKEN")
                   : detail::concat("slurm:", job, ".", get(env, "SLURM_STEP_ID"), ":", info.world_size);
  return info;
}

int slurm_derived_port(long long job_id, long long step_id) {
  // The first step keeps Lightning's convention, 15000 + the last four digits of the
  // job id (15000-24999). Steps running beside it (srun ... & srun ... &) need ports of
  // their own on the same first node, and must not take the first-step port of a
  // neighbouring job, which is likely to run at the same time on a shared node (a
  // plain "+ step id" gave step 1 of job J the port of job J+1): they get 7 ports per
  // job in 25000-31999, below Linux's ephemeral range. Two jobs meet only when their
  // ids are 1000 apart, or with more than 7 steps at once.
  constexpr long long kStepPortBase = 25000, kStepPortsPerJob = 7;
  if (step_id <= 0) return 15000 + static_cast<int>(job_id % 10000);
  return static_cast<int>(kStepPortBase + (job_id % 1000) * kStepPortsPerJob + (step_id - 1) % kStepPortsPerJob);
}

LaunchInfo parse_mpi_method(const EnvMap& env) {
  LaunchInfo info;
  info.method = "mpi";
  const std::string hint = "mpi:// expects to be started by mpirun (or srun --mpi=pmix)";
  // the variables actually read, for the error below
  std::string rank_var = "OMPI_COMM_WORLD_RANK";
  std::string size_var = "OMPI_COMM_WORLD_SIZE";
  if (has(env, "OMPI_COMM_WORLD_SIZE")) {
    info.world_size = env_int(env, "OMPI_COMM_WORLD_SIZE", 1, 1 << 20, hint);
    info.rank = env_int(env, "OMPI_COMM_WORLD_RANK", 0, 1 << 20, hint);
    info.local_rank = has(env, "OMPI_COMM_WORLD_LOCAL_RANK") ? env_int(env, "OMPI_COMM_WORLD_LOCAL_RANK", 0, 1 << 20, hint) : 0;
    info.local_world_size = has(env, "OMPI_COMM_WORLD_LOCAL_SIZE") ? env_int(env, "OMPI_COMM_WORLD_LOCAL_SIZE", 1, 1 << 20, hint) : 1;
    info.node_rank = info.rank / std::max(1, info.local_world_size);
  } else if (has(env, "PMI_SIZE")) {
    rank_var = "PMI_RANK";
    size_var = "PMI_SIZE";
    info.world_size = env_int(env, "PMI_SIZE", 1, 1 << 20, hint);
    info.rank = env_int(env, "PMI_RANK", 0, 1 << 20, hint);
  } else if (has(env, "PMIX_RANK")) {
    // PMIx gives the rank; MPI itself will tell the size at run time.
    info.rank = env_int(env, "PMIX_RANK", 0, 1 << 20, hint);
    info.world_size = -1;
  } else {
    throw CommError("mpi:// init: no MPI launcher variables (OMPI_COMM_WORLD_SIZE, PMI_SIZE or "
                    "PMIX_RANK) are set; start the program with mpirun -np N");
  }
  if (info.world_size > 0) check_rank(info.rank, info.world_size, rank_var, size_var);
  if (has(env, "MASTER_ADDR")) info.master_addr = get(env, "MASTER_ADDR");
  if (has(env, "RINGTRAIN_JOB_TOKEN")) info.token = get(env, "RINGTRAIN_JOB_TOKEN");
  return info;
}

LaunchInfo parse_url_method(const std::string& url, const EnvMap& env, int rank, int world_size) {
  LaunchInfo info;
  // The scheme first: a mistyped method is named as such, not as a missing world size.
  if (url.rfind("tcp://", 0) != 0 && url.rfind("file://", 0) != 0) {
    throw CommError("init method '" + url + "' is not one of env://, slurm://, mpi://, "
                    "tcp://host:port, file:///path, single, auto");
  }
  const std::string hint = "pass rank and world_size to init_process_group, or set RANK and WORLD_SIZE";
  if (world_size < 0) {
    if (has(env, "WORLD_SIZE")) world_size = env_int(env, "WORLD_SIZE", 1, 1 << 20, hint);
    else if (has(env, "OMPI_COMM_WORLD_SIZE")) world_size = env_int(env, "OMPI_COMM_WORLD_SIZE", 1, 1 << 20, hint);
    else if (has(env, "SLURM_NTASKS")) world_size = env_int(env, "SLURM_NTASKS", 1, 1 << 20, hint);
    else throw CommError(url + ": the world size is unknown; " + hint);
  }
  if (rank < 0) {
    if (has(env, "RANK")) rank = env_int(env, "RANK", 0, 1 << 20, hint);
    else if (has(env, "OMPI_COMM_WORLD_RANK")) rank = env_int(env, "OMPI_COMM_WORLD_RANK", 0, 1 << 20, hint);
    else if (has(env, "SLURM_PROCID")) rank = env_int(env, "SLURM_PROCID", 0, 1 << 20, hint);
    else throw CommError(url + ": the rank is unknown; " + hint);
  }
  check_rank(rank, world_size, "rank", "world_size");
  info.rank = rank;
  info.world_size = world_size;
  info.local_world_size = has(env, "LOCAL_WORLD_SIZE") ? env_int(env, "LOCAL_WORLD_SIZE", 1, 1 << 20, hint) : world_size;
  // Without LOCAL_RANK, ranks fill the nodes in order (as ringrun and torchrun number them).
  info.local_rank = has(env, "LOCAL_RANK") ? env_int(env, "LOCAL_RANK", 0, 1 << 20, hint) : rank % info.local_world_size;
  if (url.rfind("tcp://", 0) == 0) {
    // host: a name, an IPv4 address, or an IPv6 address in brackets (tcp://[fd00::2]:29500)
    static const std::regex kHostPort(R"(tcp://(\[[^\]/]+\]|[^:/\[\]]+):(\d+)/?)");
    std::smatch match;
    if (!std::regex_match(url, match, kHostPort)) {
      throw CommError("init method '" + url + "' is not tcp://host:port (an IPv6 address in brackets: "
                      "tcp://[fd00::2]:29500)");
    }
    info.method = "tcp";
    info.master_addr = match[1].str();
    if (info.master_addr.front() == '[') info.master_addr = info.master_addr.substr(1, info.master_addr.size() - 2);
    long long port = 0;
    if (!to_int(match[2].str(), &port) || port < 1 || port > 65535) {
      throw CommError("init method '" + url + "': port " + match[2].str() +
                      " is out of range 1-65535; give a free TCP port");
    }
    info.master_port = static_cast<int>(port);
    info.token = has(env, "RINGTRAIN_JOB_TOKEN") ? get(env, "RINGTRAIN_JOB_TOKEN")
                                                 : detail::concat("tcp:", port, ":", world_size);  // not the host's spelling (see env://)
  } else if (url.rfind("file://", 0) == 0) {
    info.method = "file";
    info.file_path = url.substr(7);
    if (info.file_path.empty() || info.file_path[0] != '/') {
      throw CommError("init method '" + url + "' needs an absolute path: file:///shared/dir/rendezvous");
    }
    if (has(env, "RINGTRAIN_JOB_TOKEN")) info.token = get(env, "RINGTRAIN_JOB_TOKEN");
  } else {
    throw CommError("init method '" + url + "' is not one of env://, slurm://, mpi://, "
                    "tcp://host:port, file:///path, single, auto");
  }
  return info;
}

std::string detect_init_method(const EnvMap& env) {
  // (auto, or empty, asks for the detection below, as the init_method argument does)
  if (has(env, "RINGTRAIN_INIT_METHOD") && get(env, "RINGTRAIN_INIT_METHOD") != "auto" &&
      !get(env, "RINGTRAIN_INIT_METHOD").empty())
    return get(env, "RINGTRAIN_INIT_METHOD");
  if (has(env, "MASTER_ADDR") && has(env, "RANK") && has(env, "WORLD_SIZE")) return "env://";
  const bool srun_task = (has(env, "SLURM_STEP_ID") || has(env, "SLURM_STEPID")) && has(env, "SLURM_PROCID") &&
                         (has(env, "SLURM_NTASKS") || has(env, "SLURM_NPROCS"));
  if (has(env, "OMPI_COMM_WORLD_SIZE")) return "mpi://";
  if (has(env, "PMI_SIZE") || has(env, "PMIX_RANK")) {
    // A cluster whose MpiDefault is pmi2 or pmix gives every srun task PMI_RANK/PMI_SIZE
    // or PMIX_RANK too, the same numbers as SLURM_PROCID/SLURM_NTASKS: that is srun's
    // own launch, and slurm:// knows its nodes and local ranks (the PMI variables do
    // not). An MPI launcher's processes inside an allocation (MPICH's mpiexec starts its
    // proxies with srun, one task per node) have PMI numbers of their own: mpi://.
    const std::string ntasks = get(env, has(env, "SLURM_NTASKS") ? "SLURM_NTASKS" : "SLURM_NPROCS");
    const bool srun_numbers = srun_task &&
                              (!has(env, "PMI_SIZE") || (get(env, "PMI_SIZE") == ntasks &&
                                                         get(env, "PMI_RANK") == get(env, "SLURM_PROCID"))) &&
                              (!has(env, "PMIX_RANK") || get(env, "PMIX_RANK") == get(env, "SLURM_PROCID"));
    if (!srun_numbers) return "mpi://";
  }
  if (srun_task) return "slurm://";
  // RANK or WORLD_SIZE without the rest of torchrun's set: processes started by hand
  // that forgot MASTER_ADDR. Running each as a world of one would train N separate
  // models into one checkpoint directory; env:// says which variable is missing.
  const bool lone_process = (!has(env, "WORLD_SIZE") || get(env, "WORLD_SIZE") == "1") &&
                            (!has(env, "RANK") || get(env, "RANK") == "0");
  if ((has(env, "RANK") || has(env, "WORLD_SIZE")) && !lone_process) return "env://";
  return "single";
}

LaunchInfo resolve_launch(const std::string& init_method, const EnvMap& env, int rank,
                          int world_size) {
  std::string method = init_method.empty() || init_method == "auto" ? detect_init_method(env) : init_method;
  if (method == "env://" || method == "env") return parse_env_method(env);
  if (method == "slurm://" || method == "slurm") return parse_slurm_method(env);
  if (method == "mpi://" || method == "mpi") return parse_mpi_method(env);
  if (method == "single") {
    RT_CHECK(world_size <= 1 && rank <= 0, "init method 'single' is one process (rank 0 of 1), but rank ", rank,
             " and world size ", world_size, " were given; use tcp://host:port or file:///path with them, or "
             "leave them unset");
    LaunchInfo info;
    info.method = "single";
    info.master_addr = "127.0.0.1";
    return info;
  }
  return parse_url_method(method, env, rank, world_size);
}

}  // namespace ringtrain::comm

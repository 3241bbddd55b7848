#include "comm/init.h"

#include <unistd.h>

#include <cstdio>
#include <exception>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <thread>

#include "comm/backends.h"
#include "comm/mpi_runtime.h"
#include "comm/socket.h"
#include "tensor/cuda/runtime.h"

namespace ringtrain::comm {

using nlohmann::json;

namespace {

LaunchInfo g_launch;
// How many world groups this process has made so far (counted when one is made): a group
// destroyed and made again in the same process (PyTorch's destroy_process_group +
// init_process_group). A failed attempt does not count, so ranks that retry together agree.
int g_init_generation = 0;
// file://: per rendezvous path, the nonce of the record this process last joined through.
std::map<std::string, std::string> g_file_nonce_used;

// ---- publishing uncaught exceptions: the std::terminate handler
std::weak_ptr<Store> g_store;
int g_world_rank = -1;
std::terminate_handler g_previous_terminate = nullptr;

void publish_then_terminate() {
  if (std::current_exception()) {  // an uncaught exception, not a bare std::terminate()
    const std::string what = detail::current_exception_what();
    if (auto store = g_store.lock()) {
      publish_rank_error(*store, g_world_rank, "exception",
                         detail::concat("uncaught exception on rank ", g_world_rank, ": ", what));
    }
  }
  if (g_previous_terminate) g_previous_terminate();
  std::abort();
}

// Debug mode compares every collective through the store before it runs, so a rank
// with it on waits there while ranks with it off run the collective: both would sit
// until the timeout and blame each other. Every rank must agree; rank 0 publishes its
// setting, the others compare (every backend: the store is always there).
void check_same_debug_mode(Store& store, int rank, bool debug, std::chrono::milliseconds timeout) {
  const std::string key = "rt/world/debug_collectives";
  const std::string mine = debug ? "1" : "0";
  if (rank == 0) {
    store.set(key, mine);
    return;
  }
  const std::string rank0 = store.get(key, timeout);
  if (rank0 != mine) {
    throw CommError(detail::concat(
        "collective debug mode differs: rank ", rank, " has RINGTRAIN_DEBUG_COLLECTIVES=", mine, " but rank 0 has ",
        rank0, "; debug mode checks every collective with every rank, so turn it on or off on all of them (export "
        "it to every rank, e.g. mpirun -x RINGTRAIN_DEBUG_COLLECTIVES, or set InitOptions::group.debug_collectives "
        "the same everywhere)"));
  }
}

void apply_environment(ProcessGroupOptions& options, const EnvMap& env) {
  if (auto it = env.find("RINGTRAIN_TIMEOUT_SEC"); it != env.end() && !it->second.empty()) {
    int seconds = env_int(env, "RINGTRAIN_TIMEOUT_SEC", 1, 1 << 30,
                          "give the per-collective timeout in seconds");
    options.timeout = std::chrono::seconds(seconds);
  }
  if (auto it = env.find("RINGTRAIN_DEBUG_COLLECTIVES"); it != env.end()) {
    if (it->second == "1" || it->second == "true") options.debug_collectives = true;
    else if (it->second == "0" || it->second == "false" || it->second.empty()) options.debug_collectives = false;
    else throw CommError("RINGTRAIN_DEBUG_COLLECTIVES='" + it->second + "' must be 0 or 1");
  }
  if (auto it = env.find("RINGTRAIN_TRANSPORT"); it != env.end() && !it->second.empty()) {
    options.transport = it->second;
  }
}

// file://path: rank 0 writes its store address into the file (atomically, via a
// rename); the others read it. A stale file from an earlier run is harmless: its
// address refuses or rejects us, and we read the file again. A group made again in the
// same process must not take the record it used before: the previous group's file may
// still be there, pointing at rank 0's old store, which is still up while it waits for
// every rank to check out. Each record carries a fresh nonce, and a rank skips the one
// it last used for this path (a count of groups made would do only if every rank had
// made the same number, by every method).
std::shared_ptr<Store> file_rendezvous(LaunchInfo& info, std::shared_ptr<StoreServer>* server,
                                       std::chrono::milliseconds timeout) {
  Deadline deadline = Clock::now() + timeout;
  if (info.rank == 0) {
    if (info.token.empty()) info.token = random_job_token();
    std::remove(info.file_path.c_str());
    *server = std::make_shared<StoreServer>("", 0, info.token, "");
    json record{{"addr", local_hostname()}, {"port", (*server)->port()}, {"token", info.token},
                {"world_size", info.world_size}, {"nonce", random_job_token()}};
    std::string tmp = info.file_path + ".tmp." + std::to_string(getpid());
    {
      std::ofstream out(tmp);
      out << record.dump();
      if (!out) throw CommError("file:// init: cannot write " + tmp + " (is the directory writable?)");
    }
    SYS_CHECK(std::rename(tmp.c_str(), info.file_path.c_str()));
    info.master_addr = record["addr"].get<std::string>();
    info.master_port = (*server)->port();
    auto store = std::make_shared<Store>("127.0.0.1", info.master_port, info.token, timeout);
    // peers find this rank where they found the store, not at 127.0.0.1
    store->set_advertised_address(info.master_addr);
    return store;
  }
  std::string last_error = "the file does not exist yet";
  while (Clock::now() < deadline) {
    std::ifstream in(info.file_path);
    if (in) {
      try {
        json record = json::parse(in);
        const std::string nonce = record.value("nonce", std::string());
        if (!nonce.empty() && g_file_nonce_used[info.file_path] == nonce) {
          last_error = "it still holds the address of the group this process made before";
          std::this_thread::sleep_for(std::chrono::milliseconds(100));
          continue;
        }
        info.token = record.at("token").get<std::string>();
        info.master_addr = record.at("addr").get<std::string>();
        info.master_port = record.at("port").get<int>();
        auto store = std::make_shared<Store>(info.master_addr, info.master_port, info.token, std::chrono::seconds(2));
        g_file_nonce_used[info.file_path] = nonce;
        return store;
      } catch (const std::exception& e) {
        last_error = e.what();
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  throw CommTimeoutError(detail::concat("file:// init: rank ", info.rank, " found no usable store ",
                                        "address in ", info.file_path, " (", last_error,
                                        "); is rank 0 running, and is the path on a shared file system?"));
}

// mpi://: rank 0 starts the store and MPI_Bcast's its address and a fresh token.
std::shared_ptr<Store> mpi_rendezvous(LaunchInfo& info, const EnvMap& env,
                                      std::shared_ptr<StoreServer>* server,
                                      std::chrono::milliseconds timeout) {
  // MASTER_PORT (optional; else any free port) is checked on every rank, so that all
  // of them fail the same way instead of the others waiting in MPI_Bcast for rank 0.
  int port = 0;
  if (auto it = env.find("MASTER_PORT"); it != env.end() && !it->second.empty()) {
    port = env_int(env, "MASTER_PORT", 1, 65535,
                   "mpi:// uses it as the store's port on rank 0; unset it to take any free port");
  }
  ensure_mpi_initialized();
  int mpi_rank = 0;
  int mpi_size = 0;
  MPI_CHECK(MPI_Comm_rank(MPI_COMM_WORLD, &mpi_rank));
  MPI_CHECK(MPI_Comm_size(MPI_COMM_WORLD, &mpi_size));
  if (info.world_size > 0 && mpi_size != info.world_size) {
    throw CommError(detail::concat("mpi:// init: MPI reports ", mpi_size, " processes but the "
                                   "launcher's environment says ", info.world_size,
                                   "; start the program with mpirun -np N"));
  }
  info.rank = mpi_rank;
  info.world_size = mpi_size;
  // Rank 0 always broadcasts, its error if it could not start the store (MASTER_PORT
  // in use, say): the other ranks then fail with that message instead of waiting in
  // MPI_Bcast, which has no timeout, for a rank that has given up.
  std::string blob;
  std::exception_ptr failure;
  if (mpi_rank == 0) {
    try {
      if (info.token.empty()) info.token = random_job_token();
      *server = std::make_shared<StoreServer>("", port, info.token, "MASTER_PORT");
      std::string addr = info.master_addr.empty() ? local_hostname() : info.master_addr;
      blob = json{{"addr", addr}, {"port", (*server)->port()}, {"token", info.token}}.dump();
    } catch (const std::exception& e) {
      failure = std::current_exception();
      blob = json{{"error", e.what()}}.dump();
    }
  }
  int length = static_cast<int>(blob.size());
  MPI_CHECK(MPI_Bcast(&length, 1, MPI_INT, 0, MPI_COMM_WORLD));
  blob.resize(length);
  MPI_CHECK(MPI_Bcast(blob.data(), length, MPI_CHAR, 0, MPI_COMM_WORLD));
  if (failure) std::rethrow_exception(failure);
  json record = json::parse(blob);
  if (record.contains("error")) {
    throw CommError(detail::concat("mpi:// init: rank 0 could not start the store: ",
                                   record["error"].get<std::string>()));
  }
  info.token = record["token"].get<std::string>();
  info.master_addr = record["addr"].get<std::string>();
  info.master_port = record["port"].get<int>();
  auto store = std::make_shared<Store>(mpi_rank == 0 ? "127.0.0.1" : info.master_addr,
                                      info.master_port, info.token, timeout);
  // rank 0 reaches its own store over loopback; its peers find it where they found the store
  if (mpi_rank == 0) store->set_advertised_address(info.master_addr);
  return store;
}

}  // namespace

std::string random_job_token() {
  std::random_device device;
  char text[33];
  for (int i = 0; i < 4; ++i) std::snprintf(text + 8 * i, 9, "%08x", device());
  return text;
}

const LaunchInfo& launch_info() { return g_launch; }

int local_cuda_device() {
  RT_CHECK(cuda::is_available(), "no usable GPU for this rank: ", cuda::unavailable_reason());
  return g_launch.local_rank % cuda::device_count();
}

std::shared_ptr<ProcessGroup> init_process_group(const InitOptions& options) {
  const EnvMap env = current_environment();
  LaunchInfo info = resolve_launch(options.init_method, env, options.rank, options.world_size);
  ProcessGroupOptions group_options = options.group;
  apply_environment(group_options, env);
  RT_CHECK(group_options.timeout.count() > 0, "init_process_group: the collective timeout must be positive, got ",
           group_options.timeout.count(), " ms");
  RT_CHECK(options.rendezvous_timeout.count() > 0, "init_process_group: rendezvous_timeout must be positive, got ",
           options.rendezvous_timeout.count(), " ms");
  std::chrono::milliseconds rendezvous_timeout = options.rendezvous_timeout;
  if (auto it = env.find("RINGTRAIN_RENDEZVOUS_TIMEOUT_SEC"); it != env.end() && !it->second.empty()) {
    rendezvous_timeout = std::chrono::seconds(env_int(env, "RINGTRAIN_RENDEZVOUS_TIMEOUT_SEC", 1, 1 << 30,
                                                      "give how long joining the job may take, in seconds"));
  }
  RT_CHECK(options.backend == "ring" || options.backend == "mpi" || options.backend == "nccl",
           "init_process_group: unknown backend '", options.backend, "' (ring, mpi or nccl)");
  // Read by every socket as it connects; a bad value is an error here, on the caller's
  // thread (the socket functions themselves fall back to 60 s, since the store's
  // accept thread makes sockets too).
  tcp_keepalive_seconds();

  // ---- the store: on world rank 0, every rank connected to it
  std::shared_ptr<StoreServer> server;
  std::shared_ptr<Store> store;
  const auto timeout = rendezvous_timeout;
  if (info.method == "mpi") {
    store = mpi_rendezvous(info, env, &server, timeout);
  } else if (info.method == "file") {
    store = file_rendezvous(info, &server, timeout);
  } else if (info.method == "single") {
    info.token = random_job_token();
    server = std::make_shared<StoreServer>("127.0.0.1", 0, info.token, "");
    store = std::make_shared<Store>("127.0.0.1", server->port(), info.token, timeout);
  } else {
    // A group made again in the same process meets at the same MASTER_PORT, where rank 0's
    // previous store may still be up (it waits for every rank to check out of the old
    // group before it closes): its keys would send this rank to the old group's dead mesh.
    // So each generation has its own token, the old store refuses the new hello (or closes
    // the connection as it shuts down), and the hello is retried until rank 0's new store
    // answers (first generation: a refusal is another job's store, an error at once).
    const int generation = g_init_generation;
    if (generation > 0) info.token += detail::concat(":generation", generation);
    if (info.rank == 0) {
      const char* hint = info.method == "tcp" ? "the port of the tcp:// init method" : "MASTER_PORT";
      server = std::make_shared<StoreServer>("", info.master_port, info.token, hint);
    }
    const Deadline deadline = Clock::now() + timeout;
    while (true) {
      try {
        store = std::make_shared<Store>(
            info.master_addr, info.master_port, info.token,
            std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
        break;
      } catch (const CommError&) {
        // Later generations: the old store refusing this token, or closing the connection
        // as it shuts down. Retried until the deadline, which then throws the last error.
        if (generation == 0 || Clock::now() + std::chrono::milliseconds(50) >= deadline) throw;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
      }
    }
  }
  g_launch = info;

  // Two processes given the same rank (a launch script's mistake) leave the rank they
  // displaced missing, and everyone waiting for it until the rendezvous timeout. Each
  // rank claims its number in the store: the second claimant fails at once and
  // publishes why, which ends the others' waits in the group's setup too.
  if (info.world_size > 1 && store->add(detail::concat("rt/rank_claim/", info.rank), 1) > 1) {
    const char* variable = info.method == "slurm" ? "SLURM_PROCID" : info.method == "mpi" ? "the MPI rank" : "RANK";
    const std::string message = detail::concat(
        "two processes were started as rank ", info.rank, " of ", info.world_size, " (this one is pid ", getpid(),
        " on ", local_hostname(), "), so another rank is missing: give every process its own ", variable,
        " in 0..", info.world_size - 1);
    publish_rank_error(*store, info.rank, "exception", message);
    throw CommError(message);
  }
  // Should this process now die without a word (kill -9, the OOM killer), the store
  // says so for it: the others may be waiting for it where no connection of its own
  // could close (its address in the store, while the mesh forms).
  if (info.world_size > 1) leave_last_will(*store, info.rank);

  GroupContext context;
  context.rank = info.rank;
  context.size = info.world_size;
  for (int r = 0; r < info.world_size; ++r) context.world_ranks.push_back(r);
  context.store = store;
  context.server = server;
  context.prefix = "rt/world";
  context.token = info.token;
  context.is_world = true;
  context.options = group_options;
  context.setup_timeout = rendezvous_timeout;

  std::shared_ptr<ProcessGroup> group;
  try {
    check_same_debug_mode(*store, info.rank, group_options.debug_collectives, rendezvous_timeout);
    if (options.backend == "ring") group = make_ring_process_group(context);
    else if (options.backend == "mpi") group = make_mpi_process_group(context);
    else group = make_nccl_process_group(context);
  } catch (const std::exception& e) {
    // This rank leaves (a setting that differs from rank 0's, say) while the others
    // may have formed the group: their first collective then reports this reason,
    // not just "rank R died".
    publish_rank_error(*store, info.rank, "exception",
                       detail::concat("rank ", info.rank, " could not join the group: ", e.what()));
    // The store lives in this process on rank 0: ranks still waiting in setup would
    // lose the reason (and see only "the store closed") if it went now. Those that
    // joined (claimed their rank, maybe twice) are waited for; one never started
    // would never say.
    if (server) {
      std::vector<int> joined;
      try {
        for (int r = 0; r < info.world_size; ++r) {
          const std::optional<std::string> claims = store->try_get(detail::concat("rt/rank_claim/", r));
          for (int64_t i = claims ? std::stoll(*claims) : 0; i > 0 && r != info.rank; --i) joined.push_back(r);
        }
      } catch (const std::exception&) {
        // best effort, as the wait itself: the original error is what propagates
      }
      wait_for_peers_to_publish(*store, joined, std::chrono::seconds(5));
    }
    throw;
  }

  g_store = store;
  g_world_rank = info.rank;
  ++g_init_generation;
  static std::once_flag handler_once;
  std::call_once(handler_once, [] { g_previous_terminate = std::set_terminate(publish_then_terminate); });
  return group;
}

}  // namespace ringtrain::comm

// slurm_rendezvous_check.cc: run under `srun -N2 -n2`; proves SLURM rendezvous without PMIx.
// (Also run under mpirun and ringrun with --expect-launcher mpi / torchrun: detection
// with the variables those launchers really set, and rendezvous through them.)
//
// Each task detects its environment (slurm/cluster_environment.h), joins the job
// with comm::init_process_group using the init method it reports (slurm://: the
// store on the first host of SLURM_STEP_NODELIST, port comm::slurm_derived_port(job id, step id)),
// allreduces a vector, and runs the requeue agreement with only the last rank
// signalled. Exit 0 and one "ok" line per rank on success; any mismatch throws.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <csignal>
#include <cstdio>
#include <vector>

#include "comm/init.h"
#include "slurm/cluster_environment.h"
#include "slurm/requeue.h"

int main(int argc, char** argv) {
  using namespace ringtrain;
  CLI::App app{"slurm_rendezvous_check: allreduce + requeue agreement across srun tasks"};
  int expect_world = 0, expect_nodes = 0;
  std::string expect_launcher = "slurm";
  std::string backend = "ring";
  app.add_option("--expect-world", expect_world, "fail unless the world has this many ranks");
  app.add_option("--expect-launcher", expect_launcher, "slurm, torchrun, mpi or local");
  app.add_option("--expect-nodes", expect_nodes, "fail unless the job spans this many nodes, one rank each");
  app.add_option("--backend", backend, "comm backend (ring)");
  // the sbatch templates and ringtrain-grid pass training flags (--strategy, --lr, ...):
  // accepted and ignored, so this program can stand in for the trainer in their tests
  app.allow_extras();
  CLI11_PARSE(app, argc, argv);
  try {
    slurm::ClusterEnvironment env = slurm::detect_cluster_environment();
    std::printf("detected: %s\n", env.describe().c_str());
    if (slurm::launcher_name(env.launcher) != expect_launcher) {
      throw slurm::SlurmError("detected launcher " + std::string(slurm::launcher_name(env.launcher)) +
                              ", expected " + expect_launcher + " (run it with srun, or pass --expect-launcher)");
    }
    if (expect_world > 0 && env.world_size != expect_world) {
      throw slurm::SlurmError("world size " + std::to_string(env.world_size) + ", expected " +
                              std::to_string(expect_world));
    }
    if (expect_nodes > 0 && (env.num_nodes != expect_nodes || env.node_rank != env.rank ||
                             env.local_world_size != 1 || env.nodes.size() != size_t(expect_nodes))) {
      throw slurm::SlurmError("expected " + std::to_string(expect_nodes) + " nodes with one task each, got: " +
                              env.describe());
    }
    comm::InitOptions options;
    options.backend = backend;
    options.init_method = env.init_method;
    options.rendezvous_timeout = std::chrono::seconds(60);
    options.group.timeout = std::chrono::seconds(60);
    auto group = comm::init_process_group(options);
    const int rank = group->rank(), size = group->size();
    if (rank != env.rank || size != env.world_size) {
      throw slurm::SlurmError("the group disagrees with the environment about rank/size");
    }

    // allreduce: element i of rank r holds (r + 1) * (i + 1); the sum is n(n+1)/2 * (i + 1)
    std::vector<float> data(1 << 16);
    for (size_t i = 0; i < data.size(); ++i) data[i] = float(rank + 1) * float(i % 97 + 1);
    group->allreduce({data.data(), data.size(), DType::kFloat32, Device::cpu()}).wait();
    const float ranks_sum = float(size) * float(size + 1) / 2;
    for (size_t i = 0; i < data.size(); ++i) {
      if (data[i] != ranks_sum * float(i % 97 + 1)) {
        throw slurm::SlurmError("allreduce element " + std::to_string(i) + " is " + std::to_string(data[i]) +
                                ", expected " + std::to_string(ranks_sum * float(i % 97 + 1)));
      }
    }

    // the requeue agreement: only the last rank gets SIGUSR1, every rank must decide to requeue
    slurm::SignalWatcher watcher;
    slurm::RequeueCoordinator coordinator(watcher, group);
    if (coordinator.poll() != slurm::RequeueDecision::kContinue) throw slurm::SlurmError("spurious decision");
    if (rank == size - 1) std::raise(SIGUSR1);
    slurm::RequeueDecision decision = coordinator.poll();
    if (decision != slurm::RequeueDecision::kCheckpointAndRequeue) {
      throw slurm::SlurmError(std::string("rank ") + std::to_string(rank) + " decided " +
                              slurm::requeue_decision_name(decision) + " instead of checkpoint+requeue");
    }
    group->barrier().wait();
    char host[256] = {0};
    gethostname(host, sizeof(host) - 1);
    const char* node = std::getenv("SLURMD_NODENAME");
    std::printf("rank %d of %d on %s (host %s, node rank %d): allreduce ok, requeue agreement ok\n", rank, size,
                node ? node : "?", host, env.node_rank);
    std::fflush(stdout);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "slurm_rendezvous_check: %s\n", e.what());
    return 1;
  }
}

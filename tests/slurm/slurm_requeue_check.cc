// slurm_requeue_check.cc: the whole walltime-requeue path on a real SLURM job.
//
// A stand-in for the Trainer's loop, with "training" = sleeping one step at a time:
//   first run (SLURM_RESTART_COUNT unset/0): steps until the walltime signal
//     (#SBATCH --signal=USR1@50) arrives; then, at a step boundary, every rank
//     agrees (RequeueCoordinator), rank 0 writes the "checkpoint" (the next step,
//     atomically), all ranks barrier, rank 0 runs `scontrol requeue <requeue id>`,
//     and every rank exits 0;
//   the requeued run (SLURM_RESTART_COUNT=1): resumes at the checkpointed step,
//     runs --steps-after-resume more steps and finishes.
// Every step is printed ("rank R step S"), so the test can check that no step was
// lost or repeated across the requeue.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

#include "comm/init.h"
#include "slurm/cluster_environment.h"
#include "slurm/requeue.h"

int main(int argc, char** argv) {
  using namespace ringtrain;
  namespace fs = std::filesystem;
  CLI::App app{"slurm_requeue_check: train-until-signalled, requeue, resume"};
  std::string state_dir;
  int step_ms = 500, max_steps = 400, steps_after_resume = 3;
  app.add_option("--state-dir", state_dir, "where the checkpoint goes")->required();
  app.add_option("--step-ms", step_ms, "length of one step");
  app.add_option("--max-steps", max_steps, "give up (exit 3) after this many steps without a signal");
  app.add_option("--steps-after-resume", steps_after_resume, "steps the requeued run does");
  CLI11_PARSE(app, argc, argv);
  try {
    // The watcher first: SLURM may send the walltime signal right after a (re)start,
    // during rendezvous, and SIGUSR1's default action would kill the task (exit 138).
    slurm::SignalWatcher watcher;  // SIGUSR1 + SIGTERM -> flags
    slurm::ClusterEnvironment env = slurm::detect_cluster_environment();
    std::shared_ptr<comm::ProcessGroup> group;
    if (env.is_distributed()) {
      comm::InitOptions options;
      options.init_method = env.init_method;
      group = comm::init_process_group(options);
    }
    const fs::path checkpoint = fs::path(state_dir) / "checkpoint.txt";
    int start = 0;
    if (std::ifstream in{checkpoint}) in >> start;
    std::printf("rank %d start: restart_count %d resume_step %d (%s)\n", env.rank, env.restart_count, start,
                env.describe().c_str());
    std::fflush(stdout);
    const int end = env.restart_count > 0 ? start + steps_after_resume : max_steps;

    slurm::RequeueCoordinator coordinator(watcher, group);
    for (int step = start; step < end; ++step) {
      std::this_thread::sleep_for(std::chrono::milliseconds(step_ms));  // the "training step"
      std::printf("rank %d step %d\n", env.rank, step);
      std::fflush(stdout);
      slurm::RequeueDecision decision = coordinator.poll();
      if (decision == slurm::RequeueDecision::kContinue) continue;
      std::printf("rank %d decision %s after step %d\n", env.rank, slurm::requeue_decision_name(decision), step);
      // the checkpoint: the next step to run, written atomically by rank 0
      slurm::RequeueAction action = coordinator.carry_out(decision, env, [&] {
        fs::create_directories(state_dir);
        fs::path tmp = checkpoint;
        tmp += ".tmp";
        std::ofstream(tmp) << step + 1 << "\n";
        fs::rename(tmp, checkpoint);
      });
      std::printf("rank %d: %s\n", env.rank, action.message.c_str());
      std::fflush(stdout);
      return 0;
    }
    if (env.restart_count == 0) {
      std::fprintf(stderr, "rank %d: no signal within %d steps\n", env.rank, max_steps);
      return 3;
    }
    if (group) group->barrier().wait();
    std::printf("rank %d finished at step %d after %d restart(s)\n", env.rank, end, env.restart_count);
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "slurm_requeue_check: %s\n", e.what());
    return 1;
  }
}

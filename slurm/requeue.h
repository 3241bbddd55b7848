// requeue.h: surviving the walltime. A signal sets a flag; every rank agrees at a
// step boundary; the job checkpoints, requeues itself and exits cleanly.
//
// defines: SignalWatcher (RAII signal handlers that only set a flag),
//          RequeueDecision, RequeueCoordinator (the agreement, a collective),
//          scontrol_command, requeue_job (runs `scontrol requeue <id>`).
//
// The protocol (what the Trainer does; docs/slurm.md tells the whole story):
//
//   #SBATCH --signal=USR1@90 --requeue       // SLURM: USR1 to every task 90 s early
//   SignalWatcher watcher;                    // before training starts
//   RequeueCoordinator coordinator(watcher, group);
//   for each step:
//     train_step();
//     switch (coordinator.poll()) {           // collective: every rank, same step
//       case kContinue: continue;
//       case kCheckpointAndRequeue:           // USR1 reached some rank
//         if (rank == 0) save_checkpoint();
//         group->barrier().wait();            // nobody leaves before the save is done
//         if (rank == 0) requeue_job(env.requeue_id);
//         return;                             // all ranks exit 0
//       case kCheckpointAndExit:              // SIGTERM: scancel, preemption, walltime
//         (same, without requeue_job)
//     }
//
// Why a flag and a collective, not work in the handler: a signal handler may only
// call async-signal-safe functions (no malloc, no locks, no I/O through stdio),
// and the signal reaches each rank at a slightly different moment, maybe in the
// middle of a backward pass with allreduces in flight. Acting at once would leave
// the ranks in different steps; a checkpoint taken there would be torn. So the
// handler stores to a lock-free atomic, and poll() makes the ranks agree with one
// tiny allreduce (max of each rank's flag): if any rank saw the signal, all act,
// at the same step boundary.
//
// Why SIGTERM is watched too: `scontrol requeue`, `scancel` and the walltime all
// end a job with SIGTERM (then SIGKILL after KillWait). Caught, it becomes a
// checkpoint-and-exit decision instead of a death in the middle of a write. Note
// that rank 0's own `scontrol requeue` makes SLURM send SIGTERM to every task:
// by then all ranks have decided and are leaving, so it only sets the flag.
#pragma once

#include <atomic>
#include <csignal>
#include <memory>
#include <string>

#include <functional>

#include "comm/launch_env.h"
#include "comm/process_group.h"
#include "slurm/cluster_environment.h"
#include "slurm/subprocess.h"

namespace ringtrain::slurm {

// Installs handlers for `requeue_signal` (SIGUSR1 by default; what #SBATCH
// --signal=USR1@90 sends) and, when watch_sigterm, SIGTERM. The handlers only set a
// flag. The previous handlers are saved and put back by the destructor. Signal
// dispositions are process-wide, so only one SignalWatcher may exist at a time (a
// second one throws). Not copyable, not movable (the handlers refer to it).
class SignalWatcher {
 public:
  explicit SignalWatcher(int requeue_signal = SIGUSR1, bool watch_sigterm = true);
  ~SignalWatcher();
  SignalWatcher(const SignalWatcher&) = delete;
  SignalWatcher& operator=(const SignalWatcher&) = delete;

  bool requeue_requested() const;    // requeue_signal arrived since construction / clear()
  bool terminate_requested() const;  // SIGTERM arrived
  int requeue_signal() const { return requeue_signal_; }
  // How many watched signals arrived (tests; a log line).
  int signal_count() const;
  void clear();

  // Parses "USR1", "SIGUSR1", "10", "USR2", "TERM", ... (throws SlurmError otherwise).
  static int parse_signal(const std::string& name);

 private:
  int requeue_signal_;
  bool watch_sigterm_;
  struct sigaction previous_requeue_ {};
  struct sigaction previous_term_ {};
};

enum class RequeueDecision {
  kContinue = 0,             // nothing happened: go on training
  kCheckpointAndRequeue = 1, // the walltime signal: save, requeue, exit 0
  kCheckpointAndExit = 2,    // SIGTERM: save and exit without requeue
};
const char* requeue_decision_name(RequeueDecision decision);

// Makes every rank reach the same decision at the same step boundary. poll() is a
// collective when `group` is set: every rank must call it at the same point (each
// step, or every k steps counted identically on all ranks). With a null group it is
// a local check (single process). SIGTERM wins over requeue (max of the flags).
struct RequeueAction {
  RequeueDecision decision = RequeueDecision::kContinue;
  bool requeued = false;  // rank 0 ran scontrol requeue successfully
  std::string message;    // one line for the log: what was done and why
};

class RequeueCoordinator {
 public:
  RequeueCoordinator(const SignalWatcher& watcher, std::shared_ptr<comm::ProcessGroup> group);
  RequeueDecision poll();
  // Carries out a decision poll() returned, on every rank: rank 0 runs
  // save_checkpoint, all ranks barrier, then for kCheckpointAndRequeue rank 0 runs
  // `scontrol requeue env.requeue_id`. Outside a SLURM job (no requeue id) it saves
  // and reports that nothing could be requeued. If the save throws on rank 0, the
  // group is aborted with the reason (the others fail at the barrier with it instead
  // of timing out) and the exception propagates. The caller then exits cleanly
  // (return from main with 0): the requeued run resumes from the checkpoint.
  // kContinue: does nothing.
  RequeueAction carry_out(RequeueDecision decision, const ClusterEnvironment& env,
                          const std::function<void()>& save_checkpoint,
                          const comm::EnvMap& process_env = comm::current_environment());
  // What this rank saw itself (before agreeing).
  RequeueDecision local_state() const;

 private:
  const SignalWatcher& watcher_;
  std::shared_ptr<comm::ProcessGroup> group_;  // null: single process
};

// The scontrol to run: $RINGTRAIN_SCONTROL when set (tests point it at a fake),
// else "scontrol" from PATH.
std::string scontrol_command(const comm::EnvMap& env);

struct RequeueResult {
  std::string requeue_id;  // what was requeued
  std::string command;     // the command line run, for the log
  std::string output;      // what scontrol printed (usually nothing)
};

// Runs `scontrol requeue <requeue_id>` (no shell). Throws SlurmError when the id is
// empty or malformed, scontrol cannot be found or started, times out, or exits
// non-zero (its output and the usual causes are in the message). Call it from rank
// 0 only, after the checkpoint is on disk.
RequeueResult requeue_job(const std::string& requeue_id, const comm::EnvMap& env,
                          std::chrono::milliseconds timeout = std::chrono::seconds(60));
RequeueResult requeue_job(const std::string& requeue_id);

}  // namespace ringtrain::slurm

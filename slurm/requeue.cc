// requeue.cc: the signal flag, the agreement allreduce, and scontrol.
//
// The handler writes two process-wide lock-free atomics (std::atomic<int> is
// always lock-free on the platforms we build for: static_assert below), which is
// what POSIX allows in a handler. The watcher object itself is never touched by
// the handler, so the handler cannot race with the watcher's destruction beyond
// the flags, which outlive it.
#include "slurm/requeue.h"

#include <cctype>
#include <cstring>
#include <regex>

namespace ringtrain::slurm {
namespace {

static_assert(std::atomic<int>::is_always_lock_free, "signal handlers need lock-free atomics");

std::atomic<int> g_requeue_signal{0};   // the watched requeue signal number (0: none)
std::atomic<int> g_requeue_flag{0};     // 1 once the requeue signal arrived
std::atomic<int> g_terminate_flag{0};   // 1 once SIGTERM arrived
std::atomic<int> g_signal_count{0};
std::atomic<bool> g_watcher_alive{false};

extern "C" void on_watched_signal(int signo) {
  // async-signal-safe: lock-free atomic stores only.
  if (signo == SIGTERM) {
    g_terminate_flag.store(1, std::memory_order_relaxed);
  } else if (signo == g_requeue_signal.load(std::memory_order_relaxed)) {
    g_requeue_flag.store(1, std::memory_order_relaxed);
  }
  g_signal_count.fetch_add(1, std::memory_order_relaxed);
}

void install(int signo, struct sigaction* previous) {
  struct sigaction action {};
  action.sa_handler = on_watched_signal;
  sigemptyset(&action.sa_mask);
  // SA_RESTART: a read()/accept() in the comm or data threads resumes instead of
  // failing with EINTR because of our signal.
  action.sa_flags = SA_RESTART;
  if (sigaction(signo, &action, previous) != 0) {
    throw SlurmError(std::string("sigaction(") + strsignal(signo) + ") failed: " + std::strerror(errno));
  }
}

}  // namespace

SignalWatcher::SignalWatcher(int requeue_signal, bool watch_sigterm)
    : requeue_signal_(requeue_signal), watch_sigterm_(watch_sigterm) {
  // Also refused: the signals of a fault (a handler that only sets a flag and returns
  // makes a real SIGSEGV re-fault forever instead of crashing) and SIGCHLD (every
  // child process that exits, scontrol included, would count as a request).
  if (requeue_signal <= 0 || requeue_signal >= NSIG || requeue_signal == SIGKILL ||
      requeue_signal == SIGSTOP || requeue_signal == SIGTERM || requeue_signal == SIGSEGV ||
      requeue_signal == SIGBUS || requeue_signal == SIGFPE || requeue_signal == SIGILL ||
      requeue_signal == SIGABRT || requeue_signal == SIGTRAP || requeue_signal == SIGCHLD) {
    throw SlurmError("SignalWatcher: signal " + std::to_string(requeue_signal) +
                     " cannot be the requeue signal (SIGKILL/SIGSTOP cannot be caught; SIGTERM is "
                     "watched separately; fault signals and SIGCHLD mean something else); use SIGUSR1 "
                     "(#SBATCH --signal=USR1@90) or SIGUSR2");
  }
  bool expected = false;
  if (!g_watcher_alive.compare_exchange_strong(expected, true)) {
    throw SlurmError("SignalWatcher: another SignalWatcher is alive; signal handlers are process-wide, "
                     "create one watcher and share it");
  }
  g_requeue_flag.store(0);
  g_terminate_flag.store(0);
  g_signal_count.store(0);
  g_requeue_signal.store(requeue_signal);
  try {
    install(requeue_signal, &previous_requeue_);
    if (watch_sigterm) install(SIGTERM, &previous_term_);
  } catch (...) {
    sigaction(requeue_signal, &previous_requeue_, nullptr);
    g_requeue_signal.store(0);
    g_watcher_alive.store(false);
    throw;
  }
}

SignalWatcher::~SignalWatcher() {
  sigaction(requeue_signal_, &previous_requeue_, nullptr);
  if (watch_sigterm_) sigaction(SIGTERM, &previous_term_, nullptr);
  g_requeue_signal.store(0);
  g_watcher_alive.store(false);
}

bool SignalWatcher::requeue_requested() const { return g_requeue_flag.load() != 0; }
bool SignalWatcher::terminate_requested() const { return g_terminate_flag.load() != 0; }
int SignalWatcher::signal_count() const { return g_signal_count.load(); }
void SignalWatcher::clear() {
  g_requeue_flag.store(0);
  g_terminate_flag.store(0);
}

int SignalWatcher::parse_signal(const std::string& name) {
  std::string text = name;
  for (char& c : text) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (text.rfind("SIG", 0) == 0) text = text.substr(3);
  static const std::pair<const char*, int> kNames[] = {
      {"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"TERM", SIGTERM}, {"INT", SIGINT},
      {"HUP", SIGHUP},   {"QUIT", SIGQUIT}, {"ALRM", SIGALRM}, {"CONT", SIGCONT}};
  for (const auto& [signal_name, number] : kNames) {
    if (text == signal_name) return number;
  }
  if (!text.empty() && text.find_first_not_of("0123456789") == std::string::npos && text.size() < 4) {
    int number = std::stoi(text);
    if (number > 0 && number < NSIG) return number;
  }
  throw SlurmError("unknown signal '" + name + "'; use a name like USR1, SIGUSR2, TERM or a number");
}

const char* requeue_decision_name(RequeueDecision decision) {
  switch (decision) {
    case RequeueDecision::kContinue: return "continue";
    case RequeueDecision::kCheckpointAndRequeue: return "checkpoint+requeue";
    case RequeueDecision::kCheckpointAndExit: return "checkpoint+exit";
  }
  return "?";
}

RequeueCoordinator::RequeueCoordinator(const SignalWatcher& watcher,
                                       std::shared_ptr<comm::ProcessGroup> group)
    : watcher_(watcher), group_(std::move(group)) {}

RequeueDecision RequeueCoordinator::local_state() const {
  if (watcher_.terminate_requested()) return RequeueDecision::kCheckpointAndExit;
  if (watcher_.requeue_requested()) return RequeueDecision::kCheckpointAndRequeue;
  return RequeueDecision::kContinue;
}

RequeueDecision RequeueCoordinator::poll() {
  int32_t flag = static_cast<int32_t>(local_state());
  if (group_ && group_->size() > 1) {
    // The agreement: max over ranks (exit > requeue > continue). One 4-byte
    // allreduce per call: microseconds next to a training step.
    group_->allreduce({&flag, 1, DType::kInt32, Device::cpu()}, comm::ReduceOp::kMax).wait();
  }
  if (flag < 0 || flag > 2) {
    throw SlurmError("RequeueCoordinator: the ranks agreed on flag " + std::to_string(flag) +
                     ", which is no decision (a rank is running a different version?)");
  }
  return static_cast<RequeueDecision>(flag);
}

RequeueAction RequeueCoordinator::carry_out(RequeueDecision decision, const ClusterEnvironment& env,
                                            const std::function<void()>& save_checkpoint,
                                            const comm::EnvMap& process_env) {
  RequeueAction action;
  action.decision = decision;
  if (decision == RequeueDecision::kContinue) return action;
  const bool rank0 = group_ ? group_->rank() == 0 : true;
  const std::string why = decision == RequeueDecision::kCheckpointAndRequeue
                              ? std::string("signal ") + strsignal(watcher_.requeue_signal()) +
                                    " (walltime near)"
                              : std::string("SIGTERM");
  if (rank0) {
    try {
      save_checkpoint();
    } catch (const std::exception& e) {
      if (group_) group_->abort(std::string("rank 0 failed to save the checkpoint after ") + why + ": " + e.what());
      throw;
    }
  }
  // Nobody leaves before the checkpoint is complete: once rank 0 requeues, SLURM
  // cancels every task of the job at once.
  if (group_ && group_->size() > 1) group_->barrier().wait();
  if (decision == RequeueDecision::kCheckpointAndExit) {
    action.message = why + ": checkpoint saved, exiting without requeue";
    return action;
  }
  if (env.requeue_id.empty()) {
    action.message = why + ": checkpoint saved; not inside a SLURM job, so nothing to requeue";
    return action;
  }
  if (rank0) {
    RequeueResult result;
    try {
      result = requeue_job(env.requeue_id, process_env);
    } catch (const std::exception& e) {
      // The others have left the barrier: tell them why, or they wait for rank 0 in
      // their next collective.
      if (group_) group_->abort(std::string("rank 0 could not requeue the job after ") + why + ": " + e.what());
      throw;
    }
    action.requeued = true;
    action.message = why + ": checkpoint saved, ran `" + result.command + "`";
  } else {
    action.message = why + ": checkpoint saved by rank 0, which requeues job " + env.requeue_id;
  }
  return action;
}

std::string scontrol_command(const comm::EnvMap& env) {
  auto it = env.find("RINGTRAIN_SCONTROL");
  if (it != env.end() && !it->second.empty()) return it->second;
  return "scontrol";
}

RequeueResult requeue_job(const std::string& requeue_id, const comm::EnvMap& env,
                          std::chrono::milliseconds timeout) {
  // "123" or "123_4" (array task). Anything else would make scontrol requeue
  // something we did not mean, so refuse it here.
  static const std::regex kId(R"(\d+(_\d+)?)");
  if (!std::regex_match(requeue_id, kId)) {
    throw SlurmError("cannot requeue job '" + requeue_id +
                     "': not a SLURM job id (expected 123, or 123_4 for an array task); outside a "
                     "SLURM job there is nothing to requeue (is SLURM_JOB_ID set?)");
  }
  RequeueResult result;
  result.requeue_id = requeue_id;
  std::string scontrol = scontrol_command(env);
  result.command = scontrol + " requeue " + requeue_id;
  ProcessResult run;
  try {
    run = run_process({scontrol, "requeue", requeue_id}, timeout);
  } catch (const ProcessTimeoutError& e) {
    throw SlurmError(std::string("cannot requeue job ") + requeue_id + ": " + e.what() +
                     " (is slurmctld reachable from this node? `scontrol ping` tells; the job was "
                     "not requeued, so it ends at its walltime)");
  } catch (const ProgramNotFoundError& e) {
    throw SlurmError(std::string("cannot requeue job ") + requeue_id + ": " + e.what() +
                     " (install the SLURM client tools, slurm-client / slurm-wlm, or set "
                     "RINGTRAIN_SCONTROL to scontrol's path)");
  } catch (const SlurmError& e) {
    throw SlurmError(std::string("cannot requeue job ") + requeue_id + ": " + e.what());
  }
  result.output = run.output;
  if (run.exit_code != 0) {
    throw SlurmError("`" + result.command + "` failed with exit code " + std::to_string(run.exit_code) +
                     ": " + (run.output.empty() ? std::string("(no output)") : run.output) +
                     " -- is JobRequeue=1 in slurm.conf or was the job submitted with --requeue? "
                     "(--no-requeue jobs cannot be requeued, nor interactive salloc/srun jobs, which "
                     "are not batch jobs; only the job's owner or root may requeue)");
  }
  return result;
}

RequeueResult requeue_job(const std::string& requeue_id) {
  return requeue_job(requeue_id, comm::current_environment());
}

}  // namespace ringtrain::slurm

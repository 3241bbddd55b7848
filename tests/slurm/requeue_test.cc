// requeue_test.cc: the signal flag, handler restore, the agreement across two real
// processes, and scontrol requeue against a fake scontrol that records its argv.
#include "slurm/requeue.h"

#include <gtest/gtest.h>
#include <signal.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <thread>

#include "comm/init.h"
#include "slurm/cluster_environment.h"
#include "tests/common/free_port.h"

namespace ringtrain::slurm {
namespace {
namespace fs = std::filesystem;

std::atomic<int> g_custom_handler_calls{0};
extern "C" void custom_handler(int) { g_custom_handler_calls.fetch_add(1); }

TEST(SignalWatcher, RaiseSetsTheFlagOnly) {
  SignalWatcher watcher;
  EXPECT_FALSE(watcher.requeue_requested());
  EXPECT_FALSE(watcher.terminate_requested());
  ASSERT_EQ(raise(SIGUSR1), 0);  // delivered synchronously to this thread
  EXPECT_TRUE(watcher.requeue_requested());
  EXPECT_FALSE(watcher.terminate_requested());
  EXPECT_EQ(watcher.signal_count(), 1);
  ASSERT_EQ(raise(SIGTERM), 0);  // would kill the test without the watcher
  EXPECT_TRUE(watcher.terminate_requested());
  watcher.clear();
  EXPECT_FALSE(watcher.requeue_requested());
  EXPECT_FALSE(watcher.terminate_requested());
}

TEST(SignalWatcher, ConfigurableSignal) {
  SignalWatcher watcher(SIGUSR2, /*watch_sigterm=*/false);
  struct sigaction ignore {};
  ignore.sa_handler = SIG_IGN;
  struct sigaction old {};
  sigaction(SIGUSR1, &ignore, &old);  // USR1 is not ours now: must not set the flag
  raise(SIGUSR1);
  EXPECT_FALSE(watcher.requeue_requested());
  raise(SIGUSR2);
  EXPECT_TRUE(watcher.requeue_requested());
  sigaction(SIGUSR1, &old, nullptr);
}

TEST(SignalWatcher, RestoresThePreviousHandlers) {
  struct sigaction custom {};
  custom.sa_handler = custom_handler;
  sigemptyset(&custom.sa_mask);
  struct sigaction saved_usr1 {}, saved_term {};
  ASSERT_EQ(sigaction(SIGUSR1, &custom, &saved_usr1), 0);
  ASSERT_EQ(sigaction(SIGTERM, &custom, &saved_term), 0);
  g_custom_handler_calls = 0;
  {
    SignalWatcher watcher;
    raise(SIGUSR1);
    EXPECT_EQ(g_custom_handler_calls.load(), 0);  // ours ran instead
    EXPECT_TRUE(watcher.requeue_requested());
  }
  struct sigaction now {};
  sigaction(SIGUSR1, nullptr, &now);
  EXPECT_EQ(now.sa_handler, custom_handler);
  sigaction(SIGTERM, nullptr, &now);
  EXPECT_EQ(now.sa_handler, custom_handler);
  raise(SIGUSR1);
  raise(SIGTERM);
  EXPECT_EQ(g_custom_handler_calls.load(), 2);
  sigaction(SIGUSR1, &saved_usr1, nullptr);
  sigaction(SIGTERM, &saved_term, nullptr);
}

TEST(SignalWatcher, OnlyOneAtATimeAndNoUncatchableSignals) {
  {
    SignalWatcher first;
    EXPECT_THROW(SignalWatcher second, SlurmError);
  }
  SignalWatcher again;  // the first one's destruction freed the slot
  EXPECT_THROW(SignalWatcher(SIGKILL), SlurmError);
}

// A fault signal as the requeue signal would turn a real SIGSEGV into an endless
// re-fault loop (the handler returns); SIGCHLD fires for every child that exits.
TEST(SignalWatcher, RefusesSignalsThatMeanSomethingElse) {
  for (int signo : {SIGKILL, SIGSTOP, SIGTERM, SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT, SIGCHLD}) {
    try {
      SignalWatcher watcher(signo);
      ADD_FAILURE() << "signal " << signo << " was accepted";
    } catch (const SlurmError& e) {
      EXPECT_NE(std::string(e.what()).find("cannot be the requeue signal"), std::string::npos) << e.what();
    }
  }
  SignalWatcher usr2(SIGUSR2);  // and the slot is free for a good one
}

TEST(SignalWatcher, ParseSignal) {
  EXPECT_EQ(SignalWatcher::parse_signal("USR1"), SIGUSR1);
  EXPECT_EQ(SignalWatcher::parse_signal("SIGUSR2"), SIGUSR2);
  EXPECT_EQ(SignalWatcher::parse_signal("sigterm"), SIGTERM);
  EXPECT_EQ(SignalWatcher::parse_signal("10"), 10);
  EXPECT_THROW(SignalWatcher::parse_signal("USR3"), SlurmError);
}

TEST(RequeueCoordinator, SingleProcessDecisions) {
  SignalWatcher watcher;
  RequeueCoordinator coordinator(watcher, nullptr);
  EXPECT_EQ(coordinator.poll(), RequeueDecision::kContinue);
  raise(SIGUSR1);
  EXPECT_EQ(coordinator.poll(), RequeueDecision::kCheckpointAndRequeue);
  raise(SIGTERM);  // SIGTERM wins: save and leave, no requeue
  EXPECT_EQ(coordinator.poll(), RequeueDecision::kCheckpointAndExit);
  EXPECT_STREQ(requeue_decision_name(RequeueDecision::kCheckpointAndRequeue), "checkpoint+requeue");
}

using ::ringtrain::testing::free_port;

// Rank `rank` of a 2-rank ring group rendezvousing at 127.0.0.1:port.
std::shared_ptr<comm::ProcessGroup> join_two_rank_group(int rank, int port) {
  comm::InitOptions options;
  options.init_method = "tcp://127.0.0.1:" + std::to_string(port);
  options.rank = rank;
  options.world_size = 2;
  options.rendezvous_timeout = std::chrono::seconds(30);
  options.group.timeout = std::chrono::seconds(30);
  return comm::init_process_group(options);
}

// Forks two real processes, each running rank_body(rank, port) and exiting with the
// code it returns (20 if it throws); every rank must exit 0. `codes` explains the
// body's non-zero codes in the failure message.
void run_two_ranks(const std::function<int(int rank, int port)>& rank_body, const char* codes) {
  const int port = free_port();
  pid_t children[2];
  for (int rank = 0; rank < 2; ++rank) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int code = 0;
      try {
        code = rank_body(rank, port);
      } catch (const std::exception& e) {
        fprintf(stderr, "rank %d: %s\n", rank, e.what());
        code = 20;
      }
      _exit(code);
    }
    children[rank] = pid;
  }
  for (int rank = 0; rank < 2; ++rank) {
    int status = 0;
    ASSERT_EQ(waitpid(children[rank], &status, 0), children[rank]);
    ASSERT_TRUE(WIFEXITED(status)) << "rank " << rank << " died";
    EXPECT_EQ(WEXITSTATUS(status), 0) << "rank " << rank << " (20: exception; " << codes << ")";
  }
}

// Two real processes on the ring backend: only rank 1 gets the signal, both must
// decide to requeue at the same poll; the poll before the signal says continue on both.
TEST(RequeueCoordinator, TwoRanksAgreeWhenOnlyOneWasSignalled) {
  run_two_ranks(
      [](int rank, int port) {
        int code = 0;
        auto group = join_two_rank_group(rank, port);
        SignalWatcher watcher;
        RequeueCoordinator coordinator(watcher, group);
        if (coordinator.poll() != RequeueDecision::kContinue) code = 10;
        if (rank == 1) raise(SIGUSR1);
        if (coordinator.poll() != RequeueDecision::kCheckpointAndRequeue) code = 11;
        if (rank == 0) raise(SIGTERM);
        if (coordinator.poll() != RequeueDecision::kCheckpointAndExit) code = 12;
        group->barrier().wait();
        return code;
      },
      "10/11/12: wrong decision at poll 1/2/3");
}

// The walltime signal arrives while collectives are in flight, at any thread of the
// process (kill(getpid()) is process-directed). With the watcher installed the
// collectives must neither fail nor compute wrong results: comm retries on EINTR.
TEST(RequeueCoordinator, CollectivesSurviveASignalStorm) {
  run_two_ranks(
      [](int rank, int port) {
        int code = 0;
        SignalWatcher watcher;  // before any comm thread exists, as in the Trainer
        auto group = join_two_rank_group(rank, port);
        std::atomic<bool> stop{false};
        std::thread storm([&] {
          while (!stop.load()) {
            kill(getpid(), SIGUSR1);
            std::this_thread::sleep_for(std::chrono::microseconds(200));
          }
        });
        std::vector<float> data(1 << 15);
        for (int iter = 0; iter < 100 && code == 0; ++iter) {
          std::fill(data.begin(), data.end(), float(rank + 1 + iter));
          group->allreduce({data.data(), data.size(), DType::kFloat32, Device::cpu()}).wait();
          if (data[0] != float(3 + 2 * iter) || data.back() != float(3 + 2 * iter)) code = 30;
        }
        stop = true;
        storm.join();
        RequeueCoordinator coordinator(watcher, group);
        if (coordinator.poll() != RequeueDecision::kCheckpointAndRequeue) code = 31;
        if (watcher.signal_count() < 10) code = 32;  // the storm really hit us
        group->barrier().wait();
        return code;
      },
      "30: wrong sum, 31/32: flag");
}

// A fake scontrol: records its arguments, prints `output`, exits with `code`.
class FakeScontrol : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("ringtrain_scontrol_" + std::to_string(getpid()));
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string make(const std::string& output, int code) {
    fs::path script = dir_ / "scontrol";
    std::ofstream(script) << "#!/bin/sh\nprintf '%s\\n' \"$@\" > '" << (dir_ / "args").string() << "'\n"
                          << "echo '" << output << "'\nexit " << code << "\n";
    fs::permissions(script, fs::perms::owner_all);
    return script.string();
  }
  std::string recorded_args() {
    std::ifstream in(dir_ / "args");
    std::stringstream text;
    text << in.rdbuf();
    return text.str();
  }
  fs::path dir_;
};

TEST_F(FakeScontrol, RequeueRunsScontrolWithTheId) {
  comm::EnvMap env = {{"RINGTRAIN_SCONTROL", make("", 0)}};
  RequeueResult result = requeue_job("1234", env);
  EXPECT_EQ(recorded_args(), "requeue\n1234\n");
  EXPECT_EQ(result.command, env["RINGTRAIN_SCONTROL"] + " requeue 1234");
}

TEST_F(FakeScontrol, ArrayTaskIdFromTheEnvironment) {
  comm::EnvMap env = {{"RINGTRAIN_SCONTROL", make("", 0)}, {"SLURM_JOB_ID", "1240"},
                      {"SLURM_ARRAY_JOB_ID", "1237"}, {"SLURM_ARRAY_TASK_ID", "3"}};
  ClusterEnvironment cluster = detect_cluster_environment(env);
  requeue_job(cluster.requeue_id, env);
  EXPECT_EQ(recorded_args(), "requeue\n1237_3\n");
}

TEST_F(FakeScontrol, FailureCarriesScontrolsMessage) {
  comm::EnvMap env = {{"RINGTRAIN_SCONTROL",
                       make("scontrol: error: Requested operation is presently disabled for job 77", 1)}};
  try {
    requeue_job("77", env);
    FAIL() << "expected SlurmError";
  } catch (const SlurmError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("exit code 1"), std::string::npos) << what;
    EXPECT_NE(what.find("presently disabled"), std::string::npos) << what;
    EXPECT_NE(what.find("JobRequeue=1"), std::string::npos) << what;
    EXPECT_NE(what.find("interactive salloc/srun jobs"), std::string::npos) << what;
    EXPECT_EQ(what.find("install"), std::string::npos) << what;  // scontrol is there
  }
}

// A scontrol that hangs (slurmctld unreachable) is a timeout, and the message says so;
// before, every failure to run it said "install the SLURM client tools".
TEST_F(FakeScontrol, HangingScontrolIsReportedAsATimeoutNotAMissingTool) {
  fs::path script = dir_ / "scontrol";
  std::ofstream(script) << "#!/bin/sh\nexec sleep 30\n";
  fs::permissions(script, fs::perms::owner_all);
  comm::EnvMap env = {{"RINGTRAIN_SCONTROL", script.string()}};
  try {
    requeue_job("9", env, std::chrono::milliseconds(300));
    FAIL() << "expected SlurmError";
  } catch (const SlurmError& e) {
    std::string what = e.what();
    EXPECT_NE(what.find("did not finish within 300 ms"), std::string::npos) << what;
    EXPECT_NE(what.find("scontrol ping"), std::string::npos) << what;
    EXPECT_EQ(what.find("install"), std::string::npos) << what;
  }
}

TEST_F(FakeScontrol, MissingScontrolAndBadIds) {
  comm::EnvMap env = {{"RINGTRAIN_SCONTROL", (dir_ / "no-such-scontrol").string()}};
  try {
    requeue_job("5", env);
    FAIL() << "expected SlurmError";
  } catch (const SlurmError& e) {
    EXPECT_NE(std::string(e.what()).find("RINGTRAIN_SCONTROL"), std::string::npos) << e.what();
  }
  env["RINGTRAIN_SCONTROL"] = make("", 0);
  EXPECT_THROW(requeue_job("", env), SlurmError);
  EXPECT_THROW(requeue_job("12;reboot", env), SlurmError);
  EXPECT_THROW(requeue_job("12_", env), SlurmError);
  EXPECT_EQ(recorded_args(), "");  // never ran
}

TEST_F(FakeScontrol, CarryOutSavesThenRequeues) {
  comm::EnvMap env = {{"RINGTRAIN_SCONTROL", make("", 0)}, {"SLURM_JOB_ID", "77"}};
  ClusterEnvironment cluster = detect_cluster_environment(env);
  SignalWatcher watcher;
  RequeueCoordinator coordinator(watcher, nullptr);
  int saves = 0;
  auto save = [&] {
    EXPECT_EQ(recorded_args(), "");  // the checkpoint comes before the requeue
    ++saves;
  };
  RequeueAction none = coordinator.carry_out(coordinator.poll(), cluster, save, env);
  EXPECT_EQ(saves, 0);
  EXPECT_FALSE(none.requeued);

  raise(SIGUSR1);
  RequeueAction action = coordinator.carry_out(coordinator.poll(), cluster, save, env);
  EXPECT_EQ(saves, 1);
  EXPECT_TRUE(action.requeued);
  EXPECT_EQ(recorded_args(), "requeue\n77\n");
  EXPECT_NE(action.message.find("requeue 77"), std::string::npos) << action.message;
}

TEST_F(FakeScontrol, CarryOutWithoutRequeue) {
  comm::EnvMap env = {{"RINGTRAIN_SCONTROL", make("", 0)}};
  SignalWatcher watcher;
  RequeueCoordinator coordinator(watcher, nullptr);
  int saves = 0;
  // outside SLURM: saved, nothing to requeue
  raise(SIGUSR1);
  RequeueAction outside = coordinator.carry_out(coordinator.poll(), detect_cluster_environment(env),
                                                [&] { ++saves; }, env);
  EXPECT_EQ(saves, 1);
  EXPECT_FALSE(outside.requeued);
  EXPECT_NE(outside.message.find("not inside a SLURM job"), std::string::npos) << outside.message;
  // SIGTERM inside SLURM: saved, exit, no requeue
  comm::EnvMap slurm_env = env;
  slurm_env["SLURM_JOB_ID"] = "78";
  raise(SIGTERM);
  RequeueAction term = coordinator.carry_out(coordinator.poll(), detect_cluster_environment(slurm_env),
                                             [&] { ++saves; }, slurm_env);
  EXPECT_EQ(term.decision, RequeueDecision::kCheckpointAndExit);
  EXPECT_EQ(saves, 2);
  EXPECT_FALSE(term.requeued);
  EXPECT_EQ(recorded_args(), "");  // scontrol never ran
  // a failing save propagates and nothing is requeued
  watcher.clear();
  raise(SIGUSR1);
  EXPECT_THROW(coordinator.carry_out(coordinator.poll(), detect_cluster_environment(slurm_env),
                                     [] { throw std::runtime_error("disk full"); }, slurm_env),
               std::runtime_error);
  EXPECT_EQ(recorded_args(), "");
}

TEST(Subprocess, CapturesOutputExitCodeAndTimesOut) {
  ProcessResult result = run_process({"sh", "-c", "echo out; echo err >&2; exit 3"});
  EXPECT_EQ(result.exit_code, 3);
  EXPECT_EQ(result.output, "out\nerr\n");
  auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(run_process({"sleep", "10"}, std::chrono::milliseconds(200)), SlurmError);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(5));  // killed, not waited
  EXPECT_THROW(run_process({"ringtrain-no-such-program"}), SlurmError);
  EXPECT_EQ(scontrol_command({}), "scontrol");
}

// SLURM's warning signals reach every process of the step, a running `scontrol requeue`
// included, and may come twice: one killed scontrol (exit 138, SIGUSR1) once cost a job
// its requeue. The helper finishes its request; SIGKILL (the timeout) still ends it.
TEST(Subprocess, TheWalltimeSignalsDoNotKillAHelperMidRequest) {
  ProcessResult result = run_process({"sh", "-c", "kill -USR1 $$; kill -USR2 $$; kill -TERM $$; echo finished"});
  EXPECT_EQ(result.exit_code, 0) << result.output;
  EXPECT_EQ(result.output, "finished\n");
  result = run_process({"sh", "-c", "kill -KILL $$; echo not reached"});
  EXPECT_EQ(result.exit_code, 128 + SIGKILL);
}

// A wrapper (RINGTRAIN_SCONTROL, RINGTRAIN_SBATCH) that exits at once but leaves a background
// process holding its output pipe: the command is done when the child exits, not when the
// pipe closes (before, this was reported as a timeout and the requeue as failed). And a
// timeout kills what the command started, not only the command.
TEST(Subprocess, EndsWhenTheChildExitsAndATimeoutKillsItsProcessGroup) {
  auto start = std::chrono::steady_clock::now();
  ProcessResult result = run_process({"sh", "-c", "echo started; sleep 6 & exit 0"}, std::chrono::seconds(3));
  EXPECT_EQ(result.exit_code, 0);
  EXPECT_EQ(result.output, "started\n");
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));

  const std::string marker = "7.25" + std::to_string(::getpid() % 1000);  // a sleep no one else runs
  EXPECT_THROW(run_process({"sh", "-c", "sleep " + marker + " & wait"}, std::chrono::milliseconds(300)),
               SlurmError);
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  // '[s]leep': the pattern must not match the command line of the shell running pgrep
  ProcessResult left = run_process({"sh", "-c", "pgrep -f '[s]leep " + marker + "' || true"});
  EXPECT_EQ(left.output, "") << "the timed-out command's background sleep survived";

  // A command that closes its output and then hangs: the pipe reports EOF at once, and
  // the wait for the command itself used to have no deadline.
  start = std::chrono::steady_clock::now();
  EXPECT_THROW(run_process({"sh", "-c", "exec >&- 2>&-; sleep 8"}, std::chrono::milliseconds(300)),
               ProcessTimeoutError);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(3));
}

}  // namespace
}  // namespace ringtrain::slurm

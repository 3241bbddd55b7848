// Trainer with two real processes (forked, torchrun-style variables, ring backend over
// TCP on 127.0.0.1): uneven validation, a signal during rendezvous, resume agreement.
// Each rank runs Trainer::fit in a child and reports through its exit code, as the
// two-process tests in tests/slurm/requeue_test.cc do.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "tests/common/outside_slurm.h"

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <string>
#include <thread>

#include "autograd/functions.h"
#include "nn/layers.h"
#include "tensor/ops.h"
#include "trainer/trainer.h"
#include "tests/common/free_port.h"
#include "tests/trainer/blobs.h"

namespace ringtrain::trainer {
namespace {

namespace fs = std::filesystem;

using testing::blobs;

class Classifier : public testing::BlobStepsModule {
 public:
  explicit Classifier(bool batch_norm) {
    Generator gen(1);
    model_ = nn::make<nn::Sequential>();
    model_->push_back(nn::make<nn::Linear>(4, 16, true, gen));
    if (batch_norm) model_->push_back(nn::make<nn::BatchNorm1d>(16));
    model_->push_back(nn::make<nn::ReLU>());
    model_->push_back(nn::make<nn::Linear>(16, 3, true, gen));
  }
  std::shared_ptr<nn::Module> model() override { return model_; }
  Optimizers configure_optimizers(nn::Module& m) override {
    return {std::make_unique<nn::SGD>(m.parameters(), nn::SGDOptions{.lr = 0.1, .momentum = 0.9}), nullptr};
  }
  std::shared_ptr<nn::Sequential> model_;
};

TrainerOptions quiet(TrainerOptions o) {
  o.progress_bar = false;
  o.devices = "0";
  o.strategy = "ddp";
  return o;
}

using ::ringtrain::testing::free_port;

// Forks rank `rank` of 2 with the torchrun variables set; the child exits with what
// body returns (20 when it throws, after printing the error).
pid_t start_rank(int rank, int port, const std::function<int(int rank)>& body) {
  std::fflush(nullptr);  // or the child repeats what the parent had buffered
  pid_t pid = fork();
  if (pid != 0) return pid;
  setenv("MASTER_ADDR", "127.0.0.1", 1);
  setenv("MASTER_PORT", std::to_string(port).c_str(), 1);
  setenv("RANK", std::to_string(rank).c_str(), 1);
  setenv("LOCAL_RANK", std::to_string(rank).c_str(), 1);
  setenv("WORLD_SIZE", "2", 1);
  setenv("LOCAL_WORLD_SIZE", "2", 1);
  setenv("RINGTRAIN_TIMEOUT_SEC", "30", 1);  // a mismatch fails in 30 s, not 30 min
  int code = 0;
  try {
    code = body(rank);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "rank %d: %s\n", rank, e.what());
    code = 20;
  }
  std::fflush(stdout);
  _exit(code);
}

// Waits for both; a child still running after `limit` is killed (a hang fails, not blocks).
void expect_exit_codes(pid_t pids[2], int expected, const char* codes,
                       std::chrono::seconds limit = std::chrono::seconds(90)) {
  auto deadline = std::chrono::steady_clock::now() + limit;
  for (int rank = 0; rank < 2; ++rank) {
    int status = 0;
    pid_t done = 0;
    while ((done = waitpid(pids[rank], &status, WNOHANG)) == 0 && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    if (done == 0) {
      kill(pids[rank], SIGKILL);
      waitpid(pids[rank], &status, 0);
      ADD_FAILURE() << "rank " << rank << " hung (killed after " << limit.count() << " s)";
      continue;
    }
    if (WIFSIGNALED(status)) {
      ADD_FAILURE() << "rank " << rank << " was killed by signal " << WTERMSIG(status);
      continue;
    }
    EXPECT_EQ(WEXITSTATUS(status), expected) << "rank " << rank << " (20: exception; " << codes << ")";
  }
}

void run_two_ranks(const std::function<int(int rank)>& body, const char* codes, int expected = 0) {
  const int port = free_port();
  pid_t pids[2] = {start_rank(0, port, body), start_rank(1, port, body)};
  expect_exit_codes(pids, expected, codes);
}

// 33 validation examples, batch 16, 2 ranks: the exact sampler gives rank 0 17 (two
// batches) and rank 1 16 (one). With BatchNorm, DDP's forward broadcast the buffers
// on every call, even under no_grad, so rank 0 broadcast twice and rank 1 once: "peer
// sent 64 bytes where 16 were expected". Validation must not go through DDP.
// A classifier whose learning rate depends on the rank: DDP averages the same gradients,
// but the steps differ, so the replicas drift apart.
class RankDependentLrClassifier : public Classifier {
 public:
  explicit RankDependentLrClassifier(int rank) : Classifier(false), rank_(rank) {}
  Optimizers configure_optimizers(nn::Module& m) override {
    return {std::make_unique<nn::SGD>(m.parameters(), nn::SGDOptions{.lr = 0.1 * (1 + rank_)}), nullptr};
  }

 private:
  int rank_;
};

// fit() ends by comparing the replicas' weights: equal for a DDP run (and reported),
// and replicas that drifted apart are an error naming the ranks, not a success.
TEST(TrainerMultiRank, TheReplicasAreComparedAtTheEnd) {
  auto data = blobs(64, 3);
  run_two_ranks(
      [&](int) {
        Classifier module(false);
        FitResult r = Trainer(quiet({.max_epochs = 2, .batch_size = 8})).fit(module, data);
        return r.replicas_compared == 2 && r.weights_fingerprint == nn::weights_fingerprint(*module.model_) ? 0 : 1;
      },
      "1: replicas not compared");
  run_two_ranks(
      [&](int rank) {
        RankDependentLrClassifier module(rank);
        try {
          Trainer(quiet({.max_epochs = 1, .batch_size = 8})).fit(module, data);
        } catch (const Error& e) {
          const std::string what = e.what();
          return what.find("after training the model replicas differ: rank 1 ended with other weights than "
                           "rank 0") != std::string::npos ? 0 : 2;
        }
        return 1;
      },
      "1: no error; 2: another error");
}

TEST(TrainerMultiRank, ValidationWithBatchNormAndUnevenBatchCounts) {
  run_two_ranks(
      [](int rank) {
        Classifier m(/*batch_norm=*/true);
        FitResult r = Trainer(quiet({.max_epochs = 2, .batch_size = 16})).fit(m, blobs(64, 1), blobs(33, 2));
        if (r.last_validation["count"] != 33) return 10;
        if (r.last_validation["correct"] < 20) return 11;
        return 0;
      },
      "10: count is not 33; 11: the model did not learn");
}

// One validation example: rank 1 has no batch, returned no keys and skipped the
// allreduce, so rank 0's was answered by the next collective (or hung).
TEST(TrainerMultiRank, ValidationWhenARankHasNoBatch) {
  run_two_ranks(
      [](int rank) {
        Classifier m(/*batch_norm=*/false);
        FitResult r = Trainer(quiet({.max_epochs = 2, .batch_size = 16})).fit(m, blobs(64, 1), blobs(1, 2));
        if (r.global_step != 2 * 2) return 9;
        if (r.last_validation.size() != 2 || r.last_validation["count"] != 1) return 10;
        return 0;
      },
      "9: wrong step count; 10: the validation sums are not {correct, count=1} on every rank");
}

// Whether `pid` has a handler installed for `sig` (/proc/<pid>/status, SigCgt).
bool catches(pid_t pid, int sig) {
  std::ifstream status("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("SigCgt:", 0) == 0) return (std::stoull(line.substr(7), nullptr, 16) >> (sig - 1)) & 1;
  }
  return false;
}

// SLURM can send SIGUSR1 right after a (re)start. Rank 0 alone waits in rendezvous;
// the signal used to kill it (the watcher was installed only after rendezvous, DDP and
// resume). Now it is noted, and once rank 1 arrives both stop before training, cleanly.
TEST(TrainerMultiRank, SignalDuringRendezvousStopsBothRanksCleanly) {
  const int port = free_port();
  auto body = [](int rank) {
    Classifier m(false);
    FitResult r = Trainer(quiet({.max_epochs = 2, .batch_size = 16})).fit(m, blobs(64, 1));
    if (!r.stopped_early) return 10;
    if (r.global_step != 0) return 11;
    return 0;
  };
  pid_t pids[2];
  pids[0] = start_rank(0, port, body);
  // Until the handler is there (or 3 s: then the signal shows what happens without it).
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (!catches(pids[0], SIGUSR1) && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  kill(pids[0], SIGUSR1);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  pids[1] = start_rank(1, port, body);
  expect_exit_codes(pids, 0, "10: not stopped early; 11: trained although signalled before the first step");
}

// Each rank used to pick "the newest valid checkpoint" on its own. With directories
// that differ between ranks (here: the same relative path from different working
// directories, as node-local disks would be), rank 0 resumed and rank 1 started
// fresh, silently. Now rank 0 chooses, every rank loads that one, and all fail
// together naming the rank that could not.
TEST(TrainerMultiRank, RanksResumeFromTheCheckpointRankZeroChoseOrFailTogether) {
  fs::path root = fs::temp_directory_path() / ("rt_multirank_resume_" + std::to_string(getpid()));
  fs::remove_all(root);
  fs::create_directories(root / "rank0");
  fs::create_directories(root / "rank1");
  {
    // A checkpoint in rank 0's directory only, from a single-process run.
    Classifier m(false);
    TrainerOptions o = quiet({.max_epochs = 1, .batch_size = 16});
    o.strategy = "none";
    o.checkpoint_dir = (root / "rank0" / "ckpt").string();
    Trainer(o).fit(m, blobs(64, 1));
  }
  run_two_ranks(
      [&root](int rank) {
        fs::current_path(root / ("rank" + std::to_string(rank)));
        Classifier m(false);
        TrainerOptions o = quiet({.max_epochs = 2, .batch_size = 16});
        o.checkpoint_dir = "ckpt";
        try {
          Trainer(o).fit(m, blobs(64, 1));
        } catch (const Error& e) {
          std::string what = e.what();
          if (what.find("rank(s) 1 could not load checkpoint ckpt/ckpt-0000000004") != std::string::npos &&
              what.find("shared file system") != std::string::npos)
            return 30;
          std::fprintf(stderr, "rank %d: unexpected error: %s\n", rank, what.c_str());
          return 21;
        }
        return 0;
      },
      "0: trained although the ranks resumed from different states; 30: the expected error; 21: another error",
      /*expected=*/30);
  fs::remove_all(root);
}

// Rank 0 alone writes checkpoints. When its save fails (here its directory turns into
// a file during epoch 1; in life, a full disk), rank 1 must fail with that reason, not
// with "rank 0 closed its connection" (ring) or after a collective timeout (NCCL).
class SaveBreakingClassifier : public Classifier {
 public:
  explicit SaveBreakingClassifier(fs::path checkpoint_dir) : Classifier(false), dir_(std::move(checkpoint_dir)) {}
  Tensor training_step(const data::Batch& b, StepContext& ctx) override {
    if (ctx.rank() == 0 && ++steps_ == 3) {  // the first step of epoch 1 (2 steps per epoch)
      fs::remove_all(dir_);
      std::ofstream(dir_) << "not a directory";
    }
    return Classifier::training_step(b, ctx);
  }

 private:
  fs::path dir_;
  int steps_ = 0;
};

TEST(TrainerMultiRank, AFailedSaveOnRankZeroFailsEveryRankWithItsReason) {
  fs::path root = fs::temp_directory_path() / ("rt_multirank_save_" + std::to_string(getpid()));
  fs::remove_all(root);
  fs::create_directories(root);
  run_two_ranks(
      [&root](int rank) {
        SaveBreakingClassifier m(root / "ckpt");
        TrainerOptions o = quiet({.max_epochs = 4, .batch_size = 16});
        o.checkpoint_dir = (root / "ckpt").string();
        try {
          Trainer(o).fit(m, blobs(64, 1));
        } catch (const std::exception& e) {  // rank 0: the filesystem's own error
          const std::string what = e.what();
          if (rank == 0 || (what.find("Trainer: rank 0 failed") != std::string::npos &&
                            what.find("cannot create the checkpoint directory") != std::string::npos))
            return 30;
          std::fprintf(stderr, "rank %d: unexpected error: %s\n", rank, what.c_str());
          return 21;
        }
        return 0;
      },
      "0: trained on although the save failed; 30: the expected error; 21: another error", /*expected=*/30);
  fs::remove_all(root);
}

// An error on rank 0 alone after rendezvous (here: its metrics CSV cannot be written)
// aborts the group with the reason. Before, rank 1 waited in DDP's first collective
// while rank 0 waited 60 s at shutdown for rank 1 to check out, and rank 1 learned only
// that rank 0 had died.
TEST(TrainerMultiRank, AnErrorOnRankZeroAloneFailsEveryRankAtOnceWithItsReason) {
  run_two_ranks(
      [](int rank) {
        Classifier m(/*batch_norm=*/false);
        TrainerOptions o = quiet({.max_epochs = 2, .batch_size = 16});
        o.metrics_csv = "/nonexistent-dir/metrics.csv";  // checked on rank 0 only
        const auto start = std::chrono::steady_clock::now();
        try {
          Trainer(o).fit(m, blobs(64, 1));
        } catch (const std::exception& e) {
          const std::string what = e.what();
          const bool named = what.find("cannot write '/nonexistent-dir/metrics.csv'") != std::string::npos &&
                             (rank == 0 || what.find("Trainer: rank 0 failed") != std::string::npos);
          if (!named) {
            std::fprintf(stderr, "rank %d: unexpected error: %s\n", rank, what.c_str());
            return 21;
          }
          return std::chrono::steady_clock::now() - start < std::chrono::seconds(20) ? 30 : 22;
        }
        return 0;
      },
      "0: trained on; 30: the expected error, in time; 21: another error; 22: it took 20 s or more",
      /*expected=*/30);
}

}  // namespace
}  // namespace ringtrain::trainer

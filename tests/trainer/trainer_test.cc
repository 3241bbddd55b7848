// Trainer, single process: option checks, learning, precision, accumulation, resume.
#include "trainer/trainer.h"

#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <span>
#include <utility>

#include "autograd/functions.h"
#include "nn/checkpoint.h"
#include "nn/layers.h"
#include "nn/lr_scheduler.h"
#include "tensor/ops.h"
#include "tests/common/expect_error.h"
#include "tests/common/outside_slurm.h"
#include "tests/trainer/blobs.h"

namespace ringtrain::trainer {
namespace {

namespace fs = std::filesystem;
using ringtrain::testing::expect_error;

using testing::blobs;

class BlobClassifier : public testing::BlobStepsModule {
 public:
  explicit BlobClassifier(uint64_t seed = 1) {
    Generator gen(seed);
    model_ = nn::make<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
        nn::make<nn::Linear>(4, 16, true, gen), nn::make<nn::ReLU>(), nn::make<nn::Linear>(16, 3, true, gen)});
  }
  std::shared_ptr<nn::Module> model() override { return model_; }
  Optimizers configure_optimizers(nn::Module& m) override {
    return {std::make_unique<nn::SGD>(m.parameters(), nn::SGDOptions{.lr = 0.1}), nullptr};
  }
  std::shared_ptr<nn::Module> model_;
};

TrainerOptions quiet(TrainerOptions o) {
  o.progress_bar = false;
  o.devices = "0";
  return o;
}

double accuracy(const FitResult& r) { return r.last_validation.at("correct") / r.last_validation.at("count"); }

TEST(TrainerTest, RejectsBadOptionsWithTheFix) {
  EXPECT_THROW(Trainer(quiet({.precision = "8-bit"})), Error);
  EXPECT_THROW(Trainer(quiet({.batch_size = 0})), Error);
  EXPECT_THROW(Trainer(quiet({.accumulate_grad_batches = 0})), Error);
  BlobClassifier m;
  expect_error([&] { Trainer(quiet({.strategy = "fsdp", .max_epochs = 1})).fit(m, blobs(32, 1)); }, {"ddp2"});
  expect_error([&] { Trainer(quiet({.num_nodes = 4, .max_epochs = 1})).fit(m, blobs(32, 1)); }, {"num_nodes"});
}

// Options that were silently ignored (or failed only after an epoch had trained) are
// refused up front, each naming the option.
TEST(TrainerTest, RejectsIgnoredOrLateFailingOptionsUpFront) {
  auto data = blobs(32, 1);
  auto fit = [&](TrainerOptions o) {
    BlobClassifier m;
    o.max_epochs = 1;
    Trainer(quiet(o)).fit(m, data);
  };
  expect_error([&] { fit({.backend = "gloo"}); }, {"backend must be auto, ring, mpi or nccl"});
  expect_error([&] { fit({.backend = "nccl"}); }, {"backend=nccl needs GPUs"});
  expect_error([&] { fit({.gradient_clip_val = -1}); }, {"gradient_clip_val must be >= 0"});
  expect_error([&] { fit({.gradient_clip_val = std::nan("")}); }, {"gradient_clip_val"});
  expect_error([&] { fit({.resume = "ckpt-0000000007"}); }, {"checkpoint_dir is empty"});
  expect_error([&] { fit({.metrics_csv = "/nonexistent/dir/m.csv"}); }, {"cannot write '/nonexistent/dir/m.csv'"});
  expect_error([&] { fit({.step_log_csv = "/nonexistent/dir/s.csv"}); },
               {"cannot write '/nonexistent/dir/s.csv'", "directory must exist"});
  expect_error([&] { fit({.checkpoint_dir = "/proc/nope"}); }, {"cannot create or write checkpoint_dir"});
  struct NullModel : BlobClassifier {
    std::shared_ptr<nn::Module> model() override { return nullptr; }
  };
  expect_error(
      [&] {
        NullModel m;
        Trainer(quiet({.max_epochs = 1})).fit(m, data);
      },
      {"model() returned null"});
}

TEST(TrainerTest, LearnsAndWritesMetrics) {
  fs::path csv = fs::temp_directory_path() / ("rt_trainer_metrics_" + std::to_string(::getpid()) + ".csv");
  fs::remove(csv);
  BlobClassifier m;
  FitResult r = Trainer(quiet({.max_epochs = 5, .batch_size = 16, .metrics_csv = csv.string()}))
                    .fit(m, blobs(400, 1), blobs(200, 2));
  EXPECT_EQ(r.epochs_completed, 5);
  EXPECT_EQ(r.global_step, 5 * 25);
  EXPECT_GT(accuracy(r), 0.95);
  std::ifstream in(csv);
  std::string header;
  std::getline(in, header);
  EXPECT_EQ(header, "epoch,step,train_loss,seconds,lr,correct,count");
  int rows = 0;
  for (std::string line; std::getline(in, line);) ++rows;
  EXPECT_EQ(rows, 5);
  fs::remove(csv);
}

TEST(TrainerTest, DataParallelOnCpuReplicasAndMixedPrecisionAlsoLearn) {
  for (const char* precision : {"32", "16-mixed", "bf16-mixed"}) {
    for (const char* strategy : {"none", "dp"}) {
      SCOPED_TRACE(std::string(precision) + " " + strategy);
      BlobClassifier m;
      FitResult r = Trainer(quiet({.strategy = strategy, .precision = precision, .max_epochs = 4, .batch_size = 16}))
                        .fit(m, blobs(400, 1), blobs(200, 2));
      EXPECT_GT(accuracy(r), 0.9);
    }
  }
}

TEST(TrainerTest, AccumulatingTwoHalfBatchesEqualsOneFullBatch) {
  BlobClassifier a(3), b(3);
  auto data = blobs(128, 4);
  Trainer(quiet({.max_epochs = 2, .batch_size = 16})).fit(a, data);
  Trainer(quiet({.max_epochs = 2, .batch_size = 8, .accumulate_grad_batches = 2})).fit(b, data);
  auto pa = a.model_->parameters(), pb = b.model_->parameters();
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_LT(max_abs_diff(pa[i], pb[i]), 1e-5) << "parameter " << i;
}

TEST(TrainerTest, MaxStepsAndResumeContinueExactly) {
  fs::path dir = fs::temp_directory_path() / ("rt_trainer_ckpt_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  auto data = blobs(160, 5);
  BlobClassifier straight(7);
  Trainer(quiet({.max_epochs = 3, .batch_size = 16})).fit(straight, data);

  BlobClassifier first(7);
  FitResult r1 = Trainer(quiet({.max_epochs = 3, .max_steps = 13, .batch_size = 16, .checkpoint_dir = dir.string()}))
                     .fit(first, data);
  EXPECT_EQ(r1.global_step, 13);  // stopped mid-epoch 1 (10 steps per epoch)
  // Save happens at epoch ends; stop by signal instead to save mid-epoch.
  BlobClassifier second(99);  // different initial weights: the checkpoint must replace them
  FitResult r2 = Trainer(quiet({.max_epochs = 3, .batch_size = 16, .checkpoint_dir = dir.string(),
                                .simulate_signal_at_step = 17}))
                     .fit(second, data);
  EXPECT_TRUE(r2.stopped_early);
  EXPECT_FALSE(r2.requeued);  // not in a SLURM job: nothing to requeue
  BlobClassifier third(42);
  FitResult r3 = Trainer(quiet({.max_epochs = 3, .batch_size = 16, .checkpoint_dir = dir.string()})).fit(third, data);
  EXPECT_NE(r3.resumed_from.find("ckpt-0000000017"), std::string::npos) << r3.resumed_from;
  EXPECT_EQ(r3.global_step, 30);
  auto ps = straight.model_->parameters(), pt = third.model_->parameters();
  for (size_t i = 0; i < ps.size(); ++i)
    EXPECT_EQ(ps[i].to_vector<float>(), pt[i].to_vector<float>()) << "parameter " << i;
  fs::remove_all(dir);
}

// max_epochs=0 with max_steps=5 used to be accepted and train nothing. Lightning's
// reading: max_epochs=-1 is "no epoch limit" (then max_steps decides), 0 is an error.
TEST(TrainerTest, MaxEpochsZeroIsRefusedAndMinusOneRunsUntilMaxSteps) {
  auto refused = [](TrainerOptions o, const std::vector<std::string>& needles) {
    expect_error([&] { Trainer t(quiet(o)); }, needles);
  };
  refused({.max_epochs = 0, .max_steps = 5}, {"max_epochs=0", "max_epochs=-1", "max_steps"});
  refused({.max_epochs = 0}, {"max_epochs=0"});
  refused({.max_epochs = -1}, {"max_epochs=-1 and max_steps=-1", "set max_steps"});
  refused({.max_epochs = -2, .max_steps = 5}, {"max_epochs must be >= 1, or -1"});
  refused({.max_epochs = 1, .max_steps = 0}, {"max_steps must be -1 (no limit) or >= 1"});
  BlobClassifier m;
  // 64 examples / batch 16 = 4 steps per epoch: 10 steps cross two epoch ends.
  FitResult r = Trainer(quiet({.max_epochs = -1, .max_steps = 10, .batch_size = 16})).fit(m, blobs(64, 1));
  EXPECT_EQ(r.global_step, 10);
  EXPECT_EQ(r.epochs_completed, 2);
}

// A classifier whose Dropout has its own seeded Generator (not default_generator()).
class SeededDropoutClassifier : public BlobClassifier {
 public:
  explicit SeededDropoutClassifier(uint64_t seed) {
    Generator gen(seed);
    model_ = nn::make<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
        nn::make<nn::Linear>(4, 16, true, gen), nn::make<nn::ReLU>(), nn::make<nn::Dropout>(0.3, 7),
        nn::make<nn::Linear>(16, 3, true, gen)});
  }
};

void expect_same_bits(nn::Module& a, nn::Module& b) {
  auto pa = a.parameters(), pb = b.parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) EXPECT_EQ(pa[i].to_vector<float>(), pb[i].to_vector<float>()) << "parameter " << i;
}

fs::path fresh_dir(const std::string& name) {
  fs::path dir = fs::temp_directory_path() / (name + "_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  return dir;
}

// The checkpoint held only default_generator(); a Dropout's own stream restarted at its
// seed on resume, so the resumed run drew other masks than the uninterrupted one.
TEST(TrainerTest, SeededDropoutResumesBitExactly) {
  fs::path dir = fresh_dir("rt_trainer_dropout");
  auto data = blobs(100, 1);
  const TrainerOptions base = quiet({.max_epochs = 3, .batch_size = 8});
  SeededDropoutClassifier straight(1);
  Trainer(base).fit(straight, data);

  TrainerOptions stopped = base;
  stopped.checkpoint_dir = dir.string();
  stopped.simulate_signal_at_step = 20;  // mid-epoch 1 (13 steps per epoch)
  SeededDropoutClassifier first(1);
  EXPECT_TRUE(Trainer(stopped).fit(first, data).stopped_early);
  nn::CheckpointInfo info = nn::read_checkpoint_info(*nn::CheckpointManager(dir.string()).latest_valid());
  EXPECT_TRUE(info.metadata.at("rng_extra").contains("model.2.generator")) << info.metadata.dump();

  TrainerOptions resume = base;
  resume.checkpoint_dir = dir.string();
  SeededDropoutClassifier second(99);
  FitResult r = Trainer(resume).fit(second, data);
  EXPECT_NE(r.resumed_from.find("ckpt-0000000020"), std::string::npos) << r.resumed_from;
  EXPECT_EQ(r.global_step, 39);
  expect_same_bits(*straight.model_, *second.model_);
  fs::remove_all(dir);
}

// Validation must not move the training's random streams: DataParallel draws a key from
// the default generator and from the model's own generators at every forward, eval
// included, so the masks after the first validation depended on how many validation
// batches there were (and ranks validate different numbers; checkpoints keep rank 0's).
TEST(TrainerTest, ValidationLeavesTheTrainingRandomStreamsAlone) {
  auto data = blobs(96, 1);
  const TrainerOptions base = quiet({.strategy = "dp", .max_epochs = 3, .batch_size = 8});
  SeededDropoutClassifier without(1), with(1);
  Trainer(base).fit(without, data);
  Trainer(base).fit(with, data, blobs(40, 2));
  expect_same_bits(*without.model_, *with.model_);
}

// The metrics CSV's lr column is the rate the epoch trained with (it was read after the
// schedule stepped: the next epoch's), and a failed write is an error, not silence.
class SteppedLrClassifier : public BlobClassifier {
 public:
  Optimizers configure_optimizers(nn::Module& m) override {
    auto sgd = std::make_unique<nn::SGD>(m.parameters(), nn::SGDOptions{.lr = 0.1});
    auto schedule = std::make_unique<nn::StepLR>(*sgd, /*step_size=*/1, /*gamma=*/0.5);
    return {std::move(sgd), std::move(schedule)};
  }
};

TEST(TrainerTest, MetricsRowsCarryTheEpochsLearningRateAndFailedWritesAreErrors) {
  fs::path csv = fs::temp_directory_path() / ("rt_trainer_lr_" + std::to_string(::getpid()) + ".csv");
  fs::remove(csv);
  SteppedLrClassifier m;
  Trainer(quiet({.max_epochs = 3, .batch_size = 16, .metrics_csv = csv.string()})).fit(m, blobs(64, 1));
  std::ifstream in(csv);
  std::vector<double> lrs;
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) lrs.push_back(std::stod(line.substr(line.rfind(',') + 1)));
  EXPECT_EQ(lrs, (std::vector<double>{0.1, 0.05, 0.025}));
  fs::remove(csv);
  SteppedLrClassifier full;
  expect_error([&] { Trainer(quiet({.max_epochs = 1, .batch_size = 16, .metrics_csv = "/dev/full"})).fit(full, blobs(64, 1)); },
               {"metrics_csv '/dev/full' failed", "disk full"});
  SteppedLrClassifier full_log;
  expect_error([&] { Trainer(quiet({.max_epochs = 1, .batch_size = 16, .step_log_csv = "/dev/full"})).fit(full_log, blobs(64, 1)); },
               {"step log '/dev/full' failed"});
}

// A resumed run with nothing left to train reports the epochs it had completed.
TEST(TrainerTest, AFinishedRunResumedReportsItsCompletedEpochs) {
  fs::path dir = fresh_dir("rt_trainer_finished");
  TrainerOptions o = quiet({.max_epochs = 2, .batch_size = 16});
  o.checkpoint_dir = dir.string();
  BlobClassifier first, again;
  EXPECT_EQ(Trainer(o).fit(first, blobs(64, 1)).epochs_completed, 2);
  FitResult r = Trainer(o).fit(again, blobs(64, 1));
  EXPECT_FALSE(r.resumed_from.empty());
  EXPECT_EQ(r.global_step, 8);
  EXPECT_EQ(r.epochs_completed, 2);
  fs::remove_all(dir);
}

// A signal on the last batch of an epoch saves ckpt-S (epoch e, all batches done); the
// resumed run then ends that epoch and saved again at the same step S, writing over
// ckpt-S: tensors first, record second. A crash between the two renames left a record
// whose CRC no longer matched, and with keep_last=1 no valid checkpoint at all. The
// crash is simulated by making the record's write fail (its temporary path is taken).
TEST(TrainerTest, ASecondSaveAtTheSameStepNeverDestroysTheFirst) {
  fs::path dir = fresh_dir("rt_trainer_samestep");
  auto data = blobs(100, 1);
  TrainerOptions base = quiet({.max_epochs = 3, .batch_size = 8, .checkpoint_dir = dir.string(), .keep_last = 1});
  BlobClassifier straight(3);
  TrainerOptions no_ckpt = base;
  no_ckpt.checkpoint_dir.clear();
  Trainer(no_ckpt).fit(straight, data);

  TrainerOptions stopped = base;
  stopped.simulate_signal_at_step = 13;  // the last of epoch 0's 13 steps
  BlobClassifier first(3);
  EXPECT_TRUE(Trainer(stopped).fit(first, data).stopped_early);

  // Block the JSON record of any save at step 13 (whichever stem it uses).
  const std::string pid = std::to_string(::getpid());
  for (const char* stem : {"ckpt-0000000013", "ckpt-0000000013-1"})
    fs::create_directories(dir / ("." + std::string(stem) + ".json.tmp." + pid));
  BlobClassifier crashed(3);
  EXPECT_THROW(Trainer(base).fit(crashed, data), std::exception);
  for (const char* stem : {"ckpt-0000000013", "ckpt-0000000013-1"})
    fs::remove_all(dir / ("." + std::string(stem) + ".json.tmp." + pid));

  std::vector<std::string> skipped;
  std::optional<std::string> latest = nn::CheckpointManager(dir.string(), 1).latest_valid(&skipped);
  ASSERT_TRUE(latest.has_value()) << "no valid checkpoint left; skipped: " << (skipped.empty() ? "" : skipped[0]);
  EXPECT_EQ(nn::read_checkpoint_info(*latest).progress.step, 13);

  // Both saves at step 13 now succeed, under two names, and the run finishes exactly.
  BlobClassifier resumed(42);
  FitResult r = Trainer(base).fit(resumed, data);
  EXPECT_EQ(r.global_step, 39);
  expect_same_bits(*straight.model_, *resumed.model_);
  fs::remove_all(dir);
}

// resume="auto" over a directory whose checkpoints are all damaged: an error that lists
// them, and nothing deleted. Starting fresh used to follow, and its first saves rotated
// the damaged (maybe repairable) checkpoints away. resume="never" still starts over.
TEST(TrainerTest, AllCheckpointsDamagedIsAnErrorNotAFreshStart) {
  fs::path dir = fresh_dir("rt_trainer_damaged");
  auto data = blobs(64, 2);
  TrainerOptions o = quiet({.max_epochs = 2, .batch_size = 16, .checkpoint_dir = dir.string(), .keep_last = 1});
  BlobClassifier first(3);
  Trainer(o).fit(first, data);
  std::vector<std::string> stems = nn::CheckpointManager(dir.string(), 1).list();
  ASSERT_FALSE(stems.empty());
  for (const std::string& stem : stems) std::ofstream(stem + ".json") << "{garbage";
  BlobClassifier second(3);
  // It must not train from scratch over them.
  expect_error([&] { Trainer(o).fit(second, data); }, {"none is valid", "resume=\"never\""});
  for (const std::string& stem : stems) EXPECT_TRUE(fs::exists(stem + ".safetensors")) << stem;
  TrainerOptions fresh = o;
  fresh.resume = "never";
  BlobClassifier third(3);
  EXPECT_EQ(Trainer(fresh).fit(third, data).global_step, 8);
  for (const std::string& stem : stems) EXPECT_TRUE(fs::exists(stem + ".safetensors")) << stem;
  fs::remove_all(dir);
}

// A checkpoint taken k batches into an epoch, resumed with another batch size: "k
// batches" means other samples, so the epoch restarts (nothing skipped) and says so.
TEST(TrainerTest, ResumingWithAnotherBatchSizeRestartsTheEpoch) {
  fs::path dir = fresh_dir("rt_trainer_layout");
  auto data = blobs(160, 5);
  TrainerOptions o = quiet({.max_epochs = 1, .batch_size = 16, .checkpoint_dir = dir.string(),
                            .simulate_signal_at_step = 5});
  BlobClassifier first(3);
  EXPECT_TRUE(Trainer(o).fit(first, data).stopped_early);
  o.simulate_signal_at_step = -1;
  o.batch_size = 32;  // 5 steps of 16 were 80 samples; 5 batches of 32 would skip 160
  BlobClassifier second(3);
  ::testing::internal::CaptureStdout();
  FitResult r = Trainer(o).fit(second, data);
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(out.find("restarts from its first batch"), std::string::npos) << out;
  EXPECT_EQ(r.global_step, 5 + 5);  // the whole epoch again: 160 / 32 batches

  // The same with a data set that grew: the shuffled order of 176 samples is another
  // order, so "5 batches in" would skip samples never seen and repeat others.
  fs::remove_all(dir);
  o.batch_size = 16;
  o.simulate_signal_at_step = 5;
  BlobClassifier third(3);
  EXPECT_TRUE(Trainer(o).fit(third, data).stopped_early);
  o.simulate_signal_at_step = -1;
  BlobClassifier fourth(3);
  ::testing::internal::CaptureStdout();
  r = Trainer(o).fit(fourth, blobs(176, 5));
  const std::string grown = ::testing::internal::GetCapturedStdout();
  EXPECT_NE(grown.find("restarts from its first batch"), std::string::npos) << grown;
  EXPECT_EQ(r.global_step, 5 + 11);  // the whole epoch: 176 / 16 batches
  fs::remove_all(dir);
}

// A data set that counts the examples it was asked for.
class CountingDataset : public data::Dataset {
 public:
  explicit CountingDataset(std::shared_ptr<const data::Dataset> inner) : inner_(std::move(inner)) {}
  int64_t size() const override { return inner_->size(); }
  data::Example get(int64_t i) const override {
    ++examples_read;
    return inner_->get(i);
  }
  data::Batch get_batch(std::span<const int64_t> indices) const override {
    examples_read += static_cast<int64_t>(indices.size());
    return inner_->get_batch(indices);
  }
  mutable std::atomic<int64_t> examples_read{0};

 private:
  std::shared_ptr<const data::Dataset> inner_;
};

// Resumed 5 batches into an epoch, the run reads only the batches it trains on (it used
// to build and throw away the first five), and still ends where an uninterrupted run does.
TEST(TrainerTest, AResumedEpochReadsOnlyTheBatchesItTrainsOn) {
  fs::path dir = fresh_dir("rt_trainer_fast_forward");
  auto data = blobs(160, 5);
  TrainerOptions o = quiet({.max_epochs = 2, .batch_size = 16, .checkpoint_dir = dir.string(),
                            .simulate_signal_at_step = 5});
  BlobClassifier first(3);
  EXPECT_TRUE(Trainer(o).fit(first, data).stopped_early);
  o.simulate_signal_at_step = -1;
  BlobClassifier second(3);
  auto counted = std::make_shared<CountingDataset>(data);
  FitResult r = Trainer(o).fit(second, counted);
  EXPECT_EQ(r.global_step, 20);
  EXPECT_EQ(counted->examples_read.load(), 160 - 5 * 16 + 160) << "epoch 0 from batch 5, then all of epoch 1";
  BlobClassifier straight(3);
  Trainer(quiet({.max_epochs = 2, .batch_size = 16})).fit(straight, data);
  auto ps = straight.model_->parameters(), pr = second.model_->parameters();
  for (size_t i = 0; i < ps.size(); ++i)
    EXPECT_EQ(ps[i].to_vector<float>(), pr[i].to_vector<float>()) << "parameter " << i;
  fs::remove_all(dir);
}

// A classifier whose learning rate follows a cosine over `t_max` epochs.
class CosineClassifier : public BlobClassifier {
 public:
  explicit CosineClassifier(int64_t t_max) : BlobClassifier(4), t_max_(t_max) {}
  Optimizers configure_optimizers(nn::Module& m) override {
    auto sgd = std::make_unique<nn::SGD>(m.parameters(), nn::SGDOptions{.lr = 0.1});
    auto cosine = std::make_unique<nn::CosineAnnealingLR>(*sgd, t_max_);
    return {std::move(sgd), std::move(cosine)};
  }

 private:
  int64_t t_max_;
};

// Resumed with another schedule length, the saved one wins (PyTorch's rule) and the
// Trainer says so, instead of silently training on a curve the user did not ask for.
TEST(TrainerTest, ResumingWithAnotherScheduleWarnsThatTheSavedOneWins) {
  fs::path dir = fresh_dir("rt_trainer_schedule");
  auto data = blobs(64, 5);
  CosineClassifier first(2);
  Trainer(quiet({.max_epochs = 1, .batch_size = 16, .checkpoint_dir = dir.string()})).fit(first, data);
  CosineClassifier second(4);
  ::testing::internal::CaptureStderr();
  FitResult r = Trainer(quiet({.max_epochs = 2, .batch_size = 16, .checkpoint_dir = dir.string()})).fit(second, data);
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_FALSE(r.resumed_from.empty());
  EXPECT_NE(err.find("trainer: warning: lr_scheduler: CosineAnnealingLR t_max"), std::string::npos) << err;
  fs::remove_all(dir);
}

// A signal during start-up (simulated as "after 0 steps"): stop before training,
// nothing to save, no checkpoint written; a later run starts from the beginning.
TEST(TrainerTest, SignalBeforeTheFirstStepStopsWithoutTraining) {
  fs::path dir = fresh_dir("rt_trainer_early");
  BlobClassifier m;
  FitResult r = Trainer(quiet({.max_epochs = 2, .batch_size = 16, .checkpoint_dir = dir.string(),
                               .simulate_signal_at_step = 0}))
                    .fit(m, blobs(64, 1));
  EXPECT_TRUE(r.stopped_early);
  EXPECT_EQ(r.global_step, 0);
  EXPECT_FALSE(nn::CheckpointManager(dir.string()).latest_valid().has_value());
  fs::remove_all(dir);
}

// The train_loss column of a metrics CSV, one entry per epoch row (with its epoch and step).
std::vector<std::string> train_loss_rows(const fs::path& csv) {
  std::ifstream in(csv);
  std::vector<std::string> rows;
  std::string line;
  std::getline(in, line);  // header: epoch,step,train_loss,seconds,lr
  EXPECT_EQ(line.rfind("epoch,step,train_loss,", 0), 0u) << line;
  while (std::getline(in, line)) {
    size_t third = line.find(',', line.find(',') + 1);
    rows.push_back(line.substr(0, line.find(',', third + 1)));  // "epoch,step,train_loss"
  }
  return rows;
}

// The metrics row of an epoch that a walltime signal cut and a resumed run finished
// reports the mean loss over the whole epoch, as an uninterrupted run does. It used to
// be the mean over the batches after the resume only, and 0 when the signal came at the
// epoch's last batch (the resumed epoch then trained none): a jump in the curve at
// every requeue.
TEST(TrainerTest, AnEpochCutByASignalReportsTheWholeEpochsTrainLoss) {
  fs::path dir = fresh_dir("rt_trainer_epoch_loss");
  fs::create_directories(dir);
  auto data = blobs(160, 5);  // 10 steps per epoch
  BlobClassifier straight(7);
  Trainer(quiet({.max_epochs = 2, .batch_size = 16, .metrics_csv = (dir / "straight.csv").string()}))
      .fit(straight, data);
  const std::vector<std::string> expected = train_loss_rows(dir / "straight.csv");
  ASSERT_EQ(expected.size(), 2u);
  for (int64_t stop_at : {6, 10}) {  // inside epoch 0; at its last batch
    SCOPED_TRACE("signal at step " + std::to_string(stop_at));
    const fs::path csv = dir / ("cut" + std::to_string(stop_at) + ".csv");
    const std::string ckpt = (dir / ("ckpt" + std::to_string(stop_at))).string();
    BlobClassifier first(7);
    FitResult cut = Trainer(quiet({.max_epochs = 2, .batch_size = 16, .checkpoint_dir = ckpt,
                                   .metrics_csv = csv.string(), .simulate_signal_at_step = stop_at}))
                        .fit(first, data);
    ASSERT_TRUE(cut.stopped_early);
    BlobClassifier second(7);
    FitResult resumed =
        Trainer(quiet({.max_epochs = 2, .batch_size = 16, .checkpoint_dir = ckpt, .metrics_csv = csv.string()}))
            .fit(second, data);
    EXPECT_FALSE(resumed.resumed_from.empty());
    EXPECT_EQ(train_loss_rows(csv), expected);
  }
  fs::remove_all(dir);
}

// A run that dies without saving (kill -9, a lost node) after its last checkpoint has
// logged the steps and the epoch it trained since. Resumed from that checkpoint, it
// trains them again: the step log and the metrics CSV must end with one row per step
// and per epoch, equal to an uninterrupted run's, not the lost rows and their replays.
TEST(TrainerTest, ACrashAfterTheCheckpointLeavesOneRowPerStepAndEpochInTheLogs) {
  fs::path dir = fresh_dir("rt_trainer_crash_logs");
  fs::create_directories(dir);
  auto data = blobs(160, 5);  // 10 steps per epoch
  auto read = [](const fs::path& path) {
    std::ifstream in(path);
    return std::string(std::istreambuf_iterator<char>(in), {});
  };
  BlobClassifier straight(7);
  Trainer(quiet({.max_epochs = 3, .batch_size = 16, .metrics_csv = (dir / "straight.csv").string(),
                 .step_log_csv = (dir / "straight.log").string()}))
      .fit(straight, data);

  const TrainerOptions crashing = quiet({.max_epochs = 3, .batch_size = 16, .checkpoint_dir = (dir / "ckpt").string(),
                                         .metrics_csv = (dir / "crash.csv").string(),
                                         .step_log_csv = (dir / "crash.log").string()});
  TrainerOptions two_epochs = crashing;
  two_epochs.max_epochs = 2;
  BlobClassifier first(7);
  Trainer(two_epochs).fit(first, data);  // checkpoints at steps 10 and 20
  // The process "died" during epoch 1 after logging it, before its checkpoint was
  // written: the checkpoint of step 20 is not there, the rows of steps 11-20 and
  // epoch 1 are, and the last step-log line was cut short.
  nn::CheckpointManager manager((dir / "ckpt").string());
  const std::string last = *manager.latest_valid();
  ASSERT_NE(last.find("ckpt-0000000020"), std::string::npos) << last;
  for (const char* ext : {".json", ".safetensors"}) fs::remove(last + ext);
  std::ofstream(dir / "crash.log", std::ios::app) << "21,2,0.12";
  BlobClassifier second(7);
  FitResult resumed = Trainer(crashing).fit(second, data);
  ASSERT_NE(resumed.resumed_from.find("ckpt-0000000010"), std::string::npos) << resumed.resumed_from;
  EXPECT_EQ(resumed.global_step, 30);
  EXPECT_EQ(read(dir / "crash.log"), read(dir / "straight.log"));
  EXPECT_EQ(train_loss_rows(dir / "crash.csv"), train_loss_rows(dir / "straight.csv"));
  fs::remove_all(dir);
}

// Inside a SLURM job (SLURM_JOB_ID set) with a fake scontrol that records its arguments.
class InsideASlurmJob {
 public:
  explicit InsideASlurmJob(const fs::path& dir, const char* restart_count = "0") : log_(dir / "scontrol.log") {
    fs::create_directories(dir);
    const fs::path fake = dir / "scontrol";
    std::ofstream(fake) << "#!/bin/sh\necho \"$@\" >> '" << log_.string() << "'\n";
    fs::permissions(fake, fs::perms::owner_all);
    ::setenv("SLURM_JOB_ID", "77", 1);
    ::setenv("SLURM_RESTART_COUNT", restart_count, 1);
    ::setenv("RINGTRAIN_SCONTROL", fake.c_str(), 1);
  }
  ~InsideASlurmJob() {
    ::unsetenv("SLURM_JOB_ID");
    ::unsetenv("SLURM_RESTART_COUNT");
    ::unsetenv("RINGTRAIN_SCONTROL");
  }
  std::string calls() const {
    std::ifstream in(log_);
    return std::string(std::istreambuf_iterator<char>(in), {});
  }

 private:
  fs::path log_;
};

// The walltime signal with no checkpoint_dir: a requeued run would start again from
// step 0 (and be stopped again at its walltime, for as long as the job may be
// requeued), so the job is not requeued; with a checkpoint_dir it is.
TEST(TrainerTest, WithoutACheckpointDirTheWalltimeSignalStopsButDoesNotRequeue) {
  fs::path dir = fresh_dir("rt_trainer_noreq");
  InsideASlurmJob job(dir / "bin");
  BlobClassifier m;
  ::testing::internal::CaptureStdout();
  FitResult r = Trainer(quiet({.max_epochs = 2, .batch_size = 16, .simulate_signal_at_step = 3})).fit(m, blobs(64, 1));
  const std::string out = ::testing::internal::GetCapturedStdout();
  EXPECT_TRUE(r.stopped_early);
  EXPECT_FALSE(r.requeued);
  EXPECT_EQ(r.global_step, 3);
  EXPECT_EQ(job.calls(), "");
  EXPECT_NE(out.find("no checkpoint_dir, so nothing was saved and the job is not requeued"), std::string::npos) << out;

  // the control: the same signal with somewhere to save requeues job 77
  FitResult saved = Trainer(quiet({.max_epochs = 2, .batch_size = 16, .checkpoint_dir = (dir / "ckpt").string(),
                                   .simulate_signal_at_step = 3}))
                        .fit(m, blobs(64, 1));
  EXPECT_TRUE(saved.requeued);
  EXPECT_EQ(job.calls(), "requeue 77\n");
  fs::remove_all(dir);
}

// A signal caught at the last step of the last epoch: the run is finished, so it is
// validated and saved as usual and neither stopped early nor requeued.
TEST(TrainerTest, ASignalAtTheVeryLastStepFinishesTheRun) {
  fs::path dir = fresh_dir("rt_trainer_laststep");
  InsideASlurmJob job(dir / "bin");
  BlobClassifier m;
  FitResult r = Trainer(quiet({.max_epochs = 1, .batch_size = 16, .checkpoint_dir = (dir / "ckpt").string(),
                               .simulate_signal_at_step = 4}))
                    .fit(m, blobs(64, 1), blobs(32, 2));  // 4 steps in all
  EXPECT_FALSE(r.stopped_early);
  EXPECT_FALSE(r.requeued);
  EXPECT_EQ(r.epochs_completed, 1);
  EXPECT_EQ(job.calls(), "");
  EXPECT_TRUE(r.last_validation.count("count")) << "the final validation ran";
  fs::remove_all(dir);
}

// A requeued job that finds nothing to resume from says so (a checkpoint_dir on a
// node-local disk, say) instead of silently starting over.
TEST(TrainerTest, ARequeuedJobWithNothingToResumeFromWarns) {
  fs::path dir = fresh_dir("rt_trainer_restart");
  InsideASlurmJob job(dir / "bin", "2");
  BlobClassifier m;
  ::testing::internal::CaptureStderr();
  Trainer(quiet({.max_epochs = 1, .batch_size = 16, .checkpoint_dir = (dir / "ckpt").string()})).fit(m, blobs(32, 1));
  std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("requeued 2 time(s) (SLURM_RESTART_COUNT)"), std::string::npos) << err;
  EXPECT_NE(err.find("holds no checkpoint"), std::string::npos) << err;
  // resumed: no warning
  ::testing::internal::CaptureStderr();
  Trainer(quiet({.max_epochs = 2, .batch_size = 16, .checkpoint_dir = (dir / "ckpt").string()})).fit(m, blobs(32, 1));
  err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(err.find("SLURM_RESTART_COUNT"), std::string::npos) << err;
  fs::remove_all(dir);
}

// A classifier that records the loss of every training step it computes.
class LossRecordingClassifier : public BlobClassifier {
 public:
  Tensor training_step(const data::Batch& b, StepContext& ctx) override {
    Tensor loss = BlobClassifier::training_step(b, ctx);
    losses.push_back(loss.item());
    return loss;
  }
  Optimizers configure_optimizers(nn::Module& m) override {
    auto sgd = std::make_unique<nn::SGD>(m.parameters(), nn::SGDOptions{.lr = 0.1});
    auto cosine = std::make_unique<nn::CosineAnnealingLR>(*sgd, 3);
    return {std::move(sgd), std::move(cosine)};
  }
  std::vector<double> losses;
};

// The step log is there to show that a resumed run replays an uninterrupted one bit for
// bit (tests/trainer/requeue_replay.sh compares two with cmp), and the metrics CSV is
// read back as numbers. Both held 6 significant digits (0.912345 for 0.91234567...), so
// runs that differed below that compared equal. Each value now reads back exactly, as
// Lightning's CSVLogger (Python's repr) writes it.
TEST(TrainerTest, TheLogsHoldLossesAndLearningRatesExactly) {
  fs::path dir = fresh_dir("rt_trainer_exact_logs");
  fs::create_directories(dir);
  LossRecordingClassifier m;
  Trainer(quiet({.max_epochs = 3, .batch_size = 16, .metrics_csv = (dir / "m.csv").string(),
                 .step_log_csv = (dir / "s.csv").string()}))
      .fit(m, blobs(64, 1));  // 4 steps per epoch
  ASSERT_EQ(m.losses.size(), 12u);
  auto column = [](const std::string& line, int index) {
    size_t start = 0;
    for (int i = 0; i < index; ++i) start = line.find(',', start) + 1;
    return std::stod(line.substr(start, line.find(',', start) - start));
  };
  std::ifstream steps(dir / "s.csv");
  std::vector<double> logged;
  for (std::string line; std::getline(steps, line);) logged.push_back(column(line, 2));
  EXPECT_EQ(logged, m.losses);

  std::ifstream metrics(dir / "m.csv");
  std::string line;
  std::getline(metrics, line);  // header: epoch,step,train_loss,seconds,lr
  nn::SGD sgd({Tensor::from_vector<float>({0}, {1})}, nn::SGDOptions{.lr = 0.1});
  nn::CosineAnnealingLR cosine(sgd, 3);
  for (int epoch = 0; epoch < 3; ++epoch) {
    ASSERT_TRUE(std::getline(metrics, line)) << "epoch " << epoch;
    double sum = 0;
    for (int i = 0; i < 4; ++i) sum += m.losses[4 * epoch + i];
    EXPECT_EQ(column(line, 2), sum / 4) << line;
    EXPECT_EQ(column(line, 4), sgd.param_groups().front().lr()) << line;
    cosine.step();
  }
  fs::remove_all(dir);
}

// A training_step that returns no loss (Lightning's "return None" to skip a batch) was
// reported by the loss scaler ("LossScaler::scale: the loss must be a floating-point
// tensor, got an undefined tensor"): neither where it came from nor what to do.
TEST(TrainerTest, ATrainingStepWithoutALossIsNamedWithTheFix) {
  struct NoLoss : BlobClassifier {
    Tensor training_step(const data::Batch& b, StepContext& ctx) override {
      ctx.forward(b.inputs);
      return Tensor();
    }
  };
  for (const char* precision : {"32", "16-mixed"}) {
    NoLoss m;
    expect_error([&] { Trainer(quiet({.precision = precision, .max_epochs = 1, .batch_size = 16})).fit(m, blobs(32, 1)); },
                 {"training_step returned an undefined Tensor (epoch 0, batch 0)", "return the batch's loss",
                  "Lightning's None) is not supported", "return a zero loss"});
  }
}

// resume= names a checkpoint, and checkpoint_dir is required with it; but a name as the
// directory lists it ("ckpt-0000000004") was looked for in the working directory only:
// "ckpt-0000000004.json: checkpoint record not found". It is found in checkpoint_dir now;
// a path still works, and a name found nowhere says where it looked.
TEST(TrainerTest, ResumeNamesACheckpointInTheCheckpointDir) {
  fs::path dir = fresh_dir("rt_trainer_resume_name");
  auto data = blobs(64, 1);  // 4 steps per epoch
  BlobClassifier first;
  Trainer(quiet({.max_epochs = 2, .batch_size = 16, .checkpoint_dir = dir.string()})).fit(first, data);
  const fs::path at_4 = dir / "ckpt-0000000004";
  ASSERT_TRUE(fs::exists(at_4.string() + ".json"));
  for (const std::string& resume : {std::string("ckpt-0000000004"), std::string("ckpt-0000000004.json"), at_4.string()}) {
    SCOPED_TRACE(resume);
    BlobClassifier again;
    TrainerOptions o = quiet({.max_epochs = 2, .batch_size = 16, .checkpoint_dir = dir.string(), .keep_last = 10});
    o.resume = resume;
    FitResult r = Trainer(o).fit(again, data);
    EXPECT_EQ(r.resumed_from, at_4.string());
    EXPECT_EQ(r.global_step, 8);  // epoch 1 trained again from step 4
  }
  BlobClassifier missing;
  TrainerOptions o = quiet({.max_epochs = 2, .batch_size = 16, .checkpoint_dir = dir.string()});
  o.resume = "ckpt-0000000099";
  expect_error([&] { Trainer(o).fit(missing, data); },
               {"resume='ckpt-0000000099': no checkpoint record at ckpt-0000000099.json nor at " +
                    (dir / "ckpt-0000000099").string() + ".json",
                "the name of one in checkpoint_dir"});
  fs::remove_all(dir);
}

// Task 1 of `srun -N1 --ntasks-per-node=2 --gpus-per-task=1`, set for the scope (the
// outside_slurm.h guard cleared the real job's variables).
class AnSrunTaskWithItsOwnGpu {
 public:
  AnSrunTaskWithItsOwnGpu() {
    for (const auto& [name, value] : kVars) ::setenv(name, value, 1);
  }
  ~AnSrunTaskWithItsOwnGpu() {
    for (const auto& [name, value] : kVars) ::unsetenv(name);
  }

 private:
  static constexpr std::pair<const char*, const char*> kVars[] = {
      {"SLURM_JOB_ID", "78"},          {"SLURM_JOB_NODELIST", "gpu1"}, {"SLURM_NNODES", "1"},
      {"SLURM_NTASKS", "2"},           {"SLURM_TASKS_PER_NODE", "2"},  {"SLURM_STEP_ID", "0"},
      {"SLURM_PROCID", "1"},           {"SLURM_LOCALID", "1"},         {"SLURM_NODEID", "0"},
      {"SLURM_GPUS_PER_TASK", "1"}};
};

// Lightning's devices=N is the node's GPU count; under srun --gpus-per-task a process
// sees only its own GPUs, so such a count cannot be met: the error says what to write
// (before rendezvous: nothing waits for the other task). 64: more than any machine
// running this has, so the count fails there too.
TEST(TrainerTest, DevicesBeyondATasksOwnGpusSayWhatToWriteUnderGpusPerTask) {
  AnSrunTaskWithItsOwnGpu task;
  BlobClassifier m;
  TrainerOptions o = quiet({.strategy = "ddp", .max_epochs = 1});
  o.devices = "64";
  expect_error([&] { Trainer(o).fit(m, blobs(32, 1)); },
               {"devices=64 asks for 64 GPUs", "srun --gpus-per-task=1 gave this task 1 GPU(s) of its own",
                "write devices=auto"});
}

}  // namespace
}  // namespace ringtrain::trainer

// checkpoint_resume_test.cc: checkpoints of model + optimizer + LR schedule +
// RNG + epoch/step.
//
// The central claim: training N epochs straight and training k epochs, saving,
// throwing every object away, building fresh ones (with different random
// initial weights) and resuming from the checkpoint give bitwise identical
// parameters (float32, CPU). The net uses dropout from a seeded Generator and a
// shuffling DataLoader, so the RNG state and the epoch must both be restored for
// that to hold. Then: keep-last-K, newest-valid selection past corrupt files,
// clear errors for truncated/corrupt/foreign checkpoints, and that a failed load
// changes nothing.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>

#include <nlohmann/json.hpp>

#include "autograd/functions.h"
#include "nn/checkpoint.h"
#include "nn/data/dataloader.h"
#include "nn/lr_scheduler.h"
#include "nn/optim.h"
#include "tensor/ops.h"

namespace ringtrain::nn {
namespace {

namespace fs = std::filesystem;
using data::Batch;
using data::DataLoader;
using data::TensorDataset;

// in -> hidden -> classes with ReLU and dropout; weights from `init`.
class TinyNet : public Cloneable<TinyNet> {
 public:
  TinyNet(int64_t in, int64_t hidden, int64_t classes, Generator& init, Generator* dropout_gen,
          bool extra_param = false)
      : Cloneable<TinyNet>("TinyNet"), dropout_gen_(dropout_gen) {
    w1_ = register_parameter("w1", mul(randn({hidden, in}, init), 0.3));
    b1_ = register_parameter("b1", zeros({hidden}));
    w2_ = register_parameter("w2", mul(randn({classes, hidden}, init), 0.3));
    b2_ = register_parameter("b2", zeros({classes}));
    if (extra_param) register_parameter("scale", ones({1}));
  }
  Tensor forward(const Tensor& x) override {
    Tensor h = ag::relu(ag::linear(x, param(w1_), param(b1_)));
    if (dropout_gen_ != nullptr) h = ag::dropout(h, 0.2, is_training(), *dropout_gen_);
    return ag::linear(h, param(w2_), param(b2_));
  }

 private:
  ParamSlot w1_, b1_, w2_, b2_;
  Generator* dropout_gen_;
};

std::shared_ptr<TensorDataset> blobs(int64_t n = 96) {
  Generator g(123);
  Tensor x = randn({n, 8}, g);
  std::vector<float> xv = x.to_vector<float>();
  std::vector<int64_t> y(n);
  for (int64_t i = 0; i < n; ++i) {
    y[i] = i % 3;
    xv[i * 8 + y[i]] += 2.5f;  // class i%3 shifts feature i%3
  }
  return std::make_shared<TensorDataset>(Tensor::from_vector(xv, {n, 8}), Tensor::from_vector(y, {n}));
}

// Everything one run owns. Different `init_seed`s give different starting weights.
struct TrainingRun {
  Generator init;
  Generator dropout;
  std::shared_ptr<TinyNet> model;
  std::unique_ptr<Optimizer> opt;
  std::unique_ptr<LRScheduler> sched;
  DataLoader loader;
  int64_t step = 0;

  TrainingRun(uint64_t init_seed, bool adam)
      : init(init_seed),
        dropout(999),
        model(std::make_shared<TinyNet>(8, 16, 3, init, &dropout)),
        loader(blobs(), {.batch_size = 16, .shuffle = true, .seed = 77, .prefetch = 2}) {
    if (adam) {
      opt = std::make_unique<Adam>(model->parameters(), AdamOptions{.lr = 0.01, .weight_decay = 1e-4});
    } else {
      opt = std::make_unique<SGD>(model->parameters(),
                                  SGDOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-4, .nesterov = true});
    }
    sched = std::make_unique<StepLR>(*opt, 2, 0.5);
  }
  CheckpointTargets targets() {
    return {.model = model.get(), .optimizer = opt.get(), .scheduler = sched.get(), .generator = &dropout};
  }

  void train_epoch() {
    model->train();
    for (Batch& b : loader.epoch()) {
      opt->zero_grad();
      Tensor loss = ag::cross_entropy((*model)(b.inputs), b.targets);
      autograd::backward(loss);
      opt->step();
      ++step;
    }
    sched->step();
  }
};

std::vector<uint32_t> bits(const Tensor& t) {
  std::vector<float> v = t.to_vector<float>();
  std::vector<uint32_t> out(v.size());
  std::memcpy(out.data(), v.data(), v.size() * 4);
  return out;
}

void expect_bitwise_equal(Module& a, Module& b) {
  auto pa = a.named_parameters(), pb = b.named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    EXPECT_EQ(pa[i].first, pb[i].first);
    EXPECT_EQ(bits(pa[i].second), bits(pb[i].second)) << "parameter " << pa[i].first << " differs";
  }
}

class CheckpointTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("ringtrain_ckpt_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string save_checkpoint_stem() {
    fs::create_directories(dir_);
    return (dir_ / "single").string();
  }
  fs::path dir_;
};

// A record as a person editing it on purpose (or a build from before the record had
// its own checksum) leaves it: without "record_crc32", so it is read unchecked.
std::string without_record_crc(nlohmann::json record) {
  record.erase("record_crc32");
  return record.dump();
}

void resume_matches_uninterrupted(const fs::path& dir, bool adam) {
  const int total = 5, stop_at = 2;
  TrainingRun straight(1, adam);
  for (int e = 0; e < total; ++e) straight.train_epoch();

  CheckpointManager mgr(dir.string(), 2);
  {
    TrainingRun first(1, adam);
    for (int e = 0; e < stop_at; ++e) first.train_epoch();
    mgr.save(first.targets(), {stop_at, first.step}, {{"note", "half way"}});
  }  // everything of the first half is gone

  TrainingRun resumed(42, adam);  // other initial weights: the checkpoint must overwrite all of them
  std::optional<CheckpointInfo> info = mgr.restore_latest(resumed.targets());
  ASSERT_TRUE(info.has_value());
  EXPECT_EQ(info->progress.epoch, stop_at);
  EXPECT_EQ(info->extra["note"], "half way");
  resumed.step = info->progress.step;
  resumed.loader.set_epoch(info->progress.epoch);
  for (int e = stop_at; e < total; ++e) resumed.train_epoch();

  expect_bitwise_equal(*straight.model, *resumed.model);
  EXPECT_EQ(straight.step, resumed.step);
  EXPECT_EQ(straight.opt->param_groups()[0].lr(), resumed.opt->param_groups()[0].lr());
  EXPECT_EQ(straight.dropout.offset(), resumed.dropout.offset());
  // And it did train: the straight run is not at its initial weights.
  Generator g(1), d(999);
  TinyNet fresh(8, 16, 3, g, &d);
  EXPECT_NE(bits(fresh.named_parameters()[0].second), bits(straight.model->named_parameters()[0].second));
}

TEST_F(CheckpointTest, ResumeIsBitwiseIdenticalSgdNesterov) { resume_matches_uninterrupted(dir_, false); }
TEST_F(CheckpointTest, ResumeIsBitwiseIdenticalAdam) { resume_matches_uninterrupted(dir_, true); }

TEST_F(CheckpointTest, WithoutRestoringTheRngTheRunDiverges) {
  // Guards the test above against passing vacuously: skipping the generator breaks it.
  TrainingRun straight(1, false);
  for (int e = 0; e < 3; ++e) straight.train_epoch();
  CheckpointManager mgr(dir_.string(), 1);
  {
    TrainingRun first(1, false);
    first.train_epoch();
    mgr.save(first.targets(), {1, first.step});
  }
  TrainingRun resumed(1, false);
  CheckpointTargets t = resumed.targets();
  t.generator = nullptr;
  load_checkpoint(*mgr.latest_valid(), t);
  resumed.loader.set_epoch(1);
  for (int e = 1; e < 3; ++e) resumed.train_epoch();
  EXPECT_NE(bits(straight.model->named_parameters()[0].second),
            bits(resumed.model->named_parameters()[0].second));
}

TEST_F(CheckpointTest, KeepsTheLastK) {
  TrainingRun run(1, false);
  CheckpointManager mgr(dir_.string(), 3, "model");
  for (int64_t s : {10, 20, 30, 40, 50}) mgr.save(run.targets(), {0, s});
  std::vector<std::string> stems = mgr.list();
  ASSERT_EQ(stems.size(), 3u);
  EXPECT_EQ(fs::path(stems[0]).filename(), "model-0000000030");
  EXPECT_EQ(fs::path(stems[2]).filename(), "model-0000000050");
  EXPECT_FALSE(fs::exists(dir_ / "model-0000000010.safetensors"));
  EXPECT_FALSE(fs::exists(dir_ / "model-0000000020.json"));
  int files = 0;
  for (auto& e : fs::directory_iterator(dir_)) files += e.is_regular_file();
  EXPECT_EQ(files, 6);  // 3 x (.json + .safetensors), no temporaries left behind
  EXPECT_EQ(*mgr.latest_valid(), stems[2]);
  EXPECT_THROW(CheckpointManager(dir_.string(), 0), Error);
}

void flip_byte(const fs::path& p, size_t from_end) {
  std::fstream f(p, std::ios::in | std::ios::out | std::ios::binary);
  f.seekg(-static_cast<std::streamoff>(from_end), std::ios::end);
  char c;
  f.get(c);
  f.seekp(-static_cast<std::streamoff>(from_end), std::ios::end);
  f.put(static_cast<char>(c ^ 0x5a));
}

template <typename Fn>
void expect_ckpt_error(Fn&& fn, const std::vector<std::string>& needles) {
  try {
    fn();
    ADD_FAILURE() << "expected a CheckpointError";
  } catch (const CheckpointError& e) {
    for (const std::string& n : needles) {
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << "'" << n << "' not in: " << e.what();
    }
  }
}

TEST_F(CheckpointTest, CorruptAndTruncatedCheckpointsAreRejectedAndSkipped) {
  TrainingRun run(1, false);
  CheckpointManager mgr(dir_.string(), 5);
  mgr.save(run.targets(), {0, 1});
  run.train_epoch();
  std::string s2 = mgr.save(run.targets(), {1, 2});
  std::string s3 = mgr.save(run.targets(), {1, 3});

  flip_byte(s3 + ".safetensors", 10);  // a bit flip in the tensor data
  expect_ckpt_error([&] { read_checkpoint_info(s3); }, {s3 + ".safetensors", "corrupt"});
  fs::resize_file(s2 + ".safetensors", fs::file_size(s2 + ".safetensors") - 7);
  expect_ckpt_error([&] { read_checkpoint_info(s2); }, {s2 + ".safetensors", "truncated"});

  std::vector<std::string> skipped;
  std::optional<std::string> latest = mgr.latest_valid(&skipped);
  ASSERT_TRUE(latest.has_value());
  EXPECT_EQ(fs::path(*latest).filename(), "ckpt-0000000001");
  EXPECT_EQ(skipped.size(), 2u);

  // A failed load of a corrupt checkpoint changes nothing.
  auto before = bits(run.model->named_parameters()[0].second);
  expect_ckpt_error([&] { load_checkpoint(s3, run.targets()); }, {"corrupt"});
  EXPECT_EQ(before, bits(run.model->named_parameters()[0].second));

  std::ofstream(s3 + ".json") << "{\"format\": \"ringtrain-checkpoint\", \"version\": 1,";
  expect_ckpt_error([&] { read_checkpoint_info(s3); }, {s3 + ".json", "malformed JSON"});
  fs::remove(s2 + ".safetensors");
  expect_ckpt_error([&] { read_checkpoint_info(s2); }, {s2 + ".safetensors", "not found"});
  expect_ckpt_error([&] { read_checkpoint_info((dir_ / "nothing").string()); }, {"nothing.json", "not found"});
}

// The tensors' CRC does not cover the JSON record. A damaged digit there (step 13 read as
// 93, a generator offset, the batch to resume at) still parses, and the checkpoint used to
// load with it silently; the record now carries its own CRC-32.
TEST_F(CheckpointTest, ADamagedDigitInTheRecordIsCaughtByItsOwnChecksum) {
  TrainingRun run(1, false);
  run.train_epoch();
  CheckpointManager mgr(dir_.string(), 5);
  const std::string good = mgr.save(run.targets(), {1, 13}, {{"batches_into_epoch", 0}});
  run.train_epoch();
  const std::string damaged = mgr.save(run.targets(), {2, 26}, {{"batches_into_epoch", 0}});
  std::ifstream in(damaged + ".json");
  std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  in.close();
  const size_t at = text.find("\n  \"step\": 26");  // the record's own step (indent 2), not an optimizer's
  ASSERT_NE(at, std::string::npos) << text;
  text[at + 11] = '9';  // "step": 96, still valid JSON
  std::ofstream(damaged + ".json") << text;

  expect_ckpt_error([&] { read_checkpoint_info(damaged); },
                    {damaged + ".json", "corrupt", "do not match its CRC-32"});
  TrainingRun other(7, false);
  auto before = bits(other.model->named_parameters()[0].second);
  expect_ckpt_error([&] { load_checkpoint(damaged, other.targets()); }, {"corrupt"});
  EXPECT_EQ(before, bits(other.model->named_parameters()[0].second));
  std::vector<std::string> skipped;
  EXPECT_EQ(mgr.latest_valid(&skipped), good);  // the damaged one is skipped, and named
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_NE(skipped[0].find(damaged + ".json"), std::string::npos) << skipped[0];
  // An edit on purpose loads once the checksum line is deleted (as a record of an older build).
  std::ofstream(damaged + ".json") << without_record_crc(nlohmann::json::parse(text));
  EXPECT_EQ(load_checkpoint(damaged, other.targets()).progress.step, 96);
}

// Rotation neither deletes nor counts a damaged checkpoint: with keep_last = 1, a bad
// newest record once pushed out the last good checkpoint (and then the damaged one
// went too), leaving nothing to resume from.
TEST_F(CheckpointTest, PruningLeavesDamagedCheckpointsAloneAndKeepsKGoodOnes) {
  TrainingRun run(1, false);
  CheckpointManager mgr(dir_.string(), 1);
  std::string s1 = mgr.save(run.targets(), {0, 1});
  std::string s2 = mgr.save(run.targets(), {0, 2});
  std::ofstream(s2 + ".json") << "{garbage";                      // a bad record, tensors intact
  std::string s3 = mgr.save(run.targets(), {0, 3});
  fs::resize_file(s3 + ".safetensors", 1000);                     // a truncated tensor file
  std::string s4 = mgr.save(run.targets(), {0, 4});
  std::string s5 = mgr.save(run.targets(), {0, 5});
  EXPECT_FALSE(fs::exists(s1 + ".json")) << "a good checkpoint beyond keep_last stays";
  EXPECT_FALSE(fs::exists(s4 + ".json")) << "a good checkpoint beyond keep_last stays";
  // A record of another format version, its tensors intact: this build cannot load it,
  // so it must not count toward keep_last either (s6 is kept beside it, not instead).
  nlohmann::json record = nlohmann::json::parse(std::ifstream(s5 + ".json"));
  record["version"] = 999;
  std::ofstream(s5 + ".json") << without_record_crc(record);
  std::string s6 = mgr.save(run.targets(), {0, 6});
  EXPECT_TRUE(fs::exists(s6 + ".json"));
  for (const std::string& damaged : {s2, s3, s5}) {
    EXPECT_TRUE(fs::exists(damaged + ".json")) << damaged << " was deleted";
    EXPECT_TRUE(fs::exists(damaged + ".safetensors")) << damaged << " was deleted";
  }
  EXPECT_EQ(*mgr.latest_valid(), s6);
}

// Where resume=auto / --resume starts: the newest valid checkpoint; nothing in an empty
// directory; and a refusal naming every damaged checkpoint when none is valid.
TEST_F(CheckpointTest, ResumePointRefusesToStartOverDamagedCheckpoints) {
  TrainingRun run(1, false);
  CheckpointManager mgr(dir_.string(), 5);
  EXPECT_FALSE(mgr.resume_point("start fresh").has_value());
  std::string s1 = mgr.save(run.targets(), {0, 1});
  std::string s2 = mgr.save(run.targets(), {0, 2});
  std::ofstream(s2 + ".json") << "{garbage";
  std::vector<std::string> skipped;
  EXPECT_EQ(mgr.resume_point("start fresh", &skipped), s1);
  ASSERT_EQ(skipped.size(), 1u);
  EXPECT_NE(skipped[0].find(s2 + ".json"), std::string::npos) << skipped[0];
  flip_byte(s1 + ".safetensors", 10);
  skipped.clear();
  expect_ckpt_error([&] { mgr.resume_point("drop --resume to start fresh", &skipped); },
                    {dir_.string(), "2 checkpoint(s) and none is valid", "nothing was deleted",
                     "drop --resume to start fresh", s1 + ".safetensors", "corrupt", s2 + ".json"});
  EXPECT_EQ(skipped.size(), 2u);
  EXPECT_EQ(mgr.list().size(), 2u);
}

TEST_F(CheckpointTest, DifferentModelListsEveryMismatchAndLoadsNothing) {
  TrainingRun run(1, false);
  run.train_epoch();
  std::string stem = save_checkpoint_stem();
  save_checkpoint(stem, run.targets(), {1, run.step});

  Generator g(5), d(5);
  TinyNet other(8, 32, 3, g, &d, /*extra_param=*/true);  // hidden 32 instead of 16, plus "scale"
  SGD opt(other.parameters(), {.lr = 0.1, .momentum = 0.9});
  auto w_before = bits(other.named_parameters()[0].second);
  expect_ckpt_error([&] { load_checkpoint(stem, {.model = &other, .optimizer = &opt}); },
                    {"nothing was loaded", "missing from the checkpoint: scale",
                     "shape mismatch: w1 (checkpoint [16, 8], model [32, 8])", "b1", "w2",
                     "param group 0 has 4 parameters in the checkpoint, 5 here"});
  EXPECT_EQ(w_before, bits(other.named_parameters()[0].second));
  for (const Tensor& p : other.parameters()) EXPECT_FALSE(autograd::grad(p).defined());
}

TEST_F(CheckpointTest, OptimizerTypeMismatchLeavesTheModelAlone) {
  TrainingRun sgd_run(1, false);
  sgd_run.train_epoch();
  std::string stem = save_checkpoint_stem();
  save_checkpoint(stem, sgd_run.targets(), {1, sgd_run.step});

  TrainingRun adam_run(7, true);  // same model shape, different optimizer type
  auto before = bits(adam_run.model->named_parameters()[2].second);
  expect_ckpt_error([&] { load_checkpoint(stem, adam_run.targets()); },
                    {"optimizer: checkpoint has \"SGD\", this run uses Adam"});
  EXPECT_EQ(before, bits(adam_run.model->named_parameters()[2].second));
  // Loading only the model from it works.
  load_checkpoint(stem, {.model = adam_run.model.get()});
  expect_bitwise_equal(*sgd_run.model, *adam_run.model);
}

TEST_F(CheckpointTest, AskingForStateTheCheckpointLacksIsAnError) {
  TrainingRun run(1, false);
  std::string stem = save_checkpoint_stem();
  save_checkpoint(stem, {.model = run.model.get()}, {0, 0});
  expect_ckpt_error([&] { load_checkpoint(stem, run.targets()); },
                    {"no optimizer state", "no LR schedule state", "no generator state"});
}

TEST_F(CheckpointTest, CrashBetweenTensorsAndRecordLeavesThePreviousCheckpoint) {
  // save_checkpoint writes the tensors, then the JSON record. A crash in between leaves
  // a .safetensors without a record: it is not a checkpoint, and the next prune removes it.
  TrainingRun run(1, false);
  CheckpointManager mgr(dir_.string(), 2);
  std::string s1 = mgr.save(run.targets(), {1, 10});
  fs::copy_file(s1 + ".safetensors", dir_ / "ckpt-0000000015.safetensors");  // the "crashed" save
  EXPECT_EQ(mgr.list().size(), 1u);
  EXPECT_EQ(*mgr.latest_valid(), s1);
  mgr.save(run.targets(), {2, 20});
  mgr.save(run.targets(), {3, 30});  // keeps 20 and 30; 10 and the orphan at 15 go
  EXPECT_FALSE(fs::exists(dir_ / "ckpt-0000000015.safetensors"));
  EXPECT_FALSE(fs::exists(s1 + ".json"));
  EXPECT_EQ(mgr.list().size(), 2u);
}

// A second save at a step that already has a checkpoint used to write over it (tensors
// renamed first, record second): a crash between the two left a record whose CRC no
// longer matched, and with keep_last=1 no valid checkpoint at all. The crash is
// simulated by taking the record's temporary path, so its write fails.
TEST_F(CheckpointTest, ASecondSaveAtTheSameStepNeverWritesOverTheFirst) {
  TrainingRun run(1, false);
  CheckpointManager mgr(dir_.string(), 1);
  std::string first = mgr.save(run.targets(), {0, 13}, {{"batches_into_epoch", 13}});
  EXPECT_EQ(fs::path(first).filename(), "ckpt-0000000013");

  const std::string pid = std::to_string(::getpid());
  for (const char* stem : {"ckpt-0000000013", "ckpt-0000000013-1"})
    fs::create_directories(dir_ / ("." + std::string(stem) + ".json.tmp." + pid));
  EXPECT_THROW(mgr.save(run.targets(), {1, 13}), Error);
  for (const char* stem : {"ckpt-0000000013", "ckpt-0000000013-1"})
    fs::remove_all(dir_ / ("." + std::string(stem) + ".json.tmp." + pid));
  std::optional<std::string> latest = mgr.latest_valid();
  ASSERT_TRUE(latest.has_value()) << "the crashed second save destroyed the only checkpoint";
  EXPECT_EQ(*latest, first);
  EXPECT_EQ(read_checkpoint_info(first).progress.epoch, 0);

  // Done again without the crash: a new name, and the newest (saved last); keep_last=1 drops the first.
  std::string second = mgr.save(run.targets(), {1, 13});
  EXPECT_EQ(fs::path(second).filename(), "ckpt-0000000013-1");
  std::string third = mgr.save(run.targets(), {2, 13});
  EXPECT_EQ(fs::path(third).filename(), "ckpt-0000000013-2");
  EXPECT_EQ(mgr.list(), std::vector<std::string>{third});
  EXPECT_EQ(read_checkpoint_info(*mgr.latest_valid()).progress.epoch, 2);
  std::string later = mgr.save(run.targets(), {2, 14});
  EXPECT_EQ(mgr.list(), std::vector<std::string>{later});  // -<n> orders below the next step
}

// A save at an older step (a run resumed from an earlier checkpoint by name) was deleted
// right after it was written when pruning kept the newest keep_last by step.
TEST_F(CheckpointTest, PruningNeverDeletesTheCheckpointJustWritten) {
  TrainingRun run(1, false);
  CheckpointManager mgr(dir_.string(), 1);
  mgr.save(run.targets(), {5, 50});
  std::string older = mgr.save(run.targets(), {2, 20});
  EXPECT_NO_THROW(read_checkpoint_info(older));
}

// "Newest" is the order of saving, not the step. A run resumed from an earlier checkpoint
// (or started over in a directory of higher-step checkpoints) used to lose its own
// checkpoints at every save, keep the abandoned run's higher-step ones, and make the next
// automatic resume (a SLURM requeue) go back to the abandoned run.
TEST_F(CheckpointTest, TheNewestCheckpointsAreTheLastSavedWhateverTheirSteps) {
  TrainingRun run(1, false);
  CheckpointManager mgr(dir_.string(), 3);
  for (int64_t s : {360, 450, 540}) mgr.save(run.targets(), {0, s});  // the first run
  // A second run resumed from 360 saves at 405, 450 (taken: 450-1) and 495.
  const std::string s405 = mgr.save(run.targets(), {1, 405});
  EXPECT_EQ(*mgr.latest_valid(), s405);
  const std::string s450 = mgr.save(run.targets(), {1, 450});
  EXPECT_EQ(fs::path(s450).filename(), "ckpt-0000000450-1");
  const std::string s495 = mgr.save(run.targets(), {1, 495});
  EXPECT_EQ(mgr.list(), (std::vector<std::string>{s405, s450, s495}));  // the first run's are gone
  EXPECT_EQ(*mgr.latest_valid(), s495);
  EXPECT_EQ(read_checkpoint_info(s495).metadata["save_sequence"], 6);
  // A record without a save sequence (written before it existed) counts as oldest.
  nlohmann::json legacy = read_checkpoint_info(s405).metadata;
  legacy.erase("save_sequence");
  std::ofstream(s405 + ".json") << without_record_crc(legacy);
  EXPECT_EQ(mgr.list(), (std::vector<std::string>{s405, s450, s495}));
  const std::string s10 = mgr.save(run.targets(), {2, 10});  // starting over: step 10 is newest
  EXPECT_EQ(mgr.list(), (std::vector<std::string>{s450, s495, s10}));
  EXPECT_EQ(*mgr.latest_valid(), s10);
}

TEST_F(CheckpointTest, ExtraNamedGeneratorsAreRestored) {
  TrainingRun run(1, false);
  Generator a(5), b(6);
  Tensor t = zeros({10});
  uniform_(t, 0, 1, a);  // advance a
  std::string stem = save_checkpoint_stem();
  CheckpointTargets targets = run.targets();
  targets.extra_generators = {{"augment", &a}, {"dropout2", &b}};
  save_checkpoint(stem, targets, {0, 0});
  const uint64_t a_offset = a.offset();
  EXPECT_GT(a_offset, 0u);
  a.manual_seed(77);
  b.manual_seed(78);
  load_checkpoint(stem, targets);
  EXPECT_EQ(a.seed(), 5u);
  EXPECT_EQ(a.offset(), a_offset);
  EXPECT_EQ(b.seed(), 6u);
  Generator c(9);
  targets.extra_generators.emplace_back("missing", &c);
  expect_ckpt_error([&] { load_checkpoint(stem, targets); }, {"no state for generator 'missing'"});
  EXPECT_EQ(c.seed(), 9u);
}

// A record whose fields have other types (hand-edited, foreign, a future format) is
// a damaged checkpoint like any other: skipped when choosing where to resume, left
// alone by rotation, and never a bare json type_error out of save() or resume.
TEST_F(CheckpointTest, RecordsWithFieldsOfOtherTypesAreSkippedNotThrown) {
  TrainingRun run(1, false);
  CheckpointManager mgr(dir_.string(), 1);
  std::string s1 = mgr.save(run.targets(), {0, 1});
  const std::string odd_version = (dir_ / "ckpt-0000000098").string();
  const std::string odd_format = (dir_ / "ckpt-0000000099").string();
  std::ofstream(odd_version + ".json") << R"({"format": "ringtrain-checkpoint", "version": "1"})";
  std::ofstream(odd_format + ".json") << R"({"format": 1, "version": 1})";
  expect_ckpt_error([&] { read_checkpoint_info(odd_version); }, {odd_version + ".json", "version"});
  expect_ckpt_error([&] { read_checkpoint_info(odd_format); }, {odd_format + ".json", "format"});
  std::string s2 = mgr.save(run.targets(), {0, 2});  // prunes: must step over both records
  EXPECT_EQ(mgr.latest_valid(), s2);
  EXPECT_TRUE(fs::exists(odd_version + ".json") && fs::exists(odd_format + ".json"));
  EXPECT_FALSE(fs::exists(s1 + ".json")) << "keep_last = 1";
  // with s2 gone only the odd ones are left: none valid, each named
  fs::remove(s2 + ".json");
  std::vector<std::string> skipped;
  EXPECT_FALSE(mgr.latest_valid(&skipped).has_value());
  EXPECT_EQ(skipped.size(), 2u);
  expect_ckpt_error([&] { mgr.resume_point("start fresh"); },
                    {"none is valid", "ckpt-0000000098.json", "ckpt-0000000099.json"});
}

// A generator state that is not two unsigned integers is found while planning the
// load, which then changes nothing (it used to set the first generator and then throw
// a json type_error at the second, "rolled back" but with the first one changed).
TEST_F(CheckpointTest, AGeneratorStateOfAnotherTypeIsRefusedAndChangesNothing) {
  TrainingRun run(1, false);
  Generator a(5);
  std::string stem = save_checkpoint_stem();
  CheckpointTargets targets = run.targets();
  targets.extra_generators = {{"augment", &a}};
  save_checkpoint(stem, targets, {0, 0});
  nlohmann::json record = nlohmann::json::parse(std::ifstream(stem + ".json"));
  record["rng_extra"]["augment"]["seed"] = "five";
  std::ofstream(stem + ".json") << without_record_crc(record);
  run.dropout.manual_seed(1234);
  a.manual_seed(4321);
  auto before = bits(run.model->named_parameters()[0].second);
  expect_ckpt_error([&] { load_checkpoint(stem, targets); }, {"no state for generator 'augment'", "nothing was loaded"});
  EXPECT_EQ(run.dropout.seed(), 1234u);
  EXPECT_EQ(a.seed(), 4321u);
  EXPECT_EQ(before, bits(run.model->named_parameters()[0].second));
}

// An optimizer record that is not an object, or whose "type" is not a string (a
// hand-edited record, read unchecked without its CRC), is a problem the plan lists,
// naming the checkpoint, with nothing loaded: json's value() threw a bare type_error
// ("cannot use value() with string") out of load_checkpoint, naming neither.
TEST_F(CheckpointTest, AnOptimizerRecordOfAnotherTypeIsRefusedAndChangesNothing) {
  TrainingRun run(1, false);
  run.train_epoch();
  std::string stem = save_checkpoint_stem();
  save_checkpoint(stem, run.targets(), {1, run.step});
  const nlohmann::json saved = nlohmann::json::parse(std::ifstream(stem + ".json"));
  TrainingRun other(7, false);
  auto before = bits(other.model->named_parameters()[0].second);
  for (const nlohmann::json& bad : {nlohmann::json("SGD"), nlohmann::json::array({1, 2}), nlohmann::json(5)}) {
    nlohmann::json record = saved;
    record["optimizer"] = bad;
    std::ofstream(stem + ".json") << without_record_crc(record);
    expect_ckpt_error([&] { load_checkpoint(stem, other.targets()); },
                      {stem, "optimizer:", "not an object", "nothing was loaded"});
  }
  nlohmann::json record = saved;
  record["optimizer"]["type"] = 5;
  std::ofstream(stem + ".json") << without_record_crc(record);
  expect_ckpt_error([&] { load_checkpoint(stem, other.targets()); },
                    {stem, "optimizer: checkpoint has 5, this run uses SGD", "nothing was loaded"});
  EXPECT_EQ(before, bits(other.model->named_parameters()[0].second));
  EXPECT_EQ(other.opt->param_groups()[0].lr(), 0.1);
}

// The schedule's hyperparameters travel in the checkpoint and win over the ones the
// resuming run built its schedule with (PyTorch's load_state_dict), and the load says
// so in CheckpointInfo::notes. Before, a run resumed with StepLR(opt, 3, ...) after a
// run with step_size 2 (or digits_train --epochs 40 after 30: another t_max) silently
// followed the new curve from the saved epoch on.
TEST_F(CheckpointTest, TheSavedStepSizeWinsOverTheResumingRunsAndTheChangeIsReported) {
  std::string stem = save_checkpoint_stem();
  {
    TrainingRun first(1, false);  // StepLR(opt, 2, 0.5)
    first.train_epoch();
    save_checkpoint(stem, first.targets(), {1, first.step});
  }
  TrainingRun resumed(1, false);
  resumed.sched = std::make_unique<StepLR>(*resumed.opt, 3, 0.5);
  CheckpointInfo info = load_checkpoint(stem, resumed.targets());
  EXPECT_EQ(resumed.sched->last_epoch(), 1);
  for (double want : {0.05, 0.05, 0.025, 0.025, 0.0125}) {  // epochs 2..6 at step_size 2, base 0.1
    resumed.sched->step();
    EXPECT_NEAR(resumed.opt->param_groups()[0].lr(), want, 1e-15) << "epoch " << resumed.sched->last_epoch();
  }
  EXPECT_EQ(info.notes.size(), 1u);
  for (const char* part : {"lr_scheduler", "StepLR step_size", "2 replaces 3"})
    EXPECT_NE(info.notes.empty() ? std::string::npos : info.notes[0].find(part), std::string::npos) << part;

  // The same schedule: nothing to report.
  TrainingRun same(1, false);
  EXPECT_TRUE(load_checkpoint(stem, same.targets()).notes.empty());
}

// As digits_train: saved at epoch 10 of a cosine over 30 epochs, resumed with --epochs 40.
TEST_F(CheckpointTest, ACosineResumedWithAnotherTMaxStaysOnTheSavedCurve) {
  std::string cos_stem = save_checkpoint_stem();
  TrainingRun thirty(1, false);
  thirty.sched = std::make_unique<CosineAnnealingLR>(*thirty.opt, 30);
  for (int e = 0; e < 10; ++e) thirty.sched->step();
  save_checkpoint(cos_stem, thirty.targets(), {10, 0});
  TrainingRun forty(1, false);
  forty.sched = std::make_unique<CosineAnnealingLR>(*forty.opt, 40);
  CheckpointInfo info = load_checkpoint(cos_stem, forty.targets());
  for (int e = 10; e < 40; ++e) {
    EXPECT_EQ(forty.opt->param_groups()[0].lr(), thirty.opt->param_groups()[0].lr()) << "epoch " << e;
    forty.sched->step();
    thirty.sched->step();
  }
  EXPECT_EQ(forty.opt->param_groups()[0].lr(), 0.0);  // t_max 30 ended the cosine at eta_min
  EXPECT_EQ(info.notes.size(), 1u);
  for (const std::string& note : info.notes)
    EXPECT_NE(note.find("CosineAnnealingLR t_max: the loaded state's 30 replaces 40"), std::string::npos) << note;
}

// A checkpoint whose schedule state is out of range (edited, or corrupt in a way the
// CRC of the tensor file does not cover) is refused while planning the load: nothing
// is written, and the message names the field.
TEST_F(CheckpointTest, AnInvalidSavedScheduleIsRefusedAndLoadsNothing) {
  TrainingRun run(1, false);
  run.train_epoch();
  std::string stem = save_checkpoint_stem();
  save_checkpoint(stem, run.targets(), {1, run.step});
  nlohmann::json record = nlohmann::json::parse(std::ifstream(stem + ".json"));
  record["lr_scheduler"]["step_size"] = 0;  // lr_at would divide by zero
  std::ofstream(stem + ".json") << without_record_crc(record);

  TrainingRun other(7, false);
  auto before = bits(other.model->named_parameters()[0].second);
  expect_ckpt_error([&] { load_checkpoint(stem, other.targets()); },
                    {"nothing was loaded",
                     "lr_scheduler: StepLR::load_state_dict: step_size must be positive, got 0"});
  EXPECT_EQ(before, bits(other.model->named_parameters()[0].second));
  EXPECT_EQ(other.sched->last_epoch(), 0);
  EXPECT_EQ(other.sched->state_dict()["step_size"], 2);

  // A checkpoint written before the hyperparameters were saved loads, with this run's.
  record["lr_scheduler"].erase("step_size");
  record["lr_scheduler"].erase("gamma");
  std::ofstream(stem + ".json") << without_record_crc(record);
  TrainingRun three(7, false);
  three.sched = std::make_unique<StepLR>(*three.opt, 3, 0.5);
  CheckpointInfo info = load_checkpoint(stem, three.targets());
  EXPECT_TRUE(info.notes.empty());
  EXPECT_EQ(three.sched->state_dict()["step_size"], 3);
  EXPECT_EQ(three.sched->last_epoch(), 1);
}

}  // namespace
}  // namespace ringtrain::nn

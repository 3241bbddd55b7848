// data_loader_test.cc: Dataset, samplers and DataLoader behaviour.
//
// What is pinned down here: batch contents and order (sequential, seeded
// shuffle, per-epoch reshuffle, set_epoch replay), drop_last, that the prefetch
// thread changes nothing about the values, that an exception inside the worker
// reaches the consumer at the right batch, that leaving a loop early joins the
// thread, and that a custom (DistributedSampler-like) sampler plugs in.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <limits>
#include <memory>
#include <numeric>
#include <set>
#include <stdexcept>
#include <thread>

#include "nn/data/dataloader.h"
#include "nn/data/dataset.h"
#include "nn/data/sampler.h"
#include "tensor/ops.h"
#include "tests/common/expect_error.h"

namespace ringtrain::data {
namespace {

using ringtrain::testing::expect_error;

// inputs[i] = {i, 10 i} (float), targets[i] = i (int64).
std::shared_ptr<TensorDataset> counting_dataset(int64_t n) {
  std::vector<float> x;
  std::vector<int64_t> y;
  for (int64_t i = 0; i < n; ++i) {
    x.push_back(static_cast<float>(i));
    x.push_back(static_cast<float>(10 * i));
    y.push_back(i);
  }
  return std::make_shared<TensorDataset>(Tensor::from_vector(x, {n, 2}), Tensor::from_vector(y, {n}));
}

std::vector<std::vector<int64_t>> collect(DataLoader& loader) {
  std::vector<std::vector<int64_t>> out;
  for (Batch& b : loader.epoch()) {
    std::vector<int64_t> t = b.targets.to_vector<int64_t>();
    EXPECT_EQ(t, b.indices);
    std::vector<float> x = b.inputs.to_vector<float>();
    for (size_t r = 0; r < t.size(); ++r) {
      EXPECT_EQ(x[2 * r], static_cast<float>(t[r]));
      EXPECT_EQ(x[2 * r + 1], static_cast<float>(10 * t[r]));
    }
    out.push_back(t);
  }
  return out;
}

TEST(TensorDataset, GetAndGetBatch) {
  auto ds = counting_dataset(5);
  EXPECT_EQ(ds->size(), 5);
  Example e = ds->get(3);
  EXPECT_EQ(e.input.to_vector<float>(), (std::vector<float>{3, 30}));
  EXPECT_EQ(e.target.item(), 3);
  std::vector<int64_t> idx = {4, 0, 4};
  Batch b = ds->get_batch(idx);
  EXPECT_EQ(b.inputs.shape(), (Shape{3, 2}));
  EXPECT_EQ(b.inputs.to_vector<float>(), (std::vector<float>{4, 40, 0, 0, 4, 40}));
  EXPECT_EQ(b.targets.to_vector<int64_t>(), idx);
  std::vector<int64_t> bad = {1, 5};
  EXPECT_THROW(ds->get_batch(bad), Error);
  EXPECT_THROW(ds->get(-1), Error);
}

TEST(TensorDataset, RejectsMismatchedLengths) {
  expect_error([] { TensorDataset ds(zeros({4, 2}), zeros({3}, DType::kInt64)); }, {"same number of examples"});
}

TEST(DataLoader, SequentialBatchesWithShortTail) {
  DataLoader loader(counting_dataset(10), {.batch_size = 4});
  EXPECT_EQ(loader.num_batches(), 3);
  auto batches = collect(loader);
  ASSERT_EQ(batches.size(), 3u);
  EXPECT_EQ(batches[0], (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(batches[2], (std::vector<int64_t>{8, 9}));
}

TEST(DataLoader, DropLastDropsTheShortBatch) {
  DataLoader loader(counting_dataset(10), {.batch_size = 4, .drop_last = true});
  EXPECT_EQ(loader.num_batches(), 2);
  auto batches = collect(loader);
  ASSERT_EQ(batches.size(), 2u);
  EXPECT_EQ(batches[1], (std::vector<int64_t>{4, 5, 6, 7}));
  // Exact multiple: nothing dropped.
  DataLoader exact(counting_dataset(8), {.batch_size = 4, .drop_last = true});
  EXPECT_EQ(collect(exact).size(), 2u);
}

// "Everything in one batch" as batch_size = INT64_MAX: the count was (n + b - 1) / b,
// which overflowed (undefined behaviour; it gave 0 batches, an epoch with no data).
TEST(DataLoader, AHugeBatchSizeGivesOneBatchOfEverything) {
  DataLoader loader(counting_dataset(10), {.batch_size = std::numeric_limits<int64_t>::max()});
  EXPECT_EQ(loader.num_batches(), 1);
  auto batches = collect(loader);
  ASSERT_EQ(batches.size(), 1u);
  EXPECT_EQ(batches[0], (std::vector<int64_t>{0, 1, 2, 3, 4, 5, 6, 7, 8, 9}));
  DataLoader dropping(counting_dataset(10), {.batch_size = std::numeric_limits<int64_t>::max(), .drop_last = true});
  EXPECT_EQ(dropping.num_batches(), 0);  // the one batch is short
}

std::vector<int64_t> flatten(const std::vector<std::vector<int64_t>>& b) {
  std::vector<int64_t> out;
  for (const auto& v : b) out.insert(out.end(), v.begin(), v.end());
  return out;
}

TEST(DataLoader, ShuffleIsAPermutationDeterminedBySeedAndEpoch) {
  const int64_t n = 50;
  DataLoader a(counting_dataset(n), {.batch_size = 8, .shuffle = true, .seed = 42});
  DataLoader b(counting_dataset(n), {.batch_size = 8, .shuffle = true, .seed = 42});
  DataLoader c(counting_dataset(n), {.batch_size = 8, .shuffle = true, .seed = 43});
  auto a0 = flatten(collect(a)), a1 = flatten(collect(a));
  auto b0 = flatten(collect(b)), b1 = flatten(collect(b));
  auto c0 = flatten(collect(c));
  EXPECT_EQ(a0, b0);  // same seed, same epoch
  EXPECT_EQ(a1, b1);
  EXPECT_NE(a0, a1);  // reshuffled every epoch
  EXPECT_NE(a0, c0);  // seed matters
  std::vector<int64_t> sorted = a0;
  std::sort(sorted.begin(), sorted.end());
  std::vector<int64_t> iota(n);
  std::iota(iota.begin(), iota.end(), 0);
  EXPECT_EQ(sorted, iota);
  std::vector<int64_t> identity(iota);
  EXPECT_NE(a0, identity);
  // Resuming at epoch 1 replays epoch 1's order.
  DataLoader resumed(counting_dataset(n), {.batch_size = 8, .shuffle = true, .seed = 42});
  resumed.set_epoch(1);
  EXPECT_EQ(flatten(collect(resumed)), a1);
  EXPECT_EQ(resumed.next_epoch(), 2);
  // The rule is the public one: randperm with Generator(seed + epoch).
  EXPECT_EQ(a1, epoch_permutation(n, 42, 1));
}

TEST(DataLoader, PrefetchThreadDeliversTheSameBatches) {
  DataLoader sync(counting_dataset(37), {.batch_size = 5, .shuffle = true, .seed = 7, .prefetch = 0});
  DataLoader async(counting_dataset(37), {.batch_size = 5, .shuffle = true, .seed = 7, .prefetch = 3});
  for (int epoch = 0; epoch < 3; ++epoch) EXPECT_EQ(collect(sync), collect(async));
}

TEST(DataLoader, NextAfterTheEndKeepsReturningNullopt) {
  DataLoader loader(counting_dataset(3), {.batch_size = 2});
  auto run = loader.epoch();
  EXPECT_EQ(run.num_batches(), 2);
  EXPECT_TRUE(run.next().has_value());
  EXPECT_TRUE(run.next().has_value());
  EXPECT_FALSE(run.next().has_value());
  EXPECT_FALSE(run.next().has_value());
}

TEST(DataLoader, AMovedFromRunThrowsInsteadOfCrashing) {
  DataLoader loader(counting_dataset(5), {.batch_size = 2});
  auto run = loader.epoch();
  auto moved = std::move(run);
  auto expect_moved_error = [](auto f, const char* method) {
    expect_error(f, {method, "moved from", "loader.epoch()"});
  };
  expect_moved_error([&] { (void)run.next(); }, "next");  // NOLINT(bugprone-use-after-move)
  expect_moved_error([&] { (void)run.epoch(); }, "epoch");
  expect_moved_error([&] { (void)run.num_batches(); }, "num_batches");
  expect_moved_error([&] { for (Batch& b : run) (void)b; }, "next");
  // The run it was moved into is intact; assigning a new run makes the old one usable again.
  EXPECT_EQ(moved.num_batches(), 3);
  EXPECT_TRUE(moved.next().has_value());
  run = loader.epoch();
  EXPECT_EQ(run.epoch(), 1);
  EXPECT_TRUE(run.next().has_value());
}

// Examples one at a time (the default get_batch path); example `fail_at` throws.
class FlakyDataset : public Dataset {
 public:
  FlakyDataset(int64_t n, int64_t fail_at) : n_(n), fail_at_(fail_at) {}
  int64_t size() const override { return n_; }
  Example get(int64_t i) const override {
    ++calls;
    if (i == fail_at_) throw std::runtime_error("decode failed for example " + std::to_string(i));
    return {full({3}, static_cast<double>(i)), scalar_tensor(static_cast<double>(i), DType::kInt64)};
  }
  mutable std::atomic<int64_t> calls{0};

 private:
  int64_t n_, fail_at_;
};

// A job resumed k batches into an epoch starts the epoch there: the same order as the
// uninterrupted epoch, only its tail, and the skipped batches are never built.
TEST(DataLoader, AnEpochStartedPartWayYieldsTheTailAndReadsNothingBeforeIt) {
  for (int64_t prefetch : {0, 3}) {
    DataLoader whole(counting_dataset(37), {.batch_size = 5, .shuffle = true, .seed = 9, .prefetch = prefetch});
    whole.set_epoch(2);
    const auto all = collect(whole);
    ASSERT_EQ(all.size(), 8u);

    auto ds = std::make_shared<FlakyDataset>(37, -1);
    DataLoader resumed(ds, {.batch_size = 5, .shuffle = true, .seed = 9, .prefetch = prefetch});
    resumed.set_epoch(2);
    auto run = resumed.epoch(3);
    EXPECT_EQ(run.epoch(), 2);
    EXPECT_EQ(run.num_batches(), 8);  // the whole epoch's count, as the progress bar shows it
    std::vector<std::vector<int64_t>> tail;
    while (auto b = run.next()) tail.push_back(b->targets.to_vector<int64_t>());
    EXPECT_EQ(tail, std::vector<std::vector<int64_t>>(all.begin() + 3, all.end())) << "prefetch " << prefetch;
    EXPECT_EQ(ds->calls.load(), 37 - 3 * 5) << "the skipped batches were built (prefetch " << prefetch << ")";
    EXPECT_EQ(resumed.next_epoch(), 3);

    // Starting at the end yields nothing; past it is an error that leaves the epoch alone.
    EXPECT_FALSE(resumed.epoch(8).next().has_value());
    expect_error([&] { (void)resumed.epoch(9); }, {"first_batch 9", "0..8 batches", "37 samples", "of 5"});
    expect_error([&] { (void)resumed.epoch(-1); }, {"first_batch -1"});
    EXPECT_EQ(resumed.next_epoch(), 4);
  }
}

TEST(DataLoader, DefaultGetBatchStacksExamples) {
  auto ds = std::make_shared<FlakyDataset>(5, -1);
  DataLoader loader(ds, {.batch_size = 2});
  auto run = loader.epoch();
  std::optional<Batch> b = run.next();
  ASSERT_TRUE(b);
  EXPECT_EQ(b->inputs.shape(), (Shape{2, 3}));
  EXPECT_EQ(b->inputs.to_vector<float>(), (std::vector<float>{0, 0, 0, 1, 1, 1}));
  EXPECT_EQ(b->targets.to_vector<int64_t>(), (std::vector<int64_t>{0, 1}));
}

TEST(DataLoader, WorkerExceptionIsRethrownAtItsBatch) {
  for (int64_t prefetch : {0, 1, 4}) {
    auto ds = std::make_shared<FlakyDataset>(20, 9);  // example 9 is in batch 2 (batch size 4)
    DataLoader loader(ds, {.batch_size = 4, .prefetch = prefetch});
    auto run = loader.epoch();
    int delivered = 0;
    try {
      while (run.next()) ++delivered;
      FAIL() << "expected the worker's exception (prefetch " << prefetch << ")";
    } catch (const std::runtime_error& e) {
      EXPECT_STREQ(e.what(), "decode failed for example 9");
    }
    EXPECT_EQ(delivered, 2) << "prefetch " << prefetch;
    EXPECT_FALSE(run.next().has_value());  // the run is over after the error
  }
}

TEST(DataLoader, RangeForPropagatesTheException) {
  auto ds = std::make_shared<FlakyDataset>(8, 0);
  DataLoader loader(ds, {.batch_size = 4, .prefetch = 2});
  EXPECT_THROW(
      {
        for (Batch& b : loader.epoch()) (void)b;
      },
      std::runtime_error);
}

// Slow examples, so the worker is mid-batch (or blocked on a full queue) when the run dies.
class SlowDataset : public Dataset {
 public:
  int64_t size() const override { return 1000; }
  Example get(int64_t i) const override {
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    return {full({2}, static_cast<double>(i)), Tensor()};
  }
};

TEST(DataLoader, BreakingOutEarlyJoinsTheWorker) {
  DataLoader loader(std::make_shared<SlowDataset>(), {.batch_size = 10, .prefetch = 2});
  auto start = std::chrono::steady_clock::now();
  for (int rep = 0; rep < 5; ++rep) {
    int seen = 0;
    for (Batch& b : loader.epoch()) {
      EXPECT_FALSE(b.targets.defined());
      if (++seen == 2) break;
    }
    EXPECT_EQ(seen, 2);
  }
  // 5 runs that each built at most ~5 batches of 2 ms: far less than a full epoch (200 ms) each.
  auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now() - start);
  EXPECT_LT(ms.count(), 900);
}

// A toy DistributedSampler: this rank's strided slice of the shared shuffled order.
class StridedSampler : public Sampler {
 public:
  StridedSampler(int64_t n, int rank, int world, uint64_t seed) : n_(n), rank_(rank), world_(world), seed_(seed) {}
  int64_t size() const override { return (n_ - rank_ + world_ - 1) / world_; }
  std::vector<int64_t> indices() const override {
    std::vector<int64_t> all = epoch_permutation(n_, seed_, epoch_), mine;
    for (size_t i = rank_; i < all.size(); i += world_) mine.push_back(all[i]);
    return mine;
  }

 private:
  int64_t n_;
  int rank_, world_;
  uint64_t seed_;
};

TEST(DataLoader, CustomSamplerPartitionsTheEpoch) {
  const int64_t n = 23;
  std::set<int64_t> seen;
  int64_t total = 0;
  for (int rank = 0; rank < 2; ++rank) {
    DataLoader loader(counting_dataset(n), {.batch_size = 4},
                      std::make_shared<StridedSampler>(n, rank, 2, 5));
    loader.set_epoch(3);
    for (const auto& b : collect(loader)) {
      for (int64_t i : b) seen.insert(i);
      total += static_cast<int64_t>(b.size());
    }
    EXPECT_EQ(loader.sampler().epoch(), 3);
  }
  EXPECT_EQ(total, n);
  EXPECT_EQ(static_cast<int64_t>(seen.size()), n);
}

TEST(DataLoader, RejectsBadOptions) {
  EXPECT_THROW(DataLoader(counting_dataset(4), {.batch_size = 0}), Error);
  EXPECT_THROW(DataLoader(nullptr, {.batch_size = 1}), Error);
}

TEST(PinMemory, CopiesValues) {
  Tensor t = arange(0, 12, 1, DType::kFloat32).reshape({3, 4}).t();  // non-contiguous source
  Tensor p = pin_memory(t);
  EXPECT_TRUE(p.is_contiguous());
  EXPECT_EQ(p.shape(), t.shape());
  EXPECT_EQ(p.to_vector<float>(), t.to_vector<float>());
}

TEST(TrainTestSplit, DisjointCoveringAndSeeded) {
  auto ds = counting_dataset(100);
  auto [train, test] = train_test_split(*ds, 0.25, 11);
  EXPECT_EQ(train.size(), 75);
  EXPECT_EQ(test.size(), 25);
  std::set<int64_t> all;
  for (int64_t v : train.targets().to_vector<int64_t>()) all.insert(v);
  for (int64_t v : test.targets().to_vector<int64_t>()) all.insert(v);
  EXPECT_EQ(all.size(), 100u);
  auto [train2, test2] = train_test_split(*ds, 0.25, 11);
  EXPECT_EQ(test.targets().to_vector<int64_t>(), test2.targets().to_vector<int64_t>());
  auto [train3, test3] = train_test_split(*ds, 0.25, 12);
  EXPECT_NE(test.targets().to_vector<int64_t>(), test3.targets().to_vector<int64_t>());
  EXPECT_THROW(train_test_split(*ds, 1.0, 1), Error);
}

}  // namespace
}  // namespace ringtrain::data

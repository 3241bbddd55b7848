// DistributedSampler: PyTorch's sharding rules, checked on every rank of a simulated world.
#include "ddp/distributed_sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "tensor/checks.h"

namespace ringtrain::ddp {
namespace {

std::vector<std::vector<int64_t>> shards(int64_t n, int world, DistributedSamplerOptions o, int64_t epoch) {
  std::vector<std::vector<int64_t>> out;
  for (int r = 0; r < world; ++r) {
    DistributedSampler s(n, r, world, o);
    s.set_epoch(epoch);
    auto idx = s.indices();
    EXPECT_EQ(static_cast<int64_t>(idx.size()), s.size()) << "rank " << r;
    out.push_back(idx);
  }
  return out;
}

TEST(DistributedSamplerTest, PaddingGivesEqualShardsCoveringEverySample) {
  auto s = shards(10, 3, {.shuffle = true, .seed = 5}, 0);
  std::map<int64_t, int> count;
  for (auto& shard : s) {
    EXPECT_EQ(shard.size(), 4u);  // ceil(10 / 3)
    for (int64_t i : shard) count[i]++;
  }
  EXPECT_EQ(count.size(), 10u);
  int duplicates = 0;
  for (auto& [i, c] : count) duplicates += c - 1;
  EXPECT_EQ(duplicates, 2);  // 12 slots for 10 samples
}

TEST(DistributedSamplerTest, DropLastDropsTheTail) {
  auto s = shards(10, 3, {.shuffle = false, .drop_last = true}, 0);
  EXPECT_EQ(s[0], (std::vector<int64_t>{0, 3, 6}));
  EXPECT_EQ(s[1], (std::vector<int64_t>{1, 4, 7}));
  EXPECT_EQ(s[2], (std::vector<int64_t>{2, 5, 8}));
}

TEST(DistributedSamplerTest, ExactModeSeesEverySampleOnce) {
  auto s = shards(11, 4, {.shuffle = true, .seed = 9, .exact = true}, 3);
  std::vector<int64_t> all;
  for (auto& shard : s) all.insert(all.end(), shard.begin(), shard.end());
  std::sort(all.begin(), all.end());
  std::vector<int64_t> expected(11);
  for (int64_t i = 0; i < 11; ++i) expected[i] = i;
  EXPECT_EQ(all, expected);
  EXPECT_EQ(s[0].size(), 3u);
  EXPECT_EQ(s[3].size(), 2u);
}

TEST(DistributedSamplerTest, EpochChangesTheOrderAndTheSameEpochRepeatsIt) {
  auto a = shards(50, 2, {.shuffle = true, .seed = 1}, 0);
  auto b = shards(50, 2, {.shuffle = true, .seed = 1}, 0);
  auto c = shards(50, 2, {.shuffle = true, .seed = 1}, 1);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
}

TEST(DistributedSamplerTest, SmallerDataSetThanWorldStillGivesEveryRankWork) {
  auto s = shards(2, 5, {.shuffle = false}, 0);
  for (auto& shard : s) EXPECT_EQ(shard.size(), 1u);
  EXPECT_EQ(s[4], (std::vector<int64_t>{0}));
}

TEST(DistributedSamplerTest, BadArgumentsAreRejected) {
  EXPECT_THROW(DistributedSampler(10, 2, 2), Error);
  EXPECT_THROW(DistributedSampler(10, 0, 0), Error);
  EXPECT_THROW(DistributedSampler(10, 0, 2, {.drop_last = true, .exact = true}), Error);
}

}  // namespace
}  // namespace ringtrain::ddp

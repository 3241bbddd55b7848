// sampler.h: which examples an epoch visits, and in what order.
//
// defines: Sampler (the interface), SequentialSampler, RandomSampler.
//
// The DataLoader asks its sampler for one epoch's index list at the start of the
// epoch, then cuts it into batches. Orders that shuffle are a pure function of
// (seed, epoch): the permutation for epoch e comes from a fresh Philox generator
// seeded with seed + e, exactly the rule PyTorch's DistributedSampler uses. Two
// consequences the rest of ringtrain relies on:
//   * every rank of a DDP job computes the same permutation without talking, and
//     the DistributedSampler (ddp/) implements this interface by taking its
//     rank's strided slice of that permutation;
//   * a run resumed from a checkpoint at epoch e sees the same order it would
//     have seen without stopping (set_epoch(e), nothing else to restore).
//
// Samplers are used from the thread that drives the DataLoader only; the
// prefetch thread receives the finished index list.
#pragma once

#include <cstdint>
#include <vector>

namespace ringtrain::data {

class Sampler {
 public:
  virtual ~Sampler() = default;
  // Number of indices indices() returns (for a DistributedSampler: for this rank).
  virtual int64_t size() const = 0;
  // The indices of the current epoch, in visiting order. Calling it twice in one epoch
  // gives the same list.
  virtual std::vector<int64_t> indices() const = 0;
  // Selects the epoch whose order indices() returns. The DataLoader calls it at the
  // start of every epoch; samplers that do not shuffle may ignore it.
  virtual void set_epoch(int64_t epoch) { epoch_ = epoch; }
  int64_t epoch() const { return epoch_; }

 protected:
  int64_t epoch_ = 0;
};

// 0, 1, ..., n-1 every epoch.
class SequentialSampler : public Sampler {
 public:
  explicit SequentialSampler(int64_t n);
  int64_t size() const override { return n_; }
  std::vector<int64_t> indices() const override;

 private:
  int64_t n_;
};

// A permutation of [0, n) drawn from Generator(seed + epoch).
class RandomSampler : public Sampler {
 public:
  RandomSampler(int64_t n, uint64_t seed);
  int64_t size() const override { return n_; }
  std::vector<int64_t> indices() const override;
  uint64_t seed() const { return seed_; }

 private:
  int64_t n_;
  uint64_t seed_;
};

// The permutation of [0, n) for (seed, epoch): randperm with Generator(seed + epoch).
// Exposed so the DistributedSampler shares the exact rule.
std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch);

}  // namespace ringtrain::data

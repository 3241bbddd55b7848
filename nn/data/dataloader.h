// dataloader.h: batches from a Dataset, built ahead of time on a background thread.
//
// defines: DataLoaderOptions, DataLoader, DataLoader::EpochRun.
//
// One epoch, step by step:
//   1. On the caller's thread the sampler is told the epoch (set_epoch) and gives
//      the epoch's index list (sequential, seeded shuffle, or this rank's slice).
//   2. The list is cut into batches of batch_size; with drop_last the short tail
//      batch is dropped, otherwise it is the last, smaller batch.
//   3. A prefetch thread calls dataset.get_batch() for batch k+1, k+2, ... while
//      the trainer works on batch k, keeping at most `prefetch` finished batches in
//      a bounded queue (so memory stays bounded when the trainer is slower).
//   4. For a CUDA target the batch is staged in pinned (page-locked) host memory,
//      so the host->device copy the consumer issues is a DMA, not a pageable copy.
//      The copy itself is made on the consumer's thread, on its current stream.
//
// Ownership and failure (RAII): an EpochRun owns its thread. Destroying the run
// (end of the loop, a `break`, an exception in the training step) stops the
// thread and joins it; it never outlives the run. An exception thrown inside
// get_batch() on the prefetch thread is carried through the queue and rethrown
// to the consumer at the batch where it happened, then the run ends.
//
// Epochs: every run uses the loader's next epoch number and then advances it,
// so plain `for (auto& b : loader)` loops shuffle differently each epoch. A
// resumed job calls set_epoch(e) once to continue the same sequence of orders,
// and epoch(k) to start that epoch at batch k without reading batches 0..k-1.
//
//   DataLoader loader(train, {.batch_size = 64, .shuffle = true, .seed = 1});
//   for (int e = 0; e < epochs; ++e)
//     for (const Batch& b : loader.epoch()) { ... }
#pragma once

#include <cstdint>
#include <iterator>
#include <memory>
#include <optional>
#include <vector>

#include "nn/data/dataset.h"
#include "nn/data/sampler.h"
#include "tensor/device.h"

namespace ringtrain::data {

struct DataLoaderOptions {
  int64_t batch_size = 1;
  bool shuffle = false;   // RandomSampler(seed) instead of SequentialSampler (ignored with a custom sampler)
  uint64_t seed = 0;      // shuffle seed; epoch e uses seed + e
  bool drop_last = false; // drop the final batch when it has fewer than batch_size examples
  int64_t prefetch = 2;   // batches built ahead on a background thread; 0 = on the caller's thread
  Device device = Device::cpu();  // where batches are delivered; CUDA stages them in pinned memory
};

class DataLoader {
 public:
  DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options);
  // With an explicit sampler (e.g. a DistributedSampler); options.shuffle/seed are then unused.
  DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options,
             std::shared_ptr<Sampler> sampler);
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  // Batches per epoch.
  int64_t num_batches() const;
  const DataLoaderOptions& options() const { return options_; }
  Sampler& sampler() { return *sampler_; }
  const Dataset& dataset() const { return *dataset_; }

  // The epoch the next run uses. Runs advance it by one.
  int64_t next_epoch() const { return next_epoch_; }
  void set_epoch(int64_t epoch);

  class EpochRun;
  // Starts an epoch: the returned run yields its batches (range-for or next()).
  // `first_batch` > 0 starts it part-way (a job resumed mid-epoch): the epoch's order
  // is drawn as usual and the batches before `first_batch` are neither built nor
  // yielded, so a resumed run reads only what it will train on. num_batches() still
  // counts the whole epoch. 0 <= first_batch <= num_batches().
  EpochRun epoch(int64_t first_batch = 0);

  // One epoch as a single-pass range. The run owns its prefetch thread.
  class EpochRun {
   public:
    EpochRun(EpochRun&&) noexcept;
    EpochRun& operator=(EpochRun&&) noexcept;
    ~EpochRun();  // stops and joins the prefetch thread

    // On a moved-from run, epoch(), num_batches(), next() and begin() throw.
    int64_t epoch() const;
    int64_t num_batches() const;
    // The next batch, or nullopt after the last. Rethrows a prefetch-thread exception.
    std::optional<Batch> next();

    class Iterator {
     public:
      using iterator_category = std::input_iterator_tag;
      using value_type = Batch;
      using difference_type = std::ptrdiff_t;
      using pointer = Batch*;
      using reference = Batch&;
      Iterator() = default;
      explicit Iterator(EpochRun* run) : run_(run) { advance(); }
      Batch& operator*() { return *current_; }
      Batch* operator->() { return &*current_; }
      Iterator& operator++() { advance(); return *this; }
      bool operator==(const Iterator& other) const { return done() == other.done(); }

     private:
      void advance();
      bool done() const { return !current_.has_value(); }
      EpochRun* run_ = nullptr;
      std::optional<Batch> current_;
    };
    Iterator begin() { return Iterator(this); }
    Iterator end() { return Iterator(); }

   private:
    friend class DataLoader;
    struct State;
    explicit EpochRun(std::unique_ptr<State> state);
    State& checked_state(const char* method) const;  // throws on a moved-from run
    std::unique_ptr<State> state_;
  };

 private:
  std::shared_ptr<const Dataset> dataset_;
  DataLoaderOptions options_;
  std::shared_ptr<Sampler> sampler_;
  int64_t next_epoch_ = 0;
};

// A copy of `t` (CPU) in page-locked host memory (ordinary memory when CUDA is unusable).
Tensor pin_memory(const Tensor& t);

}  // namespace ringtrain::data

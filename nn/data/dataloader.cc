// dataloader.cc: the epoch run, its bounded prefetch queue and thread.
//
// The producer (prefetch thread) and consumer (training thread) share one
// mutex-protected deque of finished items. An item is either a batch or the
// exception that building it raised. Two condition variables: `can_pop` wakes
// the consumer when an item arrives, `can_push` wakes the producer when the
// consumer made room or when the run is being torn down (`stop`).
#include "nn/data/dataloader.h"

#include <algorithm>
#include <condition_variable>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include "tensor/storage.h"

namespace ringtrain::data {

Tensor pin_memory(const Tensor& t) {
  if (!t.defined()) return t;
  RT_CHECK(t.device().is_cpu(), "pin_memory: expected a CPU tensor, got ", t.describe());
  size_t nbytes = t.nbytes();
  auto storage = std::make_shared<Storage>(allocate_pinned_host_bytes(nbytes), nbytes, Device::cpu());
  Tensor pinned = Tensor::from_storage(std::move(storage), t.shape(), contiguous_strides(t.shape()), 0,
                                       t.dtype());
  pinned.copy_(t);
  return pinned;
}

// ---------------------------------------------------------------- the run's shared state

struct DataLoader::EpochRun::State {
  // Fixed at construction.
  std::shared_ptr<const Dataset> dataset;
  std::vector<int64_t> order;  // the sampler's indices for this epoch
  int64_t batch_size = 1;
  int64_t num_batches = 0;
  int64_t epoch = 0;
  int64_t prefetch = 0;
  Device device = Device::cpu();

  int64_t first_batch = 0;  // batches before it are skipped (a resumed epoch)

  // Consumer-side progress.
  int64_t consumed = 0;  // batches of the epoch behind us, skipped ones included
  bool failed = false;  // an exception was delivered; the run is over

  // Shared between producer and consumer, guarded by mu.
  struct Item {
    std::optional<Batch> batch;
    std::exception_ptr error;
  };
  std::mutex mu;
  std::condition_variable can_pop;
  std::condition_variable can_push;
  std::deque<Item> queue;
  bool stop = false;
  std::thread worker;  // last: started after every field above is ready

  ~State() {
    if (worker.joinable()) {
      {
        std::lock_guard<std::mutex> lock(mu);
        stop = true;
      }
      can_push.notify_all();
      worker.join();
    }
  }

  // Batch k, staged for the target device (pinned host memory for CUDA).
  Batch build(int64_t k) const {
    int64_t begin = k * batch_size;
    int64_t end = std::min<int64_t>(begin + batch_size, static_cast<int64_t>(order.size()));
    Batch b = dataset->get_batch(std::span<const int64_t>(order.data() + begin,
                                                          static_cast<size_t>(end - begin)));
    if (device.is_cuda()) {
      b.inputs = pin_memory(b.inputs);
      b.targets = pin_memory(b.targets);
    }
    return b;
  }

  void produce() {
    for (int64_t k = first_batch; k < num_batches; ++k) {
      Item item;
      try {
        item.batch = build(k);
      } catch (...) {
        item.error = std::current_exception();
      }
      bool is_error = static_cast<bool>(item.error);
      {
        std::unique_lock<std::mutex> lock(mu);
        can_push.wait(lock, [&] { return stop || static_cast<int64_t>(queue.size()) < prefetch; });
        if (stop) return;
        queue.push_back(std::move(item));
      }
      can_pop.notify_one();
      if (is_error) return;  // nothing after a failed batch
    }
  }

  // Moves a staged batch to the target device (on the consumer's thread and stream).
  Batch deliver(Batch b) const {
    if (device.is_cuda()) {
      b.inputs = b.inputs.to(device);
      if (b.targets.defined()) b.targets = b.targets.to(device);
    }
    return b;
  }
};

// ---------------------------------------------------------------- EpochRun

DataLoader::EpochRun::EpochRun(std::unique_ptr<State> state) : state_(std::move(state)) {}
DataLoader::EpochRun::EpochRun(EpochRun&&) noexcept = default;
DataLoader::EpochRun& DataLoader::EpochRun::operator=(EpochRun&&) noexcept = default;
DataLoader::EpochRun::~EpochRun() = default;

// A moved-from run has no state: every member but the destructor and assignment
// throws (rather than dereferencing null), naming the way out.
DataLoader::EpochRun::State& DataLoader::EpochRun::checked_state(const char* method) const {
  RT_CHECK(state_ != nullptr, "DataLoader::EpochRun::", method, ": this run was moved from (its batches "
           "and prefetch thread now belong to the run it was moved into); use that run, or start a new "
           "epoch with loader.epoch()");
  return *state_;
}

int64_t DataLoader::EpochRun::epoch() const { return checked_state("epoch").epoch; }
int64_t DataLoader::EpochRun::num_batches() const { return checked_state("num_batches").num_batches; }

std::optional<Batch> DataLoader::EpochRun::next() {
  State& s = checked_state("next");
  if (s.failed || s.consumed >= s.num_batches) return std::nullopt;
  if (s.prefetch == 0) {
    // Synchronous: build on this thread; an exception propagates directly.
    try {
      Batch b = s.build(s.consumed);
      ++s.consumed;
      return s.deliver(std::move(b));
    } catch (...) {
      s.failed = true;
      throw;
    }
  }
  State::Item item;
  {
    std::unique_lock<std::mutex> lock(s.mu);
    s.can_pop.wait(lock, [&] { return !s.queue.empty(); });
    item = std::move(s.queue.front());
    s.queue.pop_front();
  }
  s.can_push.notify_one();
  ++s.consumed;
  if (item.error) {
    s.failed = true;
    std::rethrow_exception(item.error);
  }
  return s.deliver(std::move(*item.batch));
}

void DataLoader::EpochRun::Iterator::advance() {
  current_.reset();
  if (run_ != nullptr) current_ = run_->next();
}

// ---------------------------------------------------------------- DataLoader

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options)
    : DataLoader(dataset, options,
                 options.shuffle && dataset
                     ? std::shared_ptr<Sampler>(std::make_shared<RandomSampler>(dataset->size(), options.seed))
                     : std::shared_ptr<Sampler>(
                           std::make_shared<SequentialSampler>(dataset ? dataset->size() : 0))) {}

DataLoader::DataLoader(std::shared_ptr<const Dataset> dataset, DataLoaderOptions options,
                       std::shared_ptr<Sampler> sampler)
    : dataset_(std::move(dataset)), options_(options), sampler_(std::move(sampler)) {
  RT_CHECK(dataset_ != nullptr, "DataLoader: dataset is null");
  RT_CHECK(sampler_ != nullptr, "DataLoader: sampler is null");
  RT_CHECK(options_.batch_size > 0, "DataLoader: batch_size must be positive, got ", options_.batch_size);
  RT_CHECK(options_.prefetch >= 0, "DataLoader: prefetch must be >= 0, got ", options_.prefetch);
}

int64_t DataLoader::num_batches() const {
  int64_t n = sampler_->size();
  int64_t b = options_.batch_size;
  // Not (n + b - 1) / b: that overflows for a batch_size near INT64_MAX ("the whole
  // data set in one batch") and gave 0 batches.
  return options_.drop_last ? n / b : n / b + (n % b != 0);
}

void DataLoader::set_epoch(int64_t epoch) {
  RT_CHECK(epoch >= 0, "DataLoader::set_epoch: epoch must be non-negative, got ", epoch);
  next_epoch_ = epoch;
}

DataLoader::EpochRun DataLoader::epoch(int64_t first_batch) {
  const int64_t batches = num_batches();
  RT_CHECK(first_batch >= 0 && first_batch <= batches, "DataLoader::epoch: first_batch ", first_batch,
           " is outside this epoch's 0..", batches, " batches (", sampler_->size(), " samples in batches of ",
           options_.batch_size, options_.drop_last ? ", drop_last" : "", ")");
  auto state = std::make_unique<EpochRun::State>();
  state->dataset = dataset_;
  state->epoch = next_epoch_++;
  sampler_->set_epoch(state->epoch);
  state->order = sampler_->indices();
  RT_CHECK(static_cast<int64_t>(state->order.size()) == sampler_->size(), "DataLoader: sampler returned ",
           state->order.size(), " indices but its size() is ", sampler_->size());
  state->batch_size = options_.batch_size;
  state->num_batches = batches;
  state->first_batch = first_batch;
  state->consumed = first_batch;
  state->prefetch = options_.prefetch;
  state->device = options_.device;
  if (state->prefetch > 0 && first_batch < batches) {
    EpochRun::State* raw = state.get();
    state->worker = std::thread([raw] { raw->produce(); });
  }
  return EpochRun(std::move(state));
}

}  // namespace ringtrain::data

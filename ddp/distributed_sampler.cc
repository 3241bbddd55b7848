// distributed_sampler.cc: see distributed_sampler.h.
#include "ddp/distributed_sampler.h"

#include <numeric>

#include "tensor/checks.h"

namespace ringtrain::ddp {

DistributedSampler::DistributedSampler(int64_t dataset_size, int rank, int world_size,
                                       DistributedSamplerOptions options)
    : n_(dataset_size), rank_(rank), world_(world_size), options_(options) {
  RT_CHECK(dataset_size >= 0, "DistributedSampler: dataset size must be non-negative, got ", dataset_size);
  RT_CHECK(world_size >= 1 && rank >= 0 && rank < world_size, "DistributedSampler: rank ", rank,
           " is invalid for world size ", world_size, " (need 0 <= rank < world_size)");
  RT_CHECK(!(options.exact && options.drop_last),
           "DistributedSampler: exact and drop_last exclude each other (exact keeps every sample once)");
  if (options.exact) total_size_ = n_;
  else if (options.drop_last) total_size_ = n_ / world_ * world_;
  else total_size_ = (n_ + world_ - 1) / world_ * world_;
}

int64_t DistributedSampler::size() const {
  if (!options_.exact) return total_size_ / world_;
  return n_ / world_ + (rank_ < n_ % world_ ? 1 : 0);
}

std::vector<int64_t> DistributedSampler::indices() const {
  std::vector<int64_t> order;
  if (options_.shuffle) {
    order = data::epoch_permutation(n_, options_.seed, epoch_);
  } else {
    order.resize(static_cast<size_t>(n_));
    std::iota(order.begin(), order.end(), int64_t{0});
  }
  // Pad by repeating from the start (several times over if n < world), or cut.
  if (!order.empty()) {
    for (size_t i = 0; static_cast<int64_t>(order.size()) < total_size_; ++i) order.push_back(order[i]);
  }
  order.resize(static_cast<size_t>(total_size_));
  std::vector<int64_t> mine;
  for (int64_t i = rank_; i < total_size_; i += world_) mine.push_back(order[i]);
  return mine;
}

}  // namespace ringtrain::ddp

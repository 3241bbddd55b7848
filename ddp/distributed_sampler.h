// distributed_sampler.h: each rank's share of the data set, PyTorch's
// DistributedSampler rules.
//
// defines: DistributedSamplerOptions, DistributedSampler (a data::Sampler).
//
// Every rank computes the same epoch permutation (seed + epoch, no communication),
// then takes the strided slice rank, rank + W, rank + 2W, ... Modes:
//   * padding (default): the list is extended by repeating its head until it
//     divides by W, so every rank runs the same number of steps (a rank with fewer
//     batches would leave the others waiting in allreduce);
//   * drop_last: the tail that does not divide by W is dropped instead;
//   * exact (evaluation): no padding and no dropping; ranks get sizes that differ
//     by at most one and every sample is seen exactly once across ranks, so a
//     summed metric is exact. Do not use it for training steps with DDP.
#pragma once

#include <cstdint>
#include <vector>

#include "nn/data/sampler.h"

namespace ringtrain::ddp {

struct DistributedSamplerOptions {
  bool shuffle = true;
  uint64_t seed = 0;
  bool drop_last = false;
  bool exact = false;  // evaluation mode: no duplicated and no dropped samples
};

class DistributedSampler : public data::Sampler {
 public:
  DistributedSampler(int64_t dataset_size, int rank, int world_size, DistributedSamplerOptions options = {});
  int64_t size() const override;
  std::vector<int64_t> indices() const override;

  int64_t total_size() const { return total_size_; }  // indices over all ranks per epoch

 private:
  int64_t n_;
  int rank_;
  int world_;
  DistributedSamplerOptions options_;
  int64_t total_size_;  // n padded up / dropped down to a multiple of world (== n in exact mode)
};

}  // namespace ringtrain::ddp

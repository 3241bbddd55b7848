// sampler.cc: the sequential and seeded random orders.
#include "nn/data/sampler.h"

#include <numeric>

#include "tensor/ops.h"

namespace ringtrain::data {

std::vector<int64_t> epoch_permutation(int64_t n, uint64_t seed, int64_t epoch) {
  RT_CHECK(n >= 0, "epoch_permutation: n must be non-negative, got ", n);
  RT_CHECK(epoch >= 0, "epoch_permutation: epoch must be non-negative, got ", epoch);
  Generator gen(seed + static_cast<uint64_t>(epoch));
  return randperm(n, gen).to_vector<int64_t>();
}

SequentialSampler::SequentialSampler(int64_t n) : n_(n) {
  RT_CHECK(n >= 0, "SequentialSampler: n must be non-negative, got ", n);
}

std::vector<int64_t> SequentialSampler::indices() const {
  std::vector<int64_t> out(static_cast<size_t>(n_));
  std::iota(out.begin(), out.end(), int64_t{0});
  return out;
}

RandomSampler::RandomSampler(int64_t n, uint64_t seed) : n_(n), seed_(seed) {
  RT_CHECK(n >= 0, "RandomSampler: n must be non-negative, got ", n);
}

std::vector<int64_t> RandomSampler::indices() const { return epoch_permutation(n_, seed_, epoch_); }

}  // namespace ringtrain::data

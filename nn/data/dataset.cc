// dataset.cc: the default get_batch (stack of examples), TensorDataset's row
// gather, and the seeded train/test split.
#include "nn/data/dataset.h"

#include <cmath>
#include <cstring>

#include "tensor/ops.h"

namespace ringtrain::data {

Batch Dataset::get_batch(std::span<const int64_t> indices) const {
  RT_CHECK(!indices.empty(), "Dataset::get_batch: empty index list");
  std::vector<Tensor> inputs, targets;
  inputs.reserve(indices.size());
  targets.reserve(indices.size());
  for (int64_t i : indices) {
    Example e = get(i);
    inputs.push_back(std::move(e.input));
    if (e.target.defined()) targets.push_back(std::move(e.target));
  }
  RT_CHECK(targets.empty() || targets.size() == inputs.size(),
           "Dataset::get_batch: some examples have a target and some do not");
  Batch b;
  b.inputs = stack(inputs, 0);
  if (!targets.empty()) b.targets = stack(targets, 0);
  b.indices.assign(indices.begin(), indices.end());
  return b;
}

Tensor gather_rows(const Tensor& t, std::span<const int64_t> indices, const char* what) {
  RT_CHECK(t.device().is_cpu() && t.is_contiguous() && t.dim() >= 1, what,
           ": needs a contiguous CPU tensor with a batch dim, got ", t.describe());
  const int64_t n = t.size(0);
  Shape shape = t.shape();
  shape[0] = static_cast<int64_t>(indices.size());
  Tensor out = Tensor::empty(shape, t.dtype(), Device::cpu());
  const size_t row_bytes = n == 0 ? 0 : t.nbytes() / static_cast<size_t>(n);
  const auto* src = static_cast<const char*>(t.data_ptr());
  auto* dst = static_cast<char*>(out.data_ptr());
  for (size_t r = 0; r < indices.size(); ++r) {
    int64_t i = indices[r];
    RT_CHECK(i >= 0 && i < n, what, ": index ", i, " out of range for ", n, " examples");
    std::memcpy(dst + r * row_bytes, src + static_cast<size_t>(i) * row_bytes, row_bytes);
  }
  return out;
}

TensorDataset::TensorDataset(Tensor inputs, Tensor targets) {
  RT_CHECK(inputs.defined() && inputs.dim() >= 1,
           "TensorDataset: inputs must be a tensor with a leading example dim, got ",
           inputs.defined() ? inputs.describe() : std::string("an undefined tensor"));
  if (targets.defined()) {
    RT_CHECK(targets.dim() >= 1 && targets.size(0) == inputs.size(0),
             "TensorDataset: inputs ", inputs.describe(), " and targets ", targets.describe(),
             " must have the same number of examples (dim 0)");
  }
  inputs_ = inputs.to(Device::cpu()).contiguous();
  if (targets.defined()) targets_ = targets.to(Device::cpu()).contiguous();
}

Example TensorDataset::get(int64_t index) const {
  RT_CHECK(index >= 0 && index < size(), "TensorDataset::get: index ", index, " out of range for ",
           size(), " examples");
  Example e;
  e.input = inputs_.select(0, index);
  if (targets_.defined()) e.target = targets_.select(0, index);
  return e;
}

Batch TensorDataset::get_batch(std::span<const int64_t> indices) const {
  Batch b;
  b.inputs = gather_rows(inputs_, indices, "TensorDataset::get_batch");
  if (targets_.defined()) b.targets = gather_rows(targets_, indices, "TensorDataset::get_batch");
  b.indices.assign(indices.begin(), indices.end());
  return b;
}

std::pair<TensorDataset, TensorDataset> train_test_split(const TensorDataset& dataset,
                                                         double test_fraction, uint64_t seed) {
  RT_CHECK(test_fraction > 0.0 && test_fraction < 1.0,
           "train_test_split: test_fraction must be in (0, 1), got ", test_fraction);
  const int64_t n = dataset.size();
  const auto n_test = static_cast<int64_t>(std::llround(test_fraction * static_cast<double>(n)));
  RT_CHECK(n_test > 0 && n_test < n, "train_test_split: ", n, " examples with test_fraction ",
           test_fraction, " leave an empty side");
  Generator gen(seed);
  std::vector<int64_t> perm = randperm(n, gen).to_vector<int64_t>();
  std::span<const int64_t> test_idx(perm.data(), static_cast<size_t>(n_test));
  std::span<const int64_t> train_idx(perm.data() + n_test, static_cast<size_t>(n - n_test));
  Batch train = dataset.get_batch(train_idx);
  Batch test = dataset.get_batch(test_idx);
  return {TensorDataset(train.inputs, train.targets), TensorDataset(test.inputs, test.targets)};
}

}  // namespace ringtrain::data

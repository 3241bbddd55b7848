// dataset.h: what a DataLoader reads from.
//
// defines: Example, Batch, Dataset (the interface), TensorDataset (in-memory
//          inputs/targets), train_test_split().
//
// A Dataset is a random-access collection of (input, target) examples. The
// DataLoader asks it for whole batches at once, by index list, because a batch
// built row by row from single examples is the slow path: TensorDataset answers
// get_batch() with one memcpy per row into a fresh contiguous tensor. Datasets
// that can only produce one example at a time implement get() and inherit the
// default get_batch(), which stacks.
//
// Thread safety: the DataLoader's prefetch thread calls get_batch() while the
// training thread runs, so get()/get_batch() must be safe to call concurrently
// with other const calls (TensorDataset is: it never mutates after construction).
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

#include "tensor/tensor.h"

namespace ringtrain::data {

// One example: the input and its target (target may be undefined for unlabelled data).
struct Example {
  Tensor input;
  Tensor target;
};

// A batch: row i of `inputs`/`targets` is dataset example `indices[i]`.
struct Batch {
  Tensor inputs;   // [B, ...]
  Tensor targets;  // [B, ...] or undefined
  std::vector<int64_t> indices;
  int64_t size() const { return static_cast<int64_t>(indices.size()); }
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  virtual int64_t size() const = 0;
  // Example `index` in [0, size()). Throws std::out_of_range-style ringtrain::Error otherwise.
  virtual Example get(int64_t index) const = 0;
  // Examples `indices`, stacked along a new dim 0. The default calls get() per index and
  // stacks; override when the data can be gathered directly.
  virtual Batch get_batch(std::span<const int64_t> indices) const;
};

// Inputs [N, ...] and targets [N, ...] held in CPU memory; example i is row i of both.
class TensorDataset : public Dataset {
 public:
  // `targets` may be undefined. Both are made contiguous on the CPU (copied if needed).
  // Throws if they are not on the CPU-readable path or their first dims differ.
  explicit TensorDataset(Tensor inputs, Tensor targets = Tensor());

  int64_t size() const override { return inputs_.defined() ? inputs_.size(0) : 0; }
  Example get(int64_t index) const override;
  Batch get_batch(std::span<const int64_t> indices) const override;

  const Tensor& inputs() const { return inputs_; }
  const Tensor& targets() const { return targets_; }

 private:
  Tensor inputs_;
  Tensor targets_;
};

// Rows `indices` of a contiguous CPU tensor `t` (dim 0), copied into a new contiguous tensor.
// Every index is checked against t.size(0); the error names `what` and the bad index.
Tensor gather_rows(const Tensor& t, std::span<const int64_t> indices, const char* what = "gather_rows");

// Splits a TensorDataset into (train, test): a permutation drawn from Generator(seed)
// puts round(test_fraction * N) examples in test and the rest in train (each in
// permutation order). The same seed gives the same split on every machine.
std::pair<TensorDataset, TensorDataset> train_test_split(const TensorDataset& dataset,
                                                         double test_fraction, uint64_t seed);

}  // namespace ringtrain::data

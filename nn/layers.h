// layers.h: the standard layers, each a Module with PyTorch's defaults.
//
// defines: Linear, Conv2d, MaxPool2d, AvgPool2d, BatchNorm1d, BatchNorm2d,
//          LayerNorm, Dropout, Embedding, ReLU, GELU, Tanh, Flatten, Sequential.
//
// Where it sits: a model is a tree of these; forward() calls the
// differentiable ops of autograd/functions.h with the layer's parameters, so the
// backward graph is built as the forward runs. Initialisation follows PyTorch
// (torch/nn/modules/*.py reset_parameters) and draws from a seeded Generator
// (tensor/ops.h): the same seed gives the same model on every rank, which DDP
// also relies on (it broadcasts rank 0's parameters anyway).
//
//   Linear, Conv2d: weight ~ kaiming_uniform(a = sqrt(5)) = U(-1/sqrt(fan_in), 1/sqrt(fan_in)),
//                   bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in))
//   BatchNorm, LayerNorm: weight = 1, bias = 0; running_mean = 0, running_var = 1
//   Embedding: weight ~ N(0, 1)
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "nn/module.h"
#include "tensor/ops.h"

namespace ringtrain::nn {

class Linear : public Cloneable<Linear> {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true,
         Generator& gen = default_generator());
  Tensor forward(const Tensor& input) override;  // [*, in] -> [*, out]
  std::string extra_repr() const override;
  Tensor& weight() { return param(weight_); }  // [out, in]
  Tensor& bias();                               // [out]; throws when built without bias

 private:
  int64_t in_features_, out_features_;
  ParamSlot weight_, bias_;
  bool has_bias_;
};

class Conv2d : public Cloneable<Conv2d> {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel_size, int64_t stride = 1,
         int64_t padding = 0, bool bias = true, Generator& gen = default_generator(),
         int64_t dilation = 1, int64_t groups = 1);
  Tensor forward(const Tensor& input) override;  // [N, C, H, W] -> [N, O, Ho, Wo]
  std::string extra_repr() const override;
  Tensor& weight() { return param(weight_); }

 private:
  int64_t in_channels_, out_channels_, kernel_size_;
  Conv2dParams params_;
  ParamSlot weight_, bias_;
  bool has_bias_;
};

class MaxPool2d : public Cloneable<MaxPool2d> {
 public:
  // stride 0 means stride = kernel_size (PyTorch's default).
  explicit MaxPool2d(int64_t kernel_size, int64_t stride = 0, int64_t padding = 0);
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;

 private:
  Pool2dParams params_;
};

class AvgPool2d : public Cloneable<AvgPool2d> {
 public:
  explicit AvgPool2d(int64_t kernel_size, int64_t stride = 0, int64_t padding = 0);
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;

 private:
  Pool2dParams params_;
};

// Batch normalisation over [N, C] / [N, C, L] (BatchNorm1d) or [N, C, H, W] (BatchNorm2d).
// Buffers: running_mean, running_var, num_batches_tracked (int64), as in PyTorch.
class BatchNorm : public Cloneable<BatchNorm> {
 public:
  BatchNorm(std::string type_name, int64_t num_features, int64_t expected_dim_min,
            int64_t expected_dim_max, double eps, double momentum, bool affine);
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;

 private:
  int64_t num_features_;
  int64_t dim_min_, dim_max_;  // accepted input ranks
  double eps_, momentum_;
  bool affine_;
  ParamSlot weight_, bias_;
  BufferSlot running_mean_, running_var_, num_batches_tracked_;
};

class BatchNorm1d : public BatchNorm {
 public:
  explicit BatchNorm1d(int64_t num_features, double eps = 1e-5, double momentum = 0.1, bool affine = true)
      : BatchNorm("BatchNorm1d", num_features, 2, 3, eps, momentum, affine) {}

 protected:
  std::shared_ptr<Module> clone_shallow() const override { return std::make_shared<BatchNorm1d>(*this); }
};

class BatchNorm2d : public BatchNorm {
 public:
  explicit BatchNorm2d(int64_t num_features, double eps = 1e-5, double momentum = 0.1, bool affine = true)
      : BatchNorm("BatchNorm2d", num_features, 4, 4, eps, momentum, affine) {}

 protected:
  std::shared_ptr<Module> clone_shallow() const override { return std::make_shared<BatchNorm2d>(*this); }
};

class LayerNorm : public Cloneable<LayerNorm> {
 public:
  explicit LayerNorm(Shape normalized_shape, double eps = 1e-5, bool elementwise_affine = true);
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;

 private:
  Shape normalized_shape_;
  double eps_;
  bool affine_;
  ParamSlot weight_, bias_;
};

// Zeroes each element with probability p in training mode (scaling the rest by
// 1/(1-p)); identity in eval mode. With a seed it owns its Generator (the same
// masks every run); without, it draws from default_generator().
class Dropout : public Cloneable<Dropout> {
 public:
  explicit Dropout(double p = 0.5);
  Dropout(double p, uint64_t seed);
  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;
  Generator& generator() { return own_generator_ ? generator_ : default_generator(); }
  // The seeded stream, so checkpoints carry it ({"generator", ...}); none without a seed.
  std::vector<std::pair<std::string, Generator*>> own_generators() override;

 private:
  double p_;
  bool own_generator_;   // true: generator_ is used; false: default_generator()
  Generator generator_;  // this layer's own stream when seeded
};

class Embedding : public Cloneable<Embedding> {
 public:
  Embedding(int64_t num_embeddings, int64_t embedding_dim, Generator& gen = default_generator());
  Tensor forward(const Tensor& indices) override;  // int64 [*] -> [*, dim]
  std::string extra_repr() const override;
  Tensor& weight() { return param(weight_); }

 private:
  int64_t num_embeddings_, embedding_dim_;
  ParamSlot weight_;
};

class ReLU : public Cloneable<ReLU> {
 public:
  ReLU() : Cloneable("ReLU") {}
  Tensor forward(const Tensor& input) override;
};

class GELU : public Cloneable<GELU> {
 public:
  GELU() : Cloneable("GELU") {}
  Tensor forward(const Tensor& input) override;
};

class Tanh : public Cloneable<Tanh> {
 public:
  Tanh() : Cloneable("Tanh") {}
  Tensor forward(const Tensor& input) override;
};

class Flatten : public Cloneable<Flatten> {
 public:
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1)
      : Cloneable("Flatten"), start_dim_(start_dim), end_dim_(end_dim) {}
  Tensor forward(const Tensor& input) override;

 private:
  int64_t start_dim_, end_dim_;
};

// Children named "0", "1", ... run in order.
class Sequential : public Cloneable<Sequential> {
 public:
  Sequential() : Cloneable("Sequential") {}
  explicit Sequential(std::vector<std::shared_ptr<Module>> modules);
  Sequential& push_back(std::shared_ptr<Module> module);
  Tensor forward(const Tensor& input) override;
  size_t size() const { return num_children(); }
  Module& operator[](size_t i) const { return child_at(i); }
};

// make_shared shorthand: nn::make<Linear>(4, 8).
template <typename M, typename... Args>
std::shared_ptr<M> make(Args&&... args) {
  return std::make_shared<M>(std::forward<Args>(args)...);
}

}  // namespace ringtrain::nn

// blobs.h: the trainer tests' data set (three Gaussian blobs in 4-D: easy, but only
// learnable by actually training) and the steps of a classifier trained on it.
#pragma once

#include <memory>

#include "autograd/functions.h"
#include "nn/data/dataset.h"
#include "tensor/ops.h"
#include "trainer/trainer.h"

namespace ringtrain::trainer::testing {

inline std::shared_ptr<data::TensorDataset> blobs(int64_t n, uint64_t seed) {
  Generator gen(seed);
  Tensor y = mul(rand({n}, gen), 3.0).to(DType::kInt64);
  Tensor centers = Tensor::from_vector<float>({2, 0, 0, 0, 0, 2, 0, 0, 0, 0, 2, 0}, {3, 4});
  Tensor x = add(index_select(centers, 0, y), mul(randn({n, 4}, gen), 0.5));
  return std::make_shared<data::TensorDataset>(x, y);
}

// A classifier's steps on blobs(): cross-entropy to train; to validate, the counts that
// accuracy is made of. Subclasses build the model and the optimizer.
class BlobStepsModule : public TrainingModule {
 public:
  Tensor training_step(const data::Batch& b, StepContext& ctx) override {
    return ag::cross_entropy(ctx.forward(b.inputs), b.targets);
  }
  std::map<std::string, double> validation_step(const data::Batch& b, StepContext& ctx) override {
    Tensor logits = ctx.forward(b.inputs);
    return {{"correct", sum(eq(argmax(logits.to(DType::kFloat32), 1), b.targets)).item()},
            {"count", static_cast<double>(b.size())}};
  }
};

}  // namespace ringtrain::trainer::testing

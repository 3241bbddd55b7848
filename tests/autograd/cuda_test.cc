// cuda_test.cc: autograd ops on a GPU where the CUDA kernels cannot throw, so the op
// itself must check its indices (label cuda; skipped with the reason without a GPU).
#include <gtest/gtest.h>

#include "autograd/autograd.h"
#include "autograd/functions.h"
#include "tensor/cuda/runtime.h"
#include "tensor/ops.h"
#include "tests/common/expect_error.h"

namespace ringtrain {
namespace {

using ringtrain::testing::expect_error;

class AutogradCuda : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!cuda::is_available()) GTEST_SKIP() << "no usable GPU: " << cuda::unavailable_reason();
  }
  const Device gpu_ = Device::cuda(0);
};

// An embedding index past the table, or a class target past the logits: the ops check
// them on every device, because the GPU's gather kernel cannot throw and would read 0
// and train on a wrong value silently.
TEST_F(AutogradCuda, OutOfRangeIndicesAreNamedNotReadAsZero) {
  Tensor table = ones({4, 3}).to(gpu_);
  autograd::set_requires_grad(table);
  expect_error([&] { ag::embedding(table, Tensor::from_vector<int64_t>({0, 4}, {2}).to(gpu_)); },
               {"embedding", "indices", "[0, 4]", "[0, 3]"});
  Tensor ok = ag::embedding(table, Tensor::from_vector<int64_t>({3, 0}, {2}).to(gpu_));
  EXPECT_EQ(ok.to(Device::cpu()).to_vector<float>(), std::vector<float>(6, 1.0f));
  Tensor logits = zeros({2, 3}).to(gpu_);
  expect_error([&] { ag::cross_entropy(logits, Tensor::from_vector<int64_t>({0, 3}, {2}).to(gpu_)); },
               {"cross_entropy", "targets", "[0, 3]", "[0, 2]"});
}

}  // namespace
}  // namespace ringtrain

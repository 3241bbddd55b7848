// data_cuda_loader_test.cc: the DataLoader's CUDA target (label `cuda`).
//
// With .device = cuda, the prefetch thread stages each batch in pinned host
// memory and the consumer copies it to the GPU. This checks that batches arrive
// on the device with the same values and order as a CPU loader's, with and
// without the prefetch thread. Skips with the runtime's reason when no GPU is
// usable (every machine without a driver).
#include <gtest/gtest.h>

#include <memory>

#include "nn/data/dataloader.h"
#include "tensor/cuda/runtime.h"
#include "tensor/ops.h"

namespace ringtrain::data {
namespace {

TEST(DataLoaderCuda, BatchesArriveOnTheGpuUnchanged) {
  if (!cuda::is_available()) GTEST_SKIP() << "no usable GPU: " << cuda::unavailable_reason();
  Generator g(4);
  auto ds = std::make_shared<TensorDataset>(randn({50, 3, 4}, g), arange(0, 50, 1, DType::kInt64));
  for (int64_t prefetch : {0, 2}) {
    DataLoader cpu(ds, {.batch_size = 8, .shuffle = true, .seed = 3, .prefetch = 0});
    DataLoader gpu(ds, {.batch_size = 8, .shuffle = true, .seed = 3, .prefetch = prefetch,
                        .device = Device::cuda(0)});
    auto a = cpu.epoch();
    auto b = gpu.epoch();
    int batches = 0;
    while (auto x = a.next()) {
      auto y = b.next();
      ASSERT_TRUE(y.has_value());
      EXPECT_TRUE(y->inputs.device().is_cuda());
      EXPECT_TRUE(y->targets.device().is_cuda());
      EXPECT_EQ(x->inputs.to_vector<float>(), y->inputs.to_vector<float>());
      EXPECT_EQ(x->targets.to_vector<int64_t>(), y->targets.to_vector<int64_t>());
      ++batches;
    }
    EXPECT_FALSE(b.next().has_value());
    EXPECT_EQ(batches, 7);
  }
}

TEST(DataLoaderCuda, PinMemoryKeepsValues) {
  if (!cuda::is_available()) GTEST_SKIP() << "no usable GPU: " << cuda::unavailable_reason();
  Tensor t = arange(0, 1000, 1, DType::kFloat32);
  Tensor p = pin_memory(t);
  EXPECT_TRUE(p.device().is_cpu());
  EXPECT_EQ(p.to_vector<float>(), t.to_vector<float>());
  EXPECT_EQ(p.to(Device::cuda(0)).to_vector<float>(), t.to_vector<float>());
}

}  // namespace
}  // namespace ringtrain::data

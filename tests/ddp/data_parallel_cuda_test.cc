// DataParallel on CUDA devices (label cuda; skips with the reason without a usable GPU).
#include <gtest/gtest.h>

#include <mutex>
#include <vector>

#include "ddp/data_parallel.h"
#include "nn/module.h"
#include "tensor/cuda/runtime.h"
#include "tensor/ops.h"

namespace ringtrain::ddp {
namespace {

// Records the current CUDA stream each replica's forward runs on (the replicas are
// clones sharing `seen`).
class StreamProbe : public nn::Cloneable<StreamProbe> {
 public:
  struct Seen {
    std::mutex mutex;
    std::vector<void*> streams;
  };
  StreamProbe() : Cloneable("StreamProbe"), seen(std::make_shared<Seen>()) {}
  Tensor forward(const Tensor& input) override {
    std::lock_guard<std::mutex> lock(seen->mutex);
    seen->streams.push_back(cuda::current_stream(input.device().index).handle());
    return mul(input, 2.0);
  }
  std::shared_ptr<Seen> seen;
};

// Each replica runs on the caller's current stream of its device, as PyTorch's
// parallel_apply. Before, replicas 1..n-1 ran on their worker thread's legacy default
// stream, which does not wait for a non-blocking stream the caller set: they could read
// their chunk before the caller's copy of it finished.
TEST(DataParallelCudaTest, ReplicasRunOnTheCallersCurrentStream) {
  if (!cuda::is_available()) GTEST_SKIP() << "no usable GPU: " << cuda::unavailable_reason();
  auto probe = std::make_shared<StreamProbe>();
  probe->to(Device::cuda(0));
  DataParallel dp(probe, std::vector<Device>(3, Device::cuda(0)));
  cuda::Stream stream = cuda::Stream::create(0);
  std::vector<float> out;
  {
    cuda::StreamGuard guard(stream);
    Tensor x = ones({6, 4}).to(Device::cuda(0));
    Tensor y = dp.forward(x);
    stream.synchronize();
    out = y.to(Device::cpu()).to_vector<float>();
  }
  EXPECT_EQ(out, std::vector<float>(24, 2.0f));
  ASSERT_EQ(probe->seen->streams.size(), 3u);
  for (void* s : probe->seen->streams) EXPECT_EQ(s, stream.handle());
}

}  // namespace
}  // namespace ringtrain::ddp

// reducer_lifetime_test.cc: what happens to a Reducer destroyed with a collective in flight.
//
// One process, its own one-rank group (file:// rendezvous) with a short collective timeout.
// A user communication hook whose Work never completes used to make the Reducer's
// destructor wait forever: destroying the DDP object (e.g. while an exception unwinds)
// hung the process. Now the destructor waits the group's timeout, then keeps the bucket's
// memory alive (so the collective cannot write freed memory), warns, and returns.
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <memory>
#include <string>

#include "autograd/functions.h"
#include "comm/init.h"
#include "ddp/distributed_data_parallel.h"
#include "nn/layers.h"
#include "tensor/ops.h"
#include "tests/common/expect_error.h"

namespace ringtrain::ddp {
namespace {

using ringtrain::testing::expect_error;
using Clock = std::chrono::steady_clock;

std::shared_ptr<comm::ProcessGroup> one_rank_group(std::chrono::milliseconds timeout) {
  const std::string file =
      (std::filesystem::temp_directory_path() / ("rt_reducer_lifetime_" + std::to_string(::getpid()))).string();
  std::filesystem::remove(file);
  comm::InitOptions options;
  options.init_method = "file://" + file;
  options.rank = 0;
  options.world_size = 1;
  options.group.timeout = timeout;
  auto group = comm::init_process_group(options);
  std::filesystem::remove(file);
  return group;
}

TEST(ReducerLifetime, AHookWorkThatNeverCompletesDoesNotHangTheDestructor) {
  const auto timeout = std::chrono::milliseconds(300);
  auto group = one_rank_group(timeout);
  Generator gen(5);
  auto model = nn::make<nn::Linear>(4, 3, true, gen);
  Tensor kept_weight_grad;
  ::testing::internal::CaptureStderr();
  const auto start = Clock::now();
  {
    DistributedDataParallel ddp(model, group);
    ddp.register_comm_hook([](comm::ProcessGroup&, Bucket&) -> CommHookResult {
      // A Work nobody will ever complete (a user's hook with a bug).
      return {comm::Work(std::make_shared<comm::WorkState>([] { return std::string("the stuck hook's work"); })),
              nullptr};
    });
    Tensor x = randn({2, 4}, gen);
    expect_error([&] { autograd::backward(ag::sum(ddp(x))); }, {"the stuck hook's work"});
  }  // ~DistributedDataParallel: must return
  const auto elapsed = Clock::now() - start;
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_LT(elapsed, std::chrono::seconds(10)) << "the destructor waited far past the group's timeout";
  EXPECT_NE(err.find("still running after the group's timeout"), std::string::npos) << err;
  EXPECT_NE(err.find("the stuck hook's work"), std::string::npos) << err;
  // The parameters' .grad are views of the kept buffer; they stay readable.
  for (const Tensor& p : model->parameters()) EXPECT_EQ(autograd::grad(p).numel(), p.numel());
}

// A hook whose collective failed: its Work counts as completed, but a backend may have
// left work queued that still writes the buffers (the CUDA IPC allreduce after a
// timeout), so the bucket and the hook's own state (its `finish` closure, which holds the
// compression hooks' wire buffer) outlive the DDP object.
TEST(ReducerLifetime, AFailedCollectiveKeepsTheBucketAndTheHooksStateAlive) {
  auto group = one_rank_group(std::chrono::milliseconds(300));
  Generator gen(6);
  auto model = nn::make<nn::Linear>(4, 3, true, gen);
  auto wire_buffer = std::make_shared<Tensor>(zeros({16}));  // stands in for a hook's own buffer
  std::weak_ptr<Tensor> wire_watch = wire_buffer;
  {
    DistributedDataParallel ddp(model, group);
    ddp.register_comm_hook([wire_buffer](comm::ProcessGroup&, Bucket&) -> CommHookResult {
      auto state = std::make_shared<comm::WorkState>([] { return std::string("the failing hook's work"); });
      state->mark_failed(std::make_exception_ptr(comm::CommError("the transport failed on purpose")));
      return {comm::Work(state), [wire_buffer] { (void)wire_buffer; }};
    });
    Tensor x = randn({2, 4}, gen);
    expect_error([&] { autograd::backward(ag::sum(ddp(x))); }, {"the transport failed on purpose"});
  }
  wire_buffer.reset();  // the hook registered with DDP held the other references
  EXPECT_FALSE(wire_watch.expired()) << "the hook's buffer was freed with the DDP object";
}

}  // namespace
}  // namespace ringtrain::ddp

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

// Three layers, one bucket per parameter: six buckets whose Work never completes.
std::shared_ptr<nn::Sequential> six_parameter_model(Generator& gen) {
  return nn::make<nn::Sequential>(std::vector<std::shared_ptr<nn::Module>>{
      nn::make<nn::Linear>(4, 5, true, gen), nn::make<nn::Linear>(5, 4, true, gen), nn::make<nn::Linear>(4, 3, true, gen)});
}
const DdpOptions kOneBucketPerParameter{.bucket_cap_bytes = 1, .first_bucket_bytes = 1};

TEST(ReducerLifetime, AHookWorkThatNeverCompletesDoesNotHangTheDestructor) {
  const auto timeout = std::chrono::milliseconds(500);
  auto group = one_rank_group(timeout);
  Generator gen(5);
  auto model = six_parameter_model(gen);
  ::testing::internal::CaptureStderr();
  Clock::time_point destroying;
  {
    DistributedDataParallel ddp(model, group, kOneBucketPerParameter);
    ddp.register_comm_hook([](comm::ProcessGroup&, Bucket&) -> CommHookResult {
      // A Work nobody will ever complete (a user's hook with a bug).
      return {comm::Work(std::make_shared<comm::WorkState>([] { return std::string("the stuck hook's work"); })),
              nullptr};
    });
    Tensor x = randn({2, 4}, gen);
    expect_error([&] { autograd::backward(ag::sum(ddp(x))); }, {"the stuck hook's work"});
    destroying = Clock::now();
  }  // ~DistributedDataParallel: must return
  const auto elapsed = Clock::now() - destroying;
  const std::string err = ::testing::internal::GetCapturedStderr();
  // One timeout for all six buckets (each bucket waiting a whole timeout took 3 s here).
  EXPECT_LT(elapsed, 3 * timeout) << "the destructor waited a timeout per bucket";
  EXPECT_NE(err.find("still running after the group's timeout"), std::string::npos) << err;
  EXPECT_NE(err.find("the stuck hook's work"), std::string::npos) << err;
  // The parameters' .grad are views of the kept buffers; they stay readable.
  for (const Tensor& p : model->parameters()) EXPECT_EQ(autograd::grad(p).numel(), p.numel());
}

// A hook whose collective failed: where the backend may still write the buffers after
// a failure (MPI cannot cancel a request; device copies may stay queued), the bucket and
// the hook's own state (its `finish` closure, which holds the compression hooks' wire
// buffer) outlive the DDP object; where nothing can (the ring backend's host buffers:
// its collective has returned), they are freed, not leaked once per failure.
TEST(ReducerLifetime, AFailedCollectivesBuffersAreKeptOnlyWhereSomethingMayStillWriteThem) {
  auto group = one_rank_group(std::chrono::milliseconds(300));
  EXPECT_FALSE(group->may_write_after_failure(Device::cpu()));   // ring, host memory
  EXPECT_TRUE(group->may_write_after_failure(Device::cuda(0)));  // queued device copies
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
  EXPECT_TRUE(wire_watch.expired()) << "host buffers of a failed ring collective were kept (leaked)";
}

}  // namespace
}  // namespace ringtrain::ddp

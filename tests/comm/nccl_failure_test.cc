// nccl_failure_test.cc: the nccl backend gives up instead of hanging, and can be
// aborted from another thread.
//
// What is checked (one GPU is enough; every case plays all members itself, in
// one process, with the store in-process):
//  * a member that never reaches NCCL's communicator creation: rank 0 of a group
//    of two fails with CommTimeoutError after the group's timeout, naming
//    ncclCommInitRankConfig, instead of waiting forever in ncclCommInitRank;
//  * a member that published an error before it got there: rank 0 fails within
//    about a second with PeerLostError quoting that member's message;
//  * ProcessGroup::abort() on another thread while the comm thread keeps
//    collectives in flight on the communicator: abort returns, every collective
//    after it fails with the abort's message, and the group shuts down. (NCCL
//    forbids two threads on one communicator at once; abort() used to call
//    ncclCommAbort while the comm thread polled the same communicator.)
// Without NCCL or a GPU every case skips with the reason.
//
// Label: cuda.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "comm/backends.h"
#include "comm/process_group.h"
#include "comm/store.h"
#include "tensor/cuda/runtime.h"
#include "tensor/storage.h"

namespace ringtrain::comm {
namespace {

using namespace std::chrono_literals;

constexpr const char* kToken = "nccl-failure-test";

class NcclFailure : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!nccl_is_built()) GTEST_SKIP() << "SKIP: this build has no NCCL";
    if (!cuda::is_available()) GTEST_SKIP() << "no usable GPU: " << cuda::unavailable_reason();
  }

  // Rank 0's context in a group of `size` whose store lives in this process. Not a
  // world group, so shutting it down waits for no other member.
  GroupContext rank0_context(int size, std::chrono::milliseconds timeout) {
    server_ = std::make_shared<StoreServer>("127.0.0.1", 0, kToken);
    GroupContext context;
    context.rank = 0;
    context.size = size;
    for (int r = 0; r < size; ++r) context.world_ranks.push_back(r);
    context.store = std::make_shared<Store>("127.0.0.1", server_->port(), kToken);
    context.prefix = "nccl-failure";
    context.token = kToken;
    context.options.timeout = timeout;
    context.options.cuda_device = 0;
    return context;
  }

  std::shared_ptr<StoreServer> server_;
};

template <typename Fn>
double seconds_taken(Fn&& fn) {
  const auto start = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

TEST_F(NcclFailure, InitGivesUpWhenAMemberNeverArrives) {
  GroupContext context = rank0_context(2, 3s);
  std::string message;
  const double took = seconds_taken([&] {
    try {
      make_nccl_process_group(context);
      ADD_FAILURE() << "a group of two was created with one member";
    } catch (const CommTimeoutError& e) {
      message = e.what();
    }
  });
  EXPECT_NE(message.find("ncclCommInitRankConfig"), std::string::npos) << message;
  EXPECT_NE(message.find("never reached it"), std::string::npos) << message;
  EXPECT_NE(message.find("RINGTRAIN_TIMEOUT_SEC"), std::string::npos) << message;
  EXPECT_GE(took, 2.5);
  EXPECT_LT(took, 20.0);
}

TEST_F(NcclFailure, InitFailsFastWhenAMemberPublishedAnError) {
  GroupContext context = rank0_context(2, 120s);
  // Rank 1 fails before creating its communicator and says why.
  std::thread rank1([port = server_->port()] {
    std::this_thread::sleep_for(300ms);
    Store store("127.0.0.1", port, kToken);
    publish_rank_error(store, 1, "exception", "rank 1 could not open its shard", -1);
  });
  std::string message;
  const double took = seconds_taken([&] {
    try {
      make_nccl_process_group(context);
      ADD_FAILURE() << "a group of two was created with one member";
    } catch (const PeerLostError& e) {
      message = e.what();
      EXPECT_EQ(e.rank(), 1);
    }
  });
  rank1.join();
  EXPECT_NE(message.find("rank 1 could not open its shard"), std::string::npos) << message;
  EXPECT_LT(took, 10.0) << "waited for the timeout instead of reading the member's error";
}

TEST_F(NcclFailure, AbortFromAnotherThreadWhileCollectivesAreInFlight) {
  auto group = make_nccl_process_group(rank0_context(1, 60s));
  constexpr size_t kCount = 1 << 16;
  DataPtr buffer = allocate_bytes(kCount * sizeof(float), Device::cuda(0));
  BufferRef ref{buffer.get(), kCount, DType::kFloat32, Device::cuda(0)};
  std::atomic<bool> stop{false};
  std::atomic<bool> issuer_done{false};
  std::atomic<int> completed{0};
  std::string first_failure;
  // The issuing thread keeps up to 8 allreduces queued on the comm thread.
  std::thread issuer([&] {
    std::vector<Work> in_flight;
    try {
      while (!stop.load()) {
        in_flight.push_back(group->allreduce(ref));
        if (in_flight.size() == 8) {
          in_flight.front().wait(30s);
          in_flight.erase(in_flight.begin());
          completed.fetch_add(1);
        }
      }
    } catch (const std::exception& e) {
      first_failure = e.what();
    }
    issuer_done = true;
  });
  const auto give_up = std::chrono::steady_clock::now() + 60s;
  while (completed.load() < 50 && !issuer_done.load() && std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(1ms);
  if (issuer_done.load() || completed.load() < 50) {
    stop = true;
    issuer.join();
    FAIL() << "the allreduces did not run before the abort: " << completed.load()
           << " completed; error: " << first_failure;
  }
  const double abort_took = seconds_taken([&] { group->abort("the test pulls the plug"); });
  std::this_thread::sleep_for(100ms);
  stop = true;
  issuer.join();
  EXPECT_LT(abort_took, 10.0);
  EXPECT_NE(first_failure.find("the test pulls the plug"), std::string::npos)
      << "the collectives in flight did not fail with the abort's reason: " << first_failure;
  EXPECT_TRUE(group->failed());
  try {
    group->allreduce(ref).wait(10s);
    ADD_FAILURE() << "a collective after abort() succeeded";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("the test pulls the plug"), std::string::npos) << e.what();
  }
  const double shutdown_took = seconds_taken([&] { group.reset(); });
  EXPECT_LT(shutdown_took, 40.0);
}

}  // namespace
}  // namespace ringtrain::comm

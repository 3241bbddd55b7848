// The Chrome-trace timeline (ddp/timeline.h) of a DDP step, on a one-rank file://
// group, so it runs without mpirun (the multi-rank drawing is checked in
// ddp_multirank_test's TimelineDrawsAWaitOnlyForABucketThatWaited).
#include "ddp/timeline.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "autograd/autograd.h"
#include "autograd/functions.h"
#include "comm/init.h"
#include "ddp/distributed_data_parallel.h"
#include "nn/layers.h"
#include "tensor/ops.h"

namespace ringtrain::ddp {
namespace {

// A step whose backward threw used to be written as if it were the last synced step: a
// backward of no length, the hooks that fired before the failure, and no buckets. Now
// write_chrome_trace refuses, naming why, and writes nothing; a finished step still draws.
TEST(TimelineTest, AStepThatThrewIsRefusedNotDrawnAsTheLastStep) {
  namespace fs = std::filesystem;
  const std::string stem = (fs::temp_directory_path() / ("rt_timeline_" + std::to_string(::getpid()))).string();
  fs::remove(stem);
  comm::InitOptions options;
  options.init_method = "file://" + stem;
  options.rank = 0;
  options.world_size = 1;
  auto group = comm::init_process_group(options);
  fs::remove(stem);
  Generator gen(31);
  auto model = nn::make<nn::Sequential>();  // 4 parameters, one bucket each
  model->push_back(nn::make<nn::Linear>(6, 16, true, gen));
  model->push_back(nn::make<nn::ReLU>());
  model->push_back(nn::make<nn::Linear>(16, 3, true, gen));
  DistributedDataParallel ddp(model, group, DdpOptions{.bucket_cap_bytes = 1, .first_bucket_bytes = 1});
  Tensor x = randn({4, 6}, default_generator());
  const std::string path = stem + ".json";
  auto count_events = [&](const char* phase, const std::string& name_prefix = "") {
    nlohmann::json trace = nlohmann::json::parse(std::ifstream(path));
    int n = 0;
    for (const auto& event : trace.at("traceEvents"))
      n += event.at("ph") == phase && event.at("name").get<std::string>().rfind(name_prefix, 0) == 0;
    return n;
  };

  autograd::backward(ag::sum(ddp(x)));
  write_chrome_trace(path, ddp.reducer(), 1.0, 0);
  EXPECT_EQ(count_events("i"), 4);  // one instant per gradient
  EXPECT_EQ(count_events("X", "allreduce bucket"), 4);
  EXPECT_EQ(count_events("X", "backward"), 1);
  fs::remove(path);

  ddp.register_comm_hook([](comm::ProcessGroup&, Bucket&) -> CommHookResult {
    throw Error("the hook failed on purpose");
  });
  EXPECT_THROW(autograd::backward(ag::sum(ddp(x))), Error);
  try {
    write_chrome_trace(path, ddp.reducer(), 1.0, 0);
    ADD_FAILURE() << "the step that threw was drawn: " << count_events("X", "allreduce bucket")
                  << " bucket spans, " << count_events("i") << " gradient instants";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("no finished synced step"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(path));
  fs::remove(path);
}

}  // namespace
}  // namespace ringtrain::ddp

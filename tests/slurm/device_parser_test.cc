// device_parser_test.cc: Lightning's `gpus`/`devices` spellings, as a table.
#include "slurm/device_parser.h"

#include <ostream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "slurm/subprocess.h"
#include "tensor/cuda/runtime.h"

namespace ringtrain::slurm {
namespace {

struct Case {
  std::string spec;
  int available;
  std::vector<int> expected;  // empty: CPU
};

// gtest prints a parameter it cannot format as its raw bytes, pointers included, and CMake's
// gtest_discover_tests would put those bytes into the test name (a different name every run).
// So both tables print their rows, and the tests are named after them: Parses/'1,3' with 4 GPUs.
void PrintTo(const Case& c, std::ostream* os) { *os << "'" << c.spec << "' with " << c.available << " GPUs"; }


class DeviceParseOk : public ::testing::TestWithParam<Case> {};

TEST_P(DeviceParseOk, Parses) {
  const Case& c = GetParam();
  DeviceSelection selection = parse_devices(c.spec, c.available);
  EXPECT_EQ(selection.cuda_devices, c.expected) << "spec '" << c.spec << "' with " << c.available << " GPUs";
  EXPECT_EQ(selection.is_cpu(), c.expected.empty());
}

INSTANTIATE_TEST_SUITE_P(
    Table, DeviceParseOk,
    ::testing::Values(
        // CPU spellings
        Case{"0", 4, {}}, Case{"", 4, {}}, Case{"None", 4, {}}, Case{"none", 0, {}}, Case{"cpu", 2, {}},
        Case{"[]", 2, {}}, Case{"  0 ", 0, {}},
        // a count: the first N
        Case{"1", 4, {0}}, Case{"2", 4, {0, 1}}, Case{"4", 4, {0, 1, 2, 3}},
        // all
        Case{"-1", 3, {0, 1, 2}}, Case{"auto", 2, {0, 1}}, Case{"AUTO", 0, {}},
        // lists: a comma or brackets make a list of indices
        Case{"0,1", 4, {0, 1}}, Case{"1,3", 4, {1, 3}}, Case{"1,", 4, {1}}, Case{"3, 2", 4, {3, 2}},
        Case{"[0, 1]", 2, {0, 1}}, Case{"[1]", 2, {1}}, Case{"(0,1)", 2, {0, 1}}));

struct BadCase {
  std::string spec;
  int available;
  std::string needle;  // the message must contain it
};

void PrintTo(const BadCase& c, std::ostream* os) { *os << "'" << c.spec << "' with " << c.available << " GPUs"; }

class DeviceParseError : public ::testing::TestWithParam<BadCase> {};

TEST_P(DeviceParseError, ExplainsTheProblem) {
  const BadCase& c = GetParam();
  try {
    DeviceSelection selection = parse_devices(c.spec, c.available);
    FAIL() << "spec '" << c.spec << "' parsed as " << selection.describe();
  } catch (const SlurmError& e) {
    EXPECT_NE(std::string(e.what()).find(c.needle), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Table, DeviceParseError,
    ::testing::Values(BadCase{"3", 2, "this machine has 2 GPUs (indices 0-1)"},
                      BadCase{"1", 0, "no usable GPU"},
                      BadCase{"-1", 0, "devices=-1 asks for every GPU"},
                      BadCase{"-2", 4, "-1 for all GPUs"},
                      BadCase{"0,5", 2, "GPU index 5"},
                      BadCase{"1,1", 2, "appears twice"},
                      BadCase{"[0, 1", 2, "unbalanced brackets"},
                      BadCase{"two", 2, "'two' is not an integer"},
                      BadCase{"0,x", 2, "'x' is not an integer"},
                      BadCase{"1.5", 2, "not an integer"}));

TEST(DeviceParser, IntOverloadMatchesLightning) {
  EXPECT_TRUE(parse_devices(0, 8).is_cpu());
  EXPECT_EQ(parse_devices(2, 8).cuda_devices, (std::vector<int>{0, 1}));
  EXPECT_EQ(parse_devices(-1, 2).cuda_devices, (std::vector<int>{0, 1}));
  EXPECT_EQ(parse_device_list({2, 0}, 4).cuda_devices, (std::vector<int>{2, 0}));
  EXPECT_TRUE(parse_device_list({}, 4).is_cpu());
  EXPECT_THROW(parse_device_list({-1}, 4), SlurmError);
}

// DDP: one process per selected GPU on each node, or an error naming both counts.
TEST(DeviceParser, DdpNeedsOneProcessPerGpuOnEachNode) {
  const DeviceSelection two = parse_devices("[2, 3]", 4);
  EXPECT_EQ(ddp_device_for_local_rank(two, 0, 2), 2);
  EXPECT_EQ(ddp_device_for_local_rank(two, 1, 2), 3);
  auto error_of = [](auto f) {
    try {
      f();
    } catch (const SlurmError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string one = error_of([&] { ddp_device_for_local_rank(parse_devices("4", 4), 0, 1); });
  EXPECT_NE(one.find("needs 4 process(es) on this node, one per GPU, but the launcher started 1"), std::string::npos)
      << one;
  EXPECT_NE(one.find("--nproc-per-node 4"), std::string::npos) << one;
  EXPECT_NE(one.find("strategy dp"), std::string::npos) << one;
  const std::string four = error_of([&] { ddp_device_for_local_rank(two, 3, 4); });
  EXPECT_NE(four.find("started 4"), std::string::npos) << four;
  EXPECT_EQ(four.find("--gpus-per-task"), std::string::npos) << four;
  // Every process sees one GPU: SLURM may have bound one to each task; say what to ask for.
  const std::string bound = error_of([&] { ddp_device_for_local_rank(parse_devices("auto", 1), 2, 4); });
  EXPECT_NE(bound.find("started 4"), std::string::npos) << bound;
  EXPECT_NE(bound.find("--gpus-per-task=1"), std::string::npos) << bound;
  EXPECT_NE(bound.find("--gres=gpu:4 or --gpus-per-node=4"), std::string::npos) << bound;
  EXPECT_NE(error_of([] { ddp_device_for_local_rank(DeviceSelection{}, 0, 1); }), "no error");
}

TEST(DeviceParser, Describe) {
  EXPECT_EQ(parse_devices("cpu", 2).describe(), "cpu");
  EXPECT_EQ(parse_devices("1,0", 2).describe(), "cuda:1,0");
}

TEST(DeviceParser, RuntimeOverloadAgreesWithTheRuntime) {
  // Whatever this machine has: "auto" is every GPU the CUDA runtime reports, or the CPU.
  const int gpus = cuda::device_count();
  DeviceSelection selection = parse_devices("auto");
  EXPECT_EQ(static_cast<int>(selection.cuda_devices.size()), gpus);
  if (gpus == 0) EXPECT_THROW(parse_devices("1"), SlurmError);
}

}  // namespace
}  // namespace ringtrain::slurm

// device_parser_test.cc: Lightning's `gpus`/`devices` spellings, as a table.
#include "slurm/device_parser.h"

#include <functional>
#include <ostream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "slurm/cluster_environment.h"
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

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const SlurmError& e) {
    return e.what();
  }
  return "no error";
}

// Local task `localid` of `srun -N2 --ntasks-per-node=<per_node> [--gpus-per-task=<k>]` on
// two nodes, with the variables srun(1) documents for it: SLURM_GPUS_PER_TASK only with
// --gpus-per-task, and CUDA_VISIBLE_DEVICES per task ("0": with ConstrainDevices every
// task's GPU is its device 0). Not captured on a GPU cluster (there is none here); the
// task variables around them are the local cluster's (cluster_environment_test.cc).
comm::EnvMap srun_gpu_task(int localid, int per_node, const std::string& gpus_per_task) {
  const int procid = per_node + localid;  // on the second node
  comm::EnvMap env = {{"SLURM_JOB_ID", "77"},
                      {"SLURM_JOB_NODELIST", "gpu[1-2]"},
                      {"SLURM_STEP_NODELIST", "gpu[1-2]"},
                      {"SLURM_NNODES", "2"},
                      {"SLURM_NTASKS", std::to_string(2 * per_node)},
                      {"SLURM_TASKS_PER_NODE", std::to_string(per_node) + "(x2)"},
                      {"SLURM_STEP_TASKS_PER_NODE", std::to_string(per_node) + "(x2)"},
                      {"SLURM_STEP_ID", "0"},
                      {"SLURM_PROCID", std::to_string(procid)},
                      {"SLURM_LOCALID", std::to_string(localid)},
                      {"SLURM_NODEID", "1"},
                      {"CUDA_VISIBLE_DEVICES", "0"}};
  if (!gpus_per_task.empty()) env["SLURM_GPUS_PER_TASK"] = gpus_per_task;
  return env;
}

// srun --gpus-per-task=1: every task sees one GPU, its own; DDP trains each process on
// it (it used to refuse, unable to tell this from four processes sharing one GPU).
// Without SLURM_GPUS_PER_TASK nothing says the GPU is the task's own: still refused.
TEST(DeviceParser, SrunGpusPerTaskGivesEveryTaskItsOwnGpu) {
  for (int localid = 0; localid < 4; ++localid) {
    const ClusterEnvironment env = detect_cluster_environment(srun_gpu_task(localid, 4, "1"));
    ASSERT_EQ(env.launcher, Launcher::kSlurm);
    EXPECT_EQ(env.gpus_per_task, 1);
    EXPECT_EQ(env.local_rank, localid);
    EXPECT_EQ(env.local_world_size, 4);
    EXPECT_NE(env.describe().find("gpus-per-task 1"), std::string::npos) << env.describe();
    const int visible = 1;
    for (const char* devices : {"auto", "1", "-1", "0,", "[0]"}) {
      EXPECT_EQ(ddp_device_for_local_rank(parse_devices(devices, visible), env.local_rank, env.local_world_size,
                                          env.gpus_per_task, visible),
                0)
          << devices << " local rank " << localid;
    }
  }
  const ClusterEnvironment shared = detect_cluster_environment(srun_gpu_task(2, 4, ""));
  EXPECT_EQ(shared.gpus_per_task, 0);
  const std::string refused = error_of([&] {
    ddp_device_for_local_rank(parse_devices("auto", 1), shared.local_rank, shared.local_world_size,
                              shared.gpus_per_task, 1);
  });
  EXPECT_NE(refused.find("started 4"), std::string::npos) << refused;
  EXPECT_NE(refused.find("launch with srun --gpus-per-task=1"), std::string::npos) << refused;
  EXPECT_NE(refused.find("would share one GPU"), std::string::npos) << refused;
  EXPECT_NE(refused.find("--gres=gpu:4 or --gpus-per-node=4"), std::string::npos) << refused;
}

// --gpus-per-task=2 with 2 tasks per node: each task sees its own 2 GPUs. The local rank
// does not index them (local rank 1 took its own second GPU, leaving its first and the
// other task's second idle). One GPU per process is chosen explicitly, or it is an error
// that names the launches that use every GPU.
TEST(DeviceParser, SrunGpusPerTaskAboveOneNeedsOneGpuChosen) {
  const ClusterEnvironment env = detect_cluster_environment(srun_gpu_task(1, 2, "a100:2"));
  EXPECT_EQ(env.gpus_per_task, 2);
  const std::string idle = error_of([&] {
    ddp_device_for_local_rank(parse_devices("auto", 2), env.local_rank, env.local_world_size, env.gpus_per_task, 2);
  });
  EXPECT_NE(idle.find("srun --gpus-per-task=2 gave this process 2 GPUs of its own"), std::string::npos) << idle;
  EXPECT_NE(idle.find("1 would idle"), std::string::npos) << idle;
  EXPECT_NE(idle.find("--gpus-per-task=1"), std::string::npos) << idle;
  EXPECT_NE(idle.find("strategy ddp2"), std::string::npos) << idle;
  EXPECT_EQ(ddp_device_for_local_rank(parse_devices("1", 2), env.local_rank, env.local_world_size, 2, 2), 0);
  EXPECT_EQ(ddp_device_for_local_rank(parse_devices("1,", 2), env.local_rank, env.local_world_size, 2, 2), 1);
}

// SLURM_GPUS_PER_TASK without per-task binding: --gpu-bind=none (every task sees the
// node's GPUs: the local rank picks one, as with --gres), the batch shell, and the
// processes torchrun starts inside one srun task (they share the task's GPUs).
TEST(DeviceParser, SrunGpusPerTaskWithoutBindingUsesTheLocalRank) {
  const ClusterEnvironment env = detect_cluster_environment(srun_gpu_task(3, 4, "1"));
  EXPECT_EQ(ddp_device_for_local_rank(parse_devices("auto", 4), env.local_rank, env.local_world_size, 1, 4), 3);
  const std::string odd = error_of([&] {
    ddp_device_for_local_rank(parse_devices("auto", 2), env.local_rank, env.local_world_size, 1, 2);
  });
  EXPECT_NE(odd.find("this process sees 2 GPU(s), not GPUs of its own"), std::string::npos) << odd;

  comm::EnvMap batch = srun_gpu_task(0, 4, "1");
  batch.erase("SLURM_STEP_ID");
  EXPECT_EQ(detect_cluster_environment(batch).gpus_per_task, 0);
  comm::EnvMap torchrun = srun_gpu_task(0, 1, "4");
  torchrun.insert({{"MASTER_ADDR", "gpu1"}, {"MASTER_PORT", "29500"}, {"RANK", "5"}, {"WORLD_SIZE", "8"},
                   {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"}});
  const ClusterEnvironment inside = detect_cluster_environment(torchrun);
  EXPECT_EQ(inside.launcher, Launcher::kTorchrun);
  EXPECT_EQ(inside.gpus_per_task, 0);
}

// ddp2 runs DataParallel over every selected GPU in each process: four processes on a
// node with --gres=gpu:4 all drove GPUs 0-3 (four master copies on GPU 0). One process
// per node, or tasks with GPUs of their own, or the CPU.
TEST(DeviceParser, Ddp2NeedsOneProcessPerNodeOrGpusOfItsOwn) {
  const std::string shared = error_of([] { check_ddp2_devices(parse_devices("auto", 4), 4); });
  EXPECT_NE(shared.find("devices=cuda:0,1,2,3 with strategy ddp2"), std::string::npos) << shared;
  EXPECT_NE(shared.find("started 4 processes on this node, so they would all share them"), std::string::npos)
      << shared;
  EXPECT_NE(shared.find("--ntasks-per-node=1"), std::string::npos) << shared;
  EXPECT_NE(shared.find("--gpus-per-task=k"), std::string::npos) << shared;
  EXPECT_NE(shared.find("strategy ddp (one process per GPU)"), std::string::npos) << shared;
  EXPECT_EQ(error_of([] { check_ddp2_devices(parse_devices("auto", 4), 1); }), "no error");
  EXPECT_EQ(error_of([] { check_ddp2_devices(parse_devices("cpu", 4), 4); }), "no error");
  // srun --gpus-per-task=2, 2 tasks per node: each drives its own 2
  const ClusterEnvironment env = detect_cluster_environment(srun_gpu_task(0, 2, "2"));
  EXPECT_EQ(error_of([&] { check_ddp2_devices(parse_devices("auto", 2), env.local_world_size, env.gpus_per_task, 2); }),
            "no error");
  EXPECT_NE(error_of([&] { check_ddp2_devices(parse_devices("auto", 4), env.local_world_size, env.gpus_per_task, 4); }),
            "no error");  // --gpu-bind=none: the node's 4 GPUs, shared
}

// strategy none trained on the first of several selected GPUs, silently leaving the others idle.
TEST(DeviceParser, StrategyNoneRefusesMoreThanOneGpu) {
  const std::string two = error_of([] { check_single_device_strategy(parse_devices("2", 4)); });
  EXPECT_NE(two.find("devices=cuda:0,1 selects 2 GPUs, but strategy none trains on one device"), std::string::npos)
      << two;
  EXPECT_NE(two.find("strategy dp"), std::string::npos) << two;
  EXPECT_NE(two.find("--nproc-per-node 2"), std::string::npos) << two;
  EXPECT_NE(two.find("devices=1"), std::string::npos) << two;
  EXPECT_EQ(error_of([] { check_single_device_strategy(parse_devices("1", 4)); }), "no error");
  EXPECT_EQ(error_of([] { check_single_device_strategy(parse_devices("cpu", 4)); }), "no error");
}

TEST(DeviceParser, MalformedGpusPerTaskIsNamed) {
  for (const char* bad : {"x", "gpu:", "0", "1,x", "2,"}) {
    const std::string error = error_of([&] { detect_cluster_environment(srun_gpu_task(0, 1, bad)); });
    EXPECT_NE(error.find("SLURM_GPUS_PER_TASK='"), std::string::npos) << bad << ": " << error;
    EXPECT_NE(error.find("--gpus-per-task=N"), std::string::npos) << bad << ": " << error;
  }
  EXPECT_EQ(detect_cluster_environment(srun_gpu_task(0, 1, "a100:1,v100:1")).gpus_per_task, 2);
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

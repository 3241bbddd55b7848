// Single-process tests of launch-environment parsing: the exact variables that
// ringrun/torchrun, srun and mpirun set, and the errors for bad ones.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>
#include <functional>
#include <set>
#include <string>

#include "comm/launch_env.h"
#include "comm/reduce.h"
#include "comm/types.h"

namespace ringtrain::comm {
namespace {

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const std::exception& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Nodelist, ExpandsRangesListsAndPadding) {
  EXPECT_EQ(expand_nodelist("node[1-3,7]"),
            (std::vector<std::string>{"node1", "node2", "node3", "node7"}));
  EXPECT_EQ(expand_nodelist("gpu[08-10],login01"),
            (std::vector<std::string>{"gpu08", "gpu09", "gpu10", "login01"}));
  EXPECT_EQ(expand_nodelist("a[1-2]-ib,b"), (std::vector<std::string>{"a1-ib", "a2-ib", "b"}));
  EXPECT_EQ(expand_nodelist("single"), (std::vector<std::string>{"single"}));
}

TEST(Nodelist, RejectsMalformed) {
  for (const char* bad : {"node[1-3", "node[]", "node[3-1]", "node[a-b]", ",", "n[1]x[2]"}) {
    EXPECT_NE(error_of([&] { expand_nodelist(bad); }).find("cannot parse node list"), std::string::npos)
        << bad;
  }
}

TEST(TasksPerNode, Expands) {
  EXPECT_EQ(expand_tasks_per_node("2(x3),1"), (std::vector<int>{2, 2, 2, 1}));
  EXPECT_EQ(expand_tasks_per_node("4"), (std::vector<int>{4}));
}

EnvMap torchrun_env() {
  return {{"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29500"}, {"WORLD_SIZE", "8"},
          {"RANK", "5"},               {"LOCAL_RANK", "1"},      {"LOCAL_WORLD_SIZE", "4"},
          {"GROUP_RANK", "1"}};
}

TEST(EnvMethod, ReadsTorchrunVariables) {
  LaunchInfo info = parse_env_method(torchrun_env());
  EXPECT_EQ(info.method, "env");
  EXPECT_EQ(info.master_addr, "10.0.0.1");
  EXPECT_EQ(info.master_port, 29500);
  EXPECT_EQ(info.world_size, 8);
  EXPECT_EQ(info.rank, 5);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.local_world_size, 4);
  EXPECT_EQ(info.node_rank, 1);
  EXPECT_FALSE(info.token.empty());
}

// The derived token keeps jobs on different ports, or of different sizes, apart, but
// not ranks that name the same master differently.
TEST(EnvMethod, DerivedTokenIgnoresHowTheMasterIsNamed) {
  EnvMap env = torchrun_env();
  const std::string token = parse_env_method(env).token;
  env["MASTER_ADDR"] = "node1.cluster";
  EXPECT_EQ(parse_env_method(env).token, token);
  env["MASTER_PORT"] = "29501";
  EXPECT_NE(parse_env_method(env).token, token);
  env["MASTER_PORT"] = "29500";
  env["WORLD_SIZE"] = "16";
  EXPECT_NE(parse_env_method(env).token, token);
  EXPECT_EQ(parse_url_method("tcp://localhost:29500", env, 0, 4).token,
            parse_url_method("tcp://[::1]:29500", env, 0, 4).token);
}

// Under torchrun's agent store the port is torchrun's: named at once, with what to do,
// instead of "port in use, set MASTER_PORT to a free port".
TEST(EnvMethod, TorchrunsAgentStoreIsNamedNotMistakenForABusyPort) {
  EnvMap env = torchrun_env();
  env["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  const std::string error = error_of([&] { parse_env_method(env); });
  EXPECT_NE(error.find("TORCHELASTIC_USE_AGENT_STORE=True"), std::string::npos) << error;
  EXPECT_NE(error.find("ringrun"), std::string::npos) << error;
  env["TORCHELASTIC_USE_AGENT_STORE"] = "False";  // the agent left MASTER_PORT to the workers
  EXPECT_EQ(parse_env_method(env).master_port, 29500);
}

TEST(EnvMethod, ErrorsNameTheVariable) {
  EnvMap env = torchrun_env();
  env.erase("MASTER_ADDR");
  EXPECT_NE(error_of([&] { parse_env_method(env); }).find("MASTER_ADDR is not set"), std::string::npos);
  env = torchrun_env();
  env["RANK"] = "five";
  EXPECT_NE(error_of([&] { parse_env_method(env); }).find("RANK='five'"), std::string::npos);
  env = torchrun_env();
  env["RANK"] = "8";
  EXPECT_NE(error_of([&] { parse_env_method(env); }).find("RANK=8 is not below WORLD_SIZE=8"),
            std::string::npos);
  env = torchrun_env();
  env["MASTER_PORT"] = "70000";
  EXPECT_NE(error_of([&] { parse_env_method(env); }).find("MASTER_PORT='70000'"), std::string::npos);
}

EnvMap srun_env() {
  return {{"SLURM_PROCID", "3"},       {"SLURM_NTASKS", "4"},
          {"SLURM_LOCALID", "1"},      {"SLURM_NODEID", "1"},
          {"SLURM_JOB_NODELIST", "node[1-3,7]"}, {"SLURM_JOB_ID", "123456"},
          {"SLURM_TASKS_PER_NODE", "2(x2)"},     {"SLURM_STEP_ID", "0"}};
}

TEST(SlurmMethod, MasterIsFirstNodeAndPortFromJobId) {
  LaunchInfo info = parse_slurm_method(srun_env());
  EXPECT_EQ(info.method, "slurm");
  EXPECT_EQ(info.rank, 3);
  EXPECT_EQ(info.world_size, 4);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.local_world_size, 2);
  EXPECT_EQ(info.node_rank, 1);
  EXPECT_EQ(info.master_addr, "node1");
  EXPECT_EQ(info.master_port, 15000 + 3456);
}

// A step on part of the allocation (srun -N1 -w node3 in a 4-node job): its store is on the
// step's first node, and a second step running at the same time gets another port.
TEST(SlurmMethod, StepNodesAndStepIdDecideTheMaster) {
  EnvMap env = srun_env();
  env["SLURM_STEP_NODELIST"] = "node[3,7]";
  env["SLURM_STEP_TASKS_PER_NODE"] = "2,1";
  env["SLURM_STEP_ID"] = "2";
  env["SLURM_NODEID"] = "1";
  env["SLURM_LOCALID"] = "0";
  LaunchInfo info = parse_slurm_method(env);
  EXPECT_EQ(info.master_addr, "node3");
  EXPECT_EQ(info.master_port, 25000 + 456 * 7 + 1);  // job 123456, step 2
  EXPECT_EQ(info.local_world_size, 1);  // node 1 of the step runs 1 task
  env["SLURM_JOB_ID"] = "129999";
  env["SLURM_STEP_ID"] = "1";
  EXPECT_EQ(parse_slurm_method(env).master_port, 25000 + 999 * 7);
  env["SLURM_STEP_ID"] = "0";
  EXPECT_EQ(parse_slurm_method(env).master_port, 15000 + 9999);
}

// Steps of one job, and the next jobs' steps (likely to share the first node at the same
// time), never share a port: "+ step id" gave step 1 of job J the port of job J+1's step 0.
TEST(SlurmMethod, DerivedPortsOfNeighbouringJobsAndStepsDiffer) {
  for (long long job : {0LL, 999LL, 1000LL, 123456LL, 129999LL, 4294967295LL}) {
    std::set<int> ports;
    for (long long j = job; j < job + 50; ++j) {
      for (long long step = 0; step < 7; ++step) {
        const int port = slurm_derived_port(j, step);
        EXPECT_TRUE(ports.insert(port).second) << "job " << j << " step " << step << " port " << port;
        EXPECT_GE(port, 15000);
        EXPECT_LT(port, 32768) << "inside Linux's ephemeral port range";
      }
    }
  }
}

TEST(SlurmMethod, MasterPortAndAddrOverride) {
  EnvMap env = srun_env();
  env["MASTER_PORT"] = "40000";
  env["MASTER_ADDR"] = "head";
  LaunchInfo info = parse_slurm_method(env);
  EXPECT_EQ(info.master_port, 40000);
  EXPECT_EQ(info.master_addr, "head");
}

TEST(SlurmMethod, BadJobIdSaysSetMasterPort) {
  EnvMap env = srun_env();
  env["SLURM_JOB_ID"] = "x";
  EXPECT_NE(error_of([&] { parse_slurm_method(env); }).find("set MASTER_PORT"), std::string::npos);
}

TEST(MpiMethod, ReadsOpenMpiVariables) {
  EnvMap env{{"OMPI_COMM_WORLD_RANK", "2"}, {"OMPI_COMM_WORLD_SIZE", "4"},
             {"OMPI_COMM_WORLD_LOCAL_RANK", "0"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}};
  LaunchInfo info = parse_mpi_method(env);
  EXPECT_EQ(info.rank, 2);
  EXPECT_EQ(info.world_size, 4);
  EXPECT_EQ(info.local_world_size, 2);
  EXPECT_EQ(info.node_rank, 1);
  EXPECT_NE(error_of([] { parse_mpi_method({}); }).find("mpirun"), std::string::npos);
}

TEST(UrlMethods, TcpAndFile) {
  LaunchInfo tcp = resolve_launch("tcp://127.0.0.1:4567", {}, 1, 3);
  EXPECT_EQ(tcp.method, "tcp");
  EXPECT_EQ(tcp.master_addr, "127.0.0.1");
  EXPECT_EQ(tcp.master_port, 4567);
  EXPECT_EQ(tcp.rank, 1);
  LaunchInfo file = resolve_launch("file:///tmp/rdv", {{"RANK", "0"}, {"WORLD_SIZE", "2"}});
  EXPECT_EQ(file.method, "file");
  EXPECT_EQ(file.file_path, "/tmp/rdv");
  EXPECT_EQ(file.world_size, 2);
  EXPECT_NE(error_of([] { resolve_launch("tcp://host", {}, 0, 1); }).find("tcp://host:port"), std::string::npos);
  // IPv6: in brackets, as in any URL; bare, the colons make host and port ambiguous
  LaunchInfo tcp6 = resolve_launch("tcp://[fd00::2]:4567", {}, 0, 2);
  EXPECT_EQ(tcp6.master_addr, "fd00::2");
  EXPECT_EQ(tcp6.master_port, 4567);
  EXPECT_NE(error_of([] { resolve_launch("tcp://fd00::2:4567", {}, 0, 2); }).find("tcp://[fd00::2]:29500"),
            std::string::npos);
  EXPECT_NE(error_of([] { resolve_launch("tcp://h:1", {}, -1, -1); }).find("world size is unknown"), std::string::npos);
  EXPECT_NE(error_of([] { resolve_launch("file://relative", {}, 0, 1); }).find("absolute"), std::string::npos);
  EXPECT_NE(error_of([] { resolve_launch("bogus://", {}, 0, 1); }).find("is not one of"), std::string::npos);
  // 'single' is rank 0 of 1: a rank or world size given with it was silently dropped
  EXPECT_NE(error_of([] { resolve_launch("single", {}, 3, 2); }).find("is one process"), std::string::npos);
  EXPECT_EQ(resolve_launch("single", {}, -1, -1).method, "single");
}

// A step on part of an allocation made with --ntasks-per-node=4 (srun -n 2 inside it):
// the job's SLURM_NTASKS_PER_NODE is still in the step's environment, but the step runs
// 2 tasks on the node; its own layout decides.
TEST(SlurmMethod, TheStepsLayoutWinsOverTheJobsTasksPerNode) {
  EnvMap env = srun_env();
  env["SLURM_PROCID"] = "1";
  env["SLURM_NTASKS"] = "2";
  env["SLURM_LOCALID"] = "1";
  env["SLURM_NODEID"] = "0";
  env["SLURM_NTASKS_PER_NODE"] = "4";
  env["SLURM_TASKS_PER_NODE"] = "4(x2)";
  env["SLURM_STEP_TASKS_PER_NODE"] = "2";
  EXPECT_EQ(parse_slurm_method(env).local_world_size, 2);
  env.erase("SLURM_STEP_TASKS_PER_NODE");  // (no step layout: the job's count)
  EXPECT_EQ(parse_slurm_method(env).local_world_size, 4);
}

// Without LOCAL_RANK, a rank's local rank is its place on its node (rank % local world
// size, as launchers number them), not its global rank ("LOCAL_RANK=1 is not below
// LOCAL_WORLD_SIZE=1" for a hand launch that set only LOCAL_WORLD_SIZE).
TEST(EnvMethod, WithoutLocalRankRanksFillTheNodesInOrder) {
  EnvMap env = {{"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29500"}, {"WORLD_SIZE", "4"}, {"RANK", "3"},
                {"LOCAL_WORLD_SIZE", "2"}};
  LaunchInfo info = parse_env_method(env);
  EXPECT_EQ(info.local_rank, 1);
  EXPECT_EQ(info.node_rank, 1);
  EXPECT_EQ(resolve_launch("tcp://h:1", {{"LOCAL_WORLD_SIZE", "1"}}, 1, 2).local_rank, 0);
}

// RINGTRAIN_INIT_METHOD=auto asks for detection (it was taken for a URL: "auto: the world
// size is unknown"); a mistyped URL is named as such, not as a missing world size.
TEST(Detection, AutoInTheVariableDetectsAndATypoIsNamed) {
  EXPECT_EQ(resolve_launch("auto", {{"RINGTRAIN_INIT_METHOD", "auto"}}).method, "single");
  EXPECT_EQ(resolve_launch("", {{"RINGTRAIN_INIT_METHOD", ""}}).method, "single");
  for (const char* typo : {"tcp:/127.0.0.1:29571", "envv"}) {
    const std::string message = error_of([&] { resolve_launch(typo, {{"RANK", "0"}, {"WORLD_SIZE", "2"}}); });
    EXPECT_NE(message.find("is not one of env://"), std::string::npos) << typo << ": " << message;
    EXPECT_EQ(error_of([&] { resolve_launch(typo, {}); }), message) << "the world size was asked for first";
  }
}

TEST(Detection, DocumentedOrder) {
  EXPECT_EQ(detect_init_method({}), "single");
  EnvMap env = srun_env();
  EXPECT_EQ(detect_init_method(env), "slurm://");
  EnvMap batch_shell = env;  // sbatch's script: SLURM_PROCID=0, SLURM_NTASKS=4, no step
  batch_shell.erase("SLURM_STEP_ID");
  batch_shell["SLURM_PROCID"] = "0";
  EXPECT_EQ(detect_init_method(batch_shell), "single");
  batch_shell["SLURM_STEPID"] = "0";  // the older spelling counts as a step too
  EXPECT_EQ(detect_init_method(batch_shell), "slurm://");
  // Started by hand without MASTER_ADDR: env://, whose parser names the missing variable,
  // not N separate single-process runs.
  EXPECT_EQ(detect_init_method({{"RANK", "1"}, {"WORLD_SIZE", "2"}}), "env://");
  EXPECT_EQ(detect_init_method({{"WORLD_SIZE", "2"}}), "env://");
  EXPECT_EQ(detect_init_method({{"RANK", "0"}, {"WORLD_SIZE", "1"}}), "single");
  EXPECT_NE(error_of([] { resolve_launch("auto", {{"RANK", "1"}, {"WORLD_SIZE", "2"}}, -1, -1); })
                .find("MASTER_ADDR"),
            std::string::npos);
  // srun on a cluster whose MpiDefault is pmi2 or pmix: the PMI numbers are srun's own
  EnvMap pmi2 = srun_env();
  pmi2.insert({{"PMI_SIZE", "4"}, {"PMI_RANK", "3"}});
  EXPECT_EQ(detect_init_method(pmi2), "slurm://");
  EnvMap pmix = srun_env();
  pmix["PMIX_RANK"] = "3";
  EXPECT_EQ(detect_init_method(pmix), "slurm://");
  // MPICH's mpiexec inside an allocation: one srun task per node, its own PMI numbers
  EnvMap hydra = srun_env();
  hydra.insert({{"PMI_SIZE", "8"}, {"PMI_RANK", "6"}});
  EXPECT_EQ(detect_init_method(hydra), "mpi://");
  pmix["PMIX_RANK"] = "5";
  EXPECT_EQ(detect_init_method(pmix), "mpi://");
  EXPECT_EQ(detect_init_method({{"PMIX_RANK", "1"}}), "mpi://");  // no srun task: an MPI launcher
  env["OMPI_COMM_WORLD_SIZE"] = "2";  // mpirun inside an allocation: mpi wins over slurm
  EXPECT_EQ(detect_init_method(env), "mpi://");
  env.insert({{"MASTER_ADDR", "h"}, {"RANK", "0"}, {"WORLD_SIZE", "2"}});  // torchrun/ringrun wins
  EXPECT_EQ(detect_init_method(env), "env://");
  env["RINGTRAIN_INIT_METHOD"] = "file:///x";  // an explicit choice wins over everything
  EXPECT_EQ(detect_init_method(env), "file:///x");
}

TEST(EnvSize, FallbackNumberOrAnErrorNamingTheVariable) {
  const char* kName = "RINGTRAIN_TEST_ENV_SIZE";
  ::unsetenv(kName);
  EXPECT_EQ(env_size(kName, 65536, 0), 65536u);
  ::setenv(kName, "", 1);
  EXPECT_EQ(env_size(kName, 65536, 0), 65536u);
  ::setenv(kName, "0", 1);
  EXPECT_EQ(env_size(kName, 65536, 0), 0u);
  ::setenv(kName, "4096", 1);
  EXPECT_EQ(env_size(kName, 65536, 64), 4096u);
  for (const char* bad : {"64k", "-5", "1e3", "32", "1073741825"}) {
    ::setenv(kName, bad, 1);
    EXPECT_EQ(error_of([&] { env_size(kName, 65536, 64, size_t{1} << 30); }),
              std::string(kName) + "='" + bad + "' is not a whole number in [64, 1073741824]; unset it "
              "or give one such as 65536");
  }
  ::setenv(kName, "1073741824", 1);
  EXPECT_EQ(env_size(kName, 65536, 64, size_t{1} << 30), size_t{1} << 30);
  ::unsetenv(kName);
}

// The message of the CommError fn throws; anything else (std::out_of_range from a
// stoll, no error at all) is reported as such, so the test fails saying what happened.
std::string comm_error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const CommError& e) {
    return e.what();
  } catch (const std::exception& e) {
    return std::string("(not a CommError: ") + e.what() + ")";
  }
  return "(no error)";
}

bool contains(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

TEST(Nodelist, NumbersTooLargeOrTrailingCommasAreNamedErrors) {
  for (const char* bad : {"node[99999999999999999999]", "node[1-99999999999999999999]", "a,",
                          "a[1-2],"}) {
    std::string error = comm_error_of([&] { expand_nodelist(bad); });
    EXPECT_TRUE(contains(error, std::string("cannot parse node list '") + bad + "'")) << error;
  }
}

TEST(TasksPerNode, RejectsZeroAndHugeCounts) {
  for (const char* bad : {"2(x0)", "0", "2,0(x3)", "99999999999", "2(x99999999999)"}) {
    std::string error = comm_error_of([&] { expand_tasks_per_node(bad); });
    EXPECT_TRUE(contains(error, std::string("SLURM_TASKS_PER_NODE='") + bad + "'")) << error;
    EXPECT_TRUE(contains(error, "in [1, 1048576]")) << error;
  }
}

TEST(SlurmMethod, LocalIdMustBeBelowTheTasksOnItsNode) {
  EnvMap env = srun_env();  // node 1 of 2(x2): 2 tasks
  env["SLURM_LOCALID"] = "7";
  EXPECT_EQ(comm_error_of([&] { parse_slurm_method(env); }),
            "SLURM_LOCALID=7 is not below the 2 tasks on node 1 that SLURM_TASKS_PER_NODE='2(x2)' "
            "gives; launch with srun, or set them consistently");
  env = srun_env();
  env["SLURM_TASKS_PER_NODE"] = "2(x0)";  // used to crash on counts.back() of an empty list
  EXPECT_TRUE(contains(comm_error_of([&] { parse_slurm_method(env); }), "SLURM_TASKS_PER_NODE='2(x0)'"));
}

TEST(MpiMethod, PmiErrorsNameThePmiVariables) {
  EXPECT_EQ(comm_error_of([] { parse_mpi_method({{"PMI_SIZE", "2"}, {"PMI_RANK", "5"}}); }),
            "PMI_RANK=5 is not below PMI_SIZE=2; ranks count from 0 to PMI_SIZE-1");
}

TEST(UrlMethods, HugePortIsANamedError) {
  std::string error = comm_error_of([] { resolve_launch("tcp://h:99999999999999999999", {}, 0, 1); });
  EXPECT_TRUE(contains(error, "init method 'tcp://h:99999999999999999999': port 99999999999999999999 "
                              "is out of range 1-65535")) << error;
}

TEST(EnvMethod, IntegersWithSpacesOrSignsAreRejected) {
  for (const char* bad : {" 1", "\t1", "+1", "1 ", "-"}) {
    EnvMap env = torchrun_env();
    env["RANK"] = bad;
    EXPECT_TRUE(contains(comm_error_of([&] { parse_env_method(env); }),
                         std::string("environment variable RANK='") + bad + "'")) << bad;
  }
}

TEST(Reduce, SixteenBitFloatsComputeInFloat) {
  Half a[3] = {Half(1.5f), Half(-2.0f), Half(65504.0f)};
  Half b[3] = {Half(0.25f), Half(3.0f), Half(1.0f)};
  reduce_into(a, b, 3, DType::kFloat16, ReduceOp::kSum);
  EXPECT_EQ(static_cast<float>(a[0]), 1.75f);
  EXPECT_EQ(static_cast<float>(a[1]), 1.0f);
  BFloat16 c[2] = {BFloat16(3.0f), BFloat16(-1.0f)};
  BFloat16 d[2] = {BFloat16(2.0f), BFloat16(4.0f)};
  reduce_into(c, d, 2, DType::kBFloat16, ReduceOp::kMax);
  EXPECT_EQ(static_cast<float>(c[0]), 3.0f);
  EXPECT_EQ(static_cast<float>(c[1]), 4.0f);
  int64_t x[2] = {7, -7};
  scale_for_average(x, 2, DType::kInt64, 2);
  EXPECT_EQ(x[0], 3);  // truncating, like C++ integer division
  EXPECT_EQ(x[1], -3);
  EXPECT_EQ(parse_reduce_op("prod"), ReduceOp::kProd);
  EXPECT_THROW(parse_reduce_op("mean"), CommError);
}

// The reduction loops convert 16-bit floats inline (F16C for half, bit arithmetic for
// bfloat16) instead of through Half's and BFloat16's out-of-line conversions: they must
// agree bit for bit, on every 16-bit value and on floats across the whole range
// (rounding ties, subnormals, overflow to inf, NaN of either sign).
TEST(Reduce, InlineSixteenBitConversionsMatchTheDtypeOnes) {
  auto bits_of = [](float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof u);
    return u;
  };
  // NaN: a NaN of the same sign (F16C quiets a signaling NaN's payload, the software
  // conversion keeps it; either is a NaN, and every rank runs the same code).
  auto same_f32 = [&](float got, float want) {
    return want != want ? got != got && std::signbit(got) == std::signbit(want) : bits_of(got) == bits_of(want);
  };
  auto same_16 = [](uint16_t got, uint16_t want, uint16_t exponent) {
    const bool want_nan = (want & exponent) == exponent && (want & ~exponent & 0x7FFF) != 0;
    if (!want_nan) return got == want;
    return (got & exponent) == exponent && (got & ~exponent & 0x7FFF) != 0 && (got & 0x8000) == (want & 0x8000);
  };
  for (uint32_t v = 0; v <= 0xFFFF; ++v) {
    Half h;
    BFloat16 b;
    h.bits = b.bits = static_cast<uint16_t>(v);
    ASSERT_TRUE(same_f32(inline_conversion::sixteen_bit_to_float(h.bits, DType::kFloat16), static_cast<float>(h))) << v;
    ASSERT_TRUE(same_f32(inline_conversion::sixteen_bit_to_float(b.bits, DType::kBFloat16), static_cast<float>(b))) << v;
  }
  for (uint64_t u = 0; u <= 0xFFFFFFFFull; u += 4099) {  // every sign, exponent and many mantissas
    float f;
    const uint32_t u32 = static_cast<uint32_t>(u);
    std::memcpy(&f, &u32, sizeof f);
    ASSERT_TRUE(same_16(inline_conversion::float_to_sixteen_bit(f, DType::kFloat16), Half(f).bits, 0x7C00))
        << std::hex << u32;
    ASSERT_TRUE(same_16(inline_conversion::float_to_sixteen_bit(f, DType::kBFloat16), BFloat16(f).bits, 0x7F80))
        << std::hex << u32;
  }
  // ties to even, at both widths (1 + 2^-11 is halfway between two halves; bf16 at 2^-8)
  for (float f : {1.0f + 0x1p-11f, 1.0f + 3 * 0x1p-11f, 1.0f + 0x1p-8f, 1.0f + 3 * 0x1p-8f, 65520.0f, -0.0f}) {
    EXPECT_EQ(inline_conversion::float_to_sixteen_bit(f, DType::kFloat16), Half(f).bits) << f;
    EXPECT_EQ(inline_conversion::float_to_sixteen_bit(f, DType::kBFloat16), BFloat16(f).bits) << f;
  }
}

// The vectorized f16 sum (eight at a time) and its scalar tail give what one float add
// and one rounding per element give, for every op, in place or not.
TEST(Reduce, SixteenBitLoopsEqualAFloatCombinePerElement) {
  const size_t n = 1000 + 5;  // not a multiple of 8: the tail runs too
  std::vector<Half> a(n), b(n);
  for (size_t i = 0; i < n; ++i) {
    a[i].bits = static_cast<uint16_t>((i * 40503u) & 0xFFFF);
    b[i].bits = static_cast<uint16_t>((i * 9973u + 17) & 0xFFFF);
  }
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kProd, ReduceOp::kMax, ReduceOp::kMin}) {
    std::vector<Half> out(n), in_place = a;
    reduce_into3(out.data(), a.data(), b.data(), n, DType::kFloat16, op);
    reduce_into(in_place.data(), b.data(), n, DType::kFloat16, op);
    for (size_t i = 0; i < n; ++i) {
      const float x = static_cast<float>(a[i]), y = static_cast<float>(b[i]);
      float r = op == ReduceOp::kSum ? x + y : op == ReduceOp::kProd ? x * y : 0.0f;
      if (op == ReduceOp::kMax || op == ReduceOp::kMin) {
        if (x != x || y != y) r = std::numeric_limits<float>::quiet_NaN();
        else r = op == ReduceOp::kMax ? (x < y ? y : x) : (y < x ? y : x);
      }
      const uint16_t want = Half(r).bits;
      if (r != r) {  // NaN: any NaN (the payload follows the operand order of the hardware)
        EXPECT_TRUE(static_cast<float>(out[i]) != static_cast<float>(out[i])) << reduce_op_name(op) << " " << i;
        continue;
      }
      ASSERT_EQ(out[i].bits, want) << reduce_op_name(op) << " element " << i;
      ASSERT_EQ(in_place[i].bits, want) << reduce_op_name(op) << " in place, element " << i;
    }
  }
}

// Integer sums and products wrap around like MPI's and NCCL's (two's complement), defined
// behaviour rather than signed overflow (which UBSan reports as an error in our builds).
TEST(Reduce, IntegerOverflowWrapsAround) {
  int32_t a[2] = {INT32_MAX, INT32_MIN};
  int32_t b[2] = {1, -1};
  reduce_into(a, b, 2, DType::kInt32, ReduceOp::kSum);
  EXPECT_EQ(a[0], INT32_MIN);
  EXPECT_EQ(a[1], INT32_MAX);
  int64_t c[1] = {INT64_MAX};
  int64_t d[1] = {2};
  reduce_into(c, d, 1, DType::kInt64, ReduceOp::kProd);
  EXPECT_EQ(c[0], -2);
}

}  // namespace
}  // namespace ringtrain::comm

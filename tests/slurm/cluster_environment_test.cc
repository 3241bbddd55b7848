// cluster_environment_test.cc: launcher detection with the variables real launchers set.
//
// The SLURM environments below were captured on the local cluster
// (scripts/slurm/start-local-cluster.sh): an `srun -N2 -n2` task, the batch shell of
// `sbatch -N2 -n2` (SLURM_PROCID=0 and SLURM_NTASKS=2 but no step id: not a task),
// and an `salloc` shell. The Open MPI one is `mpirun -np 2` (Open MPI 4.1.4) here;
// the torchrun one is what torchrun documents (and ringrun sets).
#include "slurm/cluster_environment.h"

#include <gtest/gtest.h>

#include "slurm/subprocess.h"

namespace ringtrain::slurm {
namespace {

comm::EnvMap srun_task(int procid, int nodeid) {
  return {{"SLURM_JOB_ID", "1234"},        {"SLURM_JOBID", "1234"},
          {"SLURM_JOB_NAME", "bash"},      {"SLURM_JOB_NODELIST", "node[1-2]"},
          {"SLURM_NODELIST", "node[1-2]"}, {"SLURM_NNODES", "2"},
          {"SLURM_JOB_NUM_NODES", "2"},    {"SLURM_NTASKS", "2"},
          {"SLURM_NPROCS", "2"},           {"SLURM_TASKS_PER_NODE", "1(x2)"},
          {"SLURM_STEP_ID", "0"},          {"SLURM_STEPID", "0"},
          {"SLURM_PROCID", std::to_string(procid)},
          {"SLURM_LOCALID", "0"},          {"SLURM_NODEID", std::to_string(nodeid)}};
}

TEST(ClusterEnvironment, SrunTaskOnTwoNodes) {
  ClusterEnvironment env = detect_cluster_environment(srun_task(1, 1));
  EXPECT_EQ(env.launcher, Launcher::kSlurm);
  EXPECT_EQ(env.init_method, "slurm://");
  EXPECT_EQ(env.rank, 1);
  EXPECT_EQ(env.world_size, 2);
  EXPECT_EQ(env.local_rank, 0);
  EXPECT_EQ(env.local_world_size, 1);
  EXPECT_EQ(env.node_rank, 1);
  EXPECT_EQ(env.num_nodes, 2);
  EXPECT_EQ(env.master_addr, "node1");      // first host of the expanded node list
  EXPECT_EQ(env.master_port, 15000 + 1234);  // Lightning's port rule, via comm
  EXPECT_TRUE(env.in_slurm_job);
  EXPECT_EQ(env.job_id, "1234");
  EXPECT_EQ(env.requeue_id, "1234");
  EXPECT_EQ(env.restart_count, 0);
  EXPECT_EQ(env.nodes, (std::vector<std::string>{"node1", "node2"}));
  EXPECT_TRUE(env.note.empty());
  EXPECT_TRUE(env.is_distributed());
  EXPECT_FALSE(env.is_global_zero());
}

TEST(ClusterEnvironment, FourTasksOnTwoNodesUsesTasksPerNode) {
  comm::EnvMap vars = srun_task(3, 1);
  vars["SLURM_NTASKS"] = "4";
  vars["SLURM_TASKS_PER_NODE"] = "2(x2)";
  vars["SLURM_LOCALID"] = "1";
  ClusterEnvironment env = detect_cluster_environment(vars);
  EXPECT_EQ(env.world_size, 4);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 2);
  EXPECT_EQ(env.node_rank, 1);
  EXPECT_EQ(env.num_nodes, 2);
}

// A cluster whose MpiDefault is pmi2 or pmix gives every srun task PMI variables too;
// they once made the task an MPI launch with 4 nodes (pmi2) or 1 node and an unknown
// world (pmix), every rank local rank 0.
TEST(ClusterEnvironment, SrunTasksWithTheClustersPmiVariablesAreStillSrunTasks) {
  comm::EnvMap vars = srun_task(3, 1);
  vars["SLURM_NTASKS"] = vars["SLURM_NPROCS"] = "4";
  vars["SLURM_TASKS_PER_NODE"] = "2(x2)";
  vars["SLURM_LOCALID"] = "1";
  for (const comm::EnvMap& pmi : {comm::EnvMap{{"PMI_RANK", "3"}, {"PMI_SIZE", "4"}}, comm::EnvMap{{"PMIX_RANK", "3"}}}) {
    comm::EnvMap task = vars;
    task.insert(pmi.begin(), pmi.end());
    ClusterEnvironment env = detect_cluster_environment(task);
    EXPECT_EQ(env.launcher, Launcher::kSlurm) << pmi.begin()->first;
    EXPECT_EQ(env.world_size, 4);
    EXPECT_EQ(env.num_nodes, 2);
    EXPECT_EQ(env.node_rank, 1);
    EXPECT_EQ(env.local_rank, 1);
    EXPECT_EQ(env.local_world_size, 2);
  }
}

TEST(ClusterEnvironment, BatchShellIsNotATask) {
  // sbatch -N2 -n2: the batch script sees SLURM_PROCID=0 and SLURM_NTASKS=2, no step.
  comm::EnvMap vars = srun_task(0, 0);
  vars.erase("SLURM_STEP_ID");
  vars.erase("SLURM_STEPID");
  vars["SLURM_JOB_NAME"] = "envjob.sh";
  ClusterEnvironment env = detect_cluster_environment(vars);
  EXPECT_EQ(env.launcher, Launcher::kLocal);
  EXPECT_EQ(env.init_method, "single");
  EXPECT_EQ(env.world_size, 1);
  EXPECT_NE(env.note.find("srun"), std::string::npos) << env.note;
  // still inside the job: the requeue facts are known
  EXPECT_TRUE(env.in_slurm_job);
  EXPECT_EQ(env.requeue_id, "1234");
}

TEST(ClusterEnvironment, SallocShellIsLocal) {
  comm::EnvMap vars = {{"SLURM_JOB_ID", "3"}, {"SLURM_JOB_NAME", "interactive"}, {"SLURM_NTASKS", "1"},
                       {"SLURM_JOB_NODELIST", "node1"}, {"SLURM_NNODES", "1"}};
  ClusterEnvironment env = detect_cluster_environment(vars);
  EXPECT_EQ(env.launcher, Launcher::kLocal);
  EXPECT_EQ(env.world_size, 1);
  EXPECT_TRUE(env.in_slurm_job);
}

TEST(ClusterEnvironment, ArrayJobRequeueIdAndRestartCount) {
  comm::EnvMap vars = srun_task(0, 0);
  vars["SLURM_JOB_ID"] = "1240";  // each array task has its own job id
  vars["SLURM_ARRAY_JOB_ID"] = "1237";
  vars["SLURM_ARRAY_TASK_ID"] = "3";
  vars["SLURM_RESTART_COUNT"] = "2";
  ClusterEnvironment env = detect_cluster_environment(vars);
  EXPECT_EQ(env.job_id, "1240");
  EXPECT_EQ(env.requeue_id, "1237_3");
  EXPECT_EQ(env.restart_count, 2);
  EXPECT_NE(env.describe().find("requeue-id 1237_3 restarts 2"), std::string::npos) << env.describe();
}

TEST(ClusterEnvironment, TorchrunInsideSlurmIsTorchrun) {
  comm::EnvMap vars = srun_task(0, 0);  // srun torchrun ...: torchrun's variables win
  vars.insert({{"MASTER_ADDR", "node1"}, {"MASTER_PORT", "29500"}, {"RANK", "5"}, {"WORLD_SIZE", "8"},
               {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "4"}, {"GROUP_RANK", "1"},
               {"GROUP_WORLD_SIZE", "2"}});
  ClusterEnvironment env = detect_cluster_environment(vars);
  EXPECT_EQ(env.launcher, Launcher::kTorchrun);
  EXPECT_EQ(env.init_method, "env://");
  EXPECT_EQ(env.rank, 5);
  EXPECT_EQ(env.world_size, 8);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 4);
  EXPECT_EQ(env.node_rank, 1);
  EXPECT_EQ(env.num_nodes, 2);
  EXPECT_EQ(env.master_port, 29500);
  EXPECT_EQ(env.requeue_id, "1234");  // still a SLURM job
}

TEST(ClusterEnvironment, TorchrunNodeRankWithoutGroupWorldSize) {
  comm::EnvMap vars = {{"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "1234"}, {"RANK", "3"},
                       {"WORLD_SIZE", "4"},         {"LOCAL_RANK", "1"},     {"LOCAL_WORLD_SIZE", "2"},
                       {"NODE_RANK", "1"}};
  ClusterEnvironment env = detect_cluster_environment(vars);
  EXPECT_EQ(env.node_rank, 1);
  EXPECT_EQ(env.num_nodes, 2);
  EXPECT_FALSE(env.in_slurm_job);
}

TEST(ClusterEnvironment, OpenMpiAsMpirunSetsIt) {
  comm::EnvMap vars = {{"OMPI_COMM_WORLD_LOCAL_RANK", "1"}, {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"},
                       {"OMPI_COMM_WORLD_NODE_RANK", "1"},  {"OMPI_COMM_WORLD_RANK", "1"},
                       {"OMPI_COMM_WORLD_SIZE", "2"},       {"OMPI_UNIVERSE_SIZE", "2"},
                       {"PMIX_RANK", "1"}};
  ClusterEnvironment env = detect_cluster_environment(vars);
  EXPECT_EQ(env.launcher, Launcher::kOpenMpi);
  EXPECT_EQ(env.init_method, "mpi://");
  EXPECT_EQ(env.rank, 1);
  EXPECT_EQ(env.world_size, 2);
  EXPECT_EQ(env.local_rank, 1);
  EXPECT_EQ(env.local_world_size, 2);
  EXPECT_EQ(env.node_rank, 0);
  EXPECT_EQ(env.num_nodes, 1);
}

TEST(ClusterEnvironment, NothingSetIsLocal) {
  ClusterEnvironment env = detect_cluster_environment(comm::EnvMap{{"HOME", "/root"}});
  EXPECT_EQ(env.launcher, Launcher::kLocal);
  EXPECT_EQ(env.rank, 0);
  EXPECT_EQ(env.world_size, 1);
  EXPECT_EQ(env.num_nodes, 1);
  EXPECT_FALSE(env.in_slurm_job);
  EXPECT_TRUE(env.requeue_id.empty());
}

// Errors name the variable, the value and the fix.
void expect_error(const comm::EnvMap& vars, const std::vector<std::string>& needles) {
  try {
    detect_cluster_environment(vars);
    FAIL() << "expected SlurmError";
  } catch (const SlurmError& e) {
    for (const std::string& needle : needles) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what() << "\nmissing: " << needle;
    }
  }
}

TEST(ClusterEnvironment, BadVariablesAreNamed) {
  comm::EnvMap vars = srun_task(0, 0);
  vars["SLURM_PROCID"] = "zero";
  expect_error(vars, {"SLURM_PROCID", "zero", "srun"});

  vars = srun_task(2, 0);  // rank beyond the task count
  expect_error(vars, {"SLURM_PROCID=2", "SLURM_NTASKS=2"});

  vars = srun_task(0, 0);
  vars.erase("SLURM_JOB_NODELIST");
  vars.erase("SLURM_NODELIST");
  expect_error(vars, {"SLURM_JOB_NODELIST"});

  vars = srun_task(0, 0);
  vars["SLURM_ARRAY_JOB_ID"] = "1237";
  expect_error(vars, {"SLURM_ARRAY_TASK_ID", "--array"});

  vars = srun_task(0, 0);
  vars["SLURM_RESTART_COUNT"] = "-1";
  expect_error(vars, {"SLURM_RESTART_COUNT", "-1"});

  vars = srun_task(0, 0);
  vars["SLURM_JOB_NODELIST"] = "node[1-";
  expect_error(vars, {"SLURM_JOB_NODELIST", "node[1-"});

  expect_error({{"MASTER_ADDR", "h"}, {"RANK", "0"}, {"WORLD_SIZE", "2"}}, {"MASTER_PORT"});
}

TEST(ClusterEnvironment, LauncherNames) {
  EXPECT_STREQ(launcher_name(Launcher::kSlurm), "slurm");
  EXPECT_STREQ(launcher_name(Launcher::kTorchrun), "torchrun");
  EXPECT_STREQ(launcher_name(Launcher::kOpenMpi), "mpi");
  EXPECT_STREQ(launcher_name(Launcher::kLocal), "local");
}

}  // namespace
}  // namespace ringtrain::slurm

// world_from_environment(): env:// (torchrun / built-in launcher) and SLURM rules, their errors,
// and SLURM node-list parsing, all over a fake environment.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <string>

#include "trainer/launch/world.h"

namespace gpipe {
namespace {

using ::testing::AllOf;
using ::testing::HasSubstr;
using Env = std::map<std::string, std::string>;

WorldInfo world_of(const Env& env) {
  return world_from_environment([&env](const char* name) -> const char* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : it->second.c_str();
  });
}

std::string error_of(const Env& env) {
  try {
    world_of(env);
  } catch (const WorldError& e) {
    return e.what();
  }
  ADD_FAILURE() << "no WorldError";
  return "";
}

const Env kTorchrun{{"RANK", "3"},
                    {"WORLD_SIZE", "4"},
                    {"LOCAL_RANK", "1"},
                    {"LOCAL_WORLD_SIZE", "2"},
                    {"MASTER_ADDR", "10.0.0.1"},
                    {"MASTER_PORT", "29512"}};

Env with(Env env, const std::string& name, const std::string& value) {
  env[name] = value;
  return env;
}
Env without(Env env, const std::string& name) {
  env.erase(name);
  return env;
}

TEST(World, NoLauncherVariablesIsASingleProcess) {
  const WorldInfo w = world_of({{"HOME", "/root"}});
  EXPECT_EQ(w.source, "single");
  EXPECT_EQ(w.rank, 0);
  EXPECT_EQ(w.world_size, 1);
  EXPECT_FALSE(w.distributed());
  EXPECT_FALSE(w.agent_store);
  EXPECT_EQ(w.describe(), "rank 0/1 (single process)");
}

TEST(World, TorchrunVariablesAreRead) {
  const WorldInfo w = world_of(kTorchrun);
  EXPECT_EQ(w.source, "env");
  EXPECT_EQ(w.rank, 3);
  EXPECT_EQ(w.world_size, 4);
  EXPECT_EQ(w.local_rank, 1);
  EXPECT_EQ(w.local_world_size, 2);
  EXPECT_EQ(w.master_addr, "10.0.0.1");
  EXPECT_EQ(w.master_port, 29512);
  EXPECT_TRUE(w.distributed());
  EXPECT_FALSE(w.agent_store);
  EXPECT_EQ(w.store_prefix, "");
  EXPECT_EQ(w.describe(), "rank 3/4 (local 1/2) master 10.0.0.1:29512 via env");
}

TEST(World, LocalRankAndSizeDefault) {
  const WorldInfo w = world_of(without(without(kTorchrun, "LOCAL_RANK"), "LOCAL_WORLD_SIZE"));
  EXPECT_EQ(w.local_rank, 0);
  EXPECT_EQ(w.local_world_size, 1);
}

// LOCAL_RANK without LOCAL_WORLD_SIZE is a valid env:// launch (an MPI wrapper): at least
// LOCAL_RANK + 1 processes on the node, not a refusal against a default of 1.
TEST(World, LocalRankWithoutLocalWorldSizeIsAccepted) {
  const WorldInfo w = world_of(without(kTorchrun, "LOCAL_WORLD_SIZE"));
  EXPECT_EQ(w.local_rank, 1);
  EXPECT_EQ(w.local_world_size, 2);
  // Open MPI's (or MPICH's) own count of the node's processes, when the wrapper left it.
  EXPECT_EQ(world_of(with(without(kTorchrun, "LOCAL_WORLD_SIZE"), "OMPI_COMM_WORLD_LOCAL_SIZE", "4")).local_world_size, 4);
  EXPECT_EQ(world_of(with(without(kTorchrun, "LOCAL_WORLD_SIZE"), "MPI_LOCALNRANKS", "3")).local_world_size, 3);
}

TEST(World, OneProcessWorldNeedsNoMaster) {
  const WorldInfo w = world_of({{"RANK", "0"}, {"WORLD_SIZE", "1"}});
  EXPECT_EQ(w.source, "env");
  EXPECT_FALSE(w.distributed());
  EXPECT_EQ(w.master_addr, "127.0.0.1");
  EXPECT_EQ(w.master_port, 29500);
}

TEST(World, MissingRankOrWorldSizeIsNamedWithTheLaunchHint) {
  const std::string no_world = error_of({{"RANK", "0"}});
  EXPECT_THAT(no_world, AllOf(HasSubstr("WORLD_SIZE is not set"), HasSubstr("torchrun --no-python --nproc_per_node=N"),
                              HasSubstr("gpipe_runner --nproc-per-node N")));
  EXPECT_THAT(error_of({{"WORLD_SIZE", "2"}}), AllOf(HasSubstr("RANK is not set"), HasSubstr("--nproc-per-node N")));
}

TEST(World, MissingMasterIsAnErrorForAMultiProcessWorld) {
  EXPECT_THAT(error_of(without(kTorchrun, "MASTER_ADDR")),
              AllOf(HasSubstr("MASTER_ADDR is not set"), HasSubstr("WORLD_SIZE=4"), HasSubstr("torchrun")));
  EXPECT_THAT(error_of(without(kTorchrun, "MASTER_PORT")), HasSubstr("MASTER_PORT is not set"));
}

TEST(World, MalformedIntegersNameTheVariableAndValue) {
  EXPECT_THAT(error_of(with(kTorchrun, "RANK", "two")), AllOf(HasSubstr("RANK='two'"), HasSubstr("not an integer")));
  EXPECT_THAT(error_of(with(kTorchrun, "RANK", "1x")), HasSubstr("RANK='1x'"));
  EXPECT_THAT(error_of(with(kTorchrun, "WORLD_SIZE", "4 ")), HasSubstr("WORLD_SIZE='4 '"));
  EXPECT_THAT(error_of(with(kTorchrun, "RANK", "-1")), AllOf(HasSubstr("RANK='-1'"), HasSubstr("at least 0")));
  EXPECT_THAT(error_of(with(kTorchrun, "WORLD_SIZE", "0")),
              AllOf(HasSubstr("WORLD_SIZE='0'"), HasSubstr("at least 1")));
  EXPECT_THAT(error_of(with(kTorchrun, "LOCAL_RANK", "-2")), HasSubstr("LOCAL_RANK='-2'"));
  EXPECT_THAT(error_of(with(kTorchrun, "LOCAL_WORLD_SIZE", "zero")), HasSubstr("LOCAL_WORLD_SIZE='zero'"));
  EXPECT_THAT(error_of(with(kTorchrun, "RANK", "99999999999")), HasSubstr("RANK='99999999999'"));
}

TEST(World, RanksMustFitTheirSizes) {
  EXPECT_THAT(error_of(with(kTorchrun, "RANK", "4")), AllOf(HasSubstr("RANK=4"), HasSubstr("WORLD_SIZE=4")));
  EXPECT_THAT(error_of(with(kTorchrun, "LOCAL_RANK", "2")),
              AllOf(HasSubstr("LOCAL_RANK=2"), HasSubstr("LOCAL_WORLD_SIZE=2")));
}

TEST(World, PortMustBeATcpPort) {
  EXPECT_THAT(error_of(with(kTorchrun, "MASTER_PORT", "0")), HasSubstr("MASTER_PORT='0'"));
  EXPECT_THAT(error_of(with(kTorchrun, "MASTER_PORT", "65536")),
              AllOf(HasSubstr("MASTER_PORT='65536'"), HasSubstr("1..65535")));
  EXPECT_THAT(error_of(with(kTorchrun, "MASTER_PORT", "http")), HasSubstr("MASTER_PORT='http'"));
  EXPECT_EQ(world_of(with(kTorchrun, "MASTER_PORT", "65535")).master_port, 65535);
}

TEST(World, TorchrunAgentStoreUsesTheAttemptPrefix) {
  const WorldInfo first = world_of(with(kTorchrun, "TORCHELASTIC_USE_AGENT_STORE", "True"));
  EXPECT_TRUE(first.agent_store);
  EXPECT_EQ(first.store_prefix, "/worker/attempt_0");
  EXPECT_THAT(first.describe(), HasSubstr("/worker/attempt_0"));
  const WorldInfo third =
      world_of(with(with(kTorchrun, "TORCHELASTIC_USE_AGENT_STORE", "True"), "TORCHELASTIC_RESTART_COUNT", "2"));
  EXPECT_EQ(third.store_prefix, "/worker/attempt_2");
  // Only the exact "True" torchrun writes turns it on.
  const WorldInfo off = world_of(with(kTorchrun, "TORCHELASTIC_USE_AGENT_STORE", "False"));
  EXPECT_FALSE(off.agent_store);
  EXPECT_EQ(off.store_prefix, "");
  EXPECT_THAT(
      error_of(with(with(kTorchrun, "TORCHELASTIC_USE_AGENT_STORE", "True"), "TORCHELASTIC_RESTART_COUNT", "x")),
      HasSubstr("TORCHELASTIC_RESTART_COUNT='x'"));
}

// A task of an srun step (srun -n8 in a job of 2 nodes x 4 tasks).
const Env kSlurm{{"SLURM_PROCID", "5"},
                 {"SLURM_NTASKS", "8"},
                 {"SLURM_STEP_NUM_TASKS", "8"},
                 {"SLURM_STEP_ID", "0"},
                 {"SLURM_LOCALID", "1"},
                 {"SLURM_NTASKS_PER_NODE", "4"},
                 {"SLURM_TASKS_PER_NODE", "4(x2)"},
                 {"SLURM_JOB_NODELIST", "gpu[07-08]"}};

TEST(World, SlurmVariablesAreRead) {
  const WorldInfo w = world_of(kSlurm);
  EXPECT_EQ(w.source, "slurm");
  EXPECT_EQ(w.rank, 5);
  EXPECT_EQ(w.world_size, 8);
  EXPECT_EQ(w.local_rank, 1);
  EXPECT_EQ(w.local_world_size, 4);
  EXPECT_EQ(w.master_addr, "gpu07");
  EXPECT_EQ(w.master_port, 29500);
  EXPECT_FALSE(w.agent_store);
  EXPECT_EQ(w.describe(), "rank 5/8 (local 1/4) master gpu07:29500 via slurm");
}

TEST(World, TorchVariablesWinOverSlurm) {
  Env both = kSlurm;
  both.insert(kTorchrun.begin(), kTorchrun.end());
  EXPECT_EQ(world_of(both).source, "env");
  EXPECT_EQ(world_of(both).rank, 3);
}

TEST(World, OnlyATaskOfAnSrunStepJoinsASlurmWorld) {
  EXPECT_EQ(world_of(without(kSlurm, "SLURM_PROCID")).source, "single");
  // The batch script of sbatch -n8 (task 0 of the batch step) and an salloc shell: the
  // allocation's SLURM_PROCID / SLURM_NTASKS, no step variables. One process, not rank 0 of 8
  // (which waited for 7 ranks that never came).
  const Env batch_script = without(without(kSlurm, "SLURM_STEP_NUM_TASKS"), "SLURM_STEP_ID");
  EXPECT_EQ(world_of(with(batch_script, "SLURM_PROCID", "0")).source, "single");
  EXPECT_EQ(world_of(with(batch_script, "SLURM_PROCID", "0")).world_size, 1);
  // salloc's interactive step (srun --interactive: reserved id 0xfffffffa), and the batch and
  // extern steps' reserved ids: one process each.
  for (const char* reserved : {"4294967290", "4294967291", "4294967292", "4294967294", "4294967295"}) {
    EXPECT_EQ(world_of(with(kSlurm, "SLURM_STEP_ID", reserved)).source, "single") << reserved;
  }
  EXPECT_EQ(world_of(with(kSlurm, "SLURM_STEP_ID", "-5")).source, "single");
  EXPECT_EQ(world_of(with(kSlurm, "SLURM_STEP_ID", "12")).source, "slurm");
  // srun --preserve-env keeps the allocation's SLURM_NTASKS: the step's count is the world.
  EXPECT_EQ(world_of(with(kSlurm, "SLURM_NTASKS", "16")).world_size, 8);
}

TEST(World, SlurmLocalWorldSizeFallsBackToTasksPerNode) {
  // SLURM_NTASKS_PER_NODE is only set with --ntasks-per-node; the compressed list always is.
  EXPECT_EQ(world_of(without(kSlurm, "SLURM_NTASKS_PER_NODE")).local_world_size, 4);
  EXPECT_EQ(world_of(with(kSlurm, "SLURM_NTASKS_PER_NODE", "2(x4)")).local_world_size, 4);
  EXPECT_EQ(world_of(with(without(kSlurm, "SLURM_NTASKS_PER_NODE"), "SLURM_TASKS_PER_NODE", "3,2")).local_world_size,
            3);
  // With SLURM_NODEID the entry of this node is used.
  EXPECT_EQ(world_of(with(with(without(kSlurm, "SLURM_NTASKS_PER_NODE"), "SLURM_TASKS_PER_NODE", "3(x2),2"),
                          "SLURM_NODEID", "2"))
                .local_world_size,
            2);
  const Env bare{{"SLURM_PROCID", "0"}, {"SLURM_STEP_NUM_TASKS", "2"}, {"SLURM_STEP_ID", "0"}, {"SLURM_NODELIST", "a,b"}};
  EXPECT_EQ(world_of(bare).local_world_size, 1);
  EXPECT_EQ(world_of(bare).local_rank, 0);
  EXPECT_EQ(world_of(bare).master_addr, "a");  // the older SLURM_NODELIST name
  EXPECT_THAT(error_of(with(without(kSlurm, "SLURM_NTASKS_PER_NODE"), "SLURM_TASKS_PER_NODE", "four")),
              HasSubstr("SLURM_TASKS_PER_NODE='four'"));
}

TEST(World, SlurmMasterComesFromTheEnvironmentFirst) {
  const WorldInfo w = world_of(with(with(kSlurm, "MASTER_ADDR", "head"), "MASTER_PORT", "1234"));
  EXPECT_EQ(w.master_addr, "head");
  EXPECT_EQ(w.master_port, 1234);
  EXPECT_THAT(error_of(without(kSlurm, "SLURM_JOB_NODELIST")),
              AllOf(HasSubstr("MASTER_ADDR is not set"), HasSubstr("SLURM_JOB_NODELIST")));
}

TEST(World, SlurmStepLayoutWinsOverTheJobs) {
  // srun -N1 -n2 inside a job of 4 tasks per node on gpu[07-08], placed on gpu08 (srun -r1).
  const Env step = with(with(kSlurm, "SLURM_STEP_TASKS_PER_NODE", "2"), "SLURM_STEP_NODELIST", "gpu08");
  EXPECT_EQ(world_of(with(step, "SLURM_PROCID", "1")).local_world_size, 2);
  EXPECT_EQ(world_of(with(step, "SLURM_PROCID", "1")).master_addr, "gpu08");
  EXPECT_THAT(error_of(with(step, "SLURM_STEP_TASKS_PER_NODE", "two")), HasSubstr("SLURM_STEP_TASKS_PER_NODE='two'"));
}

TEST(World, SlurmPortFollowsTheJobAndStepWhenMasterPortIsUnset) {
  const Env job = with(kSlurm, "SLURM_JOB_ID", "123456");
  EXPECT_EQ(world_of(job).master_port, 15000 + 123456 % 15000);
  const int step0 = world_of(with(job, "SLURM_STEP_ID", "0")).master_port;
  const int step1 = world_of(with(job, "SLURM_STEP_ID", "1")).master_port;
  EXPECT_EQ(step0, world_of(job).master_port);
  EXPECT_NE(step1, step0);  // two steps of one job on one node get two ports
  EXPECT_NE(world_of(with(job, "SLURM_JOB_ID", "123457")).master_port, step0);
  for (const char* id : {"0", "99999999", "4294967295"}) {
    const int port = world_of(with(job, "SLURM_JOB_ID", id)).master_port;
    EXPECT_GE(port, 15000);
    EXPECT_LT(port, 30000);
  }
  EXPECT_EQ(world_of(with(job, "MASTER_PORT", "1234")).master_port, 1234);  // an exported port wins
  EXPECT_THAT(error_of(with(kSlurm, "SLURM_JOB_ID", "j1")), HasSubstr("SLURM_JOB_ID='j1'"));
}

TEST(World, SlurmValuesAreValidatedLikeTorchrunOnes) {
  EXPECT_THAT(error_of(with(kSlurm, "SLURM_PROCID", "8")),
              AllOf(HasSubstr("SLURM_PROCID=8"), HasSubstr("SLURM_STEP_NUM_TASKS=8")));
  EXPECT_THAT(error_of(with(kSlurm, "SLURM_LOCALID", "4")), HasSubstr("SLURM_LOCALID=4"));
  EXPECT_THAT(error_of(with(kSlurm, "SLURM_STEP_NUM_TASKS", "x")), HasSubstr("SLURM_STEP_NUM_TASKS='x'"));
  EXPECT_THAT(error_of(with(kSlurm, "MASTER_PORT", "70000")), HasSubstr("MASTER_PORT='70000'"));
}

TEST(Nodelist, FirstHostIsExpanded) {
  EXPECT_EQ(first_host_of_nodelist("node[01-04,07],gpu2"), "node01");
  EXPECT_EQ(first_host_of_nodelist("a,b"), "a");
  EXPECT_EQ(first_host_of_nodelist("gpu-[3,5]"), "gpu-3");
  EXPECT_EQ(first_host_of_nodelist("single"), "single");
  EXPECT_EQ(first_host_of_nodelist("node[7]"), "node7");
  EXPECT_EQ(first_host_of_nodelist("rack[1-2]-ib,x"), "rack1-ib");
  EXPECT_EQ(first_host_of_nodelist("r[2-3]n[10-11]"), "r2n10");
  EXPECT_EQ(first_host_of_nodelist("node-1.cluster,node-2.cluster"), "node-1.cluster");
}

TEST(Nodelist, MalformedListsAreErrors) {
  EXPECT_THROW(first_host_of_nodelist(""), WorldError);
  EXPECT_THROW(first_host_of_nodelist(",a"), WorldError);
  EXPECT_THROW(first_host_of_nodelist("node[01-04"), WorldError);
  EXPECT_THROW(first_host_of_nodelist("node[]"), WorldError);
}

}  // namespace
}  // namespace gpipe

// Processes of one run sharing a GPU (trainer/distributed/gpu_sharing.h): when two of them meet in
// an NCCL communicator, every rank stops at start-up with one message naming the ranks, the GPU and
// the fix, instead of NCCL's "Duplicate GPU detected" at the communicator's first use; processes
// that never meet in one may share a GPU (named in the log). Which communicators a run makes comes
// from its placement and schedule. Two ranks in one process (a thread each, over a real TCPStore on
// loopback) stand for two processes; the GPUs are UUIDs given by the test (gpu_uuid on a GPU).
#include <gtest/gtest.h>

#include <exception>
#include <string>
#include <thread>

#include "free_port.h"
#include "trainer/config/config.h"
#include "trainer/distributed/distributed.h"
#include "trainer/distributed/gpu_sharing.h"
#include "trainer/launch/world.h"
#include "trainer/partition/placement.h"
#include "trainer/schedule/schedule.h"

namespace gpipe {
namespace {

TEST(GpuSharing, GroupsTheRanksOfEachSharedGpu) {
  const auto shared = shared_gpus({{"GPU-a", "n1", 0}, {"GPU-b", "n1", 1}, {"GPU-a", "n1", 2},
                                   {"GPU-c", "n2", 0}, {"GPU-b", "n1", 3}});
  ASSERT_EQ(shared.size(), 2u);
  EXPECT_EQ(shared[0].uuid, "GPU-a");
  EXPECT_EQ(shared[0].ranks, (std::vector<int>{0, 2}));
  EXPECT_EQ(shared[0].local_ranks, (std::vector<int>{0, 2}));
  EXPECT_EQ(shared[1].uuid, "GPU-b");
  EXPECT_EQ(shared[1].ranks, (std::vector<int>{1, 4}));
  EXPECT_TRUE(shared_gpus({{"GPU-a", "n1", 0}, {"GPU-b", "n1", 1}}).empty());
  EXPECT_TRUE(shared_gpus({{"", "n1", 0}, {"", "n1", 1}}).empty()) << "the CPU is no GPU to share";
}

ParallelConfig parallel(int ranks, int data_parallel) {
  ParallelConfig p;
  p.model_parallel_size = ranks;
  p.data_parallel_size = data_parallel;
  return p;
}

// 4 stages over 4 processes: the nccl transport pairs neighbours only, so processes 0 and 2 (on
// GPU 0 of 2 with --nproc-per-node 4) never meet; replicated, each stage's replicas form a group.
TEST(GpuSharing, TheCommunicatorsAreTheSendingNeighboursAndTheReplicaGroups) {
  const Schedule one_f_one_b = with_communication(make_schedule(ScheduleKind::kOneFOneB, 4, 8));
  const Placement four = make_placement(parallel(4, 1), 4, 0);
  EXPECT_EQ(nccl_communicators(four, one_f_one_b, true), (std::vector<std::vector<int>>{{0, 1}, {1, 2}, {2, 3}}));
  EXPECT_TRUE(nccl_communicators(four, one_f_one_b, false).empty());
  // Two replicas of a 4-rank pipeline on 4 processes (two ranks each): world ranks 0-1, 2-3.
  const Schedule replica = with_communication(make_schedule(ScheduleKind::kOneFOneB, 4, 4));
  const Placement replicated = make_placement(parallel(4, 2), 4, 0);
  EXPECT_EQ(nccl_communicators(replicated, replica, true),
            (std::vector<std::vector<int>>{{0, 1}, {0, 2}, {1, 3}, {2, 3}}));
  EXPECT_EQ(nccl_communicators(replicated, replica, false), (std::vector<std::vector<int>>{{0, 2}, {1, 3}}));
}

struct Outcome {
  std::string returned, error;
  bool config_error = false;
};

// Both ranks run check_gpu_sharing with their GPU's UUID ("" for the CPU).
std::pair<Outcome, Outcome> run_two(const std::string& uuid0, const std::string& uuid1,
                                    const std::vector<std::vector<int>>& communicators) {
  const int port = testing::free_port();
  EXPECT_GT(port, 0);
  Outcome out[2];
  auto rank = [&](int r, const std::string& uuid) {
    WorldInfo w;
    w.rank = w.local_rank = r;
    w.world_size = w.local_world_size = 2;
    w.master_port = port;
    w.source = "env";
    DistributedOptions o;
    o.timeout = std::chrono::milliseconds(3000);
    o.heartbeat = std::chrono::milliseconds(100);
    try {
      auto d = Distributed::connect(w, "same", o);
      try {
        out[r].returned = check_gpu_sharing(*d, {uuid, "node7", r}, communicators);
      } catch (const ConfigError& e) {
        out[r].config_error = true;
        out[r].error = e.what();
      }
      d->finish();
    } catch (const std::exception& e) {
      out[r].error = e.what();
    }
  };
  std::thread one([&] { rank(1, uuid1); });
  rank(0, uuid0);
  one.join();
  return {out[0], out[1]};
}

TEST(GpuSharing, OneCommunicatorOnOneGpuStopsEveryRankNamingTheFix) {
  const auto [r0, r1] = run_two("GPU-1234", "GPU-1234", {{0, 1}});
  for (const Outcome& o : {r0, r1}) {
    EXPECT_TRUE(o.config_error) << o.error;
    EXPECT_NE(o.error.find("ranks 0, 1 (LOCAL_RANK 0, 1 on node7) share GPU-1234, and ranks 0, 1 form one NCCL "
                           "communicator: NCCL cannot run two ranks of one communicator on one GPU"),
              std::string::npos)
        << o.error;
    EXPECT_NE(o.error.find("--nproc-per-node"), std::string::npos) << o.error;
    EXPECT_NE(o.error.find("parallel.placement"), std::string::npos) << o.error;
  }
}

TEST(GpuSharing, ProcessesThatNeverMeetInACommunicatorMayShareAGpu) {
  const auto [r0, r1] = run_two("GPU-1234", "GPU-1234", {});
  for (const Outcome& o : {r0, r1}) {
    EXPECT_EQ(o.error, "");
    EXPECT_EQ(o.returned, "ranks 0, 1 (LOCAL_RANK 0, 1 on node7) share GPU-1234");
  }
}

// srun --gpus-per-task=1: every process sees its own GPU as cuda:0, so LOCAL_RANK % visible
// devices is 0 everywhere, and yet no two share one.
TEST(GpuSharing, OneGpuEachIsFineWhateverTheIndexSays) {
  const auto [r0, r1] = run_two("GPU-aaaa", "GPU-bbbb", {{0, 1}});
  for (const Outcome& o : {r0, r1}) {
    EXPECT_EQ(o.error, "");
    EXPECT_EQ(o.returned, "");
  }
}

// One node without a usable GPU under parallel.device auto: named at once, not a wait.
TEST(GpuSharing, AMixOfCpuAndGpuProcessesIsRefused) {
  const auto [r0, r1] = run_two("GPU-aaaa", "", {});
  for (const Outcome& o : {r0, r1}) {
    EXPECT_TRUE(o.config_error) << o.error;
    EXPECT_NE(o.error.find("ranks 1 run on the CPU and ranks 0 on CUDA GPUs"), std::string::npos) << o.error;
  }
  const auto [c0, c1] = run_two("", "", {});
  EXPECT_EQ(c0.error + c1.error, "") << "all on the CPU is fine";
}

}  // namespace
}  // namespace gpipe

// Processes of one run sharing a GPU (trainer/distributed/gpu_sharing.h): with NCCL between
// processes every rank stops at start-up with one message naming the ranks, the GPU and the fix,
// instead of NCCL's "Duplicate GPU detected" at the first send; with Gloo they are let be and
// named. Two ranks in one process (a thread each, over a real TCPStore on loopback) stand for two
// processes; the GPUs are UUIDs given by the test (on a GPU, gpu_uuid gives them).
#include <gtest/gtest.h>

#include <exception>
#include <string>
#include <thread>

#include "free_port.h"
#include "trainer/config/config.h"
#include "trainer/distributed/distributed.h"
#include "trainer/distributed/gpu_sharing.h"
#include "trainer/launch/world.h"

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
}

struct Outcome {
  std::string returned, error;
  bool config_error = false;
};

// Both ranks run check_gpu_sharing with their GPU's UUID.
std::pair<Outcome, Outcome> run_two(const std::string& uuid0, const std::string& uuid1, bool nccl) {
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
        out[r].returned = check_gpu_sharing(*d, {uuid, "node7", r}, nccl);
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

TEST(GpuSharing, NcclBetweenProcessesOnOneGpuStopsEveryRankNamingTheFix) {
  const auto [r0, r1] = run_two("GPU-1234", "GPU-1234", /*nccl=*/true);
  for (const Outcome& o : {r0, r1}) {
    EXPECT_TRUE(o.config_error) << o.error;
    EXPECT_NE(o.error.find("ranks 0, 1 (LOCAL_RANK 0, 1 on node7) share GPU-1234"), std::string::npos) << o.error;
    EXPECT_NE(o.error.find("--nproc-per-node"), std::string::npos) << o.error;
    EXPECT_NE(o.error.find("parallel.transport: gloo"), std::string::npos) << o.error;
  }
}

TEST(GpuSharing, GlooBetweenProcessesOnOneGpuIsNamedNotRefused) {
  const auto [r0, r1] = run_two("GPU-1234", "GPU-1234", /*nccl=*/false);
  for (const Outcome& o : {r0, r1}) {
    EXPECT_EQ(o.error, "");
    EXPECT_EQ(o.returned, "ranks 0, 1 (LOCAL_RANK 0, 1 on node7) share GPU-1234");
  }
}

// srun --gpus-per-task=1: every process sees its own GPU as cuda:0, so LOCAL_RANK % visible
// devices is 0 everywhere, and yet no two share one.
TEST(GpuSharing, OneGpuEachIsFineWhateverTheIndexSays) {
  const auto [r0, r1] = run_two("GPU-aaaa", "GPU-bbbb", /*nccl=*/true);
  for (const Outcome& o : {r0, r1}) {
    EXPECT_EQ(o.error, "");
    EXPECT_EQ(o.returned, "");
  }
}

}  // namespace
}  // namespace gpipe

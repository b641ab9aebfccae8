// Distributed's waits on other ranks, with two ranks in one process (a thread each, over a real
// TCPStore and Gloo group on loopback): a rank that is alive but slow to reach a gather (a large
// checkpoint on a shared filesystem) is waited for while its heartbeat advances, past the
// timeout that gives up on a silent one (the monitor's lost-rank tests are distributed_cpu's).
#include <gtest/gtest.h>

#include <chrono>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "free_port.h"
#include "trainer/distributed/distributed.h"
#include "trainer/launch/world.h"

namespace gpipe {
namespace {

WorldInfo rank_of_two(int rank, int port) {
  WorldInfo w;
  w.rank = rank;
  w.world_size = 2;
  w.local_rank = rank;
  w.local_world_size = 2;
  w.master_port = port;
  w.source = "env";
  return w;
}

DistributedOptions short_waits() {
  DistributedOptions o;
  o.timeout = std::chrono::milliseconds(3000);  // the join and Gloo connect too: room on a loaded CI machine
  o.heartbeat = std::chrono::milliseconds(100);
  return o;
}

TEST(DistributedWaits, AGatherWaitsForALiveRankPastTheTimeout) {
  const int port = testing::free_port();
  ASSERT_GT(port, 0);
  std::vector<std::string> gathered;
  std::exception_ptr error0, error1;
  std::thread rank1([&] {
    try {
      auto d = Distributed::connect(rank_of_two(1, port), "same", short_waits());
      std::this_thread::sleep_for(std::chrono::milliseconds(7000));  // over twice the timeout, beating
      d->gather_to_rank0("slow", "from rank 1");
      d->finish();
    } catch (...) {
      error1 = std::current_exception();
    }
  });
  try {
    auto d = Distributed::connect(rank_of_two(0, port), "same", short_waits());
    gathered = d->gather_to_rank0("slow", "from rank 0");
    d->finish();
  } catch (...) {
    error0 = std::current_exception();
  }
  rank1.join();
  auto what = [](const std::exception_ptr& e) -> std::string {
    try {
      if (e) std::rethrow_exception(e);
    } catch (const std::exception& x) {
      return x.what();
    }
    return "";
  };
  EXPECT_EQ(what(error0), "") << "rank 0 gave up on a rank that was alive";
  EXPECT_EQ(what(error1), "");
  EXPECT_EQ(gathered, (std::vector<std::string>{"from rank 0", "from rank 1"}));
}

}  // namespace
}  // namespace gpipe

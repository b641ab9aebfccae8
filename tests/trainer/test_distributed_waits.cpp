// Distributed's waits on other ranks, with two ranks in one process (a thread each, over a real
// TCPStore and Gloo group on loopback): a rank that is alive but slow to reach a gather or to
// send a stage's activation (a large checkpoint on a shared filesystem) is waited for while its
// heartbeat advances, past the timeout that gives up on a silent one, and a live rank that never
// gets there still ends the wait, after 10 x the timeout (the monitor's lost-rank tests are
// distributed_cpu's).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <exception>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>

#include "free_port.h"
#include "trainer/distributed/distributed.h"
#include "trainer/distributed/transport.h"
#include "trainer/launch/world.h"
#include "trainer/partition/placement.h"
#include "trainer/schedule/schedule.h"

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

std::string what(const std::exception_ptr& e) {
  try {
    if (e) std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  }
  return "";
}

// Pipeline rank r in world rank r's process: a two-stage pipeline over the Gloo transport.
struct TwoStagePipeline {
  Schedule schedule = make_schedule(ScheduleKind::kOneFOneB, 2, 1);
  Placement placement{{0, 1}};
};

const TransferKey kActivationForStage1{TransferKind::kActivation, 1, 0};

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
  EXPECT_EQ(what(error0), "") << "rank 0 gave up on a rank that was alive";
  EXPECT_EQ(what(error1), "");
  EXPECT_EQ(gathered, (std::vector<std::string>{"from rank 0", "from rank 1"}));
}

// The receiving stage waits with the executor's timeout (parallel.peer_timeout_s); the sender's
// process beats all along, so the receive goes on until the activation arrives.
TEST(DistributedWaits, AReceiveWaitsForALiveSenderPastTheTimeout) {
  const int port = testing::free_port();
  ASSERT_GT(port, 0);
  const TwoStagePipeline pipeline;
  at::Tensor received;
  std::exception_ptr error0, error1;
  std::thread rank0([&] {
    try {
      auto d = Distributed::connect(rank_of_two(0, port), "same", short_waits());
      auto t = d->make_transport("gloo", pipeline.placement, pipeline.schedule);
      std::this_thread::sleep_for(std::chrono::milliseconds(7000));  // over twice the timeout, beating
      t->send(kActivationForStage1, Message{at::arange(6, at::kFloat).reshape({2, 3}), nullptr});
      d->barrier();  // the send is taken before the transport goes
      d->unwatch(t.get());
      d->finish();
    } catch (...) {
      error0 = std::current_exception();
    }
  });
  try {
    auto d = Distributed::connect(rank_of_two(1, port), "same", short_waits());
    auto t = d->make_transport("gloo", pipeline.placement, pipeline.schedule);
    received = t->recv(kActivationForStage1, d->timeout()).tensor;
    d->barrier();
    d->unwatch(t.get());
    d->finish();
  } catch (...) {
    error1 = std::current_exception();
  }
  rank0.join();
  EXPECT_EQ(what(error1), "") << "the receiving rank gave up on a sender that was alive";
  EXPECT_EQ(what(error0), "");
  ASSERT_TRUE(received.defined());
  EXPECT_TRUE(received.equal(at::arange(6, at::kFloat).reshape({2, 3})));
}

// A sender that beats but never sends (its pipeline hung) is not waited for forever: the receive
// ends after 10 x the timeout with a TransportTimeout that says the peer was alive.
TEST(DistributedWaits, AReceiveFromALiveSenderThatNeverSendsEnds) {
  const int port = testing::free_port();
  ASSERT_GT(port, 0);
  const auto timeout = std::chrono::milliseconds(1500);  // the receive's; the ranks keep short_waits()'s room
  const TwoStagePipeline pipeline;
  std::string error;
  std::chrono::steady_clock::duration waited{};
  std::exception_ptr error0, unexpected;
  std::atomic<bool> receiver_done{false};
  std::thread rank0([&] {
    try {
      auto d = Distributed::connect(rank_of_two(0, port), "same", short_waits());
      auto t = d->make_transport("gloo", pipeline.placement, pipeline.schedule);
      while (!receiver_done) std::this_thread::sleep_for(std::chrono::milliseconds(20));  // alive, silent
      d->unwatch(t.get());
      d->finish();
    } catch (...) {
      error0 = std::current_exception();
    }
  });
  try {
    auto d = Distributed::connect(rank_of_two(1, port), "same", short_waits());
    auto t = d->make_transport("gloo", pipeline.placement, pipeline.schedule);
    const auto start = std::chrono::steady_clock::now();
    try {
      (void)t->recv(kActivationForStage1, timeout);
    } catch (const TransportTimeout& e) {
      error = e.what();
    }
    waited = std::chrono::steady_clock::now() - start;
    receiver_done = true;
    d->unwatch(t.get());
    d->finish();
  } catch (...) {
    unexpected = std::current_exception();
  }
  receiver_done = true;
  rank0.join();
  EXPECT_EQ(what(unexpected), "");
  EXPECT_EQ(what(error0), "");
  EXPECT_NE(error.find("activation for stage 1, micro-batch 0"), std::string::npos) << error;
  EXPECT_NE(error.find("for 15000 ms (10 x"), std::string::npos) << error;
  EXPECT_NE(error.find("hangs"), std::string::npos) << error;
  EXPECT_GE(waited, 10 * timeout) << "the receive gave up before 10 x the timeout on a live sender";
}

}  // namespace
}  // namespace gpipe

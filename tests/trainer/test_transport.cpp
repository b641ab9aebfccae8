// The in-process transport: delivery by key, a receive nobody feeds times out naming the peer,
// abort wakes waiters, duplicate sends are errors; the NCCL transport's store keys.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <chrono>
#include <thread>

#include "trainer/distributed/transport.h"
#include "trainer/partition/placement.h"

namespace gpipe {
namespace {

using namespace std::chrono_literals;

TEST(TransportTest, NcclStoreKeysOfReplicasDiffer) {
  // 2 replicas of a 2-rank pipeline, one process per rank: replica 0 on world ranks 0-1, replica 1
  // on 2-3. Both replicas' pipeline ranks 0 -> 1 meet through the store at once: their keys must
  // differ (they were "nccl/id/0/1" in both), and both ends of a pair must compute the same one.
  ParallelConfig c;
  c.model_parallel_size = 2;
  c.data_parallel_size = 2;
  const Placement sender0 = make_placement(c, 4, 0), receiver0 = make_placement(c, 4, 1);
  const Placement sender1 = make_placement(c, 4, 2), receiver1 = make_placement(c, 4, 3);
  EXPECT_EQ(nccl_id_store_key(sender0, 0, 1), nccl_id_store_key(receiver0, 0, 1));
  EXPECT_EQ(nccl_id_store_key(sender1, 0, 1), nccl_id_store_key(receiver1, 0, 1));
  EXPECT_NE(nccl_id_store_key(sender0, 0, 1), nccl_id_store_key(sender1, 0, 1));
  EXPECT_NE(nccl_id_store_key(sender0, 0, 1), nccl_id_store_key(sender0, 1, 0));
  const TransferKey activation{TransferKind::kActivation, 1, 3};
  EXPECT_EQ(nccl_shape_store_key(sender0, activation, 0), nccl_shape_store_key(receiver0, activation, 0));
  EXPECT_NE(nccl_shape_store_key(sender0, activation, 0), nccl_shape_store_key(sender1, activation, 0));
  const TransferKey gradient{TransferKind::kGradient, 0, 3};
  EXPECT_NE(nccl_shape_store_key(receiver0, gradient, 1), nccl_shape_store_key(receiver1, gradient, 1));
}

TEST(TransportTest, DeliversByKeyAcrossThreads) {
  auto t = make_inprocess_transport(4);
  const TransferKey key{TransferKind::kActivation, 2, 5};
  std::thread sender([&] {
    std::this_thread::sleep_for(20ms);
    t->send(key, Message{at::full({3}, 7.0), nullptr});
  });
  Message m = t->recv(key, 5000ms);
  sender.join();
  ASSERT_TRUE(m.tensor.defined());
  EXPECT_EQ(m.tensor.sum().item<double>(), 21.0);
  EXPECT_EQ(t->pending(), 0u);
}

TEST(TransportTest, KeysDoNotMix) {
  auto t = make_inprocess_transport(2);
  t->send({TransferKind::kGradient, 0, 1}, Message{at::ones({1}), nullptr});
  EXPECT_THROW(t->recv({TransferKind::kActivation, 1, 1}, 10ms), TransportTimeout);
  EXPECT_THROW(t->recv({TransferKind::kGradient, 0, 0}, 10ms), TransportTimeout);
  EXPECT_NO_THROW(t->recv({TransferKind::kGradient, 0, 1}, 10ms));
}

// The message of a receive of `key` that times out ("" if it did not).
std::string timeout_of(Transport& t, const TransferKey& key, std::chrono::milliseconds wait) {
  try {
    t.recv(key, wait);
  } catch (const TransportTimeout& e) {
    return e.what();
  }
  return "";
}

// zbv's V placement (2 ranks: stages 0 and 3 on rank 0, 1 and 2 on rank 1): the error named the
// ranks by round robin (stage 3 on rank 1, stage 2 on rank 0), the wrong processes to look at.
TEST(TransportTest, ATimeoutNamesTheRanksOfTheSchedulesPlacement) {
  auto t = make_inprocess_transport(2, {0, 1, 1, 0});
  const std::string what = timeout_of(*t, {TransferKind::kActivation, 3, 1}, 10ms);
  EXPECT_NE(what.find("rank 0 waited 10 ms"), std::string::npos) << what;
  EXPECT_NE(what.find("from stage 2 on rank 1"), std::string::npos) << what;
}

TEST(TransportTest, RecvWithoutSenderTimesOutNamingPeerAndKey) {
  auto t = make_inprocess_transport(4);
  const auto start = std::chrono::steady_clock::now();
  const std::string what = timeout_of(*t, {TransferKind::kActivation, 3, 2}, 50ms);
  EXPECT_NE(what.find("from stage 2 on rank 2"), std::string::npos) << what;
  EXPECT_NE(what.find("activation for stage 3, micro-batch 2"), std::string::npos) << what;
  EXPECT_NE(what.find("rank 3 waited 50 ms"), std::string::npos) << what;
  EXPECT_GE(std::chrono::steady_clock::now() - start, 50ms);
  // Gradients come from the next stage.
  const std::string gradient = timeout_of(*t, {TransferKind::kGradient, 1, 0}, 1ms);
  EXPECT_NE(gradient.find("from stage 2 on rank 2"), std::string::npos) << gradient;
}

TEST(TransportTest, AbortWakesAWaitingReceiverWithTheReason) {
  auto t = make_inprocess_transport(2);
  std::thread aborter([&] {
    std::this_thread::sleep_for(20ms);
    t->abort("rank 1 failed: out of memory");
  });
  const auto start = std::chrono::steady_clock::now();
  try {
    t->recv({TransferKind::kActivation, 1, 0}, 10000ms);
    FAIL() << "recv returned after abort";
  } catch (const TransportTimeout&) {
    FAIL() << "abort reported as a timeout";
  } catch (const TransportError& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 failed: out of memory"), std::string::npos);
  }
  aborter.join();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 5000ms);
  EXPECT_THROW(t->send({TransferKind::kActivation, 1, 0}, Message{at::ones({1}), nullptr}), TransportError);
  t->reset();
  EXPECT_NO_THROW(t->send({TransferKind::kActivation, 1, 0}, Message{at::ones({1}), nullptr}));
}

TEST(TransportTest, SendingOneKeyTwiceIsAnError) {
  auto t = make_inprocess_transport(2);
  const TransferKey key{TransferKind::kActivation, 1, 0};
  t->send(key, Message{at::ones({1}), nullptr});
  EXPECT_THROW(t->send(key, Message{at::ones({1}), nullptr}), TransportError);
  EXPECT_EQ(t->pending(), 1u);
  EXPECT_EQ(t->reset(), 1u);
  EXPECT_EQ(t->pending(), 0u);
}

}  // namespace
}  // namespace gpipe

// Placement of pipeline ranks on processes, and the in-order property the NCCL transport needs.
#include <gtest/gtest.h>

#include "trainer/config/config.h"
#include "trainer/partition/placement.h"
#include "trainer/schedule/schedule.h"

namespace gpipe {
namespace {

ParallelConfig ranks(int n, std::vector<int64_t> placement = {}) {
  ParallelConfig p;
  p.model_parallel_size = n;
  p.placement = std::move(placement);
  return p;
}

TEST(Placement, ContiguousBlocksByDefault) {
  const Placement p = make_placement(ranks(8), 4);
  EXPECT_EQ(p.process_of_rank, (std::vector<int>{0, 0, 1, 1, 2, 2, 3, 3}));
  EXPECT_EQ(p.ranks_of(2), (std::vector<int>{4, 5}));
  EXPECT_EQ(make_placement(ranks(4), 1).ranks_of(0), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(p.describe(), "process 0: ranks 0 1 | process 1: ranks 2 3 | process 2: ranks 4 5 | process 3: ranks 6 7");
}

TEST(Placement, ExplicitListMixesColocatedAndSeparateRanks) {
  const Placement p = make_placement(ranks(4, {0, 1, 1, 0}), 2);
  EXPECT_EQ(p.ranks_of(0), (std::vector<int>{0, 3}));
  EXPECT_TRUE(p.is_local(2, 1));
  EXPECT_FALSE(p.is_local(2, 0));
}

TEST(Placement, ImpossibleLayoutsNameTheProblem) {
  auto message = [](const ParallelConfig& c, int world) {
    try {
      make_placement(c, world);
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(ranks(2), 4).find("WORLD_SIZE=4 but parallel.model_parallel_size is 2"), std::string::npos);
  EXPECT_NE(message(ranks(6), 4).find("not a multiple of WORLD_SIZE=4"), std::string::npos);
  EXPECT_NE(message(ranks(4, {0, 0, 0, 0}), 2).find("no pipeline rank to process 1"), std::string::npos);
  EXPECT_NE(message(ranks(4, {0, 1, 2, 1}), 2).find("parallel.placement[2] = 2"), std::string::npos);
  EXPECT_NE(message(ranks(4, {0, 1}), 2).find("2 entries for 4 pipeline ranks"), std::string::npos);
}

TEST(Placement, ReplicasTakeContiguousBlocksOfProcesses) {
  // 2 replicas of a 4-rank pipeline over 4 processes: replica 0 on processes 0-1, replica 1 on 2-3,
  // each laid out as parallel.placement (or the default blocks) says within its processes.
  ParallelConfig c = ranks(4);
  c.data_parallel_size = 2;
  const Placement first = make_placement(c, 4, 1);
  EXPECT_EQ(first.replica, 0);
  EXPECT_EQ(first.process_of_rank, (std::vector<int>{0, 0, 1, 1}));
  const Placement second = make_placement(c, 4, 3);
  EXPECT_EQ(second.replica, 1);
  EXPECT_EQ(second.processes_per_replica, 2);
  EXPECT_EQ(second.process_of_rank, (std::vector<int>{2, 2, 3, 3}));
  EXPECT_EQ(second.ranks_of(3), (std::vector<int>{2, 3}));
  EXPECT_TRUE(second.ranks_of(0).empty());  // another replica's process
  EXPECT_EQ(second.process_in_replica(3, 0), 1);
  EXPECT_EQ(first.process_in_replica(0, 1), 2);
  EXPECT_EQ(second.describe(), "process 2: ranks 0 1 | process 3: ranks 2 3 (replica 1 of 2)");
  c.placement = {1, 0, 0, 1};
  EXPECT_EQ(make_placement(c, 4, 2).process_of_rank, (std::vector<int>{3, 2, 2, 3}));
  // Both ranks in one process, 2 replicas in 2 processes.
  c.placement.clear();
  EXPECT_EQ(make_placement(c, 2, 1).process_of_rank, (std::vector<int>{1, 1, 1, 1}));
}

TEST(Placement, ReplicasThatDoNotDivideTheWorldAreRefused) {
  ParallelConfig c = ranks(2);
  c.data_parallel_size = 2;
  try {
    make_placement(c, 3, 0);
    FAIL() << "3 processes cannot hold 2 replicas";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("do not split into parallel.data_parallel_size=2"), std::string::npos) << e.what();
  }
  try {
    make_placement(c, 8, 0);
    FAIL() << "4 processes per replica for 2 ranks";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("4 processes per replica"), std::string::npos) << e.what();
  }
}

TEST(Placement, EveryScheduleReceivesInSendOrderAcrossProcesses) {
  // NCCL matches point-to-point messages by order: every schedule the runner can make must
  // receive each cross-process pair's messages in the order they are sent.
  struct Case {
    ScheduleKind kind;
    int virtual_stages;
  };
  for (const Case c : {Case{ScheduleKind::kGPipe, 1}, Case{ScheduleKind::kOneFOneB, 1}, Case{ScheduleKind::kZeroBubbleH1, 1},
                       Case{ScheduleKind::kInterleavedOneFOneB, 2}}) {
    for (int p = 2; p <= 8; ++p) {
      for (int m = p; m <= 2 * p; m += p) {
        const Schedule s = with_communication(make_schedule(c.kind, p, m, c.virtual_stages));
        std::string why;
        EXPECT_TRUE(sends_and_receives_in_same_order(s, make_placement(ranks(p), p), &why))
            << to_string(c.kind) << " p=" << p << " m=" << m << ": " << why;
      }
    }
  }
}

TEST(Placement, OutOfOrderReceivesAreReported) {
  Schedule s = with_communication(make_schedule(ScheduleKind::kGPipe, 2, 2));
  // Swap rank 1's two forward receives: micro-batch 1 is now expected first.
  auto& program = s.per_rank[1];
  std::vector<size_t> receives;
  for (size_t i = 0; i < program.size(); ++i) {
    if (program[i].type == ActionType::kRecvForward) receives.push_back(i);
  }
  ASSERT_EQ(receives.size(), 2u);
  std::swap(program[receives[0]].microbatch, program[receives[1]].microbatch);
  std::string why;
  EXPECT_FALSE(sends_and_receives_in_same_order(s, make_placement(ranks(2), 2), &why));
  EXPECT_NE(why.find("rank 0 sends its message #0 to rank 1"), std::string::npos) << why;
  // Within one process the order does not matter (the in-memory mailbox matches by key).
  EXPECT_TRUE(sends_and_receives_in_same_order(s, make_placement(ranks(2), 1)));
}

}  // namespace
}  // namespace gpipe

// Schedule generators and the communication lowering: per-rank orders and counts, warm-up
// lengths, shape errors, and that every family validates clean over a grid of shapes.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "trainer/config/config.h"
#include "trainer/schedule/schedule.h"

namespace gpipe {
namespace {

using ::testing::HasSubstr;

std::string program(const Schedule& s, int rank) {
  std::string out;
  for (const Action& a : s.per_rank[rank]) out += (out.empty() ? "" : " ") + to_string(a);
  return out;
}
int count(const Schedule& s, int rank, ActionType t) {
  const auto& p = s.per_rank[rank];
  return static_cast<int>(std::count_if(p.begin(), p.end(), [t](const Action& a) { return a.type == t; }));
}
int forwards_before_first_backward(const Schedule& s, int rank) {
  int n = 0;
  for (const Action& a : s.per_rank[rank]) {
    if (a.type == ActionType::kBackward || a.type == ActionType::kBackwardInput) break;
    n += a.type == ActionType::kForward;
  }
  return n;
}

TEST(Schedule, Names) {
  for (ScheduleKind k : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB, ScheduleKind::kInterleavedOneFOneB,
                         ScheduleKind::kZeroBubbleH1})
    EXPECT_EQ(parse_schedule_kind(to_string(k)), k);
  try {
    parse_schedule_kind("2f2b");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("gpipe, 1f1b, interleaved_1f1b, zb_h1"));
  }
  EXPECT_EQ(to_string(Action{ActionType::kRecvForward, 2, 5}), "2RF5");
  EXPECT_STREQ(short_name(ActionType::kBackwardWeight), "W");
  EXPECT_TRUE(is_communication(ActionType::kSendBackward));
  EXPECT_FALSE(is_communication(ActionType::kBackwardInput));
}

TEST(Schedule, GPipeIsAllForwardsThenAllBackwards) {
  const Schedule s = make_schedule(ScheduleKind::kGPipe, 3, 4);
  EXPECT_EQ(program(s, 1), "1F0 1F1 1F2 1F3 1B0 1B1 1B2 1B3");  // torch's ScheduleGPipe order
}

TEST(Schedule, OneFOneBOrder) {
  const Schedule s = make_schedule(ScheduleKind::kOneFOneB, 4, 6);
  EXPECT_EQ(program(s, 0), "0F0 0F1 0F2 0F3 0B0 0F4 0B1 0F5 0B2 0B3 0B4 0B5");
  EXPECT_EQ(program(s, 2), "2F0 2F1 2B0 2F2 2B1 2F3 2B2 2F4 2B3 2F5 2B4 2B5");
  EXPECT_EQ(program(s, 3), "3F0 3B0 3F1 3B1 3F2 3B2 3F3 3B3 3F4 3B4 3F5 3B5");
}

TEST(Schedule, OneFOneBWarmupIsRanksMinusStageMinusOne) {
  for (int p = 1; p <= 8; ++p)
    for (int m = 1; m <= 16; ++m) {
      const Schedule s = make_schedule(ScheduleKind::kOneFOneB, p, m);
      for (int r = 0; r < p; ++r) {
        EXPECT_EQ(count(s, r, ActionType::kForward), m);
        EXPECT_EQ(count(s, r, ActionType::kBackward), m);
        // p-r-1 warm-up forwards, then the first steady forward precedes the first backward.
        EXPECT_EQ(forwards_before_first_backward(s, r), std::min(p - r - 1, m) + (m > p - r - 1 ? 1 : 0))
            << "p=" << p << " m=" << m << " rank " << r;
      }
    }
}

TEST(Schedule, InterleavedOrderMatchesTorch) {
  // torch.distributed.pipelining.ScheduleInterleaved1F1B, 2 ranks x 2 chunks, 4 micro-batches:
  // warm-up (v-1)p + 2(p-1-r) forwards, rounds of p micro-batches per chunk.
  const Schedule s = make_schedule(ScheduleKind::kInterleavedOneFOneB, 2, 4, 2);
  EXPECT_EQ(program(s, 0), "0F0 0F1 2F0 2F1 0F2 2B0 0F3 2B1 2F2 0B0 2F3 0B1 2B2 2B3 0B2 0B3");
  EXPECT_EQ(program(s, 1), "1F0 1F1 3F0 3B0 3F1 3B1 1F2 1B0 1F3 1B1 3F2 3B2 3F3 3B3 1B2 1B3");
}

TEST(Schedule, InterleavedCountsAndPlacement) {
  for (int p : {1, 2, 3, 4})
    for (int v : {2, 3})
      for (int m = p; m <= 12; m += p) {
        const Schedule s = make_schedule(ScheduleKind::kInterleavedOneFOneB, p, m, v);
        EXPECT_EQ(s.num_stages(), p * v);
        for (int r = 0; r < p; ++r) {
          EXPECT_EQ(count(s, r, ActionType::kForward), v * m);
          EXPECT_EQ(count(s, r, ActionType::kBackward), v * m);
          for (const Action& a : s.per_rank[r]) EXPECT_EQ(a.stage % p, r);
        }
      }
}

TEST(Schedule, ZeroBubbleH1SplitsBackwardAndKeeps1F1BWarmup) {
  for (int p = 1; p <= 8; ++p)
    for (int m = 1; m <= 16; ++m) {
      const Schedule s = make_schedule(ScheduleKind::kZeroBubbleH1, p, m);
      for (int r = 0; r < p; ++r) {
        EXPECT_EQ(count(s, r, ActionType::kForward), m);
        EXPECT_EQ(count(s, r, ActionType::kBackwardInput), m);
        EXPECT_EQ(count(s, r, ActionType::kBackwardWeight), m);
        EXPECT_EQ(count(s, r, ActionType::kBackward), 0);
        EXPECT_EQ(forwards_before_first_backward(s, r), std::min(p - r, m)) << "p=" << p << " m=" << m << " r=" << r;
        // W passes are deferred: at most r outstanding when an I starts (r + 1 right after it).
        int inputs = 0, weights = 0, most_deferred = 0;
        for (const Action& a : s.per_rank[r]) {
          inputs += a.type == ActionType::kBackwardInput;
          weights += a.type == ActionType::kBackwardWeight;
          most_deferred = std::max(most_deferred, inputs - weights);
        }
        EXPECT_LE(most_deferred, r + 1);
      }
    }
}

TEST(Schedule, ImpossibleShapesAreRejectedWithTheRule) {
  auto error = [](ScheduleKind k, int p, int m, int v) -> std::string {
    try {
      make_schedule(k, p, m, v);
    } catch (const std::invalid_argument& e) {
      return e.what();
    }
    return "(no error)";
  };
  // torch's interleaved and looped classes take one stage per rank as well.
  EXPECT_EQ(error(ScheduleKind::kInterleavedOneFOneB, 4, 8, 1), "(no error)");
  EXPECT_EQ(error(ScheduleKind::kInterleavedZeroBubble, 4, 8, 1), "(no error)");
  EXPECT_EQ(error(ScheduleKind::kLoopedBFS, 4, 8, 1), "(no error)");
  // 9 micro-batches on 4 ranks: 2 rounds, not equal.
  EXPECT_THAT(error(ScheduleKind::kInterleavedOneFOneB, 4, 9, 2), HasSubstr("= 2 equal rounds"));
  EXPECT_THAT(error(ScheduleKind::kInterleavedOneFOneB, 4, 9, 2), HasSubstr("use 8 or 10 micro-batches"));
  EXPECT_THAT(error(ScheduleKind::kInterleavedZeroBubble, 3, 7, 2), HasSubstr("use 6 or 8 micro-batches"));
  EXPECT_EQ(error(ScheduleKind::kLoopedBFS, 4, 9, 2), "(no error)");  // any micro-batch count
  EXPECT_THAT(error(ScheduleKind::kZeroBubbleV, 4, 8, 3), HasSubstr("zbv needs virtual_stages = 2"));
  EXPECT_THAT(error(ScheduleKind::kDualPipeV, 4, 8, 1), HasSubstr("dualpipev needs virtual_stages = 2"));
  EXPECT_THAT(error(ScheduleKind::kDualPipeV, 4, 7, 2), HasSubstr("at least as many micro-batches as stages (2 x ranks = 8)"));
  EXPECT_THAT(error(ScheduleKind::kOneFOneB, 4, 8, 2), HasSubstr("zbv or dualpipev"));
  EXPECT_THAT(error(ScheduleKind::kZeroBubbleH1, 4, 8, 2), HasSubstr("one stage per rank"));
  EXPECT_THAT(error(ScheduleKind::kOneFOneB, 0, 8, 1), HasSubstr("at least 1 rank"));
  EXPECT_THAT(error(ScheduleKind::kGPipe, 2, 0, 1), HasSubstr("at least 1 micro-batch"));
}

TEST(Schedule, FromConfig) {
  PipelineConfig c;
  c.parallel.schedule = "interleaved_1f1b";
  c.parallel.model_parallel_size = 2;
  c.parallel.virtual_stages = 2;
  c.training.num_microbatches = 4;
  const Schedule s = make_schedule(c);
  EXPECT_EQ(s.kind, ScheduleKind::kInterleavedOneFOneB);
  EXPECT_EQ(s.num_ranks, 2);
  EXPECT_EQ(s.stages_per_rank, 2);
  EXPECT_EQ(s.num_microbatches, 4);
}

TEST(Communication, OneFOneBPairsSendsWithTheNextReceives) {
  const Schedule s = with_communication(make_schedule(ScheduleKind::kOneFOneB, 3, 2));
  EXPECT_EQ(program(s, 0), "0F0 0SF0 0F1 0SF1 0RB0 0B0 0RB1 0B1");
  EXPECT_EQ(program(s, 1), "1RF0 1F0 1SF0 1RF1 1F1 1SF1 1RB0 1B0 1SB0 1RB1 1B1 1SB1");
  EXPECT_EQ(program(s, 2), "2RF0 2F0 2B0 2SB0 2RF1 2F1 2B1 2SB1");
}

TEST(Communication, InterleavedSteadyStatePostsFourOpsTogether) {
  const Schedule s = with_communication(make_schedule(ScheduleKind::kInterleavedOneFOneB, 2, 4, 2));
  // Rank 1's steady state pairs 3F1 with 3B1: both receives before, both sends after.
  EXPECT_THAT(program(s, 1), HasSubstr("3F0 3B0 3SB0 3RF1 3F1 3B1 3SB1 1RF2 1RB0 1F2 1B0 1SF2 1SB0"));
}

TEST(Communication, SameRankNeighboursExchangeNothing) {
  for (auto [kind, v] : {std::pair{ScheduleKind::kGPipe, 1}, std::pair{ScheduleKind::kOneFOneB, 1},
                         std::pair{ScheduleKind::kInterleavedOneFOneB, 3}, std::pair{ScheduleKind::kZeroBubbleH1, 1}}) {
    const Schedule compute = make_schedule(kind, 1, 4, v);
    EXPECT_EQ(with_communication(compute).per_rank, compute.per_rank) << to_string(kind);
  }
}

TEST(Communication, OneMessageEachWayPerBoundaryAndMicrobatch) {
  const Schedule s = with_communication(make_schedule(ScheduleKind::kInterleavedOneFOneB, 4, 8, 2));
  std::map<ActionType, int> total;
  for (const auto& prog : s.per_rank)
    for (const Action& a : prog) ++total[a.type];
  const int boundaries = s.num_stages() - 1;
  for (ActionType t : {ActionType::kSendForward, ActionType::kRecvForward, ActionType::kSendBackward, ActionType::kRecvBackward})
    EXPECT_EQ(total[t], boundaries * 8) << short_name(t);
  EXPECT_THROW(with_communication(s), std::invalid_argument);  // already lowered
}

// Every family, compute-only and lowered, validates clean for p in 1..8 and m in 1..16 wherever
// the shape is legal: no deadlock under rendezvous sends, nothing missing or duplicated.
TEST(Communication, EveryKindValidatesOverAGridOfShapes) {
  int checked = 0;
  for (ScheduleKind kind : {ScheduleKind::kGPipe, ScheduleKind::kOneFOneB, ScheduleKind::kInterleavedOneFOneB,
                            ScheduleKind::kZeroBubbleH1})
    for (int p = 1; p <= 8; ++p)
      for (int m = 1; m <= 16; ++m)
        for (int v : kind == ScheduleKind::kInterleavedOneFOneB ? std::vector<int>{2, 3} : std::vector<int>{1}) {
          if (kind == ScheduleKind::kInterleavedOneFOneB && m % p != 0) continue;
          const Schedule compute = make_schedule(kind, p, m, v);
          const Schedule lowered = with_communication(compute);
          const ValidationResult a = validate(compute), b = validate(lowered);
          ASSERT_TRUE(a.ok) << to_string(kind) << " p=" << p << " m=" << m << " v=" << v << "\n" << render_grid(compute, a);
          ASSERT_TRUE(b.ok) << to_string(kind) << " p=" << p << " m=" << m << " v=" << v << "\n" << render_grid(lowered, b);
          ++checked;
        }
  EXPECT_EQ(checked, 8 * 16 * 3 + 2 * (16 + 8 + 5 + 4 + 3 + 2 + 2 + 2));
}

}  // namespace
}  // namespace gpipe

// The generators ported from torch.distributed.pipelining 2.11's multi-stage schedules
// (looped_bfs, interleaved_zb, zbv, dualpipev, and interleaved_1f1b's flex rounds): torch's
// order on small shapes (copied from torch's pipeline_order; the full comparison against torch
// over every shape it accepts is tests/trainer/torch_schedule_csv_test.py), the V placement,
// validation over every legal shape, the grid printer, and the bubble / activation metrics (the
// shape rules are in test_schedule.cpp, ImpossibleShapesAreRejectedWithTheRule).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "trainer/schedule/schedule.h"
#include "trainer/schedule/schedule_csv.h"

namespace gpipe {
namespace {

using ::testing::HasSubstr;

constexpr ScheduleKind kPorted[] = {ScheduleKind::kLoopedBFS, ScheduleKind::kInterleavedZeroBubble,
                                    ScheduleKind::kZeroBubbleV, ScheduleKind::kDualPipeV};

std::string program(const Schedule& s, int rank) {
  std::string out;
  for (const Action& a : s.per_rank[static_cast<size_t>(rank)]) out += (out.empty() ? "" : " ") + to_string(a);
  return out;
}

// The shapes torch's constructors accept (p >= 1, m >= 1), per kind.
bool torch_accepts(ScheduleKind k, int p, int m, int v) {
  switch (k) {
    case ScheduleKind::kInterleavedOneFOneB:
    case ScheduleKind::kInterleavedZeroBubble: return m % std::max(1, m / p) == 0;  // v = 1 too
    case ScheduleKind::kLoopedBFS: return true;
    case ScheduleKind::kZeroBubbleV: return v == 2;
    case ScheduleKind::kDualPipeV: return v == 2 && m >= 2 * p;
    default: return false;
  }
}

TEST(TorchPorts, NamesRoundTrip) {
  for (ScheduleKind k : kPorted) EXPECT_EQ(parse_schedule_kind(to_string(k)), k);
  EXPECT_EQ(parse_schedule_kind("looped_bfs"), ScheduleKind::kLoopedBFS);
  EXPECT_EQ(parse_schedule_kind("interleaved_zb"), ScheduleKind::kInterleavedZeroBubble);
  EXPECT_EQ(parse_schedule_kind("zbv"), ScheduleKind::kZeroBubbleV);
  EXPECT_EQ(parse_schedule_kind("dualpipev"), ScheduleKind::kDualPipeV);
  try {
    parse_schedule_kind("zb_v");
    FAIL();
  } catch (const std::invalid_argument& e) {
    EXPECT_THAT(std::string(e.what()), HasSubstr("looped_bfs, interleaved_zb, zbv, dualpipev"));
  }
}

// Each expected string is torch 2.11's pipeline_order for the shape, empty slots dropped.
TEST(TorchPorts, LoopedBFSOrderMatchesTorch) {
  const Schedule s = make_schedule(ScheduleKind::kLoopedBFS, 2, 2, 2);
  EXPECT_EQ(program(s, 0), "0F0 0F1 2F0 2F1 2B1 2B0 0B1 0B0");
  EXPECT_EQ(program(s, 1), "1F0 1F1 3F0 3F1 3B1 3B0 1B1 1B0");
  EXPECT_TRUE(s.stage_to_rank.empty());  // round robin
}

TEST(TorchPorts, InterleavedZeroBubbleOrderMatchesTorch) {
  const Schedule s = make_schedule(ScheduleKind::kInterleavedZeroBubble, 2, 4, 2);
  EXPECT_EQ(program(s, 0), "0F0 0F1 2F0 2F1 2I0 2W0 0F2 2I1 2W1 0F3 0I0 0W0 2F2 0I1 0W1 2F3 2I2 2W2 2I3 2W3 0I2 0W2 "
                           "0I3 0W3");
  EXPECT_EQ(program(s, 1), "1F0 1F1 3F0 3I0 3F1 3I1 3W0 1F2 1I0 3W1 1F3 1I1 1W0 3F2 3I2 1W1 3F3 3I3 3W2 1I2 3W3 1I3 "
                           "1W2 1W3");
}

TEST(TorchPorts, ZeroBubbleVOrderMatchesTorch) {
  Schedule s = make_schedule(ScheduleKind::kZeroBubbleV, 2, 4, 2);
  EXPECT_EQ(program(s, 0), "0F0 0F1 0F2 3F0 3I0 3W0 3F1 3I1 3W1 0F3 0I0 0W0 3F2 3I2 3W2 0I1 0W1 3F3 3I3 3W3 0I2 0W2 "
                           "0I3 0W3");
  EXPECT_EQ(program(s, 1), "1F0 2F0 1F1 2F1 2I0 2W0 1F2 1I0 1W0 2F2 2I1 2W1 1F3 1I1 1W1 2F3 2I2 2W2 1I2 2I3 1I3 1W2 "
                           "2W3 1W3");
  // Fewer micro-batches than the V needs (2p - 1): torch's pattern for 2p - 1 with the missing
  // micro-batches dropped.
  s = make_schedule(ScheduleKind::kZeroBubbleV, 3, 2, 2);
  EXPECT_EQ(program(s, 0), "0F0 0F1 5F0 5I0 5W0 5F1 5I1 5W1 0I0 0W0 0I1 0W1");
  EXPECT_EQ(program(s, 1), "1F0 1F1 4F0 4F1 4I0 4W0 4I1 4W1 1I0 1W0 1I1 1W1");
  EXPECT_EQ(program(s, 2), "2F0 3F0 2F1 3F1 3I0 3W0 2I0 2W0 3I1 3W1 2I1 2W1");
}

TEST(TorchPorts, DualPipeVOrderMatchesTorchWithOverlappedPairsExpanded) {
  // torch: ... 3F1 (0F3;3B1)OVERLAP_F_B (3F2;0B0)OVERLAP_F_B 3B2 (3F3;0B1)OVERLAP_F_B 3B3 ...
  const Schedule s = make_schedule(ScheduleKind::kDualPipeV, 2, 4, 2);
  EXPECT_EQ(program(s, 0), "0F0 0F1 0F2 3F0 3I0 3W0 3F1 0F3 3B1 3F2 0B0 3B2 3F3 0B1 3B3 0I2 0W2 0I3 0W3");
  EXPECT_EQ(program(s, 1), "1F0 2F0 1F1 2F1 1F2 2B0 2F2 1B0 1F3 2B1 2F3 1B1 2B2 1B2 2I3 1I3 2W3 1W3");
}

TEST(TorchPorts, InterleavedOneFOneBTakesTorchsFlexRounds) {
  // 5 micro-batches on 4 ranks: one round of 5 (torch accepts it; m % p != 0).
  const Schedule s = make_schedule(ScheduleKind::kInterleavedOneFOneB, 4, 5, 2);
  EXPECT_EQ(program(s, 0), "0F0 0F1 0F2 0F3 0F4 4F0 4F1 4F2 4F3 4F4 4B0 4B1 4B2 4B3 4B4 0B0 0B1 0B2 0B3 0B4");
  EXPECT_EQ(program(s, 2), "2F0 2F1 2F2 2F3 2F4 6F0 6F1 6F2 6B0 6F3 6B1 6F4 6B2 6B3 6B4 2B0 2B1 2B2 2B3 2B4");
  EXPECT_EQ(program(s, 3), "3F0 3F1 3F2 3F3 3F4 7F0 7B0 7F1 7B1 7F2 7B2 7F3 7B3 7F4 7B4 3B0 3B1 3B2 3B3 3B4");
  EXPECT_TRUE(validate(with_communication(s)).ok);
}

TEST(TorchPorts, VPlacement) {
  for (ScheduleKind k : {ScheduleKind::kZeroBubbleV, ScheduleKind::kDualPipeV}) {
    const Schedule s = make_schedule(k, 4, 8, 2);
    EXPECT_EQ(s.stage_to_rank, (std::vector<int>{0, 1, 2, 3, 3, 2, 1, 0})) << to_string(k);
    EXPECT_EQ(s.num_stages(), 8);
    for (int r = 0; r < 4; ++r)
      for (const Action& a : s.per_rank[static_cast<size_t>(r)]) EXPECT_EQ(s.rank_of_stage(a.stage), r) << to_string(a);
  }
}

// Exactly torch's shapes are accepted, and every one validates clean, compute-only and lowered
// (torch's lowering for these kinds), prints as a grid, and its compute-only CSV reads back to
// the same programs and placement.
TEST(TorchPorts, EveryTorchShapeValidatesLowersAndPrints) {
  int checked = 0;
  for (ScheduleKind k : {ScheduleKind::kInterleavedOneFOneB, ScheduleKind::kLoopedBFS,
                         ScheduleKind::kInterleavedZeroBubble, ScheduleKind::kZeroBubbleV, ScheduleKind::kDualPipeV})
    for (int p = 1; p <= 6; ++p)
      for (int m = 1; m <= 16; ++m)
        for (int v = 1; v <= 3; ++v) {
          const std::string what = std::string(to_string(k)) + " p=" + std::to_string(p) + " m=" + std::to_string(m) +
                                   " v=" + std::to_string(v);
          if (!torch_accepts(k, p, m, v)) {
            EXPECT_THROW(make_schedule(k, p, m, v), std::invalid_argument) << what;
            continue;
          }
          const Schedule compute = make_schedule(k, p, m, v);
          const Schedule lowered = with_communication(compute);
          const ValidationResult a = validate(compute), b = validate(lowered);
          ASSERT_TRUE(a.ok) << what << "\n" << render_grid(compute, a);
          ASSERT_TRUE(b.ok) << what << "\n" << render_grid(lowered, b);
          const std::string grid = render_grid(lowered, b);
          EXPECT_THAT(grid, HasSubstr("rank " + std::to_string(p - 1))) << what;
          const Schedule back = schedule_from_csv(schedule_to_csv(compute, ScheduleCsvFormat::kComputeOnly), what);
          EXPECT_EQ(back.per_rank, compute.per_rank) << what;
          for (int s = 0; s < compute.num_stages(); ++s) EXPECT_EQ(back.rank_of_stage(s), compute.rank_of_stage(s)) << what;
          ++checked;
        }
  EXPECT_EQ(checked, 894);  // the legal shapes of the grid (v = 1 included): none skipped by mistake
}

TEST(TorchPorts, GridShowsTheVPlacement) {
  const Schedule s = with_communication(make_schedule(ScheduleKind::kZeroBubbleV, 2, 4, 2));
  const std::string grid = render_grid(s, validate(s));
  // Rank 0 holds stages 0 and 3, so its cells name their stage.
  EXPECT_THAT(grid, HasSubstr("3F0"));
  EXPECT_THAT(grid, HasSubstr("0F0"));
  EXPECT_THAT(grid, HasSubstr("2F0"));
}

// Bubbles under unit costs with each of a rank's v chunks costing 1/v (F = 1/v, B = 2/v, I = W =
// 1/v): interleaved 1F1B and looped BFS (p-1)/(vm+p-1), the 1F1B bubble time over v; the
// zero-bubble ones (p-1)/(3vm+p-1), a third of that, once the pipeline fills.
TEST(TorchPorts, BubbleMatchesTheClosedForms) {
  constexpr double kMargin = 1e-9;
  for (int p = 2; p <= 6; ++p)
    for (int m = 1; m <= 16; ++m)
      for (int v : {2, 3}) {
        const std::string what = "p=" + std::to_string(p) + " m=" + std::to_string(m) + " v=" + std::to_string(v);
        const double interleaved = (p - 1.0) / (v * m + p - 1.0);
        const double zero_bubble = (p - 1.0) / (3.0 * v * m + p - 1.0);
        auto bubble = [&](ScheduleKind k) { return simulated_bubble_fraction(make_schedule(k, p, m, v), 1.0 / v, 2.0 / v); };
        if (m >= p && m % p == 0) {
          EXPECT_NEAR(bubble(ScheduleKind::kInterleavedOneFOneB), interleaved, kMargin) << what;
          EXPECT_NEAR(bubble(ScheduleKind::kInterleavedZeroBubble), zero_bubble, kMargin) << what;
        }
        if (m >= p) {
          EXPECT_NEAR(bubble(ScheduleKind::kLoopedBFS), interleaved, kMargin) << what;
        }
        if (v != 2) continue;
        if (m >= 2 * p - 1) {
          EXPECT_NEAR(bubble(ScheduleKind::kZeroBubbleV), zero_bubble, kMargin) << what;
        }
        if (m >= 2 * p) {
          EXPECT_NEAR(bubble(ScheduleKind::kDualPipeV), zero_bubble, kMargin) << what;
        }
        EXPECT_LT(bubble(ScheduleKind::kZeroBubbleV), (p - 1.0) / (m + p - 1.0)) << "below 1F1B; " << what;
      }
}

// Activations held at once, counted in chunks (a stage's share of the rank's layers): looped BFS
// holds every micro-batch of every chunk before the first backward; ZBV stays within 1F1B's
// memory (p micro-batches of a whole rank = 2p chunks), DualPipeV one chunk more; interleaved
// zero bubble no more than interleaved 1F1B.
TEST(TorchPorts, PeakActivations) {
  for (int p = 2; p <= 6; ++p)
    for (int m = 1; m <= 16; ++m) {
      for (int v : {2, 3}) {
        for (int held : peak_activations(make_schedule(ScheduleKind::kLoopedBFS, p, m, v))) EXPECT_EQ(held, v * m);
        if (!torch_accepts(ScheduleKind::kInterleavedZeroBubble, p, m, v)) continue;
        const auto zb = peak_activations(make_schedule(ScheduleKind::kInterleavedZeroBubble, p, m, v));
        const auto ofob = peak_activations(make_schedule(ScheduleKind::kInterleavedOneFOneB, p, m, v));
        for (int r = 0; r < p; ++r) EXPECT_LE(zb[r], ofob[r]) << "p=" << p << " m=" << m << " v=" << v << " r=" << r;
      }
      for (int held : peak_activations(make_schedule(ScheduleKind::kZeroBubbleV, p, m, 2))) EXPECT_LE(held, 2 * p);
      if (m >= 2 * p) {
        for (int held : peak_activations(make_schedule(ScheduleKind::kDualPipeV, p, m, 2))) EXPECT_LE(held, 2 * p + 1);
      }
    }
}

}  // namespace
}  // namespace gpipe

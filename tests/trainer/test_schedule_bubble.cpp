// Bubble share under the unit-cost simulation and the activation-memory peak, against the
// closed forms: GPipe/1F1B (p-1)/(m+p-1) with F=1, B=2; interleaved (p-1)/(vm+p-1) (the 1F1B
// bubble time divided by v); ZB-H1 (p-1)/(3m+p-1) for m >= p (a third of 1F1B's bubble time).
#include <gtest/gtest.h>

#include <stdexcept>
#include <vector>

#include "trainer/schedule/schedule.h"

namespace gpipe {
namespace {

constexpr double kMargin = 1e-9;  // the simulation is exact for unit costs; only rounding differs

double one_f_one_b_formula(int p, int m) { return (p - 1.0) / (m + p - 1.0); }

TEST(Bubble, GPipeAnd1F1BMatchTheFormula) {
  for (int p = 1; p <= 8; ++p)
    for (int m = 1; m <= 16; ++m) {
      EXPECT_NEAR(simulated_bubble_fraction(make_schedule(ScheduleKind::kGPipe, p, m)), one_f_one_b_formula(p, m), kMargin);
      EXPECT_NEAR(simulated_bubble_fraction(with_communication(make_schedule(ScheduleKind::kOneFOneB, p, m))),
                  one_f_one_b_formula(p, m), kMargin)
          << "p=" << p << " m=" << m;
    }
}

TEST(Bubble, InterleavedDividesTheBubbleTimeByV) {
  for (int p = 2; p <= 8; ++p)
    for (int v : {2, 3, 4})
      for (int m = p; m <= 16; m += p) {
        // Each chunk is 1/v of the rank's layers, so chunk costs are 1/v and 2/v.
        const double bubble =
            simulated_bubble_fraction(make_schedule(ScheduleKind::kInterleavedOneFOneB, p, m, v), 1.0 / v, 2.0 / v);
        EXPECT_NEAR(bubble, (p - 1.0) / (v * m + p - 1.0), kMargin) << "p=" << p << " m=" << m << " v=" << v;
        EXPECT_LT(bubble, one_f_one_b_formula(p, m));
      }
}

TEST(Bubble, ZeroBubbleH1IsBelow1F1BAndAThirdOfItsBubbleTime) {
  for (int p = 2; p <= 8; ++p)
    for (int m = 1; m <= 16; ++m) {
      const double zb = simulated_bubble_fraction(make_schedule(ScheduleKind::kZeroBubbleH1, p, m));
      EXPECT_LT(zb, one_f_one_b_formula(p, m)) << "p=" << p << " m=" << m;
      if (m >= p) {
        EXPECT_NEAR(zb, (p - 1.0) / (3.0 * m + p - 1.0), kMargin) << "p=" << p << " m=" << m;
      }
    }
  EXPECT_NEAR(simulated_bubble_fraction(make_schedule(ScheduleKind::kZeroBubbleH1, 1, 4)), 0.0, kMargin);
}

TEST(Bubble, CostsAndErrors) {
  const Schedule s = make_schedule(ScheduleKind::kOneFOneB, 4, 8);
  // F = B: the 1F1B bubble is (p-1)(F+B) over m(F+B) + (p-1)(F+B): the same share.
  EXPECT_NEAR(simulated_bubble_fraction(s, 1.0, 1.0), one_f_one_b_formula(4, 8), kMargin);
  EXPECT_THROW(simulated_bubble_fraction(s, 0.0, 1.0), std::invalid_argument);
  Schedule broken = s;
  broken.per_rank[3].erase(broken.per_rank[3].begin() + 1);  // drop 3B0: rank 2 waits forever
  EXPECT_THROW(simulated_bubble_fraction(broken), std::invalid_argument);
}

TEST(ActivationMemory, OneFOneBHoldsAtMostPGPipeHoldsM) {
  for (int p = 1; p <= 8; ++p)
    for (int m = 1; m <= 16; ++m) {
      const auto gpipe = peak_activations(make_schedule(ScheduleKind::kGPipe, p, m));
      const auto ofob = peak_activations(make_schedule(ScheduleKind::kOneFOneB, p, m));
      const auto zb = peak_activations(make_schedule(ScheduleKind::kZeroBubbleH1, p, m));
      for (int r = 0; r < p; ++r) {
        EXPECT_EQ(gpipe[r], m);
        EXPECT_EQ(ofob[r], std::min(p - r, m));
        EXPECT_LE(ofob[r], p);
        EXPECT_EQ(zb[r], ofob[r]) << "ZB-H1 keeps 1F1B's activation memory; p=" << p << " m=" << m << " r=" << r;
      }
    }
}

// simulate_step: the step time with per-stage costs (the planner's model of a step). Uniform
// stages under 1F1B: (m + p - 1) x (F + B), the bubble (p - 1) / (m + p - 1).
TEST(SimulateStep, OneFOneBTakesTheTextbookTimeWithUniformStages) {
  const auto step = simulate_step(make_schedule(ScheduleKind::kOneFOneB, 4, 8), {StageCosts{2.0, 1.5, 2.5}});
  EXPECT_NEAR(step.makespan, 11 * (2.0 + 4.0), 1e-9);
  EXPECT_NEAR(step.bubble, 3.0 / 11.0, 1e-9);
  ASSERT_EQ(step.busy.size(), 4u);
  for (double b : step.busy) EXPECT_NEAR(b, 8 * 6.0, 1e-9);
}

// One slow stage sets the pace: its rank is busy m x (F + B), and the others wait for it.
TEST(SimulateStep, ASlowStageSetsThePaceAndZeroBubbleHidesLessOfIt) {
  const auto schedule = make_schedule(ScheduleKind::kOneFOneB, 4, 8);
  const std::vector<StageCosts> costs = {{1, 1, 1}, {1, 1, 1}, {2, 2, 2}, {1, 1, 1}};
  const auto uniform = simulate_step(schedule, {StageCosts{1, 1, 1}});
  const auto slow = simulate_step(schedule, costs);
  EXPECT_NEAR(slow.busy[2], 8 * 6.0, 1e-9);
  EXPECT_GE(slow.makespan, 8 * 6.0);
  EXPECT_GT(slow.makespan, uniform.makespan);
  EXPECT_GT(slow.bubble, uniform.bubble);
  // ZB-H1 fills 1F1B's bubble with W: the same costs take less time.
  EXPECT_LT(simulate_step(make_schedule(ScheduleKind::kZeroBubbleH1, 4, 8), {StageCosts{1, 1, 1}}).makespan,
            uniform.makespan);
}

TEST(SimulateStep, CostsMustFitTheSchedule) {
  const auto schedule = make_schedule(ScheduleKind::kOneFOneB, 4, 8);
  EXPECT_THROW(simulate_step(schedule, {{1, 1, 1}, {1, 1, 1}}), std::invalid_argument);
  EXPECT_THROW(simulate_step(schedule, {StageCosts{-1, 1, 1}}), std::invalid_argument);
}

}  // namespace
}  // namespace gpipe

// Measured bubble fraction under a fixed cost model: blocks that sleep F ms in forward and B ms
// in backward (sleeping does not compete for the cores). GPipe and 1F1B must match
// (p-1)/(m+p-1) within +-0.05; interleaved 1F1B must match the schedule simulator's value for
// the same costs within +-0.05. Only the async executor overlaps ranks, so only it is measured.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>

#include "test_engine_helpers.h"
#include "trainer/execution/executor.h"
#include "trainer/metrics/timeline.h"

namespace gpipe::testing {
namespace {

constexpr double kMargin = 0.05;
// Long enough that thread wake-ups and the tiny model's compute (which only ever add idle time,
// more so on a loaded machine) stay small against the sleeps, even at 2 chunks per rank.
constexpr int64_t kForwardMs = 20;
constexpr int64_t kBackwardMs = 40;

// The smallest bubble of two measured steps after a warm-up: scheduling noise only ever adds
// idle time, so the minimum is the better estimate of what the schedule itself leaves idle.
double measure(const TinySetup& s) {
  auto trainer = make_tiny_trainer(s);
  const Batch batch = tiny_batch(s.batch, s.seq, s.vocab, 3);
  ActionRecorder recorder;
  trainer->forward_backward(batch, &recorder);  // warm-up (allocator, lazy init)
  double best = 1.0;
  for (int i = 0; i < 2; ++i) {
    trainer->forward_backward(batch, &recorder);
    best = std::min(best, recorder.bubble_fraction());
  }
  return best;
}

TinySetup sleepy(const std::string& schedule, int ranks, int microbatches, int virtual_stages = 1) {
  TinySetup s;
  s.schedule = schedule;
  s.executor = "async_threaded";
  s.ranks = ranks;
  s.microbatches = microbatches;
  s.virtual_stages = virtual_stages;
  s.batch = microbatches;
  s.blocks = ranks * virtual_stages;  // one sleeping block per virtual stage
  s.costs = {kForwardMs / virtual_stages, kBackwardMs / virtual_stages};
  return s;
}

TEST(BubbleTest, GPipeMatchesFormula) {
  const int p = 4, m = 8;
  const double expected = double(p - 1) / (m + p - 1);
  EXPECT_NEAR(measure(sleepy("gpipe", p, m)), expected, kMargin);
}

TEST(BubbleTest, OneFOneBMatchesFormula) {
  const int p = 4, m = 8;
  const double expected = double(p - 1) / (m + p - 1);
  EXPECT_NEAR(measure(sleepy("1f1b", p, m)), expected, kMargin);
}

TEST(BubbleTest, MoreMicrobatchesShrinkTheBubble) {
  const int p = 4, m = 16;
  const double expected = double(p - 1) / (m + p - 1);
  EXPECT_NEAR(measure(sleepy("1f1b", p, m)), expected, kMargin);
}

TEST(BubbleTest, InterleavedMatchesSimulator) {
  const int p = 4, m = 8, v = 2;
  TinySetup s = sleepy("interleaved_1f1b", p, m, v);
  auto trainer = make_tiny_trainer(s);
  const double simulated = simulated_bubble_fraction(trainer->schedule(), 1.0, 2.0);
  EXPECT_LT(simulated, double(p - 1) / (m + p - 1)) << "interleaving should shrink the bubble";
  EXPECT_NEAR(measure(s), simulated, kMargin);
}

// ZBV on the async executor with the in-process transport: torch's lowering posts each receive as
// soon as the sender has the tensor, long before the compute that needs it. A rank must not sit at
// such a receive (it used to: 28% bubble instead of about 6% here); it waits at the compute that
// needs the tensor, so the measured bubble is the compute order's. Blocks sleep in backward's
// input-gradient pass (I), so W costs nothing.
TEST(BubbleTest, ZeroBubbleVMatchesItsComputeOrder) {
  const int p = 4, m = 8, v = 2;
  TinySetup s = sleepy("zbv", p, m, v);
  auto trainer = make_tiny_trainer(s);
  Schedule compute = trainer->schedule();
  for (auto& program : compute.per_rank) {
    std::erase_if(program, [](const Action& a) { return is_communication(a.type); });
  }
  const double simulated = simulate_step(compute, {StageCosts{1.0, 2.0, 0.0}}).bubble;
  const double measured = measure(s);
  std::printf("zbv p=%d m=%d: measured bubble %.3f, compute order %.3f\n", p, m, measured, simulated);
  EXPECT_NEAR(measured, simulated, kMargin);
}

}  // namespace
}  // namespace gpipe::testing

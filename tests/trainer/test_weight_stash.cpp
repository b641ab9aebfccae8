// Weight stashing (trainer/execution/weight_stash.h) on PipeDream's 1F1B-async order of one stage:
// with stashing every backward's gradients equal those of the exact weight version its forward
// used (a sequential reference replays the versions); without it they do not; and an update that
// went through the parameters themselves would break the in-flight graphs.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>
#include <ATen/core/grad_mode.h>

#include <map>
#include <string>
#include <vector>

#include "trainer/execution/weight_stash.h"
#include "trainer/schedule/schedule.h"

namespace gpipe {
namespace {

// A two-layer stage: its first layer's gradient reads the second layer's weights in backward.
struct TwoLayer {
  at::Tensor w1 = at::randn({5, 4}, at::kDouble).requires_grad_();
  at::Tensor w2 = at::randn({3, 5}, at::kDouble).requires_grad_();
  std::vector<at::Tensor> params() const { return {w1, w2}; }
};
at::Tensor loss_of(const at::Tensor& w1, const at::Tensor& w2, const at::Tensor& x) {
  return at::matmul(w2, at::tanh(at::matmul(w1, x))).pow(2).sum();
}

struct Replay {
  std::map<int, std::vector<at::Tensor>> grads;     // micro-batch -> (w1, w2) gradients its B produced
  std::map<int, int> forward_version;               // micro-batch -> version
  std::map<int, std::vector<at::Tensor>> history;   // version -> (w1, w2) values
  size_t most_held = 0;
};

// Runs stage 0's program of 1F1B-async (p ranks, m micro-batches) with a plain SGD update after
// every backward, written through variable_data() as the trainer's AdamW does.
Replay run(bool stashing, int p, int m, const std::vector<at::Tensor>& xs) {
  at::manual_seed(7);
  TwoLayer layer;
  WeightStash stash(layer.params(), stashing);
  const Schedule s = with_weight_versions(make_schedule(ScheduleKind::kOneFOneB, p, m), stashing);
  Replay r;
  r.history[0] = {layer.w1.detach().clone(), layer.w2.detach().clone()};
  std::map<int, at::Tensor> losses;
  for (const Action& a : s.per_rank[0]) {
    if (a.type == ActionType::kForward) {
      stash.forward(a.microbatch);
      EXPECT_EQ(stash.version(), a.weight_version) << "the schedule's version is the stash's";
      r.forward_version[a.microbatch] = stash.version();
      losses[a.microbatch] = loss_of(layer.w1, layer.w2, xs[static_cast<size_t>(a.microbatch)]);
    } else if (a.type == ActionType::kBackward) {
      stash.begin_backward(a.microbatch);
      torch::autograd::backward({losses[a.microbatch]});
      stash.end_backward(a.microbatch);
      r.grads[a.microbatch] = {layer.w1.grad().clone(), layer.w2.grad().clone()};
      stash.before_update();
      {
        at::NoGradGuard no_grad;
        for (auto& w : layer.params()) w.variable_data().sub_(w.grad() * 0.05);
      }
      for (auto& w : layer.params()) w.mutable_grad() = at::Tensor();
      stash.after_update();
      r.history[stash.version()] = {layer.w1.detach().clone(), layer.w2.detach().clone()};
      losses.erase(a.microbatch);
    }
  }
  r.most_held = stash.most_held();
  EXPECT_EQ(stash.held(), 0u) << "every stashed version is dropped once nothing needs it";
  return r;
}

// The gradient of micro-batch `mb` computed alone on the weights of `version`.
std::vector<at::Tensor> reference(const Replay& r, int mb, const at::Tensor& x) {
  const auto& w = r.history.at(r.forward_version.at(mb));
  at::Tensor w1 = w[0].clone().requires_grad_(), w2 = w[1].clone().requires_grad_();
  torch::autograd::backward({loss_of(w1, w2, x)});
  return {w1.grad(), w2.grad()};
}

std::vector<at::Tensor> inputs(int m) {
  at::manual_seed(11);
  std::vector<at::Tensor> xs;
  for (int i = 0; i < m; ++i) xs.push_back(at::randn({4, 2}, at::kDouble));
  return xs;
}

TEST(WeightStash, EveryBackwardUsesItsForwardsWeightVersion) {
  constexpr int p = 3, m = 6;
  const auto xs = inputs(m);
  const Replay r = run(/*stashing=*/true, p, m, xs);
  ASSERT_EQ(r.grads.size(), static_cast<size_t>(m));
  int stale = 0;
  for (int mb = 0; mb < m; ++mb) {
    const auto ref = reference(r, mb, xs[static_cast<size_t>(mb)]);
    // Backwards run in micro-batch order, one update each: B of mb runs on version mb.
    stale += r.forward_version.at(mb) != mb;
    EXPECT_TRUE(at::allclose(r.grads.at(mb)[0], ref[0], 1e-12, 1e-12)) << "w1 of micro-batch " << mb;
    EXPECT_TRUE(at::allclose(r.grads.at(mb)[1], ref[1], 1e-12, 1e-12)) << "w2 of micro-batch " << mb;
  }
  EXPECT_GT(stale, 0) << "the order never updated a stage with micro-batches in flight";
  EXPECT_EQ(r.most_held, 2u) << "stage 0 of 3 holds p - s - 1 = 2 stashed versions in steady state";
  EXPECT_EQ(stashed_versions(with_weight_versions(make_schedule(ScheduleKind::kOneFOneB, p, m)))[0], 2);
}

TEST(WeightStash, WithoutStashingTheGradientsMixVersions) {
  constexpr int p = 3, m = 6;
  const auto xs = inputs(m);
  const Replay r = run(/*stashing=*/false, p, m, xs);
  int mismatched = 0;
  for (int mb = 0; mb < m; ++mb) {
    const auto ref = reference(r, mb, xs[static_cast<size_t>(mb)]);
    mismatched += !at::allclose(r.grads.at(mb)[0], ref[0], 1e-9, 1e-9);
  }
  // Micro-batch 0 ran its backward before any update; those after the warm-up did not.
  EXPECT_GE(mismatched, 2) << "without stashing a backward must see newer weights than its forward";
  EXPECT_EQ(r.most_held, 0u);
}

TEST(WeightStash, AnUpdateThroughTheParameterItselfBreaksTheGraphsInFlight) {
  TwoLayer layer;
  const at::Tensor x = at::randn({4, 2}, at::kDouble);
  at::Tensor in_flight = loss_of(layer.w1, layer.w2, x);
  {
    at::NoGradGuard no_grad;
    layer.w2.sub_(0.1);  // what an optimizer's in-place step does
  }
  EXPECT_THROW(torch::autograd::backward({in_flight}), c10::Error)
      << "autograd no longer detects the in-place update: the variable_data() route may be unnecessary";
}

TEST(WeightStash, MisuseIsALogicError) {
  TwoLayer layer;
  WeightStash stash(layer.params(), true);
  EXPECT_THROW(stash.begin_backward(3), std::logic_error);
  stash.forward(1);
  EXPECT_THROW(stash.forward(1), std::logic_error);
}

}  // namespace
}  // namespace gpipe

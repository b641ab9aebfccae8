// GradientReducer (trainer/distributed/gradient_reducer.h), the replicated stages' bucketed
// gradient all-reduce, against a fake replica group: buckets in reverse parameter order and
// bounded size, the replicas' mean written back, buckets started during the last backward from
// the second step on (in order, each holding its members' final gradients), a weight accumulated
// twice in that backward never summed half-done, a changed graph refused, and parameters
// without a gradient joining with zeros. The sum over real processes (Gloo) is tested end to end
// by tests/distributed/distributed_test.py (2 x 2 against 2 stages).
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <string>
#include <vector>

#include "trainer/distributed/gradient_reducer.h"

namespace gpipe {
namespace {

// Two replicas; the other one's gradients are `other_scale` x ours as they were when the bucket
// started (so a bucket started before its gradients were final shows in the result).
struct FakeReplicas final : ReplicaCollective {
  struct Start {
    at::Tensor flat_at_start;
    bool during_backward;
  };
  std::vector<Start>* starts;
  const bool* in_backward;
  double other_scale = 3.0;
  int size() const override { return 2; }
  std::function<void()> start_sum(at::Tensor flat) override {
    starts->push_back({flat.clone(), *in_backward});
    at::Tensor other = flat.clone().mul_(other_scale);
    return [flat, other]() mutable { flat.add_(other); };
  }
};

struct Stage {
  // Registration order: w1 (first layer), b1, w2 (last layer).
  at::Tensor w1 = at::randn({6, 4}, at::kDouble).requires_grad_();
  at::Tensor b1 = at::randn({6}, at::kDouble).requires_grad_();
  at::Tensor w2 = at::randn({3, 6}, at::kDouble).requires_grad_();
  std::vector<at::Tensor> params() const { return {w1, b1, w2}; }
  at::Tensor loss(const at::Tensor& x) const {
    at::Tensor h = at::tanh(at::matmul(w1, x) + b1.unsqueeze(1));
    return at::matmul(w2, h).pow(2).sum();
  }
  // A second graph through w2 alone: its own backward accumulates into w2.grad a second time in
  // the same action (one graph using w2 twice would accumulate once: autograd sums first).
  at::Tensor second_pass() const { return (w2 * w2).sum(); }
};

struct Harness {
  Stage stage;
  std::vector<FakeReplicas::Start> starts;
  bool in_backward = false;
  std::unique_ptr<GradientReducer> reducer;
  explicit Harness(size_t bucket_bytes) {
    auto fake = std::make_unique<FakeReplicas>();
    fake->starts = &starts;
    fake->in_backward = &in_backward;
    reducer = std::make_unique<GradientReducer>("stage 0", stage.params(), std::move(fake), bucket_bytes);
  }
  // One step: `microbatches` backwards accumulating into .grad, the reducer armed around the last.
  // Returns each parameter's local gradient before the reduction.
  // `w2_twice`: every backward accumulates into w2 twice; `w2_twice_in_last`: only this step's last.
  std::vector<at::Tensor> step(int microbatches, bool w2_twice, bool w2_twice_in_last = false) {
    for (auto& p : stage.params()) p.mutable_grad() = at::Tensor();
    for (int mb = 0; mb < microbatches; ++mb) {
      const bool last = mb + 1 == microbatches;
      const at::Tensor x = at::randn({4, 5}, at::kDouble);
      const at::Tensor loss = stage.loss(x);
      if (last) reducer->begin_last_backward();
      in_backward = last;
      torch::autograd::backward({loss});
      if (w2_twice || (last && w2_twice_in_last)) torch::autograd::backward({stage.second_pass()});
      in_backward = false;
      if (last) reducer->end_last_backward();
    }
    std::vector<at::Tensor> local;
    for (auto& p : stage.params()) local.push_back(p.grad().clone());
    return local;
  }
};

TEST(GradientReducer, BucketsGoInReverseParameterOrderUpToTheSize) {
  // w2 (18 doubles = 144 bytes) then b1 (48 bytes) then w1 (192 bytes), 150-byte buckets: a bucket
  // closes once it holds at least that much.
  Harness h(150);
  EXPECT_EQ(h.reducer->bucket_members(), (std::vector<std::vector<size_t>>{{2, 1}, {0}}));
  Harness one(1 << 20);
  EXPECT_EQ(one.reducer->bucket_members(), (std::vector<std::vector<size_t>>{{2, 1, 0}}));
}

TEST(GradientReducer, EveryGradientBecomesTheReplicasMean) {
  at::manual_seed(1);
  Harness h(40);
  for (int step = 0; step < 3; ++step) {
    const auto local = h.step(3, false);
    h.reducer->finish();
    const auto params = h.stage.params();
    for (size_t k = 0; k < params.size(); ++k) {
      // (ours + 3 x ours) / 2
      EXPECT_TRUE(at::allclose(params[k].grad(), 2.0 * local[k], 1e-12, 1e-12)) << "step " << step << " param " << k;
    }
  }
}

TEST(GradientReducer, FromTheSecondStepBucketsStartDuringTheLastBackwardInOrder) {
  at::manual_seed(2);
  Harness h(40);  // three buckets: w2, b1, w1
  ASSERT_EQ(h.reducer->num_buckets(), 3);
  h.step(2, false);
  EXPECT_EQ(h.reducer->started_during_backward(), 0);  // the first step learns
  for (const auto& s : h.starts) EXPECT_FALSE(s.during_backward);
  h.reducer->finish();
  h.starts.clear();
  const auto local = h.step(2, false);
  EXPECT_EQ(h.reducer->started_during_backward(), 3);
  ASSERT_EQ(h.starts.size(), 3u);
  // In bucket order, each with its members' final local gradients.
  const auto members = h.reducer->bucket_members();
  for (size_t b = 0; b < 3; ++b) {
    EXPECT_TRUE(h.starts[b].during_backward) << "bucket " << b;
    std::vector<at::Tensor> parts;
    for (size_t k : members[b]) parts.push_back(local[k].reshape({-1}));
    EXPECT_TRUE(at::equal(h.starts[b].flat_at_start, at::cat(parts))) << "bucket " << b;
  }
  h.reducer->finish();
}

TEST(GradientReducer, AWeightAccumulatedTwiceIsSummedOnlyAfterBoth) {
  at::manual_seed(3);
  Harness h(40);
  for (int step = 0; step < 3; ++step) {
    const auto local = h.step(2, true);
    h.reducer->finish();
    // Had w2's bucket started after its first accumulation, the fake's "other replica" would hold
    // a partial gradient and the mean would not be 2 x the final one.
    EXPECT_TRUE(at::allclose(h.stage.w2.grad(), 2.0 * local[2], 1e-12, 1e-12)) << "step " << step;
    if (step > 0) {
      EXPECT_EQ(h.reducer->started_during_backward(), 3);
    }
  }
}

TEST(GradientReducer, AGraphThatChangesAfterTheFirstStepIsAnError) {
  at::manual_seed(4);
  Harness h(40);
  h.step(2, false);
  h.reducer->finish();
  try {
    h.step(2, false, /*w2_twice_in_last=*/true);
    FAIL() << "w2 got two gradients where the first step had one";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("stage 0: parameter 2 received 2 gradient(s)"), std::string::npos) << e.what();
  }
}

TEST(GradientReducer, AParameterWithoutAGradientJoinsWithZeros) {
  at::manual_seed(5);
  Harness h(1 << 20);
  at::Tensor unused = at::randn({2}, at::kDouble).requires_grad_();
  auto fake = std::make_unique<FakeReplicas>();
  fake->starts = &h.starts;
  fake->in_backward = &h.in_backward;
  std::vector<at::Tensor> params = h.stage.params();
  params.push_back(unused);
  h.reducer.reset();  // its hooks go before the new reducer's
  h.reducer = std::make_unique<GradientReducer>("stage 0", params, std::move(fake), 1 << 20);
  h.step(1, false);
  h.reducer->finish();
  ASSERT_TRUE(unused.grad().defined());
  EXPECT_TRUE(at::equal(unused.grad(), at::zeros({2}, at::kDouble)));
}

TEST(GradientReducer, FinishWithoutTheLastBackwardIsALogicError) {
  Harness h(40);
  h.reducer->begin_last_backward();
  EXPECT_THROW(h.reducer->finish(), std::logic_error);
}

}  // namespace
}  // namespace gpipe

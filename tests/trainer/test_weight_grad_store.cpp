// split_linear and WeightGradStore: outside a Defer, split_linear's gradients are at::linear's;
// inside one, backward leaves the weight and bias gradients undefined and one entry in the store,
// whose flush() gives at::linear's gradients. A GPT stage's I under zb_h1 leaves every linear
// weight to W (no .grad, entries in the store) while norms get theirs, and I + W equal B.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/autocast_mode.h>
#include <torch/csrc/autograd/autograd.h>

#include <optional>
#include <string>
#include <vector>

#include "trainer/execution/stage_runtime.h"
#include "trainer/model/registry.h"
#include "trainer/model/weight_grad_store.h"

namespace gpipe {
namespace {

struct Linear {
  at::Tensor x, w, b;
};

Linear make_linear(bool bias) {
  at::manual_seed(11);
  return {at::randn({2, 3, 5}).requires_grad_(true), at::randn({4, 5}).requires_grad_(true),
          bias ? at::randn({4}).requires_grad_(true) : at::Tensor()};
}

at::Tensor reference_loss(const Linear& l) {
  return (at::linear(l.x, l.w, l.b.defined() ? std::optional<at::Tensor>(l.b) : std::nullopt) * 0.5).pow(2).sum();
}

TEST(SplitLinear, WithoutDeferIsAnOrdinaryLinear) {
  for (bool bias : {true, false}) {
    Linear ref = make_linear(bias), ours = make_linear(bias);
    reference_loss(ref).backward();
    (split_linear(ours.x, ours.w, ours.b) * 0.5).pow(2).sum().backward();
    EXPECT_TRUE(at::allclose(ours.x.grad(), ref.x.grad(), 1e-5, 1e-6));
    EXPECT_TRUE(at::allclose(ours.w.grad(), ref.w.grad(), 1e-5, 1e-6));
    if (bias) {
      EXPECT_TRUE(at::allclose(ours.b.grad(), ref.b.grad(), 1e-5, 1e-6));
    }
  }
}

TEST(SplitLinear, DeferredWeightGradientsWaitInTheStoreUntilFlush) {
  for (bool bias : {true, false}) {
    Linear ref = make_linear(bias), ours = make_linear(bias);
    reference_loss(ref).backward();
    WeightGradStore store;
    {
      const WeightGradStore::Defer defer(store);
      (split_linear(ours.x, ours.w, ours.b) * 0.5).pow(2).sum().backward();
    }
    EXPECT_TRUE(at::allclose(ours.x.grad(), ref.x.grad(), 1e-5, 1e-6)) << "the input gradient is not deferred";
    EXPECT_FALSE(ours.w.grad().defined()) << "the weight GEMM ran in backward";
    if (bias) {
      EXPECT_FALSE(ours.b.grad().defined());
    }
    EXPECT_EQ(store.size(), 1u);
    store.flush();
    EXPECT_EQ(store.size(), 0u);
    ASSERT_TRUE(ours.w.grad().defined());
    EXPECT_TRUE(at::allclose(ours.w.grad(), ref.w.grad(), 1e-5, 1e-6));
    if (bias) {
      EXPECT_TRUE(at::allclose(ours.b.grad(), ref.b.grad(), 1e-5, 1e-6));
    }
  }
}

TEST(SplitLinear, AutocastRunsTheMatmulInLowPrecisionAndGradientsStayInTheParameterDtype) {
  Linear ref = make_linear(true), ours = make_linear(true);
  reference_loss(ref).backward();
  at::Tensor y;
  {
    at::autocast::set_autocast_enabled(at::kCPU, true);
    at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
    y = split_linear(ours.x, ours.w, ours.b);
    at::autocast::set_autocast_enabled(at::kCPU, false);
    at::autocast::clear_cache();
  }
  EXPECT_EQ(y.scalar_type(), at::kBFloat16);
  WeightGradStore store;
  {
    const WeightGradStore::Defer defer(store);
    (y.to(at::kFloat) * 0.5).pow(2).sum().backward();
  }
  store.flush();
  EXPECT_EQ(ours.w.grad().scalar_type(), at::kFloat);
  EXPECT_EQ(ours.x.grad().scalar_type(), at::kFloat);
  EXPECT_TRUE(at::allclose(ours.w.grad(), ref.w.grad(), 5e-2, 5e-2)) << "bf16 weight gradient too far from fp32";
}

// bf16 cast once per step: with a WeightCastCache active, three micro-batches' forwards cast the
// weight and bias once, and the gradients (B for one micro-batch, I + W for the others, as a
// zero-bubble step mixes them) equal those of recasting at every forward.
TEST(SplitLinear, WeightCastCacheCastsOncePerStepWithTheSameGradients) {
  at::manual_seed(5);
  const at::Tensor w0 = at::randn({4, 5}), b0 = at::randn({4});
  std::vector<at::Tensor> xs;
  for (int mb = 0; mb < 3; ++mb) xs.push_back(at::randn({2, 3, 5}));
  auto run = [&](WeightCastCache* cache) {
    at::Tensor w = w0.clone().requires_grad_(true), b = b0.clone().requires_grad_(true);
    at::autocast::set_autocast_enabled(at::kCPU, true);
    at::autocast::set_autocast_dtype(at::kCPU, at::kBFloat16);
    std::vector<at::Tensor> ys;
    {
      std::optional<WeightCastCache::Use> use;
      if (cache != nullptr) use.emplace(*cache);
      for (const auto& x : xs) ys.push_back(split_linear(x, w, b));
    }
    at::autocast::set_autocast_enabled(at::kCPU, false);
    at::autocast::clear_cache();
    WeightGradStore store;
    (ys[0].to(at::kFloat) * 0.5).pow(2).sum().backward();
    {
      const WeightGradStore::Defer defer(store);
      for (size_t mb = 1; mb < ys.size(); ++mb) (ys[mb].to(at::kFloat) * 0.5).pow(2).sum().backward();
    }
    store.flush();
    return std::make_pair(w.grad(), b.grad());
  };
  WeightCastCache cache;
  const auto cached = run(&cache);
  const auto recast = run(nullptr);
  EXPECT_EQ(cache.casts(), 2u) << "weight and bias, once each";
  EXPECT_EQ(cache.hits(), 4u) << "two later micro-batches x (weight, bias)";
  ASSERT_EQ(cached.first.scalar_type(), at::kFloat);
  EXPECT_TRUE(at::equal(cached.first, recast.first));
  EXPECT_TRUE(at::equal(cached.second, recast.second));
}

// W's bf16 weight gradients add into the fp32 .grad directly (no fp32 copy first): the same sum as
// casting first, to fp32 rounding.
TEST(WeightGradStore, LowPrecisionGradientsAddIntoAnFp32Grad) {
  at::manual_seed(6);
  at::Tensor w = at::randn({4, 5}).requires_grad_(true);
  const at::Tensor x = at::randn({6, 5}).to(at::kBFloat16), dy = at::randn({6, 4}).to(at::kBFloat16);
  WeightGradStore store;
  store.add(w, at::Tensor(), x, dy);
  store.add(w, at::Tensor(), x, dy);
  store.flush();
  ASSERT_EQ(w.grad().scalar_type(), at::kFloat);
  const at::Tensor one = dy.t().matmul(x).to(at::kFloat);
  EXPECT_TRUE(at::allclose(w.grad(), one * 2, 1e-6, 1e-6));
}

// One GPT stage (embedding, 2 blocks), two runtimes from the same seed: B on one, I then W on the
// other, same input and micro-batch.
TEST(ZeroBubbleSplit, GptStageInputGradientAtIWeightGemmsAtW) {
  ModelConfig mc;
  mc.hidden_size = 16;
  mc.num_layers = 2;
  mc.num_heads = 2;
  mc.sequence_length = 6;
  mc.vocab_size = 30;
  auto model = model_registry().create("gpt");
  auto stage = stage_registry().create("gpt");
  model->configure(mc);
  const StageSpec first{0, 2, 0, 2, 0.0};  // embedding and block 1 of 2 stages
  StageRuntime b_runtime(first, stage->create_sub_model(*model, first, 7), *stage, c10::Device(c10::kCPU), 1);
  StageRuntime iw_runtime(first, stage->create_sub_model(*model, first, 7), *stage, c10::Device(c10::kCPU), 1);
  at::manual_seed(2);
  const at::Tensor ids = at::randint(mc.vocab_size, {2, mc.sequence_length}, at::kLong);
  const Batch batch{ids, ids};
  const at::Tensor out = b_runtime.forward(0, batch, {});
  iw_runtime.forward(0, batch, {});
  const at::Tensor grad = at::randn(out.sizes());
  b_runtime.backward(0, grad);
  iw_runtime.backward_input(0, grad);

  const auto named = iw_runtime.module().named_parameters();
  int linear_weights = 0;
  for (const auto& p : named) {
    const bool linear = p.key().find("c_attn") != std::string::npos || p.key().find("c_proj") != std::string::npos ||
                        p.key().find("c_fc") != std::string::npos;
    if (linear) {
      ++linear_weights;
      EXPECT_FALSE(p.value().grad().defined()) << p.key() << " got its gradient at I";
    } else {
      EXPECT_TRUE(p.value().grad().defined()) << p.key() << " (not a linear layer) has no gradient after I";
    }
  }
  ASSERT_GT(linear_weights, 0);
  EXPECT_EQ(iw_runtime.deferred_weight_grads(0), 4u) << "c_attn, attn.c_proj, c_fc, mlp.c_proj";
  iw_runtime.backward_weight(0);
  EXPECT_EQ(iw_runtime.stashed_microbatches(), 0u);
  const auto reference = b_runtime.module().named_parameters();
  for (const auto& p : named) {
    ASSERT_TRUE(p.value().grad().defined()) << p.key();
    EXPECT_TRUE(at::allclose(p.value().grad(), reference[p.key()].grad(), 1e-5, 1e-6)) << p.key();
  }
}

}  // namespace
}  // namespace gpipe

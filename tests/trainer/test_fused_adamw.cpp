// fused_adamw_step against torch::optim::AdamW::step(): same parameters, same state, over several
// steps, with two groups (weight decay on and off, as make_adamw builds them), an amsgrad group,
// and a parameter without a gradient (skipped by both, no state created).
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/optim/adamw.h>

#include <memory>
#include <vector>

#include "trainer/training/fused_adamw.h"

namespace gpipe {
namespace {

std::vector<at::Tensor> make_params(uint64_t seed) {
  at::manual_seed(seed);
  std::vector<at::Tensor> params;
  for (const auto& shape : std::vector<std::vector<int64_t>>{{7, 5}, {5}, {3, 4}, {4}, {6}}) {
    params.push_back(at::randn(shape).requires_grad_(true));
  }
  return params;
}

std::unique_ptr<torch::optim::AdamW> make_optimizer(const std::vector<at::Tensor>& p) {
  std::vector<torch::optim::OptimizerParamGroup> groups;
  groups.emplace_back(std::vector<at::Tensor>{p[0], p[2]},
                      std::make_unique<torch::optim::AdamWOptions>(
                          torch::optim::AdamWOptions(3e-3).weight_decay(0.1).betas({0.9, 0.95}).eps(1e-8)));
  groups.emplace_back(std::vector<at::Tensor>{p[1], p[3]},
                      std::make_unique<torch::optim::AdamWOptions>(
                          torch::optim::AdamWOptions(3e-3).weight_decay(0.0).betas({0.8, 0.99}).eps(1e-6)));
  groups.emplace_back(std::vector<at::Tensor>{p[4]},
                      std::make_unique<torch::optim::AdamWOptions>(
                          torch::optim::AdamWOptions(1e-2).weight_decay(0.05).amsgrad(true)));
  return std::make_unique<torch::optim::AdamW>(std::move(groups), torch::optim::AdamWOptions(3e-3));
}

TEST(FusedAdamW, MatchesTorchOptimAdamWStepForStep) {
  auto reference = make_params(3);
  auto fused = make_params(3);
  auto ref_opt = make_optimizer(reference);
  auto fused_opt = make_optimizer(fused);
  for (int step = 0; step < 4; ++step) {
    at::manual_seed(100 + step);
    for (size_t i = 0; i < reference.size(); ++i) {
      if (i == 3) continue;  // never gets a gradient
      const at::Tensor g = at::randn(reference[i].sizes());
      reference[i].mutable_grad() = g.clone();
      fused[i].mutable_grad() = g.clone();
    }
    // The LR schedule changes the groups' lr between steps; both must read it.
    for (auto* opt : {ref_opt.get(), fused_opt.get()}) {
      for (auto& group : opt->param_groups()) {
        auto& o = static_cast<torch::optim::AdamWOptions&>(group.options());
        o.lr(o.lr() * 0.9);
      }
    }
    ref_opt->step();
    fused_adamw_step(*fused_opt);
    for (size_t i = 0; i < reference.size(); ++i) {
      EXPECT_TRUE(at::allclose(fused[i], reference[i], 1e-6, 1e-7))
          << "parameter " << i << " after step " << step + 1 << ": max difference "
          << (fused[i] - reference[i]).abs().max().item<double>();
    }
  }
  // State lives where torch::optim keeps it (checkpoints save it): same steps, same moments.
  EXPECT_EQ(fused_opt->state().size(), ref_opt->state().size());
  EXPECT_EQ(fused_opt->state().count(fused[3].unsafeGetTensorImpl()), 0u) << "state made for a parameter without a gradient";
  for (size_t i : {0u, 1u, 2u, 4u}) {
    const auto& fs = static_cast<const torch::optim::AdamWParamState&>(*fused_opt->state().at(fused[i].unsafeGetTensorImpl()));
    const auto& rs = static_cast<const torch::optim::AdamWParamState&>(*ref_opt->state().at(reference[i].unsafeGetTensorImpl()));
    EXPECT_EQ(fs.step(), 4);
    EXPECT_EQ(fs.step(), rs.step());
    EXPECT_TRUE(at::allclose(fs.exp_avg(), rs.exp_avg(), 1e-6, 1e-7)) << "exp_avg of parameter " << i;
    EXPECT_TRUE(at::allclose(fs.exp_avg_sq(), rs.exp_avg_sq(), 1e-6, 1e-8)) << "exp_avg_sq of parameter " << i;
  }
}

}  // namespace
}  // namespace gpipe

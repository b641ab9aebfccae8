// fused_adamw_step: gathers each group's parameters, gradients and AdamW state into lists per
// (device, dtype) and hands them to at::_fused_adamw_.
#include "trainer/training/fused_adamw.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/grad_mode.h>

#include <map>
#include <memory>
#include <tuple>
#include <vector>

namespace gpipe {
namespace {

struct Lists {
  std::vector<at::Tensor> params, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs;
  std::vector<float> steps;  // after this step's increment, as the kernel reads them
};

torch::optim::AdamWParamState& state_of(torch::optim::AdamW& optimizer, const at::Tensor& p, bool amsgrad) {
  auto& states = optimizer.state();
  auto it = states.find(p.unsafeGetTensorImpl());
  if (it == states.end()) {
    // What torch::optim::AdamW::step() creates for a parameter it has not seen.
    auto state = std::make_unique<torch::optim::AdamWParamState>();
    state->step(0);
    state->exp_avg(at::zeros_like(p, at::MemoryFormat::Preserve));
    state->exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
    if (amsgrad) state->max_exp_avg_sq(at::zeros_like(p, at::MemoryFormat::Preserve));
    it = states.emplace(p.unsafeGetTensorImpl(), std::move(state)).first;
  }
  return static_cast<torch::optim::AdamWParamState&>(*it->second);
}

}  // namespace

void fused_adamw_step(torch::optim::AdamW& optimizer, bool keep_autograd_versions) {
  torch::NoGradGuard no_grad;
  for (auto& group : optimizer.param_groups()) {
    auto& options = static_cast<torch::optim::AdamWOptions&>(group.options());
    const bool amsgrad = options.amsgrad();
    std::map<std::tuple<c10::DeviceType, c10::DeviceIndex, at::ScalarType>, Lists> by_device;
    for (auto& p : group.params()) {
      if (!p.grad().defined()) continue;
      auto& state = state_of(optimizer, p, amsgrad);
      state.step(state.step() + 1);
      Lists& l = by_device[{p.device().type(), p.device().index(), p.scalar_type()}];
      l.params.push_back(keep_autograd_versions ? p.variable_data() : p);
      l.grads.push_back(p.grad());
      l.exp_avgs.push_back(state.exp_avg());
      l.exp_avg_sqs.push_back(state.exp_avg_sq());
      if (amsgrad) l.max_exp_avg_sqs.push_back(state.max_exp_avg_sq());
      l.steps.push_back(static_cast<float>(state.step()));
    }
    const auto [beta1, beta2] = options.betas();
    for (auto& [key, l] : by_device) {
      // The kernel reads each parameter's step from a tensor on the parameter's device: one
      // small host-to-device copy per group, viewed as one 0-dim tensor per parameter.
      const auto n = static_cast<int64_t>(l.steps.size());
      at::Tensor steps = at::from_blob(l.steps.data(), {n}, at::kFloat).to(l.params.front().device());
      std::vector<at::Tensor> step_views = steps.unbind(0);
      at::_fused_adamw_(l.params, l.grads, l.exp_avgs, l.exp_avg_sqs, l.max_exp_avg_sqs, step_views,
                        options.lr(), beta1, beta2, options.weight_decay(), options.eps(), amsgrad,
                        /*maximize=*/false);
    }
  }
}

}  // namespace gpipe

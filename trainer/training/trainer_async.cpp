// PipelineTrainer's asynchronous half (parallel.sync_mode: asp): each stage's update after each
// of its backwards, and the schedules of asp windows (parallel.asp_window_steps), which run
// several steps' micro-batches as one 1F1B-async pipeline so that it does not drain between them.
#include "trainer/training/trainer.h"

#include "trainer_internal.h"

#include <ATen/ATen.h>

#include <cmath>

#include <fmt/format.h>

#include "trainer/config/config.h"
#include "trainer/execution/stage_runtime.h"
#include "trainer/partition/placement.h"
#include "trainer/training/fused_adamw.h"

namespace gpipe {

const Schedule& PipelineTrainer::window_schedule(int steps) {
  std::lock_guard<std::mutex> lock(async_mu_);
  auto it = window_schedules_.find(steps);
  if (it != window_schedules_.end()) return it->second;
  // The run's schedule kind for steps x num_microbatches micro-batches: 1F1B-async then keeps
  // every stage's in-flight micro-batches (and stashed versions) as in one long step, and the
  // next step's warm-up forwards fill this step's cool-down.
  TrainingConfig window = config_.training;
  window.num_microbatches *= steps;
  Schedule schedule = build_schedule(config_.parallel, window);
  std::string why;
  if (dist_ && !sends_and_receives_in_same_order(schedule, placement_, &why)) {
    // NCCL matches messages in order; the step's schedule passed this check, a window must too.
    throw ConfigError(fmt::format("parallel.asp_window_steps: the {}-step window's schedule breaks the send order "
                                  "order-matched transports need ({}); use asp_window_steps: 1", steps, why));
  }
  return window_schedules_.emplace(steps, std::move(schedule)).first->second;
}

void PipelineTrainer::update_stage_async(int stage, double lr) {
  StageRuntime& st = *stages_.at(static_cast<size_t>(stage));
  torch::optim::AdamW& opt = *optimizers_->per_stage.at(static_cast<size_t>(stage));
  double norm = 0;
  st.apply_update([&] {
    // Clipped per stage: a global norm would wait for every stage's backward, the flush asp avoids.
    std::vector<at::Tensor> grads;
    for (const auto& p : st.parameters()) {
      if (p.grad().defined()) grads.push_back(p.grad());
    }
    if (grads.empty()) return;
    norm = at::stack(at::_foreach_norm(grads, 2, at::kFloat)).pow(2).sum().sqrt().item<double>();
    if (!std::isfinite(norm)) {
      throw std::runtime_error(fmt::format("non-finite gradient norm on stage {} (sync_mode asp); lower "
                                           "training.learning_rate or check the data", stage));
    }
    const double clip = config_.training.grad_clip;
    if (clip > 0 && norm > clip) at::_foreach_mul_(grads, clip / (norm + 1e-6));
    for (auto& group : opt.param_groups()) static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
    fused_adamw_step(opt, /*keep_autograd_versions=*/true);  // graphs in flight saved these parameters
  });
  std::lock_guard<std::mutex> lock(async_mu_);
  async_norm_sum_ += norm;
  ++async_updates_;
}

}  // namespace gpipe

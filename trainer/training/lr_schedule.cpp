#include "trainer/training/lr_schedule.h"

#include <algorithm>
#include <cmath>
#include <numbers>

namespace gpipe {

double learning_rate_at(int64_t step, int64_t total_steps, double base_lr, int64_t warmup_steps,
                        double min_lr_ratio) {
  if (step < 0) step = 0;
  if (warmup_steps > 0 && step < warmup_steps) {
    return base_lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  }
  const int64_t decay_steps = total_steps - 1 - warmup_steps;
  if (decay_steps <= 0) return base_lr;  // nothing to decay over (a run of one step, or all warm-up)
  const double progress = std::clamp(static_cast<double>(step - warmup_steps) / static_cast<double>(decay_steps), 0.0, 1.0);
  const double cosine = 0.5 * (1.0 + std::cos(std::numbers::pi * progress));
  return base_lr * (min_lr_ratio + (1.0 - min_lr_ratio) * cosine);
}

}  // namespace gpipe

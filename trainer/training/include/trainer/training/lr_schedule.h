// Learning rate per optimizer step: linear warm-up, then cosine decay to min_lr_ratio x base.
#pragma once

#include <cstdint>

namespace gpipe {

// `step` is 0-based. Warm-up: base x (step+1)/warmup_steps for step < warmup_steps. Then cosine
// from base at step == warmup_steps to base x min_lr_ratio at step == total_steps - 1 (and after).
double learning_rate_at(int64_t step, int64_t total_steps, double base_lr, int64_t warmup_steps,
                        double min_lr_ratio);

}  // namespace gpipe

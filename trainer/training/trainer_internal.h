// Private to the PipelineTrainer sources (trainer.cpp, trainer_loop.cpp, trainer_checkpoints.cpp,
// trainer_async.cpp).
#pragma once

#include <torch/optim/adamw.h>

#include <memory>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "trainer/log/engine_log.h"
#include "trainer/training/trainer.h"

namespace gpipe {

template <typename... Args>
void log_info(fmt::format_string<Args...> format, Args&&... args) {
  engine_log_info(fmt::format(format, std::forward<Args>(args)...));
}
template <typename... Args>
void log_warn(fmt::format_string<Args...> format, Args&&... args) {
  engine_log_warn(fmt::format(format, std::forward<Args>(args)...));
}

struct PipelineTrainer::Optimizers {
  std::vector<std::unique_ptr<torch::optim::AdamW>> per_stage;  // indexed by stage; null for other processes' stages
};

}  // namespace gpipe

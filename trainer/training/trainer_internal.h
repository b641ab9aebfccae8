// Private to the PipelineTrainer sources (trainer.cpp, trainer_checkpoints.cpp, trainer_async.cpp).
#pragma once

#include <torch/optim/adamw.h>

#include <memory>
#include <vector>

#include "trainer/training/trainer.h"

namespace gpipe {

struct PipelineTrainer::Optimizers {
  std::vector<std::unique_ptr<torch::optim::AdamW>> per_stage;  // indexed by stage; null for other processes' stages
};

}  // namespace gpipe

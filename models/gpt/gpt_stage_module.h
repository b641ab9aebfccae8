// One pipeline stage of the GPT: a run of consecutive layers (embedding first on stage 0, final
// norm + LM head last on the last stage).
//
// Activation recomputation (StageSpec::recompute_ratio, VPipe): the last
// ceil(ratio * blocks on this stage) transformer blocks run inside one autograd node
// (RecomputeTail, models/common/recompute.cpp) whose forward runs them without grad and keeps only their
// input, and whose backward re-runs them with grad and back-propagates through them. The engine
// needs no extra call: out.backward(grad) / torch::autograd::grad() trigger the re-run.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "gpt_layers.h"
#include "trainer/model/interfaces.h"

namespace gpipe::gpt {

class GptStageModule final : public StageModule {
 public:
  // `layers` in model order with their registered names; the last `recomputed_blocks`
  // transformer blocks (only the head may follow them) are recomputed in backward.
  GptStageModule(std::vector<std::shared_ptr<GptLayer>> layers, const std::vector<std::string>& names,
                 int64_t recomputed_blocks);

  at::Tensor forward(const at::Tensor& input) override;

  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }
  // How many of this stage's last layers run under recomputation (all are transformer blocks).
  int64_t recomputed_blocks() const { return recomputed_; }

 private:
  std::vector<std::shared_ptr<GptLayer>> layers_;
  int64_t recomputed_;
  // layers_[first_recomputed_, end_recomputed_) run through run_recomputed().
  int64_t first_recomputed_ = 0;
  int64_t end_recomputed_ = 0;
  std::vector<std::shared_ptr<models::SequentialLayer>> recomputed_layers_;
};

// Shared with the other models (models/common/layered_model.h).
using models::recomputed_block_count;
using models::run_recomputed;

}  // namespace gpipe::gpt

// GptStageModule: runs its layers in order, the recomputed blocks as one autograd node.
#include "gpt_stage_module.h"

#include <stdexcept>
#include <string>

namespace gpipe::gpt {

GptStageModule::GptStageModule(std::vector<std::shared_ptr<GptLayer>> layers, const std::vector<std::string>& names,
                               int64_t recomputed_blocks)
    : layers_(std::move(layers)), recomputed_(recomputed_blocks) {
  if (layers_.empty()) throw std::invalid_argument("a GPT stage needs at least one layer");
  if (names.size() != layers_.size()) throw std::invalid_argument("GptStageModule: one name per layer is needed");
  for (size_t i = 0; i < layers_.size(); ++i) register_module(names[i], layers_[i]);

  // The recomputed blocks are the stage's last `recomputed_` transformer blocks; only the head may
  // follow them.
  first_recomputed_ = static_cast<int64_t>(layers_.size());
  end_recomputed_ = first_recomputed_;
  if (dynamic_cast<GptHead*>(layers_.back().get()) != nullptr) --first_recomputed_, --end_recomputed_;
  int64_t blocks = 0;
  for (const auto& layer : layers_) blocks += dynamic_cast<GptBlock*>(layer.get()) != nullptr ? 1 : 0;
  if (recomputed_ < 0 || recomputed_ > blocks) {
    throw std::invalid_argument("cannot recompute " + std::to_string(recomputed_) + " blocks on a stage with " +
                                std::to_string(blocks) + " transformer blocks");
  }
  first_recomputed_ -= recomputed_;
  recomputed_layers_.assign(layers_.begin() + first_recomputed_, layers_.begin() + end_recomputed_);
}

at::Tensor GptStageModule::forward(const at::Tensor& input) {
  at::Tensor x = input;
  for (int64_t i = 0; i < first_recomputed_; ++i) x = layers_[i]->forward(x);
  if (!recomputed_layers_.empty()) x = run_recomputed(recomputed_layers_, x);
  for (int64_t i = end_recomputed_; i < num_layers(); ++i) x = layers_[i]->forward(x);
  return x;
}

}  // namespace gpipe::gpt

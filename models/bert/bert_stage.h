// One pipeline stage of BERT: a run of consecutive layers (the embedding first on stage 0, the MLM
// head last on the last stage). When the stage holds both, the head's decoder uses the
// embedding's word_embeddings tensor itself (one parameter); otherwise the stage has its own
// copy, which the trainer keeps equal to the other stage's (ModelInterface::tied_parameters).
// Activation recomputation (StageSpec::recompute_ratio) works as for the GPT: the stage's last
// ceil(ratio * blocks) transformer blocks run as one autograd node (models/common/recompute.cpp).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "bert_layers.h"
#include "trainer/model/interfaces.h"

namespace gpipe::bert {

class BertStageModule final : public StageModule {
 public:
  // `layers` are model layers [first_layer, first_layer + layers.size()) with their registered
  // names; the last `recomputed_blocks` transformer blocks (only the head may follow them) are
  // recomputed in backward.
  BertStageModule(int64_t first_layer, std::vector<std::shared_ptr<BertLayer>> layers,
                  const std::vector<std::string>& names, int64_t recomputed_blocks);

  at::Tensor forward(const at::Tensor& input) override;
  at::Tensor layer_parameter(int64_t layer, const std::string& name) const override;

  int64_t num_layers() const { return static_cast<int64_t>(layers_.size()); }
  int64_t recomputed_blocks() const { return recomputed_; }
  // Both the embedding and the head are here, sharing one tensor.
  bool ties_locally() const;

 private:
  int64_t first_layer_;
  std::vector<std::shared_ptr<BertLayer>> layers_;
  int64_t recomputed_;
  int64_t first_recomputed_ = 0;  // layers_[first_recomputed_, end_recomputed_) are recomputed
  int64_t end_recomputed_ = 0;
  std::vector<std::shared_ptr<models::SequentialLayer>> recomputed_layers_;
};

}  // namespace gpipe::bert

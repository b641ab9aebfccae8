// BertStage: BERT's StageInterface (registered as "bert"): token ids in, the masked-LM loss out
// (cross-entropy over the positions whose target is not -100), sub-models built layer by layer.
#include "bert_stage.h"

#include <ATen/ATen.h>

#include <stdexcept>
#include <string>

#include "bert_model.h"
#include "common/transformer.h"
#include "trainer/model/registry.h"

namespace gpipe::bert {

inline constexpr int64_t kIgnoreIndex = -100;

BertStageModule::BertStageModule(int64_t first_layer, std::vector<std::shared_ptr<BertLayer>> layers,
                                 const std::vector<std::string>& names, int64_t recomputed_blocks)
    : first_layer_(first_layer), layers_(std::move(layers)), recomputed_(recomputed_blocks) {
  if (layers_.empty()) throw std::invalid_argument("a BERT stage needs at least one layer");
  if (names.size() != layers_.size()) throw std::invalid_argument("BertStageModule: one name per layer is needed");
  auto* embedding = dynamic_cast<BertEmbedding*>(layers_.front().get());
  auto* head = dynamic_cast<BertHead*>(layers_.back().get());
  // One stage with both ends: the decoder is the embedding's tensor, registered once (before the
  // layers are registered, so the stage's parameters never list the head's own copy).
  if (embedding != nullptr && head != nullptr) head->tie_decoder(embedding->word_embeddings->weight);
  for (size_t i = 0; i < layers_.size(); ++i) register_module(names[i], layers_[i]);

  first_recomputed_ = static_cast<int64_t>(layers_.size());
  end_recomputed_ = first_recomputed_;
  if (head != nullptr) --first_recomputed_, --end_recomputed_;
  int64_t blocks = 0;
  for (const auto& layer : layers_) blocks += dynamic_cast<BertBlock*>(layer.get()) != nullptr ? 1 : 0;
  if (recomputed_ < 0 || recomputed_ > blocks) {
    throw std::invalid_argument("cannot recompute " + std::to_string(recomputed_) + " blocks on a stage with " +
                                std::to_string(blocks) + " transformer blocks");
  }
  first_recomputed_ -= recomputed_;
  recomputed_layers_.assign(layers_.begin() + first_recomputed_, layers_.begin() + end_recomputed_);
}

bool BertStageModule::ties_locally() const {
  auto* head = dynamic_cast<BertHead*>(layers_.back().get());
  return head != nullptr && head->decoder_is_tied();
}

at::Tensor BertStageModule::forward(const at::Tensor& input) {
  at::Tensor x = input;
  for (int64_t i = 0; i < first_recomputed_; ++i) x = layers_[i]->forward(x);
  if (!recomputed_layers_.empty()) x = models::run_recomputed(recomputed_layers_, x);
  for (int64_t i = end_recomputed_; i < num_layers(); ++i) x = layers_[i]->forward(x);
  return x;
}

at::Tensor BertStageModule::layer_parameter(int64_t layer, const std::string& name) const {
  if (layer < first_layer_ || layer >= first_layer_ + num_layers()) return {};
  const auto& module = layers_[static_cast<size_t>(layer - first_layer_)];
  if (auto* head = dynamic_cast<BertHead*>(module.get()); head != nullptr && name == "decoder.weight") {
    return head->decoder_weight();  // the embedding's own tensor when tied here
  }
  const auto params = module->named_parameters();
  const at::Tensor* found = params.find(name);
  return found != nullptr ? *found : at::Tensor();
}

class BertStage final : public StageInterface {
 public:
  at::Tensor prepare_input(const Batch& microbatch) const override { return microbatch.input_ids; }

  // Mean cross-entropy over the masked positions (targets != -100), in fp32 even under autocast.
  at::Tensor compute_loss(const at::Tensor& logits, const Batch& microbatch) const override {
    if (logits.dim() != 3 || microbatch.targets.dim() != 2 || logits.size(0) != microbatch.targets.size(0) ||
        logits.size(1) != microbatch.targets.size(1)) {
      throw std::invalid_argument("BERT loss needs logits [B, T, V] and targets [B, T], got logits " +
                                  std::to_string(logits.dim()) + "-D and targets " +
                                  std::to_string(microbatch.targets.dim()) + "-D of other sizes");
    }
    return at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}).to(at::kFloat),
                                  microbatch.targets.reshape({-1}).to(logits.device()), /*weight=*/{},
                                  at::Reduction::Mean, kIgnoreIndex);
  }

  std::shared_ptr<StageModule> create_sub_model(const ModelInterface& model, const StageSpec& spec,
                                                uint64_t seed) const override {
    const ModelConfig& config = model.get_model_config();
    models::check_stage_layers(spec, config.num_layers + 2);
    std::vector<std::shared_ptr<BertLayer>> layers;
    std::vector<std::string> names;
    int64_t blocks = 0;
    for (int64_t i = spec.first_layer; i < spec.last_layer; ++i) {
      auto layer = std::dynamic_pointer_cast<BertLayer>(model.create_layer(i, seed));
      if (!layer) throw std::invalid_argument("stage 'bert' needs model 'bert' (layer " + std::to_string(i) + " is not a BERT layer)");
      blocks += std::dynamic_pointer_cast<BertBlock>(layer) ? 1 : 0;
      layers.push_back(std::move(layer));
      names.push_back(BertModel::layer_name(i, config.num_layers));
    }
    const int64_t recomputed = models::recomputed_block_count(spec.recompute_ratio, blocks);
    if (recomputed > 0 && config.dropout > 0.0) {
      throw std::invalid_argument("activation recomputation with model.dropout " + std::to_string(config.dropout) +
                                  " would draw different dropout masks in backward: set model.dropout to 0 or "
                                  "parallel.recompute_ratio to 0");
    }
    return std::make_shared<BertStageModule>(spec.first_layer, std::move(layers), names, recomputed);
  }
};

GPIPE_REGISTER_STAGE("bert", BertStage);

}  // namespace gpipe::bert

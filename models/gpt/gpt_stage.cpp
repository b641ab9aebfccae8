// GptStage: the GPT's StageInterface (registered as "gpt"): token ids in, mean cross-entropy
// out, sub-models built layer by layer from the model.
#include <ATen/ATen.h>

#include <stdexcept>
#include <string>

#include "gpt_layers.h"
#include "gpt_model.h"
#include "gpt_stage_module.h"
#include "common/transformer.h"
#include "trainer/model/registry.h"

namespace gpipe::gpt {

class GptStage final : public StageInterface {
 public:
  at::Tensor prepare_input(const Batch& microbatch) const override { return microbatch.input_ids; }

  at::Tensor compute_loss(const at::Tensor& logits, const Batch& microbatch) const override {
    if (logits.dim() != 3 || microbatch.targets.dim() != 2 || logits.size(0) != microbatch.targets.size(0) ||
        logits.size(1) != microbatch.targets.size(1)) {
      throw std::invalid_argument("GPT loss needs logits [B, T, V] and targets [B, T], got logits " +
                                  std::to_string(logits.dim()) + "-D and targets " +
                                  std::to_string(microbatch.targets.dim()) + "-D of other sizes");
    }
    // fp32 loss even when the logits come from bf16 autocast.
    return at::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}).to(at::kFloat),
                                  microbatch.targets.reshape({-1}).to(logits.device()));
  }

  std::shared_ptr<StageModule> create_sub_model(const ModelInterface& model, const StageSpec& spec,
                                                uint64_t seed) const override {
    const ModelConfig& config = model.get_model_config();
    models::check_stage_layers(spec, config.num_layers + 2);
    std::vector<std::shared_ptr<GptLayer>> layers;
    std::vector<std::string> names;
    int64_t blocks = 0;
    for (int64_t i = spec.first_layer; i < spec.last_layer; ++i) {
      auto layer = std::dynamic_pointer_cast<GptLayer>(model.create_layer(i, seed));
      if (!layer) throw std::invalid_argument("stage 'gpt' needs model 'gpt' (layer " + std::to_string(i) + " is not a GPT layer)");
      blocks += std::dynamic_pointer_cast<GptBlock>(layer) ? 1 : 0;
      layers.push_back(std::move(layer));
      names.push_back(GptModel::layer_name(i, config.num_layers));
    }
    const int64_t recomputed = recomputed_block_count(spec.recompute_ratio, blocks);
    if (recomputed > 0 && config.dropout > 0.0) {
      throw std::invalid_argument("activation recomputation with model.dropout " + std::to_string(config.dropout) +
                                  " would draw different dropout masks in backward: set model.dropout to 0 or "
                                  "parallel.recompute_ratio to 0");
    }
    return std::make_shared<GptStageModule>(std::move(layers), names, recomputed);
  }
};

GPIPE_REGISTER_STAGE("gpt", GptStage);

}  // namespace gpipe::gpt

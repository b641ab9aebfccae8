// BertModel: BERT with a masked-language-model head behind ModelInterface (registered as "bert").
// Layers are [embedding, block_1 .. block_L, mlm_head] (bert_layers.h). The MLM decoder's weight
// is the token embedding (tied_parameters()): one tensor when a stage holds both layers, two
// copies kept equal by the trainer when different stages do.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "trainer/model/interfaces.h"

namespace gpipe::bert {

class BertModel final : public ModelInterface {
 public:
  // Throws ConfigError naming the model.* field that is unusable (vocab_size must be resolved).
  void configure(const ModelConfig& config) override;
  const ModelConfig& get_model_config() const override;
  // The head's cost includes its decoder weight (a copy of the embedding's on another stage, a
  // matmul either way).
  std::vector<LayerCost> layer_costs() const override;
  // As the GPT's (models/common/layered_model.h): parameters | time | uniform | explicit.
  std::vector<StageSpec> get_stage_partition(const ParallelConfig& parallel, int num_stages,
                                             const std::vector<double>& measured_layer_ms = {}) const override;
  std::shared_ptr<torch::nn::Module> create_layer(int64_t index, uint64_t seed) const override;
  // 6 * N_non_embedding + 12 * L * H * T, N_non_embedding counting the decoder (a matmul).
  double training_flops_per_token() const override;
  std::optional<AttentionShape> attention_shape() const override;
  MemoryEstimate estimate_memory() const override;
  // {"word_embeddings": (0, "word_embeddings.weight"), (L + 1, "decoder.weight"), shape [V, H]}.
  std::vector<TiedParameter> tied_parameters() const override;

  // Distinct parameters: the tied weight counted once.
  int64_t num_parameters() const;
  int64_t num_non_embedding_parameters() const;
  static std::string layer_name(int64_t index, int64_t num_layers);

 private:
  const ModelConfig& checked_config() const;
  int64_t block_parameters() const;
  int64_t head_parameters_without_decoder() const;
  int64_t ffn_size() const;

  ModelConfig config_;
  bool configured_ = false;
};

}  // namespace gpipe::bert

// GptModel: the GPT behind ModelInterface (registered as "gpt"). Layers are
// [embedding, block_1 .. block_L, head]; see gpt_layers.h for the architecture and init.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "trainer/model/interfaces.h"

namespace gpipe::gpt {

class GptModel final : public ModelInterface {
 public:
  // Throws ConfigError naming the model.* field that is unusable (vocab_size must be resolved).
  void configure(const ModelConfig& config) override;
  const ModelConfig& get_model_config() const override;
  std::vector<LayerCost> layer_costs() const override;
  // Blocks per stage from trainer/partition.h's partition_blocks(); costs are the layers'
  // parameter counts ("parameters") or measured_layer_ms ("time", one entry per layer).
  // recompute_ratio: parallel.recompute_ratio indexed by virtual stage when it has one entry per
  // virtual stage, else by rank (virtual stage % model_parallel_size), a single value applies to
  // all, empty means none.
  std::vector<StageSpec> get_stage_partition(const ParallelConfig& parallel, int num_stages,
                                             const std::vector<double>& measured_layer_ms = {}) const override;
  std::shared_ptr<torch::nn::Module> create_layer(int64_t index, uint64_t seed) const override;
  // PaLM/Megatron convention: 6 * N_non_embedding + 12 * L * H * T, where N_non_embedding is
  // every parameter but wte and wpe (the untied LM head is counted: it is a matmul).
  double training_flops_per_token() const override;
  std::optional<AttentionShape> attention_shape() const override;
  MemoryEstimate estimate_memory() const override;

  int64_t num_parameters() const;
  int64_t num_non_embedding_parameters() const;
  static std::string layer_name(int64_t index, int64_t num_layers);

 private:
  const ModelConfig& checked_config() const;
  int64_t block_parameters() const;
  int64_t ffn_size() const;

  ModelConfig config_;
  bool configured_ = false;
};

}  // namespace gpipe::gpt

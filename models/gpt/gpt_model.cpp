// GptModel: configuration checks, layer costs, partitioning into stages, layer construction.
#include "gpt_model.h"

#include "gpt_layers.h"
#include "common/layered_model.h"
#include "common/transformer.h"
#include "trainer/model/registry.h"

#include <stdexcept>
#include <string>

namespace gpipe::gpt {

void GptModel::configure(const ModelConfig& config) {
  models::check_transformer_config(config);
  if (config.norm_position != "default" && config.norm_position != "pre") {
    throw ConfigError("model.norm_position '" + config.norm_position +
                      "': the GPT has pre-LN blocks only; use default or pre (model 'bert' also has post)");
  }
  config_ = config;
  configured_ = true;
}

const ModelConfig& GptModel::checked_config() const {
  if (!configured_) throw std::logic_error("GptModel used before configure()");
  return config_;
}

const ModelConfig& GptModel::get_model_config() const { return checked_config(); }

int64_t GptModel::ffn_size() const { return models::ffn_size(checked_config()); }

int64_t GptModel::block_parameters() const { return models::transformer_block_parameters(checked_config()); }

int64_t GptModel::num_non_embedding_parameters() const {
  const auto& c = checked_config();
  return c.num_layers * block_parameters() + 2 * c.hidden_size + c.hidden_size * c.vocab_size;
}

int64_t GptModel::num_parameters() const {
  const auto& c = checked_config();
  return num_non_embedding_parameters() + (c.vocab_size + c.sequence_length) * c.hidden_size;
}

std::string GptModel::layer_name(int64_t index, int64_t num_layers) {
  if (index == 0) return "embedding";
  if (index == num_layers + 1) return "head";
  return "block_" + std::to_string(index);
}

std::vector<LayerCost> GptModel::layer_costs() const {
  const auto& c = checked_config();
  const double h = static_cast<double>(c.hidden_size), t = static_cast<double>(c.sequence_length);
  const double f = static_cast<double>(ffn_size()), v = static_cast<double>(c.vocab_size);
  std::vector<LayerCost> costs;
  costs.push_back({"embedding", (c.vocab_size + c.sequence_length) * c.hidden_size, 0.0});
  // Per token: 2 FLOPs per matmul weight, plus 4 T H for the attention scores and their use.
  const double block_flops = 2.0 * (4.0 * h * h + 2.0 * h * f) + 4.0 * t * h;
  for (int64_t i = 1; i <= c.num_layers; ++i) costs.push_back({layer_name(i, c.num_layers), block_parameters(), block_flops});
  costs.push_back({"head", 2 * c.hidden_size + c.hidden_size * c.vocab_size, 2.0 * h * v});
  return costs;
}

std::vector<StageSpec> GptModel::get_stage_partition(const ParallelConfig& parallel, int num_stages,
                                                     const std::vector<double>& measured_layer_ms) const {
  return models::layered_stage_partition(layer_costs(), parallel, num_stages, measured_layer_ms);
}

std::shared_ptr<torch::nn::Module> GptModel::create_layer(int64_t index, uint64_t seed) const {
  const auto& c = checked_config();
  if (index < 0 || index > c.num_layers + 1) {
    throw std::out_of_range("GPT layer index " + std::to_string(index) + " is outside [0, " +
                            std::to_string(c.num_layers + 1) + "]");
  }
  std::shared_ptr<GptLayer> layer;
  if (index == 0) layer = std::make_shared<GptEmbedding>(c);
  else if (index == c.num_layers + 1) layer = std::make_shared<GptHead>(c);
  else layer = std::make_shared<GptBlock>(c);
  init_layer(*layer, c.num_layers, layer_seed(seed, index));
  layer->set_layer_index(index);
  return layer;
}

std::optional<AttentionShape> GptModel::attention_shape() const {
  return models::self_attention_shape(checked_config(), /*causal=*/true);
}

double GptModel::training_flops_per_token() const {
  const auto& c = checked_config();
  return 6.0 * static_cast<double>(num_non_embedding_parameters()) +
         12.0 * static_cast<double>(c.num_layers) * static_cast<double>(c.hidden_size) * static_cast<double>(c.sequence_length);
}

MemoryEstimate GptModel::estimate_memory() const {
  // In doubles: the layer count may be absurd (the point is to refuse it before building).
  const auto& c = checked_config();
  const double h = static_cast<double>(c.hidden_size), f = static_cast<double>(ffn_size());
  const double v = static_cast<double>(c.vocab_size), s = static_cast<double>(c.sequence_length);
  const double layers = static_cast<double>(c.num_layers), heads = static_cast<double>(c.num_heads);
  const double block = 4 * h + (3 * h * h + 3 * h) + (h * h + h) + (h * f + f) + (f * h + h);
  MemoryEstimate m;
  m.parameters = (v + s) * h + layers * block + 2 * h + h * v;
  // Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models"):
  // 34 h + 5 a s bytes per token and layer in 16-bit, twice that in fp32 (no recomputation).
  m.activation_bytes_per_token = layers * (34 * h + 5 * heads * s) * 2;
  return m;
}

GPIPE_REGISTER_MODEL("gpt", GptModel);

}  // namespace gpipe::gpt

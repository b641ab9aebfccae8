// BertModel: configuration checks, layer costs, partitioning into stages, layer construction,
// the tied word embeddings.
#include "bert_model.h"

#include <stdexcept>
#include <string>

#include "bert_layers.h"
#include "common/layered_model.h"
#include "common/transformer.h"
#include "trainer/model/registry.h"

namespace gpipe::bert {

void BertModel::configure(const ModelConfig& config) {
  models::check_transformer_config(config);
  if (config.norm_position != "default" && config.norm_position != "post" && config.norm_position != "pre") {
    throw ConfigError("model.norm_position '" + config.norm_position + "': use default (post), post or pre");
  }
  config_ = config;
  configured_ = true;
}

const ModelConfig& BertModel::checked_config() const {
  if (!configured_) throw std::logic_error("BertModel used before configure()");
  return config_;
}

const ModelConfig& BertModel::get_model_config() const { return checked_config(); }

int64_t BertModel::ffn_size() const { return models::ffn_size(checked_config()); }

int64_t BertModel::block_parameters() const { return models::transformer_block_parameters(checked_config()); }

int64_t BertModel::head_parameters_without_decoder() const {
  const auto& c = checked_config();
  const int64_t h = c.hidden_size;
  return (is_pre_norm(c) ? 2 * h : 0) + (h * h + h) + 2 * h + c.vocab_size;
}

int64_t BertModel::num_non_embedding_parameters() const {
  const auto& c = checked_config();
  return c.num_layers * block_parameters() + head_parameters_without_decoder() + c.hidden_size * c.vocab_size;
}

int64_t BertModel::num_parameters() const {
  const auto& c = checked_config();
  // The decoder weight is the word embedding: counted once, in the non-embedding part.
  return num_non_embedding_parameters() + c.sequence_length * c.hidden_size + 2 * c.hidden_size;
}

std::string BertModel::layer_name(int64_t index, int64_t num_layers) {
  if (index == 0) return "embedding";
  if (index == num_layers + 1) return "head";
  return "block_" + std::to_string(index);
}

std::vector<LayerCost> BertModel::layer_costs() const {
  const auto& c = checked_config();
  const double h = static_cast<double>(c.hidden_size), t = static_cast<double>(c.sequence_length);
  const double f = static_cast<double>(ffn_size()), v = static_cast<double>(c.vocab_size);
  std::vector<LayerCost> costs;
  costs.push_back({"embedding", (c.vocab_size + c.sequence_length) * c.hidden_size + 2 * c.hidden_size, 0.0});
  // Per token: 2 FLOPs per matmul weight, plus 4 T H for the attention scores and their use.
  const double block_flops = 2.0 * (4.0 * h * h + 2.0 * h * f) + 4.0 * t * h;
  for (int64_t i = 1; i <= c.num_layers; ++i) costs.push_back({layer_name(i, c.num_layers), block_parameters(), block_flops});
  costs.push_back({"head", head_parameters_without_decoder() + c.hidden_size * c.vocab_size, 2.0 * (h * h + h * v)});
  return costs;
}

std::vector<StageSpec> BertModel::get_stage_partition(const ParallelConfig& parallel, int num_stages,
                                                      const std::vector<double>& measured_layer_ms) const {
  return models::layered_stage_partition(layer_costs(), parallel, num_stages, measured_layer_ms);
}

std::shared_ptr<torch::nn::Module> BertModel::create_layer(int64_t index, uint64_t seed) const {
  const auto& c = checked_config();
  if (index < 0 || index > c.num_layers + 1) {
    throw std::out_of_range("BERT layer index " + std::to_string(index) + " is outside [0, " +
                            std::to_string(c.num_layers + 1) + "]");
  }
  std::shared_ptr<BertLayer> layer;
  if (index == 0) layer = std::make_shared<BertEmbedding>(c);
  else if (index == c.num_layers + 1) layer = std::make_shared<BertHead>(c);
  else layer = std::make_shared<BertBlock>(c);
  init_layer(*layer, seed, index);
  layer->set_layer_index(index);
  return layer;
}

std::optional<AttentionShape> BertModel::attention_shape() const {
  return models::self_attention_shape(checked_config(), /*causal=*/false);
}

double BertModel::training_flops_per_token() const {
  const auto& c = checked_config();
  return 6.0 * static_cast<double>(num_non_embedding_parameters()) +
         12.0 * static_cast<double>(c.num_layers) * static_cast<double>(c.hidden_size) * static_cast<double>(c.sequence_length);
}

MemoryEstimate BertModel::estimate_memory() const {
  // In doubles: the layer count may be absurd (the point is to refuse it before building). Both
  // copies of the tied weight are counted (they are, on a pipeline of several stages).
  const auto& c = checked_config();
  const double h = static_cast<double>(c.hidden_size), f = static_cast<double>(ffn_size());
  const double v = static_cast<double>(c.vocab_size), s = static_cast<double>(c.sequence_length);
  const double layers = static_cast<double>(c.num_layers), heads = static_cast<double>(c.num_heads);
  const double block = 4 * h + (3 * h * h + 3 * h) + (h * h + h) + (h * f + f) + (f * h + h);
  MemoryEstimate m;
  m.parameters = (v + s) * h + 2 * h + layers * block + (h * h + 5 * h) + v + h * v;
  // Korthikanti et al. 2022: 34 h + 5 a s bytes per token and layer in 16-bit, twice in fp32.
  m.activation_bytes_per_token = layers * (34 * h + 5 * heads * s) * 2;
  return m;
}

std::vector<TiedParameter> BertModel::tied_parameters() const {
  const auto& c = checked_config();
  TiedParameter tied;
  tied.name = "word_embeddings";
  tied.members = {{0, "word_embeddings.weight"}, {c.num_layers + 1, "decoder.weight"}};
  tied.shape = {c.vocab_size, c.hidden_size};
  return {tied};
}

GPIPE_REGISTER_MODEL("bert", BertModel);

}  // namespace gpipe::bert

// GptModel: configuration checks, layer costs, partitioning into stages, layer construction.
#include "gpt_model.h"

#include "gpt_layers.h"
#include "trainer/partition/partition.h"
#include "trainer/model/registry.h"

#include <stdexcept>
#include <string>

namespace gpipe::gpt {
namespace {

void require_positive(int64_t value, const char* field) {
  if (value <= 0) throw ConfigError(std::string(field) + " must be positive, got " + std::to_string(value));
}

}  // namespace

void GptModel::configure(const ModelConfig& config) {
  require_positive(config.hidden_size, "model.hidden_size");
  require_positive(config.num_layers, "model.num_layers");
  require_positive(config.num_heads, "model.num_heads");
  require_positive(config.sequence_length, "model.sequence_length");
  if (config.vocab_size <= 0) {
    throw ConfigError("model.vocab_size is " + std::to_string(config.vocab_size) +
                      ": resolve it from the dataset's tokenizer before configuring the model");
  }
  if (config.hidden_size % config.num_heads != 0) {
    throw ConfigError("model.hidden_size " + std::to_string(config.hidden_size) + " is not divisible by model.num_heads " +
                      std::to_string(config.num_heads));
  }
  if (config.ffn_hidden_size != -1 && config.ffn_hidden_size <= 0) {
    throw ConfigError("model.ffn_hidden_size must be positive or -1 (4 x hidden_size), got " +
                      std::to_string(config.ffn_hidden_size));
  }
  if (!(config.dropout >= 0.0 && config.dropout < 1.0)) {
    throw ConfigError("model.dropout must be in [0, 1), got " + std::to_string(config.dropout));
  }
  config_ = config;
  configured_ = true;
}

const ModelConfig& GptModel::checked_config() const {
  if (!configured_) throw std::logic_error("GptModel used before configure()");
  return config_;
}

const ModelConfig& GptModel::get_model_config() const { return checked_config(); }

int64_t GptModel::ffn_size() const {
  const auto& c = checked_config();
  return c.ffn_hidden_size > 0 ? c.ffn_hidden_size : 4 * c.hidden_size;
}

int64_t GptModel::block_parameters() const {
  const int64_t h = checked_config().hidden_size, f = ffn_size();
  return 2 * 2 * h + (h * 3 * h + 3 * h) + (h * h + h) + (h * f + f) + (f * h + h);
}

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
  const auto& c = checked_config();
  const auto layers = layer_costs();
  std::vector<double> costs;
  if (parallel.partition == "time") {
    if (measured_layer_ms.size() != layers.size()) {
      throw std::invalid_argument("parallel.partition 'time' needs one measured time per layer (" +
                                  std::to_string(layers.size()) + ": embedding, " + std::to_string(c.num_layers) +
                                  " blocks, head), got " + std::to_string(measured_layer_ms.size()));
    }
    costs = measured_layer_ms;
  } else {
    for (const auto& layer : layers) costs.push_back(static_cast<double>(layer.parameters));
  }
  const std::vector<int64_t> blocks = partition_blocks(parallel.partition, costs, num_stages, parallel.partition_layers);
  if (static_cast<int>(blocks.size()) != num_stages) {
    throw std::logic_error("partition_blocks returned " + std::to_string(blocks.size()) + " stages, expected " +
                           std::to_string(num_stages));
  }

  const auto& ratios = parallel.recompute_ratio;
  const size_t ranks = static_cast<size_t>(std::max(1, parallel.model_parallel_size));
  if (!ratios.empty() && ratios.size() != 1 && ratios.size() != static_cast<size_t>(num_stages) && ratios.size() != ranks) {
    throw ConfigError("parallel.recompute_ratio has " + std::to_string(ratios.size()) + " entries: give 1, one per rank (" +
                      std::to_string(ranks) + ") or one per virtual stage (" + std::to_string(num_stages) + ")");
  }
  std::vector<StageSpec> specs;
  int64_t next_block = 1;  // layer index of the next unassigned block
  for (int s = 0; s < num_stages; ++s) {
    StageSpec spec;
    spec.stage = s;
    spec.num_stages = num_stages;
    spec.first_layer = s == 0 ? 0 : next_block;
    next_block += blocks[s];
    spec.last_layer = spec.is_last() ? next_block + 1 : next_block;
    if (ratios.size() == 1) spec.recompute_ratio = ratios[0];
    else if (ratios.size() == static_cast<size_t>(num_stages)) spec.recompute_ratio = ratios[s];
    else if (!ratios.empty()) spec.recompute_ratio = ratios[static_cast<size_t>(s) % ranks];
    if (!(spec.recompute_ratio >= 0.0 && spec.recompute_ratio <= 1.0)) {
      throw ConfigError("parallel.recompute_ratio for stage " + std::to_string(s) + " is " +
                        std::to_string(spec.recompute_ratio) + ": use a value in [0, 1]");
    }
    specs.push_back(spec);
  }
  if (next_block != c.num_layers + 1) {
    throw std::logic_error("partition_blocks assigned " + std::to_string(next_block - 1) + " blocks, the model has " +
                           std::to_string(c.num_layers));
  }
  return specs;
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
  return layer;
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

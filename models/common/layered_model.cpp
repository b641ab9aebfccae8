// The models' shared partition into stages and per-layer seeds (layered_model.h).
#include "common/layered_model.h"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "trainer/partition/partition.h"

namespace gpipe::models {

uint64_t layer_seed(uint64_t seed, int64_t index) {
  const unsigned __int128 mixed = static_cast<unsigned __int128>(seed) * 1000003u + static_cast<uint64_t>(index);
  return static_cast<uint64_t>(mixed % (static_cast<unsigned __int128>(1) << 63));
}

std::vector<StageSpec> layered_stage_partition(const std::vector<LayerCost>& layers, const ParallelConfig& parallel,
                                               int num_stages, const std::vector<double>& measured_layer_ms) {
  if (layers.size() < 3) throw std::logic_error("a layered model needs an embedding, a block and a head");
  const int64_t num_blocks = static_cast<int64_t>(layers.size()) - 2;
  std::vector<double> costs;
  if (parallel.partition == "time") {
    if (measured_layer_ms.size() != layers.size()) {
      throw std::invalid_argument("parallel.partition 'time' needs one measured time per layer (" +
                                  std::to_string(layers.size()) + ": embedding, " + std::to_string(num_blocks) +
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
  if (next_block != num_blocks + 1) {
    throw std::logic_error("partition_blocks assigned " + std::to_string(next_block - 1) + " blocks, the model has " +
                           std::to_string(num_blocks));
  }
  return specs;
}

namespace {

void require_positive(int64_t value, const char* field) {
  if (value <= 0) throw ConfigError(std::string(field) + " must be positive, got " + std::to_string(value));
}

}  // namespace

void check_transformer_config(const ModelConfig& config) {
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
}

}  // namespace gpipe::models

// The synthetic model (registered as "synthetic", model and stage): layers [input, block_1 ..
// block_L, output], each a SyntheticLayer that waits the configured times (synthetic_layers.h).
// Token ids in (any dataset), the mean of the last hidden states out as the loss.
#include <ATen/ATen.h>

#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/layered_model.h"
#include "common/transformer.h"
#include "synthetic_layers.h"
#include "trainer/model/registry.h"

namespace gpipe::synthetic {

class SyntheticModel final : public ModelInterface {
 public:
  void configure(const ModelConfig& config) override {
    if (config.hidden_size < 1) throw ConfigError("model.hidden_size: the synthetic model needs an integer >= 1");
    if (config.num_layers < 1) throw ConfigError("model.num_layers: the synthetic model needs an integer >= 1");
    config_ = config;
    configured_ = true;
  }
  const ModelConfig& get_model_config() const override { return checked(); }

  // Equal layers: partition=parameters gives equal blocks per stage, partition=time measures.
  std::vector<LayerCost> layer_costs() const override {
    const ModelConfig& c = checked();
    std::vector<LayerCost> costs;
    for (int64_t i = 0; i <= c.num_layers + 1; ++i) costs.push_back({layer_name(i, c.num_layers), c.hidden_size, 0.0});
    return costs;
  }
  std::vector<StageSpec> get_stage_partition(const ParallelConfig& parallel, int num_stages,
                                             const std::vector<double>& measured_layer_ms = {}) const override {
    return models::layered_stage_partition(layer_costs(), parallel, num_stages, measured_layer_ms);
  }
  std::shared_ptr<torch::nn::Module> create_layer(int64_t index, uint64_t /*seed*/) const override {
    const ModelConfig& c = checked();
    if (index < 0 || index > c.num_layers + 1) {
      throw std::out_of_range("synthetic layer index " + std::to_string(index) + " is outside [0, " +
                              std::to_string(c.num_layers + 1) + "]");
    }
    return std::make_shared<SyntheticLayer>(c, index == 0);
  }
  double training_flops_per_token() const override { return 0.0; }  // it computes nothing
  MemoryEstimate estimate_memory() const override {
    const ModelConfig& c = checked();
    MemoryEstimate m;
    m.parameters = static_cast<double>((c.num_layers + 2) * c.hidden_size);
    m.activation_bytes_per_token = static_cast<double>(c.num_layers + 1) * c.synthetic.activation_bytes_per_token;
    return m;
  }

  static std::string layer_name(int64_t index, int64_t num_layers) {
    if (index == 0) return "input";
    if (index == num_layers + 1) return "output";
    return "block_" + std::to_string(index);
  }

 private:
  const ModelConfig& checked() const {
    if (!configured_) throw std::logic_error("SyntheticModel used before configure()");
    return config_;
  }
  ModelConfig config_;
  bool configured_ = false;
};

// A stage: its layers in order, the last ceil(ratio x blocks) blocks recomputed in backward (their
// forward waits again), as the other models do.
class SyntheticStageModule final : public StageModule {
 public:
  SyntheticStageModule(std::vector<std::shared_ptr<SyntheticLayer>> layers, const std::vector<std::string>& names,
                       int64_t first_recomputed, int64_t end_recomputed)
      : layers_(std::move(layers)), first_recomputed_(first_recomputed), end_recomputed_(end_recomputed) {
    for (size_t i = 0; i < layers_.size(); ++i) register_module(names[i], layers_[i]);
    recomputed_.assign(layers_.begin() + first_recomputed_, layers_.begin() + end_recomputed_);
  }
  at::Tensor forward(const at::Tensor& input) override {
    at::Tensor x = input;
    const auto n = static_cast<int64_t>(layers_.size());
    for (int64_t i = 0; i < first_recomputed_; ++i) x = layers_[i]->forward(x);
    if (!recomputed_.empty()) x = models::run_recomputed(recomputed_, x);
    for (int64_t i = end_recomputed_; i < n; ++i) x = layers_[i]->forward(x);
    return x;
  }

 private:
  std::vector<std::shared_ptr<SyntheticLayer>> layers_;
  int64_t first_recomputed_, end_recomputed_;
  std::vector<std::shared_ptr<models::SequentialLayer>> recomputed_;
};

class SyntheticStage final : public StageInterface {
 public:
  at::Tensor prepare_input(const Batch& microbatch) const override { return microbatch.input_ids; }
  // The mean of the last hidden states: a constant of the shapes (the outputs are zeros), with a
  // gradient that reaches every layer.
  at::Tensor compute_loss(const at::Tensor& logits, const Batch& /*microbatch*/) const override {
    return logits.to(at::kFloat).mean();
  }
  std::shared_ptr<StageModule> create_sub_model(const ModelInterface& model, const StageSpec& spec,
                                                uint64_t seed) const override {
    const ModelConfig& config = model.get_model_config();
    models::check_stage_layers(spec, config.num_layers + 2);
    std::vector<std::shared_ptr<SyntheticLayer>> layers;
    std::vector<std::string> names;
    for (int64_t i = spec.first_layer; i < spec.last_layer; ++i) {
      auto layer = std::dynamic_pointer_cast<SyntheticLayer>(model.create_layer(i, seed));
      if (!layer) throw std::invalid_argument("stage 'synthetic' needs model 'synthetic' (layer " + std::to_string(i) + ")");
      layers.push_back(std::move(layer));
      names.push_back(SyntheticModel::layer_name(i, config.num_layers));
    }
    // Blocks are the layers other than the input (0) and the output (L + 1).
    const int64_t first_block = std::max<int64_t>(spec.first_layer, 1);
    const int64_t end_block = std::min<int64_t>(spec.last_layer, config.num_layers + 1);
    const int64_t blocks = std::max<int64_t>(0, end_block - first_block);
    const int64_t recomputed = models::recomputed_block_count(spec.recompute_ratio, blocks);
    const int64_t end_local = end_block - spec.first_layer;
    return std::make_shared<SyntheticStageModule>(std::move(layers), names, end_local - recomputed, end_local);
  }
};

GPIPE_REGISTER_MODEL("synthetic", SyntheticModel);
GPIPE_REGISTER_STAGE("synthetic", SyntheticStage);

}  // namespace gpipe::synthetic

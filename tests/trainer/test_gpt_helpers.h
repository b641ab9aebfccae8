// Tiny GPT configurations and stage construction shared by the model tests (H=32, L=4, T=16 so
// the whole suite runs in seconds on one CPU core).
#pragma once

#include <memory>

#include "gpt/gpt_model.h"
#include "trainer/model/interfaces.h"
#include "trainer/model/registry.h"

namespace gpipe::test {

inline ModelConfig tiny_gpt_config(int64_t vocab_size = 64) {
  ModelConfig config;
  config.hidden_size = 32;
  config.num_layers = 4;
  config.num_heads = 4;
  config.sequence_length = 16;
  config.vocab_size = vocab_size;
  return config;
}

inline std::unique_ptr<ModelInterface> configured_gpt(const ModelConfig& config) {
  auto model = model_registry().create("gpt");
  model->configure(config);
  return model;
}

inline StageSpec stage_spec(int stage, int num_stages, int64_t first, int64_t last, double recompute = 0.0) {
  StageSpec spec;
  spec.stage = stage;
  spec.num_stages = num_stages;
  spec.first_layer = first;
  spec.last_layer = last;
  spec.recompute_ratio = recompute;
  return spec;
}

// The whole model as one stage: layers [0, L + 2).
inline std::shared_ptr<StageModule> whole_gpt(const ModelInterface& model, uint64_t seed, double recompute = 0.0) {
  const int64_t layers = model.get_model_config().num_layers + 2;
  return stage_registry().create("gpt")->create_sub_model(model, stage_spec(0, 1, 0, layers, recompute), seed);
}

}  // namespace gpipe::test

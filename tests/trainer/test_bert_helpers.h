// Tiny BERT configurations and stage construction shared by the BERT tests (H=32, L=4, T=16).
#pragma once

#include <memory>
#include <string>

#include "bert/bert_model.h"
#include "trainer/model/interfaces.h"
#include "trainer/model/registry.h"

namespace gpipe::test {

inline ModelConfig tiny_bert_config(int64_t vocab_size = 64, const std::string& norm = "default") {
  ModelConfig config;
  config.name = "bert";
  config.hidden_size = 32;
  config.num_layers = 4;
  config.num_heads = 4;
  config.sequence_length = 16;
  config.vocab_size = vocab_size;
  config.norm_position = norm;
  return config;
}

inline std::unique_ptr<ModelInterface> configured_bert(const ModelConfig& config) {
  auto model = model_registry().create("bert");
  model->configure(config);
  return model;
}

inline StageSpec bert_stage_spec(int stage, int num_stages, int64_t first, int64_t last, double recompute = 0.0) {
  StageSpec spec;
  spec.stage = stage;
  spec.num_stages = num_stages;
  spec.first_layer = first;
  spec.last_layer = last;
  spec.recompute_ratio = recompute;
  return spec;
}

// The whole model as one stage: layers [0, L + 2).
inline std::shared_ptr<StageModule> whole_bert(const ModelInterface& model, uint64_t seed, double recompute = 0.0) {
  const int64_t layers = model.get_model_config().num_layers + 2;
  return stage_registry().create("bert")->create_sub_model(model, bert_stage_spec(0, 1, 0, layers, recompute), seed);
}

}  // namespace gpipe::test

// The synthetic model (models/synthetic/): registered as model and stage, its config section,
// and what its layers do: the input and weight gradients run as separate autograd nodes (a
// zero-bubble schedule's I call runs no weight-gradient wait, its W call no input-gradient wait),
// the activation is held from forward to backward, and the waits take at least their time.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include <chrono>
#include <string>

#include "synthetic/synthetic_layers.h"
#include "trainer/config/config.h"
#include "trainer/model/registry.h"
#include "trainer/model/weight_grad_store.h"

namespace gpipe::test {
namespace {

ModelConfig synthetic_config(double forward_ms = 0, double input_ms = 0, double weight_ms = 0) {
  ModelConfig c;
  c.name = "synthetic";
  c.hidden_size = 8;
  c.num_layers = 4;
  c.sequence_length = 16;
  c.vocab_size = 64;
  c.synthetic = {forward_ms, input_ms, weight_ms, 512};
  return c;
}

std::shared_ptr<StageModule> whole_model(const ModelConfig& config, int64_t first, int64_t last) {
  auto model = model_registry().create("synthetic");
  model->configure(config);
  StageSpec spec;
  spec.num_stages = 1;
  spec.first_layer = first;
  spec.last_layer = last;
  return stage_registry().create("synthetic")->create_sub_model(*model, spec, 1);
}

TEST(SyntheticModel, ConfigSectionIsReadAndCheckedAndWrittenBackOnlyForIt) {
  auto config = PipelineConfig::from_yaml_string(
      "model: {name: synthetic, num_layers: 6}\n"
      "synthetic: {forward_ms: 2.5, input_grad_ms: 1.5, weight_grad_ms: 0.5, activation_bytes_per_token: 4096}\n");
  EXPECT_EQ(config.model.synthetic, (SyntheticLayerConfig{2.5, 1.5, 0.5, 4096}));
  EXPECT_NE(config.to_yaml().find("synthetic:"), std::string::npos);
  EXPECT_EQ(PipelineConfig::from_yaml_string(config.to_yaml()).model.synthetic, config.model.synthetic);
  EXPECT_EQ(PipelineConfig::from_yaml_string("model: {name: gpt}\n").to_yaml().find("synthetic"), std::string::npos);
  try {
    PipelineConfig::from_yaml_string("synthetic: {forward_ms: -1}\n").validate();
    FAIL() << "a negative time must be refused";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("synthetic.forward_ms"), std::string::npos) << e.what();
  }
}

TEST(SyntheticModel, InputAndWeightGradientsRunSeparately) {
  auto& n = synthetic::counters();
  auto stage = whole_model(synthetic_config(), 1, 4);  // three blocks
  at::Tensor x = at::zeros({2, 16, 8}).requires_grad_(true);
  at::Tensor y = stage->forward(x);
  EXPECT_EQ(y.sizes(), x.sizes());
  EXPECT_EQ(n.activations_held.load(), 3);
  const int64_t inputs = n.input_grads.load(), weights = n.weight_grads.load();
  // I, as a zero-bubble schedule runs it: the weight-gradient waits go to the store.
  WeightGradStore store;
  {
    WeightGradStore::Defer defer(store);
    y.backward(at::ones_like(y));
  }
  EXPECT_EQ(n.input_grads.load() - inputs, 3);
  EXPECT_EQ(n.weight_grads.load() - weights, 0) << "I ran a weight-gradient wait";
  EXPECT_EQ(store.size(), 3u);
  EXPECT_EQ(n.activations_held.load(), 0) << "the activations outlived their backward";
  EXPECT_TRUE(at::equal(x.grad(), at::ones_like(x)));
  // W: the deferred waits.
  store.flush();
  EXPECT_EQ(n.weight_grads.load() - weights, 3);
  EXPECT_EQ(n.input_grads.load() - inputs, 3) << "W ran an input-gradient wait";
  for (const auto& p : stage->parameters()) EXPECT_EQ(p.grad().sizes(), (std::vector<int64_t>{8}));
  // Without a Defer (every other schedule) one backward runs both.
  at::Tensor y2 = stage->forward(x);
  y2.backward(at::ones_like(y2));
  EXPECT_EQ(n.input_grads.load() - inputs, 6);
  EXPECT_EQ(n.weight_grads.load() - weights, 6);
}

TEST(SyntheticModel, TheFirstStageTakesTokenIdsAndTheWaitsTakeTheirTime) {
  auto stage = whole_model(synthetic_config(20, 0, 0), 0, 2);  // input layer + one block
  const at::Tensor ids = at::zeros({2, 16}, at::kLong);
  const auto start = std::chrono::steady_clock::now();
  at::Tensor y = stage->forward(ids);
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(y.sizes(), (std::vector<int64_t>{2, 16, 8}));
  EXPECT_GE(ms, 40.0) << "two layers of 20 ms each";  // a lower bound: sleeping cannot be shorter
  EXPECT_TRUE(y.requires_grad()) << "the weights must get gradients on the first stage too";
}

TEST(SyntheticModel, CostsAndMemoryFollowTheConfig) {
  auto model = model_registry().create("synthetic");
  model->configure(synthetic_config());
  EXPECT_EQ(model->layer_costs().size(), 6u);  // input, 4 blocks, output
  const MemoryEstimate m = model->estimate_memory();
  EXPECT_EQ(m.parameters, 6 * 8);
  EXPECT_EQ(m.activation_bytes_per_token, 5 * 512);
  EXPECT_THROW(model->create_layer(6, 1), std::out_of_range);
}

}  // namespace
}  // namespace gpipe::test

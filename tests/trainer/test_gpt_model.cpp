// The GPT as one stage: shapes, causality, initial loss, init determinism, parameter and FLOP
// accounting, configuration errors.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorIndexing.h>
#include <gtest/gtest.h>

#include <cmath>

#include "gpt/gpt_layers.h"
#include "test_gpt_helpers.h"

namespace gpipe::test {
namespace {

at::Tensor random_ids(int64_t batch, int64_t time, int64_t vocab, uint64_t seed) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randint(vocab, {batch, time}, generator, at::kLong);
}

TEST(GptModel, ForwardGivesLogitsPerPosition) {
  auto model = configured_gpt(tiny_gpt_config());
  auto gpt = whole_gpt(*model, 7);
  EXPECT_EQ(gpt->forward(random_ids(2, 16, 64, 1)).sizes(), (std::vector<int64_t>{2, 16, 64}));
  EXPECT_EQ(gpt->forward(random_ids(3, 5, 64, 2)).sizes(), (std::vector<int64_t>{3, 5, 64}));
}

TEST(GptModel, SequenceLongerThanPositionTableIsRejected) {
  auto model = configured_gpt(tiny_gpt_config());
  auto gpt = whole_gpt(*model, 7);
  try {
    gpt->forward(random_ids(1, 17, 64, 1));
    FAIL() << "17 tokens with sequence_length 16 must throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("model.sequence_length"), std::string::npos) << e.what();
  }
}

TEST(GptModel, ChangingAFutureTokenLeavesEarlierLogitsAlone) {
  auto model = configured_gpt(tiny_gpt_config());
  auto gpt = whole_gpt(*model, 11);
  at::Tensor ids = random_ids(2, 16, 64, 3);
  at::Tensor changed = ids.clone();
  changed.index_put_({at::indexing::Slice(), 10}, (ids.index({at::indexing::Slice(), 10}) + 1) % 64);
  at::NoGradGuard no_grad;
  const at::Tensor a = gpt->forward(ids), b = gpt->forward(changed);
  const auto before = at::indexing::Slice(0, 10), after = at::indexing::Slice(10, 16);
  EXPECT_TRUE(at::allclose(a.index({at::indexing::Slice(), before}), b.index({at::indexing::Slice(), before}), 0, 1e-6));
  EXPECT_FALSE(at::allclose(a.index({at::indexing::Slice(), after}), b.index({at::indexing::Slice(), after}), 0, 1e-6));
}

TEST(GptModel, InitialLossIsAboutLogVocab) {
  const int64_t vocab = 257;
  auto model = configured_gpt(tiny_gpt_config(vocab));
  auto gpt = whole_gpt(*model, 5);
  auto stage = stage_registry().create("gpt");
  Batch batch{random_ids(4, 16, vocab, 8), random_ids(4, 16, vocab, 9)};
  const double loss = stage->compute_loss(gpt->forward(stage->prepare_input(batch)), batch).item<double>();
  EXPECT_NEAR(loss, std::log(static_cast<double>(vocab)), 0.05);
}

TEST(GptModel, LayerInitDependsOnlyOnSeedAndIndex) {
  auto model = configured_gpt(tiny_gpt_config());
  auto params = [&](int64_t index, uint64_t seed) { return model->create_layer(index, seed)->parameters(); };
  const auto a = params(2, 42), again = params(2, 42), other_seed = params(2, 43), other_index = params(3, 42);
  ASSERT_EQ(a.size(), again.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(at::equal(a[i], again[i])) << "parameter " << i;
  // The first weight (ln_1 is constant, so compare c_attn.weight) must change with seed and index.
  auto c_attn = [](const std::vector<at::Tensor>& p) { return p[2]; };
  EXPECT_FALSE(at::equal(c_attn(a), c_attn(other_seed)));
  EXPECT_FALSE(at::equal(c_attn(a), c_attn(other_index)));
}

TEST(GptModel, Gpt2InitScalesResidualProjections) {
  ModelConfig config = tiny_gpt_config();
  config.hidden_size = 128;  // enough weights for stable standard deviations
  auto model = configured_gpt(config);
  auto block = std::dynamic_pointer_cast<gpt::GptBlock>(model->create_layer(1, 3));
  ASSERT_TRUE(block);
  const double residual = 0.02 / std::sqrt(2.0 * config.num_layers);
  EXPECT_NEAR(block->attn->c_attn->weight.std().item<double>(), 0.02, 0.002);
  EXPECT_NEAR(block->attn->c_proj->weight.std().item<double>(), residual, residual * 0.1);
  EXPECT_NEAR(block->mlp->c_proj->weight.std().item<double>(), residual, residual * 0.1);
  EXPECT_TRUE(at::equal(block->attn->c_attn->bias, at::zeros_like(block->attn->c_attn->bias)));
  EXPECT_TRUE(at::equal(block->ln_1->weight, at::ones_like(block->ln_1->weight)));
}

TEST(GptModel, LayerSeedMatchesThePythonPeer) {
  // (seed * 1000003 + index) mod 2^63, computed without overflow.
  EXPECT_EQ(gpt::layer_seed(1234, 5), 1234u * 1000003u + 5u);
  EXPECT_EQ(gpt::layer_seed(UINT64_MAX, 0), static_cast<uint64_t>(((static_cast<unsigned __int128>(UINT64_MAX) * 1000003u)) %
                                                                  (static_cast<unsigned __int128>(1) << 63)));
}

// Reference numbers from the Python peer (scripts/peers/gpt.py, same LibTorch CPU kernels):
//   s = GPTShape(vocab_size=64, hidden_size=32, num_layers=4, num_heads=4, sequence_length=16,
//                ffn_hidden_size=128, dropout=0.0, ...)
//   create_layer(s, 1, 1234).attn.c_attn.weight[0, :3]; create_model(s, 1234).eval()(ids) with
//   ids = (arange(32).reshape(2, 16) * 7) % 64 -> logits[1, 15, :3] and logits.abs().sum().
TEST(GptModel, MatchesThePythonPeerLayerForLayer) {
  auto model = configured_gpt(tiny_gpt_config());
  auto block = std::dynamic_pointer_cast<gpt::GptBlock>(model->create_layer(1, 1234));
  ASSERT_TRUE(block);
  const at::Tensor first = block->attn->c_attn->weight[0];
  EXPECT_NEAR(first[0].item<double>(), 0.026228029280900955, 1e-7);
  EXPECT_NEAR(first[1].item<double>(), 0.02090390957891941, 1e-7);
  EXPECT_NEAR(first[2].item<double>(), -0.028503380715847015, 1e-7);
  auto gpt = whole_gpt(*model, 1234);
  at::NoGradGuard no_grad;
  const at::Tensor ids = (at::arange(32, at::kLong).reshape({2, 16}) * 7) % 64;
  const at::Tensor logits = gpt->forward(ids);
  EXPECT_NEAR(logits[1][15][0].item<double>(), 0.09043533354997635, 1e-5);
  EXPECT_NEAR(logits[1][15][1].item<double>(), -0.22293800115585327, 1e-5);
  EXPECT_NEAR(logits[1][15][2].item<double>(), 0.0010876491433009505, 1e-5);
  EXPECT_NEAR(logits.abs().sum().item<double>(), 184.6719207763672, 1e-2);
}

TEST(GptModel, ParameterAndFlopAccountingMatchTheModules) {
  ModelConfig config = tiny_gpt_config(100);
  config.ffn_hidden_size = 48;
  auto model = configured_gpt(config);
  auto gpt = whole_gpt(*model, 1);
  int64_t total = 0, embedding = 0;
  for (const auto& item : gpt->named_parameters()) {
    total += item.value().numel();
    if (item.key().rfind("embedding.", 0) == 0) embedding += item.value().numel();
  }
  auto* gpt_model = dynamic_cast<gpt::GptModel*>(model.get());
  ASSERT_NE(gpt_model, nullptr);
  EXPECT_EQ(gpt_model->num_parameters(), total);
  EXPECT_EQ(gpt_model->num_non_embedding_parameters(), total - embedding);
  int64_t costed = 0;
  for (const auto& layer : model->layer_costs()) costed += layer.parameters;
  EXPECT_EQ(costed, total);
  const double expected = 6.0 * static_cast<double>(total - embedding) + 12.0 * 4 * 32 * 16;
  EXPECT_DOUBLE_EQ(model->training_flops_per_token(), expected);
}

TEST(GptModel, BadConfigurationNamesTheField) {
  auto model = model_registry().create("gpt");
  ModelConfig config = tiny_gpt_config();
  config.hidden_size = 30;
  try {
    model->configure(config);
    FAIL() << "hidden_size 30 with 4 heads must be rejected";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.num_heads"), std::string::npos) << e.what();
  }
  config = tiny_gpt_config(-1);
  EXPECT_THROW(model->configure(config), ConfigError);
}

TEST(GptModel, DropoutOnlyActsInTraining) {
  ModelConfig config = tiny_gpt_config();
  config.dropout = 0.5;
  auto model = configured_gpt(config);
  auto gpt = whole_gpt(*model, 2);
  const at::Tensor ids = random_ids(2, 16, 64, 4);
  at::NoGradGuard no_grad;
  gpt->train();
  EXPECT_FALSE(at::equal(gpt->forward(ids), gpt->forward(ids)));
  gpt->eval();
  EXPECT_TRUE(at::equal(gpt->forward(ids), gpt->forward(ids)));
}

}  // namespace
}  // namespace gpipe::test

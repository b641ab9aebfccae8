// BERT as one stage and split into stages: shapes, bidirectional attention, post- and pre-LN,
// initial loss, init determinism, the tied decoder (one tensor on one stage, equal copies on two),
// parameter and FLOP accounting against the closed form, configuration errors.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/TensorIndexing.h>
#include <gtest/gtest.h>

#include <cmath>

#include "bert/bert_layers.h"
#include "bert/bert_stage.h"
#include "test_bert_helpers.h"

namespace gpipe::test {
namespace {

using at::indexing::Slice;

at::Tensor random_ids(int64_t batch, int64_t time, int64_t vocab, uint64_t seed) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  return at::randint(vocab, {batch, time}, generator, at::kLong);
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

TEST(BertModel, IsRegisteredAndGivesLogitsPerPosition) {
  auto model = configured_bert(tiny_bert_config());
  auto bert = whole_bert(*model, 7);
  EXPECT_EQ(bert->forward(random_ids(2, 16, 64, 1)).sizes(), (std::vector<int64_t>{2, 16, 64}));
  EXPECT_EQ(bert->forward(random_ids(3, 5, 64, 2)).sizes(), (std::vector<int64_t>{3, 5, 64}));
  try {
    bert->forward(random_ids(1, 17, 64, 1));
    FAIL() << "17 tokens with sequence_length 16 must throw";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("model.sequence_length"), std::string::npos) << e.what();
  }
}

// The opposite of the GPT's causal test: a later token changes the outputs at earlier positions.
TEST(BertModel, ChangingALaterTokenChangesEarlierPositions) {
  for (const char* norm : {"post", "pre"}) {
    auto model = configured_bert(tiny_bert_config(64, norm));
    auto bert = whole_bert(*model, 11);
    bert->eval();
    at::Tensor ids = random_ids(2, 16, 64, 3);
    at::Tensor changed = ids.clone();
    changed.index_put_({Slice(), 12}, (ids.index({Slice(), 12}) + 1) % 64);
    at::NoGradGuard no_grad;
    const at::Tensor a = bert->forward(ids), b = bert->forward(changed);
    for (int64_t t = 0; t < 12; ++t) {
      EXPECT_GT(max_abs_diff(a.index({Slice(), t}), b.index({Slice(), t})), 1e-6) << norm << " position " << t;
    }
  }
}

TEST(BertModel, PostAndPreNormAreDifferentModels) {
  auto post = configured_bert(tiny_bert_config(64, "post"));
  auto fallback = configured_bert(tiny_bert_config(64, "default"));
  auto pre = configured_bert(tiny_bert_config(64, "pre"));
  const at::Tensor ids = random_ids(2, 16, 64, 5);
  at::NoGradGuard no_grad;
  const at::Tensor a = whole_bert(*post, 3)->forward(ids), b = whole_bert(*pre, 3)->forward(ids);
  EXPECT_TRUE(at::equal(a, whole_bert(*fallback, 3)->forward(ids))) << "default must be post-LN";
  EXPECT_FALSE(at::allclose(a, b, 0, 1e-6));
  // The encoders' outputs (embedding + blocks, before the head) differ far beyond rounding (at
  // init the blocks add little to the normalised embedding, so not by much).
  auto stage = stage_registry().create("bert");
  const at::Tensor post_hidden = stage->create_sub_model(*post, bert_stage_spec(0, 2, 0, 5), 3)->forward(ids);
  const at::Tensor pre_hidden = stage->create_sub_model(*pre, bert_stage_spec(0, 2, 0, 5), 3)->forward(ids);
  EXPECT_GT(max_abs_diff(post_hidden, pre_hidden), 1e-3);
  // Post-LN ends every block normalised; pre-LN's residual stream is not (its head has ln_f).
  auto block = std::dynamic_pointer_cast<bert::BertBlock>(post->create_layer(1, 3));
  ASSERT_TRUE(block);
  const at::Tensor y = block->forward(at::randn({2, 16, 32}) * 5);
  EXPECT_LT(y.mean(-1).abs().max().item<double>(), 1e-4);
  EXPECT_NEAR(y.var(-1, /*unbiased=*/false).mean().item<double>(), 1.0, 1e-3);
  auto head = std::dynamic_pointer_cast<bert::BertHead>(pre->create_layer(5, 3));
  ASSERT_TRUE(head && head->ln_f);
  EXPECT_FALSE(std::dynamic_pointer_cast<bert::BertHead>(post->create_layer(5, 3))->ln_f);
}

TEST(BertModel, InitialLossIsAboutLogVocab) {
  const int64_t vocab = 258;
  auto model = configured_bert(tiny_bert_config(vocab));
  auto bert = whole_bert(*model, 5);
  auto stage = stage_registry().create("bert");
  at::Tensor targets = random_ids(4, 16, vocab, 9);
  targets.index_put_({Slice(), Slice(0, 10)}, -100);  // ignored positions do not count
  const Batch batch{random_ids(4, 16, vocab, 8), targets};
  const double loss = stage->compute_loss(bert->forward(stage->prepare_input(batch)), batch).item<double>();
  EXPECT_NEAR(loss, std::log(static_cast<double>(vocab)), 0.15);
}

TEST(BertModel, LossIsTheMeanOverMaskedPositionsOnly) {
  auto stage = stage_registry().create("bert");
  auto generator = at::make_generator<at::CPUGeneratorImpl>(4);
  const at::Tensor logits = at::randn({2, 3, 5}, generator);
  const at::Tensor targets = at::tensor({-100, 2, -100, 4, -100, -100}, at::kLong).reshape({2, 3});
  const double loss = stage->compute_loss(logits, Batch{at::zeros({2, 3}, at::kLong), targets}).item<double>();
  const at::Tensor logp = at::log_softmax(logits, -1);
  const double expected = -(logp[0][1][2].item<double>() + logp[1][0][4].item<double>()) / 2.0;
  EXPECT_NEAR(loss, expected, 1e-6);
}

TEST(BertModel, LayerInitDependsOnlyOnSeedAndIndex) {
  auto model = configured_bert(tiny_bert_config());
  auto params = [&](int64_t index, uint64_t seed) { return model->create_layer(index, seed)->parameters(); };
  const auto a = params(2, 42), again = params(2, 42), other_seed = params(2, 43), other_index = params(3, 42);
  ASSERT_EQ(a.size(), again.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_TRUE(at::equal(a[i], again[i])) << "parameter " << i;
  EXPECT_FALSE(at::equal(a[0], other_seed[0]));  // attn.qkv.weight
  EXPECT_FALSE(at::equal(a[0], other_index[0]));
  EXPECT_NEAR(a[0].std().item<double>(), 0.02, 0.003);
}

TEST(BertModel, OneStageSharesOneTiedTensor) {
  auto model = configured_bert(tiny_bert_config());
  auto bert = whole_bert(*model, 9);
  auto& module = dynamic_cast<bert::BertStageModule&>(*bert);
  EXPECT_TRUE(module.ties_locally());
  const at::Tensor embedding = bert->layer_parameter(0, "word_embeddings.weight");
  const at::Tensor decoder = bert->layer_parameter(5, "decoder.weight");
  ASSERT_TRUE(embedding.defined() && decoder.defined());
  EXPECT_TRUE(embedding.is_same(decoder));
  const auto named = bert->named_parameters();
  EXPECT_NE(named.find("embedding.word_embeddings.weight"), nullptr);
  EXPECT_EQ(named.find("head.decoder.weight"), nullptr) << "the tied weight must be registered once";
  EXPECT_FALSE(bert->layer_parameter(6, "decoder.weight").defined());
  EXPECT_FALSE(bert->layer_parameter(1, "no.such").defined());
  // Both uses feed the one gradient: the embedding lookup's and the decoder's.
  auto stage = stage_registry().create("bert");
  const Batch batch{random_ids(2, 16, 64, 1), random_ids(2, 16, 64, 2)};
  stage->compute_loss(bert->forward(batch.input_ids), batch).backward();
  const at::Tensor grad = embedding.grad();
  ASSERT_TRUE(grad.defined());
  // Rows of tokens absent from the input get only the decoder's gradient, which is dense.
  EXPECT_GT(grad.abs().sum(1).gt(0).sum().item<int64_t>(), 60);
}

TEST(BertModel, CopiesOnDifferentStagesStartEqual) {
  auto model = configured_bert(tiny_bert_config());
  auto stage = stage_registry().create("bert");
  auto first = stage->create_sub_model(*model, bert_stage_spec(0, 2, 0, 3), 17);
  auto last = stage->create_sub_model(*model, bert_stage_spec(1, 2, 3, 6), 17);
  const at::Tensor embedding = first->layer_parameter(0, "word_embeddings.weight");
  const at::Tensor decoder = last->layer_parameter(5, "decoder.weight");
  ASSERT_TRUE(embedding.defined() && decoder.defined());
  EXPECT_FALSE(embedding.is_same(decoder));
  EXPECT_TRUE(at::equal(embedding, decoder));
  EXPECT_NE(last->named_parameters().find("head.decoder.weight"), nullptr);
  // ... and the model says they are one parameter.
  const auto tied = model->tied_parameters();
  ASSERT_EQ(tied.size(), 1u);
  ASSERT_EQ(tied[0].members.size(), 2u);
  EXPECT_EQ(tied[0].members[0].layer, 0);
  EXPECT_EQ(tied[0].members[0].name, "word_embeddings.weight");
  EXPECT_EQ(tied[0].members[1].layer, 5);
  EXPECT_EQ(tied[0].members[1].name, "decoder.weight");
  EXPECT_EQ(tied[0].shape, (std::vector<int64_t>{64, 32}));
  // Chained stages equal the whole model.
  const at::Tensor ids = random_ids(2, 16, 64, 6);
  at::NoGradGuard no_grad;
  EXPECT_LE(max_abs_diff(last->forward(first->forward(ids)), whole_bert(*model, 17)->forward(ids)), 1e-5);
}

// Closed form: embedding (V + T) H + 2 H; block 4 H + 3 H^2 + 3 H + H^2 + H + 2 H F + F + H;
// head H^2 + H + 2 H (+ 2 H pre-LN) + V (bias) + V H (decoder, the tied weight).
TEST(BertModel, ParameterCountsMatchTheClosedFormAndTheModules) {
  for (const char* norm : {"post", "pre"}) {
    ModelConfig config = tiny_bert_config(100, norm);
    config.ffn_hidden_size = 48;
    auto model = configured_bert(config);
    const int64_t h = 32, v = 100, t = 16, f = 48, l = 4;
    const int64_t block = 4 * h + 3 * h * h + 3 * h + h * h + h + 2 * h * f + f + h;
    const int64_t head = h * h + h + 2 * h + (std::string(norm) == "pre" ? 2 * h : 0) + v;
    const int64_t distinct = (v + t) * h + 2 * h + l * block + head;  // the tied weight once
    auto* bert = dynamic_cast<bert::BertModel*>(model.get());
    ASSERT_NE(bert, nullptr);
    EXPECT_EQ(bert->num_parameters(), distinct) << norm;
    auto whole = whole_bert(*model, 1);
    int64_t total = 0;
    for (const auto& p : whole->parameters()) total += p.numel();
    EXPECT_EQ(total, distinct) << norm;
    // The layers' costs hold the decoder copy too: what two stages hold between them.
    int64_t costed = 0;
    for (const auto& layer : model->layer_costs()) costed += layer.parameters;
    EXPECT_EQ(costed, distinct + v * h) << norm;
    auto stage = stage_registry().create("bert");
    int64_t split = 0;
    for (const auto& spec : {bert_stage_spec(0, 2, 0, 2), bert_stage_spec(1, 2, 2, 6)}) {
      for (const auto& p : stage->create_sub_model(*model, spec, 1)->parameters()) split += p.numel();
    }
    EXPECT_EQ(split, distinct + v * h) << norm;
    const int64_t non_embedding = distinct - t * h - 2 * h;
    EXPECT_EQ(bert->num_non_embedding_parameters(), non_embedding) << norm;
    EXPECT_DOUBLE_EQ(model->training_flops_per_token(), 6.0 * static_cast<double>(non_embedding) + 12.0 * l * h * t);
  }
}

TEST(BertModel, RecomputedBlocksGiveTheSameGradients) {
  auto model = configured_bert(tiny_bert_config());
  auto stage = stage_registry().create("bert");
  auto grads = [&](double ratio) {
    auto module = stage->create_sub_model(*model, bert_stage_spec(1, 2, 2, 6, ratio), 21);
    EXPECT_EQ(dynamic_cast<bert::BertStageModule&>(*module).recomputed_blocks(), ratio > 0 ? 3 : 0);
    auto generator = at::make_generator<at::CPUGeneratorImpl>(3);
    at::Tensor input = at::randn({2, 16, 32}, generator).requires_grad_(true);
    const Batch batch{random_ids(2, 16, 64, 4), random_ids(2, 16, 64, 5)};
    stage->compute_loss(module->forward(input), batch).backward();
    std::vector<at::Tensor> out{input.grad().clone()};
    for (const auto& p : module->parameters()) out.push_back(p.grad().clone());
    return out;
  };
  const auto plain = grads(0.0), recomputed = grads(1.0);
  ASSERT_EQ(plain.size(), recomputed.size());
  for (size_t i = 0; i < plain.size(); ++i) EXPECT_LE(max_abs_diff(plain[i], recomputed[i]), 1e-6) << "gradient " << i;
}

TEST(BertModel, BadConfigurationNamesTheField) {
  auto model = model_registry().create("bert");
  ModelConfig config = tiny_bert_config();
  config.hidden_size = 30;
  try {
    model->configure(config);
    FAIL() << "hidden_size 30 with 4 heads must be rejected";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.num_heads"), std::string::npos) << e.what();
  }
  EXPECT_THROW(model->configure(tiny_bert_config(-1)), ConfigError);
  EXPECT_THROW(model->configure(tiny_bert_config(64, "sandwich")), ConfigError);
  // The GPT has pre-LN only and says so; BERT's post is not silently ignored there.
  auto gpt = model_registry().create("gpt");
  ModelConfig gpt_config = tiny_bert_config(64, "post");
  try {
    gpt->configure(gpt_config);
    FAIL() << "the GPT must refuse model.norm_position post";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.norm_position"), std::string::npos) << e.what();
  }
  gpt_config.norm_position = "pre";
  EXPECT_NO_THROW(gpt->configure(gpt_config));
}

TEST(BertModel, PartitionKeepsEmbeddingFirstAndHeadLast) {
  ModelConfig config = tiny_bert_config();
  config.num_layers = 8;
  auto model = configured_bert(config);
  ParallelConfig parallel;
  parallel.model_parallel_size = 4;
  for (const char* mode : {"uniform", "parameters"}) {
    parallel.partition = mode;
    const auto specs = model->get_stage_partition(parallel, 4);
    ASSERT_EQ(specs.size(), 4u);
    EXPECT_EQ(specs.front().first_layer, 0);
    EXPECT_EQ(specs.back().last_layer, 10);
    for (size_t s = 1; s < specs.size(); ++s) EXPECT_EQ(specs[s].first_layer, specs[s - 1].last_layer) << mode;
  }
  parallel.partition = "explicit";
  parallel.partition_layers = {3, 2, 2, 1};
  parallel.recompute_ratio = {0.5, 0, 0, 0};
  const auto specs = model->get_stage_partition(parallel, 4);
  EXPECT_EQ(specs[0].last_layer, 4);
  EXPECT_DOUBLE_EQ(specs[0].recompute_ratio, 0.5);
}

}  // namespace
}  // namespace gpipe::test

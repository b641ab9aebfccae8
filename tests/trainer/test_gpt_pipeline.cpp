// The GPT split into stages: chained stages equal the whole model, recomputation gives the same
// gradients, partitioning follows parallel.partition and parallel.recompute_ratio.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <gtest/gtest.h>
#include <torch/csrc/autograd/autograd.h>

#include "gpt/gpt_stage_module.h"
#include "test_gpt_helpers.h"

namespace gpipe::test {
namespace {

Batch random_batch(int64_t batch, int64_t time, int64_t vocab, uint64_t seed) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(seed);
  return {at::randint(vocab, {batch, time}, generator, at::kLong), at::randint(vocab, {batch, time}, generator, at::kLong)};
}

double max_abs_diff(const at::Tensor& a, const at::Tensor& b) { return (a - b).abs().max().item<double>(); }

TEST(GptPipeline, ChainedStagesEqualTheWholeModel) {
  auto model = configured_gpt(tiny_gpt_config());
  auto stage = stage_registry().create("gpt");
  const Batch batch = random_batch(2, 16, 64, 1);
  at::NoGradGuard no_grad;
  const at::Tensor whole = whole_gpt(*model, 99)->forward(batch.input_ids);
  // Layers 0..5: [embedding, block_1], [block_2, block_3], [block_4, head].
  const std::vector<std::pair<int64_t, int64_t>> ranges{{0, 2}, {2, 4}, {4, 6}};
  at::Tensor x = stage->prepare_input(batch);
  for (size_t s = 0; s < ranges.size(); ++s) {
    auto module = stage->create_sub_model(*model, stage_spec(static_cast<int>(s), 3, ranges[s].first, ranges[s].second), 99);
    x = module->forward(x);
  }
  ASSERT_EQ(x.sizes(), whole.sizes());
  EXPECT_LE(max_abs_diff(x, whole), 1e-6);
}

TEST(GptPipeline, UniformPartitionStagesEqualTheWholeModel) {
  auto model = configured_gpt(tiny_gpt_config());
  auto stage = stage_registry().create("gpt");
  ParallelConfig parallel;
  parallel.partition = "uniform";
  parallel.model_parallel_size = 4;
  const auto specs = model->get_stage_partition(parallel, 4);
  ASSERT_EQ(specs.size(), 4u);
  EXPECT_EQ(specs.front().first_layer, 0);
  EXPECT_EQ(specs.back().last_layer, 6);
  const Batch batch = random_batch(2, 16, 64, 2);
  at::NoGradGuard no_grad;
  at::Tensor x = batch.input_ids;
  for (const auto& spec : specs) x = stage->create_sub_model(*model, spec, 5)->forward(x);
  EXPECT_LE(max_abs_diff(x, whole_gpt(*model, 5)->forward(batch.input_ids)), 1e-6);
}

// Loss, parameter gradients and (for a middle stage) input gradients of one stage.
struct Gradients {
  double loss = 0;
  std::vector<at::Tensor> parameters;
  at::Tensor input;
};

Gradients middle_stage_gradients(const ModelInterface& model, double recompute_ratio) {
  auto stage = stage_registry().create("gpt");
  // Blocks 1..4 without embedding and head: the input is a hidden state that needs a gradient.
  auto module = stage->create_sub_model(model, stage_spec(1, 3, 1, 5, recompute_ratio), 21);
  auto generator = at::make_generator<at::CPUGeneratorImpl>(3);
  at::Tensor input = at::randn({2, 16, 32}, generator).requires_grad_(true);
  at::Tensor output = module->forward(input);
  // The recomputed blocks end in the recomputation node, so backward must re-run them.
  EXPECT_EQ(recompute_ratio > 0, output.grad_fn()->name().find("RecomputeTail") != std::string::npos)
      << output.grad_fn()->name();
  at::Tensor upstream = at::randn(output.sizes(), generator);
  output.backward(upstream);
  Gradients g;
  g.loss = (output * upstream).sum().item<double>();
  for (const auto& p : module->parameters()) g.parameters.push_back(p.grad().clone());
  g.input = input.grad().clone();
  return g;
}

TEST(GptPipeline, RecomputedBlocksGiveTheSameGradients) {
  auto model = configured_gpt(tiny_gpt_config());
  const Gradients reference = middle_stage_gradients(*model, 0.0);
  for (double ratio : {0.25, 0.5, 1.0}) {
    const Gradients recomputed = middle_stage_gradients(*model, ratio);
    EXPECT_NEAR(recomputed.loss, reference.loss, 1e-5) << "ratio " << ratio;
    ASSERT_EQ(recomputed.parameters.size(), reference.parameters.size());
    for (size_t i = 0; i < reference.parameters.size(); ++i) {
      EXPECT_LE(max_abs_diff(recomputed.parameters[i], reference.parameters[i]), 1e-6) << "ratio " << ratio << " param " << i;
    }
    EXPECT_LE(max_abs_diff(recomputed.input, reference.input), 1e-6) << "ratio " << ratio;
  }
}

TEST(GptPipeline, RecomputeCountsAndSplitBackwardOnTheLastStage) {
  auto model = configured_gpt(tiny_gpt_config());
  auto stage = stage_registry().create("gpt");
  const Batch batch = random_batch(2, 16, 64, 4);
  // Last stage [block_3, block_4, head] with half its blocks recomputed: block_4, then the head.
  auto plain = stage->create_sub_model(*model, stage_spec(1, 2, 3, 6, 0.0), 8);
  auto recomputed = stage->create_sub_model(*model, stage_spec(1, 2, 3, 6, 0.5), 8);
  ASSERT_EQ(dynamic_cast<gpt::GptStageModule&>(*recomputed).recomputed_blocks(), 1);
  auto generator = at::make_generator<at::CPUGeneratorImpl>(6);
  const at::Tensor hidden = at::randn({2, 16, 32}, generator);
  // ZB-H1 style: input gradient first (keeping the graph), weight gradients second.
  auto split_grads = [&](const std::shared_ptr<StageModule>& module) {
    at::Tensor input = hidden.clone().requires_grad_(true);
    at::Tensor loss = stage->compute_loss(module->forward(input), batch);
    auto input_grad = torch::autograd::grad({loss}, {input}, {}, /*retain_graph=*/true);
    auto weight_grads = torch::autograd::grad({loss}, module->parameters());
    weight_grads.push_back(input_grad[0]);
    return weight_grads;
  };
  const auto a = split_grads(plain), b = split_grads(recomputed);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_LE(max_abs_diff(a[i], b[i]), 1e-6) << "gradient " << i;
}

TEST(GptPipeline, RecomputeWithDropoutIsRejected) {
  ModelConfig config = tiny_gpt_config();
  config.dropout = 0.1;
  auto model = configured_gpt(config);
  EXPECT_THROW(whole_gpt(*model, 1, 0.5), std::invalid_argument);
  EXPECT_NO_THROW(whole_gpt(*model, 1, 0.0));
}

std::vector<int64_t> blocks_per_stage(const std::vector<StageSpec>& specs) {
  std::vector<int64_t> blocks;
  for (const auto& spec : specs) {
    blocks.push_back(spec.last_layer - spec.first_layer - (spec.is_first() ? 1 : 0) - (spec.is_last() ? 1 : 0));
  }
  return blocks;
}

TEST(GptPipeline, ParameterPartitionGivesEmbeddingAndHeadStagesFewerBlocks) {
  ModelConfig config = tiny_gpt_config(4096);  // embedding and head each weigh about 10 blocks
  config.num_layers = 16;
  auto model = configured_gpt(config);
  ParallelConfig parallel;
  parallel.model_parallel_size = 4;
  parallel.partition = "uniform";
  EXPECT_EQ(blocks_per_stage(model->get_stage_partition(parallel, 4)), (std::vector<int64_t>{4, 4, 4, 4}));
  parallel.partition = "parameters";
  const auto blocks = blocks_per_stage(model->get_stage_partition(parallel, 4));
  ASSERT_EQ(blocks.size(), 4u);
  EXPECT_EQ(blocks[0] + blocks[1] + blocks[2] + blocks[3], 16);
  EXPECT_LT(blocks[0], blocks[1]);
  EXPECT_LT(blocks[3], blocks[2]);
}

TEST(GptPipeline, ExplicitPartitionAndRecomputeRatiosPerRank) {
  auto model = configured_gpt(tiny_gpt_config());
  ParallelConfig parallel;
  parallel.model_parallel_size = 2;
  parallel.partition = "explicit";
  parallel.partition_layers = {3, 1};
  parallel.recompute_ratio = {1.0, 0.0};
  const auto specs = model->get_stage_partition(parallel, 2);
  EXPECT_EQ(blocks_per_stage(specs), (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(specs[0].last_layer, specs[1].first_layer);
  EXPECT_DOUBLE_EQ(specs[0].recompute_ratio, 1.0);
  EXPECT_DOUBLE_EQ(specs[1].recompute_ratio, 0.0);
  parallel.recompute_ratio = {0.5, 0.5, 0.5};
  EXPECT_THROW(model->get_stage_partition(parallel, 2), ConfigError);
}

TEST(GptPipeline, TimePartitionNeedsOneTimePerLayer) {
  auto model = configured_gpt(tiny_gpt_config());
  ParallelConfig parallel;
  parallel.partition = "time";
  parallel.model_parallel_size = 2;
  EXPECT_THROW(model->get_stage_partition(parallel, 2, {1.0, 2.0}), std::invalid_argument);
  const auto specs = model->get_stage_partition(parallel, 2, {0.1, 1.0, 1.0, 1.0, 5.0, 0.1});
  EXPECT_EQ(blocks_per_stage(specs), (std::vector<int64_t>{3, 1}));
}

}  // namespace
}  // namespace gpipe::test

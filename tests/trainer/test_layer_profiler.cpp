// parallel.partition=time over the registered GPT on CPU: measure_layer_ms gives one positive
// time per layer, and a trainer built with partition "time" splits all blocks over its stages,
// giving a head-heavy last stage (large vocabulary) no more blocks than a middle stage. No timing
// assertions beyond positivity (timings belong in benchmarks).
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <string>
#include <utility>
#include <vector>

#include "temp_dir.h"
#include "trainer/config/config.h"
#include "trainer/training/layer_profiler.h"
#include "trainer/model/registry.h"
#include "trainer/execution/stage_runtime.h"
#include "trainer/training/trainer.h"

namespace gpipe {
namespace {

// Transformer blocks on a stage: its layers minus the embedding (layer 0) and the head (last).
int64_t blocks_of(const StageSpec& spec, int64_t num_layers) {
  int64_t n = spec.last_layer - spec.first_layer;
  if (spec.first_layer == 0) --n;
  if (spec.last_layer == num_layers + 2) --n;
  return n;
}

TEST(LayerProfilerTest, OnePositiveTimePerLayer) {
  PipelineConfig c;
  c.model.name = "gpt";
  c.model.hidden_size = 32;
  c.model.num_layers = 3;
  c.model.num_heads = 4;
  c.model.sequence_length = 16;
  c.model.vocab_size = 300;
  c.dataset.batch_size = 4;
  c.training.num_microbatches = 2;
  auto model = model_registry().create("gpt");
  auto stage = stage_registry().create("gpt");
  model->configure(c.model);
  LayerProfileOptions options;
  options.timed_runs = 3;
  std::vector<std::pair<int, int>> rounds;  // the progress the trainer logs from
  options.on_round = [&](int done, int total) { rounds.emplace_back(done, total); };
  const std::vector<double> ms = measure_layer_ms(*model, *stage, c, c10::Device(c10::kCPU), options);
  EXPECT_EQ(rounds, (std::vector<std::pair<int, int>>{{1, 5}, {2, 5}, {3, 5}, {4, 5}, {5, 5}}));  // 2 warm-up + 3
  ASSERT_EQ(ms.size(), static_cast<size_t>(c.model.num_layers + 2));
  ASSERT_EQ(ms.size(), model->layer_costs().size());
  for (size_t i = 0; i < ms.size(); ++i) EXPECT_GT(ms[i], 0.0) << "layer " << i;
}

TEST(LayerProfilerTest, TimePartitionBuildsAllBlocksAndSparesTheHeavyHead) {
  PipelineConfig c;
  c.model.name = "gpt";
  c.model.hidden_size = 64;
  c.model.num_layers = 6;
  c.model.num_heads = 4;
  c.model.sequence_length = 32;
  c.model.vocab_size = 16384;  // the head (and its loss) costs many blocks
  c.dataset.name = "code_search_net";
  c.dataset.batch_size = 4;
  c.training.num_microbatches = 2;
  c.training.max_steps = 1;
  c.training.output_dir = testing::fresh_temp_dir("layer_profiler_test");
  c.parallel.model_parallel_size = 3;
  c.parallel.schedule = "1f1b";
  c.parallel.scheduler = "naive";
  c.parallel.device = "cpu";
  c.parallel.partition = "time";
  PipelineComponents parts = create_components(c);
  PipelineTrainer trainer(c, std::move(parts));

  const int64_t layers = c.model.num_layers;
  ASSERT_EQ(trainer.measured_layer_ms().size(), static_cast<size_t>(layers + 2));
  for (double ms : trainer.measured_layer_ms()) EXPECT_GT(ms, 0.0);
  const auto& stages = trainer.stages();
  ASSERT_EQ(stages.size(), 3u);
  std::vector<int64_t> blocks;
  for (const auto& s : stages) blocks.push_back(blocks_of(s->spec(), layers));
  EXPECT_EQ(std::accumulate(blocks.begin(), blocks.end(), int64_t{0}), layers);
  for (int64_t b : blocks) EXPECT_GE(b, 1);
  EXPECT_EQ(stages.front()->spec().first_layer, 0);
  EXPECT_EQ(stages.back()->spec().last_layer, layers + 2);
  EXPECT_LE(blocks.back(), blocks[1]) << "blocks per stage: " << blocks[0] << ", " << blocks[1] << ", " << blocks[2];

  // The pipeline built from the measured split trains.
  const auto batch = create_components(c).dataset->process_batch(0, 0);
  EXPECT_TRUE(std::isfinite(trainer.forward_backward(batch)));
  testing::remove_tree(c.training.output_dir);
}

}  // namespace
}  // namespace gpipe

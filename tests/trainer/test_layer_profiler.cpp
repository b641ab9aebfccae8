// parallel.partition=time over the registered GPT on CPU: measure_layer_ms gives one positive
// time per layer, and a trainer built with partition "time" splits all blocks over its stages,
// giving a head-heavy last stage (large vocabulary) no more blocks than a middle stage. No timing
// assertions beyond positivity (timings belong in benchmarks). concurrent_wall_ms, --plan's measure
// of ranks sharing a device: kept threads, a warm-up round, backward and a stream of its own per thread.
#include <c10/core/AutogradState.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#ifdef OURGPIPE_HAVE_TORCH_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

#include <chrono>
#include <cmath>
#include <mutex>
#include <numeric>
#include <set>
#include <stdexcept>
#include <string>
#include <thread>
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

// --plan's measure of ranks sharing a device runs on kept threads, as the async executor's rank
// threads are: a thread's first-call costs (cuDNN's attention graphs on a GPU) fall in one untimed
// warm-up round, and each thread runs backward on itself, as the executors do.
TEST(ConcurrentWallMsTest, KeepsItsThreadsForEveryRoundAfterAWarmUp) {
  constexpr int k = 3, rounds = 4;
  std::mutex mu;
  std::vector<int> most_calls_on_one_thread(k, 0);
  int calls = 0;
  bool backward_on_calling_thread = true;
  const double ms = concurrent_wall_ms(k, rounds, c10::Device(c10::kCPU), [&](int i) {
    static thread_local int calls_on_this_thread = 0;  // 1 on a thread made for this round
    ++calls_on_this_thread;
    if (i == 0) std::this_thread::sleep_for(std::chrono::milliseconds(3));
    std::lock_guard<std::mutex> lock(mu);
    ++calls;
    most_calls_on_one_thread[static_cast<size_t>(i)] = std::max(most_calls_on_one_thread[static_cast<size_t>(i)], calls_on_this_thread);
    backward_on_calling_thread &= !c10::AutogradState::get_tls_state().get_multithreading_enabled();
  });
  EXPECT_EQ(calls, k * (rounds + 1)) << "every thread runs the warm-up round and every timed round";
  for (int i = 0; i < k; ++i) EXPECT_EQ(most_calls_on_one_thread[static_cast<size_t>(i)], rounds + 1) << "thread " << i;
  EXPECT_TRUE(backward_on_calling_thread);
  EXPECT_GE(ms, 3.0) << "a round lasts as long as its slowest thread";
}

TEST(ConcurrentWallMsTest, AThreadsErrorComesBackAfterEveryRoundEnded) {
  int rounds_seen_by_thread_0 = 0;
  EXPECT_THROW(concurrent_wall_ms(2, 3, c10::Device(c10::kCPU),
                                  [&](int i) {
                                    if (i == 0) ++rounds_seen_by_thread_0;
                                    if (i == 1) throw std::runtime_error("layer failed");
                                  }),
               std::runtime_error);
  EXPECT_EQ(rounds_seen_by_thread_0, 4) << "the other thread kept meeting the barriers (no deadlock)";
  EXPECT_THROW(concurrent_wall_ms(0, 3, c10::Device(c10::kCPU), [](int) {}), std::invalid_argument);
}

// On a GPU each thread launches on a stream of its own (on the default stream the threads' kernels
// would run one after another, and k ranks would look no better than one).
TEST(ConcurrentWallMsTest, CudaThreadsLaunchOnStreamsOfTheirOwn) {
#ifndef OURGPIPE_HAVE_TORCH_CUDA
  GTEST_SKIP() << "GPU-only: this build has no LibTorch-CUDA (runs in ctest -L gpu on the GPU machine)";
#else
  if (!torch::cuda::is_available()) GTEST_SKIP() << "GPU-only: no CUDA device visible (runs in ctest -L gpu on the GPU machine)";
  const c10::Device cuda(c10::kCUDA, 0);
  std::mutex mu;
  std::set<c10::StreamId> streams;
  bool on_the_default_stream = false;
  (void)concurrent_wall_ms(3, 2, cuda, [&](int) {
    const c10::cuda::CUDAStream current = c10::cuda::getCurrentCUDAStream(0);
    const at::Tensor a = at::ones({256, 256}, at::TensorOptions().device(cuda));
    (void)a.mm(a);
    std::lock_guard<std::mutex> lock(mu);
    streams.insert(current.id());
    on_the_default_stream |= current == c10::cuda::getDefaultCUDAStream(0);
  });
  EXPECT_EQ(streams.size(), 3u);
  EXPECT_FALSE(on_the_default_stream);
#endif
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

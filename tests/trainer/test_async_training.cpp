// parallel.sync_mode: asp through the runner's path (create_components + PipelineTrainer): the
// small GPT trains with per-backward stage updates (weight stashing on and off), both executors
// agree, stage 0 holds the stashed versions 1F1B-async needs, and impossible asp configs are named.
#include <gtest/gtest.h>

#include <ATen/Parallel.h>

#include <string>
#include <utility>

#include <nlohmann/json.hpp>

#include "temp_dir.h"
#include "trainer/config/config.h"
#include "trainer/execution/stage_runtime.h"
#include "trainer/training/trainer.h"

namespace gpipe {
namespace {

PipelineConfig asp_config(const std::string& tag) {
  PipelineConfig c;
  c.model.name = "gpt";
  c.model.hidden_size = 64;
  c.model.num_layers = 4;
  c.model.num_heads = 4;
  c.model.sequence_length = 32;
  c.dataset.name = "code_search_net";
  c.dataset.batch_size = 8;
  c.training.num_microbatches = 4;
  c.training.learning_rate = 1e-3;
  c.training.warmup_steps = 5;
  c.training.max_steps = 30;
  c.training.epochs = 100;
  c.training.log_interval = 100;
  c.training.exit_after_profile = false;
  c.training.output_dir = testing::fresh_temp_dir("asp_" + tag);
  c.parallel.model_parallel_size = 4;
  c.parallel.schedule = "1f1b";
  c.parallel.sync_mode = "asp";
  c.parallel.device = "cpu";
  return c;
}

std::pair<double, double> train(PipelineConfig c) {
  PipelineComponents parts = create_components(c);
  PipelineTrainer trainer(c, std::move(parts));
  const nlohmann::json summary = trainer.train();
  testing::remove_tree(c.training.output_dir);
  return {summary.at("first_loss").get<double>(), summary.at("final_loss").get<double>()};
}

TEST(AsyncTraining, AspTrainsAndBothExecutorsAgree) {
  at::set_num_threads(1);
  PipelineConfig c = asp_config("threaded");
  c.parallel.scheduler = "async_threaded";
  const auto threaded = train(c);
  EXPECT_LT(threaded.second, threaded.first - 0.5) << "asp loss " << threaded.first << " -> " << threaded.second;
  PipelineConfig n = asp_config("naive");
  n.parallel.scheduler = "naive";
  const auto naive = train(n);
  // The update order is the schedule's whatever runs it (float sums may associate differently).
  EXPECT_NEAR(naive.first, threaded.first, 1e-5);
  EXPECT_NEAR(naive.second, threaded.second, 1e-4 * threaded.second);
}

TEST(AsyncTraining, StashingChangesTheTrajectoryAndBspDiffersFromAsp) {
  at::set_num_threads(1);
  PipelineConfig c = asp_config("stash");
  c.training.max_steps = 3;
  const auto stashed = train(c);
  PipelineConfig u = asp_config("nostash");
  u.training.max_steps = 3;
  u.parallel.weight_stashing = false;
  const auto unstashed = train(u);
  PipelineConfig b = asp_config("bsp");
  b.training.max_steps = 3;
  b.parallel.sync_mode = "bsp";
  const auto bsp = train(b);
  EXPECT_NE(stashed.second, unstashed.second) << "stashing made no difference: the backwards never saw newer weights";
  EXPECT_NE(stashed.second, bsp.second) << "asp updated no more often than bsp";
}

TEST(AsyncTraining, StageZeroHoldsTheVersionsItsMicroBatchesInFlightNeed) {
  at::set_num_threads(1);
  PipelineConfig c = asp_config("held");
  c.training.num_microbatches = 8;  // past 1F1B's warm-up: the steady state's versions
  PipelineComponents parts = create_components(c);
  const Batch batch = parts.dataset->process_batch(0, 0);
  PipelineTrainer trainer(c, std::move(parts));
  ASSERT_EQ(trainer.schedule().sync_mode, SyncMode::kAsp);
  trainer.forward_backward(batch);
  const WeightStash* stash = trainer.stages().at(0)->weight_stash();
  ASSERT_NE(stash, nullptr);
  EXPECT_EQ(stash->version(), 8) << "one update per micro-batch";
  EXPECT_EQ(stash->most_held(), 3u) << "1F1B-async on 4 ranks: stage 0 keeps 3 versions for its 4 in flight";
  EXPECT_EQ(static_cast<int>(stash->most_held()), stashed_versions(trainer.schedule())[0]) << "as the schedule says";
  EXPECT_EQ(stash->held(), 0u);
  testing::remove_tree(c.training.output_dir);
}

TEST(AsyncTraining, ImpossibleAspConfigsAreNamed) {
  auto expect_error = [](PipelineConfig c, const std::string& needle) {
    try {
      PipelineComponents parts = create_components(c);
      PipelineTrainer trainer(c, std::move(parts));
      FAIL() << "accepted: " << needle;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
    testing::remove_tree(c.training.output_dir);
  };
  PipelineConfig zb = asp_config("zb");
  zb.parallel.schedule = "zb_h1";
  expect_error(zb, "use parallel.schedule: 1f1b");
  PipelineConfig pairs = asp_config("pairs");
  pairs.parallel.overlap_f_b = "true";
  expect_error(pairs, "parallel.overlap_f_b: false");
}

}  // namespace
}  // namespace gpipe

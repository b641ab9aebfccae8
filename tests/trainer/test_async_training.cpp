// parallel.sync_mode: asp through the runner's path (create_components + PipelineTrainer): the
// small GPT trains with per-backward stage updates (weight stashing on and off), both executors
// agree, stage 0 holds the stashed versions 1F1B-async needs, asp windows run several steps
// without draining (and still log, checkpoint and resume per step), and impossible asp configs
// are named.
#include <gtest/gtest.h>

#include <ATen/Parallel.h>

#include <fstream>
#include <string>
#include <vector>
#include <utility>

#include <nlohmann/json.hpp>

#include "temp_dir.h"
#include "trainer/config/config.h"
#include "trainer/execution/stage_runtime.h"
#include "trainer/schedule/schedule_csv.h"
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

TEST(AsyncTraining, AWindowRunsTheNextStepBeforeThisOneDrains) {
  // Two steps as one 1F1B-async pipeline (an asp window) against the same two steps drained in
  // between. Step 0's micro-batches see the same weight versions either way (the schedules agree
  // until step 0's cool-down), so its loss is identical; step 1's first forwards run before step
  // 0's last backwards updated the weights in the window, so its loss differs. A window that
  // drained would give step 1's loss too.
  at::set_num_threads(1);
  auto losses = [](bool window) {
    PipelineConfig c = asp_config(window ? "window" : "drained");
    c.parallel.asp_window_steps = window ? 0 : 1;
    PipelineComponents parts = create_components(c);
    const Batch b0 = parts.dataset->process_batch(0, 0), b1 = parts.dataset->process_batch(0, 1);
    PipelineTrainer trainer(c, std::move(parts));
    std::vector<double> out;
    if (window) {
      out = trainer.forward_backward_steps({b0, b1}, 0);
    } else {
      out.push_back(trainer.forward_backward_steps({b0}, 0).front());
      out.push_back(trainer.forward_backward_steps({b1}, 1).front());
    }
    const WeightStash* stash = trainer.stages().at(0)->weight_stash();
    EXPECT_EQ(stash->version(), 8) << "one update per micro-batch either way";
    EXPECT_EQ(stash->held(), 0u);
    testing::remove_tree(c.training.output_dir);
    return out;
  };
  const auto drained = losses(false);
  const auto window = losses(true);
  ASSERT_EQ(window.size(), 2u);
  EXPECT_EQ(window[0], drained[0]);
  EXPECT_NE(window[1], drained[1]) << "the window drained between its steps";
  EXPECT_NEAR(window[1], drained[1], 0.05) << "the same data, one update apart";
}

TEST(AsyncTraining, WindowedRunLogsEveryStepCheckpointsAndResumes) {
  // asp_window_steps 0: windows end at checkpoints (every 3 steps here): steps 0-2 and 3-5. Every
  // step still gets its metrics line; resuming from step 3 gives the same steps 3-5.
  at::set_num_threads(1);
  PipelineConfig c = asp_config("windows");
  c.parallel.asp_window_steps = 0;
  c.training.max_steps = 6;
  c.training.checkpoint_interval = 3;
  c.training.keep_checkpoints = 0;
  c.training.log_interval = 1;
  c.training.checkpoint_dir = c.training.output_dir + "/ckpt";
  auto read_losses = [](const std::string& dir) {
    std::vector<std::pair<int64_t, double>> out;
    std::ifstream in(dir + "/metrics.jsonl");
    for (std::string line; std::getline(in, line);) {
      if (line.empty()) continue;
      const auto j = nlohmann::json::parse(line);
      out.emplace_back(j.at("step").get<int64_t>(), j.at("loss").get<double>());
    }
    return out;
  };
  {
    PipelineConfig run = c;
    PipelineComponents parts = create_components(run);
    PipelineTrainer trainer(run, std::move(parts));
    trainer.train();
  }
  const auto full = read_losses(c.training.output_dir);
  ASSERT_EQ(full.size(), 6u);
  for (int64_t k = 0; k < 6; ++k) EXPECT_EQ(full[static_cast<size_t>(k)].first, k);
  EXPECT_NE(full[0].second, full[1].second) << "each step's own loss, not the window's";
  PipelineConfig again = c;
  again.training.output_dir = c.training.output_dir + "/resumed";
  {
    PipelineComponents parts = create_components(again);
    PipelineTrainer trainer(again, std::move(parts));
    trainer.resume_from(c.training.checkpoint_dir + "/step_00000003");
    trainer.train();
  }
  const auto resumed = read_losses(again.training.output_dir);
  ASSERT_EQ(resumed.size(), 3u);
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(resumed[k].first, full[k + 3].first);
    EXPECT_NEAR(resumed[k].second, full[k + 3].second, 1e-6);
  }
  // Another checkpoint interval ends the windows elsewhere, so it trains otherwise: refused,
  // naming the field (it used to resume and train another trajectory without a word).
  PipelineConfig other = again;
  other.training.output_dir = c.training.output_dir + "/other_interval";
  other.training.checkpoint_interval = 2;
  try {
    PipelineTrainer trainer(other, create_components(other));
    trainer.resume_from(c.training.checkpoint_dir + "/step_00000003");
    trainer.train();
    ADD_FAILURE() << "resumed an asp window run with another checkpoint interval";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("training.checkpoint_interval"), std::string::npos) << e.what();
  }
  testing::remove_tree(c.training.output_dir);
}

// A schedule file says only the order: with sync_mode asp it gets the weight versions a
// generated schedule gets (it used to stay bsp, silently), and trains as the generated one does.
TEST(AsyncTraining, AScheduleFileRunsAsAspLikeTheGeneratedSchedule) {
  PipelineConfig generated = asp_config("file_gen");
  TrainingConfig training = generated.training;
  const Schedule reference = build_schedule(generated.parallel, training);
  ASSERT_EQ(reference.sync_mode, SyncMode::kAsp);
  testing::TempDir folder;
  const std::string path = folder.path() + "/1f1b.csv";
  {
    std::ofstream out(path);
    out << schedule_to_csv(build_schedule(asp_config("file_bsp").parallel, training), ScheduleCsvFormat::kComputeOnly);
  }
  PipelineConfig from_file = asp_config("file_run");
  from_file.parallel.schedule_file = path;
  const Schedule read = build_schedule(from_file.parallel, training);
  EXPECT_EQ(read.sync_mode, SyncMode::kAsp) << "the file's schedule stayed bsp";
  for (const auto& rank : read.per_rank) {
    for (const Action& a : rank) {
      if (a.type == ActionType::kForward || a.type == ActionType::kBackward) {
        EXPECT_GE(a.weight_version, 0) << "an F or B without its weight version";
      }
    }
  }
  generated.training.max_steps = from_file.training.max_steps = 3;
  EXPECT_EQ(train(generated), train(from_file));
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

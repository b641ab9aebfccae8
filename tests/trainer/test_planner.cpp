// The planner (trainer/planner) and the simulator features it needs (transfers, ranks sharing a
// device, memory over time), on hand-made device profiles: no LibTorch, no measurement.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <numeric>

#include "trainer/config/config.h"
#include "trainer/planner/planner.h"
#include "trainer/schedule/schedule.h"

namespace gpipe {
namespace {

// simulate_step with transfers: GPipe on 2 ranks, 1 micro-batch is one chain
// F0 -> send -> F1 -> B1 -> send -> B0.
TEST(SimulateStepTransfers, ChargeOnlyBetweenRanks) {
  const Schedule s = make_schedule(ScheduleKind::kGPipe, 2, 1);
  StageCosts c{2, 1, 1, 0.5, 0.25};
  const SimulatedStep step = simulate_step(s, {c});
  EXPECT_DOUBLE_EQ(step.makespan, 2 + 0.5 + 2 + 2 + 0.25 + 2);
  // Without transfer costs the same chain is shorter by exactly them.
  EXPECT_DOUBLE_EQ(simulate_step(s, {StageCosts{2, 1, 1}}).makespan, step.makespan - 0.75);
  // The timeline lists every compute action with its start and end.
  ASSERT_EQ(step.timeline.size(), 2u);
  EXPECT_EQ(step.timeline[0].size(), 2u);
  EXPECT_DOUBLE_EQ(step.timeline[1].front().start, 2.5);
}

// A receive only posts, as in the executors (Transport::recv_waits_on_host): the compute that
// needs the tensor waits for it. So a receive posted early holds nothing, and every lowered
// schedule takes its compute-only time, torch's early-receive lowering included (receives placed
// as soon as the sender produced the tensor used to hold their rank: zbv p=4 m=8 took 67 units
// instead of 51, a 28% bubble instead of 6%).
TEST(SimulateStepReceives, AReceiveOnlyPostsAndTheComputeWaits) {
  Schedule early = make_schedule(ScheduleKind::kGPipe, 2, 1);
  // rank 0: RB(0,0) F(0,0) SF(0,0) B(0,0); rank 1: RF(1,0) F(1,0) B(1,0) SB(1,0)
  early.per_rank[0] = {{ActionType::kRecvBackward, 0, 0}, {ActionType::kForward, 0, 0},
                       {ActionType::kSendForward, 0, 0}, {ActionType::kBackward, 0, 0}};
  early.per_rank[1] = {{ActionType::kRecvForward, 1, 0}, {ActionType::kForward, 1, 0},
                       {ActionType::kBackward, 1, 0}, {ActionType::kSendBackward, 1, 0}};
  EXPECT_DOUBLE_EQ(simulate_step(early, {StageCosts{1, 1, 1}}).makespan, 1 + 1 + 2 + 2);
  Schedule late = early;
  late.per_rank[0] = {{ActionType::kForward, 0, 0}, {ActionType::kSendForward, 0, 0},
                      {ActionType::kRecvBackward, 0, 0}, {ActionType::kBackward, 0, 0}};
  EXPECT_DOUBLE_EQ(simulate_step(late, {StageCosts{1, 1, 1}}).makespan, 1 + 1 + 2 + 2);
  for (ScheduleKind kind : {ScheduleKind::kOneFOneB, ScheduleKind::kZeroBubbleV, ScheduleKind::kInterleavedZeroBubble,
                            ScheduleKind::kDualPipeV, ScheduleKind::kLoopedBFS, ScheduleKind::kInterleavedOneFOneB}) {
    const int v = kind == ScheduleKind::kOneFOneB ? 1 : 2;
    const int m = kind == ScheduleKind::kInterleavedOneFOneB ? 6 : 8;  // flex rounds: torch's lowering
    const Schedule compute = make_schedule(kind, 4, m, v);
    SCOPED_TRACE(to_string(kind));
    EXPECT_DOUBLE_EQ(simulate_step(with_communication(compute), {StageCosts{1, 1, 1}}).makespan,
                     simulate_step(compute, {StageCosts{1, 1, 1}}).makespan);
  }
}

// Interleaved: two virtual stages on one rank exchange nothing over a link.
TEST(SimulateStepTransfers, SameRankNeighboursPayNothing) {
  const Schedule s = make_schedule(ScheduleKind::kInterleavedOneFOneB, 1, 2, 2);
  EXPECT_DOUBLE_EQ(simulate_step(s, {StageCosts{1, 1, 1, 5, 5}}).makespan,
                   simulate_step(s, {StageCosts{1, 1, 1}}).makespan);
}

// Ranks sharing one device with capacity 1 (a saturated GPU): the step is all the work in turn.
TEST(SimulateStepSharing, CapacityOneSerialisesRanks) {
  const Schedule s = make_schedule(ScheduleKind::kOneFOneB, 4, 8);
  SimulateOptions opts;
  opts.rank_concurrency = {1, 1, 1, 1};
  const SimulatedStep shared = simulate_step(s, {StageCosts{1, 1, 1}}, opts);
  EXPECT_NEAR(shared.makespan, 4 * 8 * 3, 1e-6);
  // Capacity 4 for 4 ranks is the same as a device each.
  opts.rank_concurrency = {1, 2, 3, 4};
  EXPECT_NEAR(simulate_step(s, {StageCosts{1, 1, 1}}, opts).makespan, simulate_step(s, {StageCosts{1, 1, 1}}).makespan,
              1e-6);
  // Capacity 2 lies in between, and two replicas on the same device take longer still.
  opts.rank_concurrency = {1, 2, 2, 2, 2, 2, 2, 2};
  const double two = simulate_step(s, {StageCosts{1, 1, 1}}, opts).makespan;
  EXPECT_GT(two, simulate_step(s, {StageCosts{1, 1, 1}}).makespan);
  EXPECT_LT(two, shared.makespan);
  opts.replicas = 2;
  EXPECT_GT(simulate_step(s, {StageCosts{1, 1, 1}}, opts).makespan, two);
}

// An overlapped pair starts when both halves' inputs are there and takes the longer half plus
// the serial share of the shorter: the step grows with that share, and both halves of a pair
// share one start.
TEST(SimulateStepPairs, SerialShareScalesThePair) {
  const Schedule paired = with_overlap(make_schedule(ScheduleKind::kOneFOneB, 2, 8), OverlapMode::kOn);
  ASSERT_GT(count_overlapped_pairs(paired), 0);
  std::vector<double> makespans;
  for (double share : {0.0, 0.5, 0.99}) {
    SimulateOptions opts;
    opts.pair_serial_share = share;
    const SimulatedStep step = simulate_step(paired, {StageCosts{1, 1, 1}}, opts);
    makespans.push_back(step.makespan);
    for (const auto& rank : step.timeline)
      for (size_t i = 0; i + 1 < rank.size(); ++i)
        if (rank[i].action.overlaps_next) {
          EXPECT_DOUBLE_EQ(rank[i].start, rank[i + 1].start);
          EXPECT_DOUBLE_EQ(rank[i + 1].end - rank[i + 1].start, 2 + share * 1);  // B (2) with F (1)
        }
  }
  EXPECT_LT(makespans[0], makespans[1]);
  EXPECT_LT(makespans[1], makespans[2]);
  SimulateOptions bad;
  bad.pair_serial_share = 2;
  EXPECT_THROW(simulate_step(paired, {StageCosts{1, 1, 1}}, bad), std::invalid_argument);
}

// A profile of `blocks` identical blocks (plus a cheap embedding and head), measured at
// micro-batch sizes 1 and 8: time = fixed + per-sample, memory per sample.
DeviceProfile uniform_profile(int blocks, double fixed_ms = 1.0, double per_sample_ms = 1.0) {
  DeviceProfile p;
  p.device = "test-gpu";
  p.microbatch_sizes = {1, 8};
  for (int l = 0; l < blocks + 2; ++l) {
    p.layer_names.push_back(l == 0 ? "embedding" : l == blocks + 1 ? "head" : "block");
    p.layer_parameters.push_back(1000000);
  }
  for (int64_t size : p.microbatch_sizes) {
    std::vector<LayerMeasurement> layers;
    for (int l = 0; l < blocks + 2; ++l) {
      const double t = fixed_ms + per_sample_ms * static_cast<double>(size);
      const double mib = 1024.0 * 1024.0 * static_cast<double>(size);
      layers.push_back(LayerMeasurement{t, t, t, 10 * mib, 2 * mib, 1 * mib, 1 * mib});
    }
    p.layers.push_back(layers);
  }
  p.optimizer_ms_per_parameter = 1e-7;
  p.memory_per_device_bytes = 64.0 * 1024 * 1024 * 1024;
  p.devices = 8;
  return p;
}

PipelineConfig base_config(int ranks, int64_t blocks, int64_t batch) {
  PipelineConfig c;
  c.model.num_layers = blocks;
  c.model.vocab_size = 256;
  c.dataset.batch_size = batch;
  c.parallel.model_parallel_size = ranks;
  c.training.num_microbatches = 1;
  return c;
}

// A 1F1B candidate with the given blocks per stage (one stage per rank), no recompute.
PlanCandidate one_f_one_b(std::vector<int64_t> blocks, int microbatches, int data_parallel = 1) {
  PlanCandidate c;
  c.schedule = "1f1b";
  c.pipeline_ranks = static_cast<int>(blocks.size());
  c.microbatches = microbatches;
  c.data_parallel = data_parallel;
  c.recompute_ratio.assign(blocks.size(), 0.0);
  c.blocks_per_stage = std::move(blocks);
  return c;
}

TEST(DeviceProfileTest, InterpolatesBetweenMeasuredSizes) {
  const DeviceProfile p = uniform_profile(4, 1.0, 1.0);
  EXPECT_DOUBLE_EQ(p.layer_at(1, 4).forward_ms, 5.0);
  EXPECT_DOUBLE_EQ(p.layer_at(1, 1).activation_bytes, 10.0 * 1024 * 1024);
  EXPECT_DOUBLE_EQ(p.layer_at(1, 2).activation_bytes, 20.0 * 1024 * 1024);
}

TEST(EnumerateCandidates, EveryCandidateIsARunnableConfig) {
  const PipelineConfig config = base_config(4, 8, 8);
  const DeviceProfile profile = uniform_profile(8);
  std::vector<std::string> notes;
  const auto candidates = enumerate_candidates(config, profile, PlanOptions{}, &notes);
  ASSERT_FALSE(candidates.empty());
  std::set<std::string> schedules;
  for (const PlanCandidate& c : candidates) {
    schedules.insert(c.schedule);
    EXPECT_EQ(config.dataset.batch_size % c.microbatches, 0) << c.label();
    EXPECT_EQ(c.pipeline_ranks * c.data_parallel, 4) << c.label();
    EXPECT_EQ(static_cast<int>(c.blocks_per_stage.size()), c.pipeline_ranks * c.virtual_stages) << c.label();
    EXPECT_EQ(std::accumulate(c.blocks_per_stage.begin(), c.blocks_per_stage.end(), int64_t{0}), 8) << c.label();
    const PipelineConfig run = plan_config(config, c);
    EXPECT_NO_THROW(run.validate()) << c.label();
    EXPECT_NO_THROW(PipelineConfig::from_yaml_string(run.to_yaml())) << c.label();
  }
  // Every family appears (dualpipev needs m >= 2p: it does on fewer ranks).
  EXPECT_EQ(schedules.size(), 8u);
  // What cannot run is named, not dropped silently.
  EXPECT_THAT(notes, testing::Contains(testing::HasSubstr("dualpipev")));
}

TEST(EnumerateCandidates, NothingLegalIsAConfigErrorNamingTheConstraint) {
  PipelineConfig config = base_config(4, 2, 3);
  PlanOptions options;
  options.world_size = 9;  // 9 ranks: no replica count gives <= 2 pipeline ranks and divides batch 3
  try {
    enumerate_candidates(config, uniform_profile(2), options);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), testing::HasSubstr("world of 9 ranks"));
    EXPECT_THAT(e.what(), testing::HasSubstr("--world-size"));
  }
}

// More micro-batches shrink the bubble; with a fixed cost per action the best count is finite,
// and the zero-bubble schedules beat 1F1B at the same shape.
TEST(MakePlan, RanksByPredictedStepTime) {
  const PipelineConfig config = base_config(4, 8, 16);
  PlanOptions options;
  options.schedules = {"1f1b", "zb_h1", "gpipe"};
  options.allow_overlap = false;
  const Plan plan = make_plan(config, uniform_profile(8, 4.0, 1.0), options);
  ASSERT_GE(plan.ranked.size(), 3u);
  for (size_t i = 1; i < plan.ranked.size(); ++i)
    EXPECT_LE(plan.ranked[i - 1].prediction.step_ms, plan.ranked[i].prediction.step_ms);
  const auto find = [&](const std::string& schedule, int ranks, int m) {
    for (const auto& pc : plan.ranked)
      if (pc.candidate.schedule == schedule && pc.candidate.pipeline_ranks == ranks && pc.candidate.microbatches == m)
        return pc.prediction.step_ms;
    ADD_FAILURE() << "no " << schedule << " p" << ranks << " m" << m;
    return 0.0;
  };
  EXPECT_LT(find("zb_h1", 4, 8), find("1f1b", 4, 8));
  EXPECT_LT(find("1f1b", 4, 8), find("1f1b", 4, 1));
  // The table names the pick and says why the others lost.
  const std::string table = render_plan_table(plan, uniform_profile(8), 5);
  EXPECT_THAT(table, testing::HasSubstr(plan.ranked.front().candidate.label()));
  EXPECT_THAT(table, testing::HasSubstr("Why the others lost"));
  // The YAML runs as written.
  const std::string yaml = plan_yaml(config, plan.ranked.front(), uniform_profile(8));
  const PipelineConfig back = PipelineConfig::from_yaml_string(yaml);
  EXPECT_EQ(back.parallel.schedule, plan.ranked.front().candidate.schedule);
  EXPECT_EQ(back.training.num_microbatches, plan.ranked.front().candidate.microbatches);
  EXPECT_NO_THROW(back.validate());
  // The header's command launches what the pick needs: a process per replica.
  PlannedCandidate replicated = plan.ranked.front();
  replicated.candidate.data_parallel = 2;
  EXPECT_THAT(plan_yaml(config, replicated, uniform_profile(8)),
              testing::HasSubstr("# Train with it: gpipe_runner --config <this file> --nproc-per-node 2 "));
  PlanCandidate single = plan.ranked.front().candidate;
  single.data_parallel = 1;
  EXPECT_EQ(plan_train_command(single, "p.yaml"), "gpipe_runner --config p.yaml");
}

// Replicated stages (data_parallel 2): the gradient all-reduce copies a stage's gradients into
// flat buckets from its last backward to the step's end (GradientReducer::start), 4 more bytes per
// parameter then; the planner counted the gradients once.
TEST(PredictCandidate, ReplicatedStagesHoldTheirGradientBuckets) {
  const PipelineConfig config = base_config(4, 4, 8);
  DeviceProfile profile = uniform_profile(4);
  for (auto& at_size : profile.layers) {
    for (LayerMeasurement& l : at_size) l.activation_bytes = l.weight_grad_bytes = l.output_bytes = l.workspace_bytes = 0;
  }
  // Rank 1: one block of 1M parameters, 12 bytes of weights and AdamW state and 4 of gradients each.
  const PlannedCandidate single = predict_candidate(one_f_one_b({1, 1, 1, 1}, 8, 1), config, profile);
  const PlannedCandidate replicated = predict_candidate(one_f_one_b({1, 1, 1, 1}, 8, 2), config, profile);
  EXPECT_NEAR(single.prediction.peak_bytes_per_rank.at(1), 16e6, 1.0);
  EXPECT_NEAR(replicated.prediction.peak_bytes_per_rank.at(1), 20e6, 1.0);
}

// The default GPU budget was the card's total: the CUDA context, other processes (a best-effort
// job sharing the GPU) and the allocator's slack were counted as the run's.
TEST(PredictCandidate, TheDefaultGpuBudgetIsWhatThisProcessCanHave) {
  const int64_t gib = int64_t{1} << 30;
  // 80 GiB card, 19.5 GiB held by another process and 0.5 by CUDA contexts, 1 GiB in our cache.
  EXPECT_DOUBLE_EQ(usable_device_bytes(80 * gib, 59 * gib, 1 * gib), 0.95 * 60 * gib);
  EXPECT_DOUBLE_EQ(usable_device_bytes(80 * gib, 80 * gib, 1 * gib), 0.95 * 80 * gib);  // never past the total
}

// Memory over time: 1F1B holds min(p - r, m) activations on rank r; the prediction is static
// state + those activations + the workspace, each device also counting its base.
TEST(PredictCandidate, PeakMemoryFollowsTheSchedule) {
  const PipelineConfig config = base_config(4, 4, 8);
  DeviceProfile profile = uniform_profile(4);
  profile.base_bytes = 100;
  PlanCandidate c = one_f_one_b({1, 1, 1, 1}, 8);
  const PlannedCandidate p = predict_candidate(c, config, profile);
  ASSERT_EQ(p.prediction.peak_bytes_per_rank.size(), 4u);
  const double mib = 1024.0 * 1024.0;
  // Rank 1 holds one block (1M parameters x 16 bytes: weights, AdamW state, and by its activation
  // peak its gradients) and 3 micro-batches of 10 MiB at size 1.
  EXPECT_NEAR(p.prediction.peak_bytes_per_rank[1], 16e6 + 3 * 10 * mib + 1 * mib, 1.0);
  EXPECT_GT(p.prediction.peak_bytes_per_rank[0], p.prediction.peak_bytes_per_rank[3]);
  EXPECT_NEAR(p.prediction.peak_bytes_per_device[1], 100 + p.prediction.peak_bytes_per_rank[1], 1.0);
  // GPipe holds all 8 on every rank (rank 3: a block and the head, 20 MiB per micro-batch).
  c.schedule = "gpipe";
  const PlannedCandidate g = predict_candidate(c, config, profile);
  EXPECT_NEAR(g.prediction.peak_bytes_per_rank[3], 2 * 16e6 + 8 * 2 * 10 * mib + 1 * mib, 1.0);
}

// An overlapped pair holds both halves' activations at once (peak_activations counts them so):
// its forward allocates from its start, its backward frees at its end. The walk used to apply the
// pair's free first (same span, frees first) and found a peak one micro-batch too low.
TEST(PredictCandidate, AnOverlappedPairHoldsBothHalvesActivations) {
  const PipelineConfig config = base_config(2, 2, 4);
  DeviceProfile profile = uniform_profile(2);
  profile.rank_concurrency = {1.0, 2.0};  // ranks share a device: a pair runs as two threads
  PlanCandidate c = one_f_one_b({1, 1}, 4);
  const PlannedCandidate plain = predict_candidate(c, config, profile);
  c.overlap = true;
  const PlannedCandidate paired = predict_candidate(c, config, profile);
  ASSERT_GT(count_overlapped_pairs(with_overlap(make_schedule(ScheduleKind::kOneFOneB, 2, 4), OverlapMode::kOn)), 0);
  EXPECT_GE(paired.prediction.peak_bytes_per_rank[0], plain.prediction.peak_bytes_per_rank[0]);
}

// The planner plans synchronous steps; a config trained asynchronously over a window of steps
// still gets candidates that validate (the window is an asp setting, refused under bsp).
TEST(PlanConfig, AnAspWindowIsDroppedWithAsp) {
  PipelineConfig config = base_config(2, 2, 4);
  config.parallel.sync_mode = "asp";
  config.parallel.asp_window_steps = 2;
  const PipelineConfig planned = plan_config(config, one_f_one_b({1, 1}, 4));
  EXPECT_EQ(planned.parallel.sync_mode, "bsp");
  EXPECT_EQ(planned.parallel.asp_window_steps, 1);
  EXPECT_NO_THROW(planned.validate());
}

// `profile` with a memory budget one byte under what `c` needs without recomputation.
DeviceProfile squeezed_for(const PlanCandidate& c, const PipelineConfig& config, DeviceProfile profile) {
  const PlannedCandidate free_run = predict_candidate(c, config, profile);
  profile.memory_per_device_bytes = *std::max_element(free_run.prediction.peak_bytes_per_device.begin(),
                                                      free_run.prediction.peak_bytes_per_device.end()) - 1;
  return profile;
}

// With dropout the runtime refuses recomputation (config_rules.cpp): a plan that raised it to fit
// memory wrote a YAML that failed to load.
TEST(PredictCandidate, RecomputeIsNeverRaisedWithDropout) {
  PipelineConfig config = base_config(2, 8, 8);
  config.model.dropout = 0.1;
  const PlanCandidate c = one_f_one_b({4, 4}, 8);
  const PlannedCandidate squeezed = predict_candidate(c, config, squeezed_for(c, config, uniform_profile(8)));
  EXPECT_FALSE(squeezed.prediction.fits);
  EXPECT_EQ(squeezed.candidate.recompute_ratio, (std::vector<double>{0.0, 0.0}));
  EXPECT_THAT(squeezed.prediction.why_not, testing::HasSubstr("model.dropout"));
}

// The runtime recomputes a stage's last blocks as one autograd node (models/common/recompute.cpp):
// its backward brings every recomputed block's activations back at once. The planner counted each
// recomputed block's output as held and one block's activations as the backward peak, so
// recomputing every block with one micro-batch in flight looked like it saved 54 of 101 MiB, and
// "recompute raised until it fits" could pick a configuration that runs out of memory.
TEST(PredictCandidate, RecomputedBlocksComeBackTogetherInBackward) {
  const PipelineConfig config = base_config(1, 8, 1);
  const DeviceProfile profile = uniform_profile(8);  // blocks: 10 MiB of activations, 1 MiB output
  PlanCandidate stored = one_f_one_b({8}, 1), recomputed = stored;
  recomputed.recompute_ratio = {1.0};
  const double peak_stored = predict_candidate(stored, config, profile).prediction.peak_bytes_per_device.at(0);
  const double peak_recomputed = predict_candidate(recomputed, config, profile).prediction.peak_bytes_per_device.at(0);
  EXPECT_GE(peak_recomputed, peak_stored - 1024.0 * 1024.0)
      << "with one micro-batch in flight, recomputing every block saves (next to) nothing";
  // With all 8 micro-batches in flight (GPipe) it saves most of their 8 x 80 MiB of block activations.
  PlanCandidate stored8 = one_f_one_b({8}, 8);
  stored8.schedule = "gpipe";
  PlanCandidate recomputed8 = stored8;
  recomputed8.recompute_ratio = {1.0};
  PipelineConfig config8 = config;
  config8.dataset.batch_size = 8;
  const double saved = predict_candidate(stored8, config8, profile).prediction.peak_bytes_per_device.at(0) -
                       predict_candidate(recomputed8, config8, profile).prediction.peak_bytes_per_device.at(0);
  EXPECT_GT(saved, 7 * 70.0 * 1024 * 1024);
}

// A budget too small for stored activations: recompute is raised on the ranks that need it; a
// budget nothing fits is a ConfigError naming the nearest candidate.
TEST(PredictCandidate, RecomputeIsRaisedOnlyWhereMemoryNeedsIt) {
  const PipelineConfig config = base_config(2, 8, 8);
  const PlanCandidate c = one_f_one_b({4, 4}, 8);
  const PlannedCandidate free_run = predict_candidate(c, config, uniform_profile(8));
  DeviceProfile profile = squeezed_for(c, config, uniform_profile(8));
  const PlannedCandidate squeezed = predict_candidate(c, config, profile);
  EXPECT_TRUE(squeezed.prediction.fits);
  EXPECT_GT(squeezed.candidate.recompute_ratio[0], 0.0);  // rank 0 holds 2 micro-batches: it needs it
  EXPECT_EQ(squeezed.candidate.recompute_ratio[1], 0.0);
  EXPECT_GT(squeezed.prediction.step_ms, free_run.prediction.step_ms);  // recompute costs forward time
  EXPECT_THAT(squeezed.candidate.label(), testing::HasSubstr("+rc"));

  profile.memory_per_device_bytes = 1024;  // nothing fits
  PlanOptions options;
  options.schedules = {"1f1b"};
  try {
    make_plan(config, profile, options);
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_THAT(e.what(), testing::HasSubstr("no configuration fits the memory"));
    EXPECT_THAT(e.what(), testing::HasSubstr("nearest"));
    EXPECT_THAT(e.what(), testing::HasSubstr("--memory-budget-gib"));
  }
}

// Every candidate runs as proposed: with parallel.streams=per_rank on the async executor no
// candidate has overlapped pairs (the runner refuses them: a rank's F and B share one stream),
// dualpipev (its pairs are built in) included.
TEST(EnumerateCandidates, PerRankStreamsGetNoPairs) {
  PipelineConfig config = base_config(4, 8, 8);
  config.parallel.scheduler = "async_threaded";
  config.parallel.streams = "per_rank";
  PlanOptions options;
  options.schedules = {"1f1b", "dualpipev"};
  options.allow_overlap = true;
  std::vector<std::string> notes;
  const auto candidates = enumerate_candidates(config, uniform_profile(8), options, &notes);
  ASSERT_FALSE(candidates.empty());
  for (const PlanCandidate& c : candidates) {
    EXPECT_FALSE(c.overlap) << c.label();
    EXPECT_NE(c.schedule, "dualpipev") << c.label();
  }
}

// A ring all-reduce over d replicas sends 2 (d - 1) messages in turn, each paying the link's
// latency once (the formula counted 4 (d - 1) / d: twice too much at 2 replicas, a quarter at 8).
TEST(PredictCandidate, ReplicasPayTheLinkLatencyOncePerRingStep) {
  for (int d : {2, 4}) {
    SCOPED_TRACE(d);
    const PipelineConfig config = base_config(1, 2, 8);
    DeviceProfile profile = uniform_profile(2);
    profile.replica_link_ms_per_byte = 0;
    const PlanCandidate c = one_f_one_b({2}, 4, d);
    profile.replica_link_latency_ms = 0;
    const double without = predict_candidate(c, config, profile).prediction.step_ms;
    profile.replica_link_latency_ms = 1;
    const double with = predict_candidate(c, config, profile).prediction.step_ms;
    EXPECT_NEAR(with - without, 2.0 * (d - 1), 1e-9);  // one stage
  }
}

// On GPUs each replica's process sits on one GPU: replicas beyond the GPUs are not candidates
// (NCCL refuses two processes on one), and a malformed candidate is refused, not mis-simulated.
TEST(EnumerateCandidates, ReplicasNeedAGpuEach) {
  const PipelineConfig config = base_config(4, 8, 8);
  DeviceProfile profile = uniform_profile(8);
  profile.devices = 1;  // one GPU
  std::vector<std::string> notes;
  for (const PlanCandidate& c : enumerate_candidates(config, profile, PlanOptions{}, &notes)) {
    EXPECT_EQ(c.data_parallel, 1) << c.label();
  }
  EXPECT_THAT(notes, testing::Contains(testing::HasSubstr("needs a GPU of its own")));
  PlanCandidate bad = one_f_one_b({4, 3}, 8);  // 7 blocks of 8
  EXPECT_THROW(predict_candidate(bad, config, profile), std::invalid_argument);
  bad = one_f_one_b({4, 4}, 8);
  bad.recompute_ratio = {0};
  EXPECT_THROW(predict_candidate(bad, config, profile), std::invalid_argument);
}

// A stage sends its output forward and a gradient shaped like its input back: with a costly
// link, a stage whose input is small pays little for its backward send.
TEST(PredictCandidate, GradientsAreSizedByTheStageInput) {
  const PipelineConfig config = base_config(2, 2, 2);
  DeviceProfile profile = uniform_profile(2);
  profile.link_ms_per_byte = 1e-6;
  PlanCandidate c = one_f_one_b({1, 1}, 1);
  c.schedule = "gpipe";
  const double base = predict_candidate(c, config, profile).prediction.pipeline_ms;
  // Make the head's output (the logits) huge: it is never sent, so nothing changes.
  for (auto& size : profile.layers) size.back().output_bytes *= 1000;
  EXPECT_DOUBLE_EQ(predict_candidate(c, config, profile).prediction.pipeline_ms, base);
  // Make the last layer of stage 0 (block 1) output huge: both directions pay for it.
  for (auto& size : profile.layers) size[1].output_bytes *= 1000;
  EXPECT_GT(predict_candidate(c, config, profile).prediction.pipeline_ms, base + 1.0);
}

// Replicas pay an all-reduce per stage on the replicas' link; a slower link costs more.
TEST(PredictCandidate, ReplicasPayForTheirAllReduce) {
  const PipelineConfig config = base_config(2, 4, 8);
  DeviceProfile profile = uniform_profile(4);
  const PlanCandidate c = one_f_one_b({2, 2}, 8, 2);
  profile.replica_link_ms_per_byte = 0;
  const double free_link = predict_candidate(c, config, profile).prediction.step_ms;
  profile.replica_link_ms_per_byte = 1e-6;
  const double slow_link = predict_candidate(c, config, profile).prediction.step_ms;
  EXPECT_GT(slow_link, free_link + 1.0);
}

}  // namespace
}  // namespace gpipe

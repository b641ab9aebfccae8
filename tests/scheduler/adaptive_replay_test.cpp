// The adaptive partition end to end on the simulated GPU (jitter 0.05, block spread 0.2, as
// orion-sim runs): started with best effort on almost the whole GPU, it gives SMs back until
// high-priority latency is near its target, and the replay follows the resizes.
#include <gtest/gtest.h>

#include <string>

#include "scheduler/scheduler.h"
#include "scheduler/workload.h"

namespace sched {
namespace {

ReplayOptions sim(const std::string& policy, PolicyParams params = {}) {
  ReplayOptions o;
  o.policy = policy;
  o.policy_params = std::move(params);
  o.gpu.jitter = 0.05;
  o.gpu.block_spread = 0.2;
  o.gpu.seed = 1;
  return o;
}

class AdaptiveReplay : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    workload_ = new Workload(load_workload(std::string(OURGPIPE_WORKLOAD_DIR) + "/orion_inference_training.jsonl"));
    const ReplayResult alone = replay_workload(workload_->only_client("inference"), sim("passthrough"));
    alone_p99_ = latency_percentile_ns(alone, StreamClass::kHighPriority, 99);
    alone_be_ = requests_per_second(replay_workload(workload_->only_client("training"), sim("passthrough")),
                                    StreamClass::kBestEffort);
  }
  static void TearDownTestSuite() { delete workload_; }
  static Workload* workload_;
  static double alone_p99_, alone_be_;
};
Workload* AdaptiveReplay::workload_ = nullptr;
double AdaptiveReplay::alone_p99_ = 0;
double AdaptiveReplay::alone_be_ = 0;

TEST_F(AdaptiveReplay, FromNearlyTheWholeGpuItGivesSmsBackUntilHighPriorityIsNearItsTarget) {
  // Fixed at 120 of 132 SMs, high priority is slowed past 1.10x ...
  const ReplayResult fixed = replay_workload(*workload_, sim("partition", {{"be_sm_frac", "0.95"}}));
  const double fixed_p99 = latency_percentile_ns(fixed, StreamClass::kHighPriority, 99) / alone_p99_;
  EXPECT_EQ(fixed.start_be_sms, 120);
  EXPECT_EQ(fixed.partition_resizes, 0u);
  EXPECT_GT(fixed_p99, 1.10);

  // ... adaptive from the same start shrinks the partition and lands near its target.
  const ReplayResult r = replay_workload(
      *workload_, sim("partition", {{"be_sm_frac", "0.95"}, {"adaptive", "1"}, {"hp_latency_target", "1.05"}}));
  const double p99 = latency_percentile_ns(r, StreamClass::kHighPriority, 99) / alone_p99_;
  const double be = requests_per_second(r, StreamClass::kBestEffort) / alone_be_;
  EXPECT_EQ(r.start_be_sms, 120);
  EXPECT_GT(r.partition_resizes, 0u);
  EXPECT_LT(r.mean_be_sms, 112.0) << "gave SMs back";
  EXPECT_GE(r.mean_be_sms, 8.0);
  EXPECT_EQ(r.final_be_sms % 8, 0);
  EXPECT_LE(p99, 1.06) << "HP p99 / alone";
  EXPECT_LT(p99, fixed_p99);
  EXPECT_GT(be, 0.5) << "best effort keeps running";
}

TEST_F(AdaptiveReplay, AtTheIssuesTargetItMeetsTheGoalFromHalfTheGpu) {
  const ReplayResult r = replay_workload(
      *workload_, sim("partition", {{"be_sm_frac", "0.5"}, {"adaptive", "1"}, {"hp_latency_target", "1.10"}}));
  const double p99 = latency_percentile_ns(r, StreamClass::kHighPriority, 99) / alone_p99_;
  const double be = requests_per_second(r, StreamClass::kBestEffort) / alone_be_;
  EXPECT_EQ(r.start_be_sms, 64);
  EXPECT_GT(r.mean_be_sms, 80.0) << "grew: high priority was unharmed at 64 SMs";
  EXPECT_LE(p99, 1.10);
  EXPECT_GE(be, 0.60);
}

}  // namespace
}  // namespace sched

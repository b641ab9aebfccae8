// The replay plan (what --dry-run prints) on the shipped workloads and on launch shapes that
// cannot run on sm_90.
#include "plan.h"

#include <gtest/gtest.h>

#include <set>

#include "spin_kernels.h"
#include "test_util.h"

namespace replay_gpu {
namespace {

using sched::StreamClass;

TEST(ReplayPlan, InferenceTrainingHasOneHighPriorityAndOneBestEffortStream) {
  const sched::Workload w = sched::load_workload(OURGPIPE_WORKLOAD_DIR "/orion_inference_training.jsonl");
  const Plan plan = make_plan(w, 132);
  ASSERT_EQ(plan.streams.size(), 2u);
  EXPECT_EQ(plan.streams[0].name, "inference");
  EXPECT_EQ(plan.streams[0].cls, StreamClass::kHighPriority);
  EXPECT_EQ(plan.streams[1].name, "training");
  EXPECT_EQ(plan.streams[1].cls, StreamClass::kBestEffort);
  EXPECT_EQ(plan.streams_of(StreamClass::kHighPriority), 1u);
  EXPECT_EQ(plan.streams_of(StreamClass::kBestEffort), 1u);
  EXPECT_EQ(plan.streams[0].kernels, 4800u);  // 300 requests x 16 kernels
  EXPECT_EQ(plan.streams[1].kernels, 480u);   // 12 iterations x 40 kernels
  EXPECT_EQ(plan.clients, (std::vector<std::string>{"inference", "training"}));
  EXPECT_EQ(plan.requests, 312u);
  EXPECT_EQ(plan.closed_loop_requests, 310u);  // all but each client's first
  EXPECT_EQ(plan.events, 0u);
  // One spin-kernel copy per kernel name, all distinct.
  EXPECT_EQ(plan.kernels.size(), 56u);
  std::set<int> slots;
  for (const PlanKernel& k : plan.kernels) slots.insert(k.slot);
  EXPECT_EQ(slots.size(), plan.kernels.size());
  // Expected busy time: the simulator's kernel durations (duration_us) summed.
  double file_us = 0;
  for (const sched::WorkloadOp& op : w.ops) file_us += op.duration_ns / 1e3;
  EXPECT_NEAR(plan.kernel_busy_ns / 1e3, file_us, 1e-6 * file_us);
  EXPECT_EQ(plan.copy_busy_ns, 0);
}

TEST(ReplayPlan, PipelineStageHasCommunicationStreamsCopiesAndEvents) {
  const Plan plan = make_plan(sched::load_workload(OURGPIPE_WORKLOAD_DIR "/pipeline_stage.jsonl"), 132);
  EXPECT_EQ(plan.streams.size(), 4u);
  EXPECT_EQ(plan.streams_of(StreamClass::kHighPriority), 1u);
  EXPECT_EQ(plan.streams_of(StreamClass::kBestEffort), 1u);
  EXPECT_EQ(plan.streams_of(StreamClass::kCommunication), 2u);
  EXPECT_EQ(plan.clients.size(), 3u);
  EXPECT_EQ(plan.events, 16u);  // distinct event names
  size_t copies = 0;
  for (const PlanStream& s : plan.streams) copies += s.copies;
  EXPECT_EQ(copies, 16u);
  EXPECT_GT(plan.max_copy_bytes, 0u);
  EXPECT_NEAR(plan.copy_busy_ns, 76.538e6, 0.01e6);  // 16 server ops at the simulator's 25 GB/s
}

TEST(ReplayPlan, WavesAndBlockTimeFollowTheSimulator) {
  // 72 KiB of shared memory: 3 blocks per SM; 1024 blocks on 132 SMs are 3 waves.
  const sched::Workload w = replay_gpu_test::workload_from(
      R"({"stream":"s","class":"be","name":"gemm","grid":1024,"block":256,"smem":73728,"duration_us":300})" "\n");
  const Plan plan = make_plan(w, 132);
  ASSERT_EQ(plan.kernels.size(), 1u);
  EXPECT_EQ(plan.kernels[0].blocks_per_sm, 3);
  EXPECT_EQ(plan.kernels[0].waves, 3u);
  EXPECT_NEAR(plan.ops[0].block_ns, 100'000, 1e-6);
  EXPECT_EQ(plan.ops[0].launch_smem, 73728u);
}

TEST(ReplayPlan, BlocksPerSmIsEnforcedWithSharedMemory) {
  // 128 threads and no shared memory would fit 16 blocks an SM; the file says 2.
  const Plan plan = make_plan(replay_gpu_test::workload_from(
      R"({"stream":"s","class":"hp","name":"k","grid":10,"block":128,"blocks_per_sm":2,"block_us":5})" "\n"), 132);
  const uint32_t smem = plan.ops[0].launch_smem;
  EXPECT_EQ(kSharedMemPerSm / (smem + kReservedSharedMemPerBlock), 2u) << smem;
  EXPECT_LE(smem, kMaxSharedMemPerBlock);
}

TEST(ReplayPlan, ShapesThatDoNotFitAnSmAreRefusedNamingTheLine) {
  auto error_of = [](const std::string& line) {
    try {
      make_plan(replay_gpu_test::workload_from("# header\n" + line + "\n", "bad.jsonl"), 132);
    } catch (const std::exception& e) {  // PlanError, or the workload reader's for CUDA's own limits
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::string threads = error_of(R"({"stream":"s","class":"hp","name":"k","grid":1,"block":[32,64],"block_us":5})");
  EXPECT_NE(threads.find("bad.jsonl:2: field \"block\": a block holds at most 1024 threads"), std::string::npos) << threads;
  const std::string smem =
      error_of(R"({"stream":"s","class":"hp","name":"k","grid":1,"block":64,"smem":240000,"block_us":5})");
  EXPECT_NE(smem.find("228 KiB"), std::string::npos) << smem;
  EXPECT_NE(smem.find("bad.jsonl:2"), std::string::npos) << smem;
  // 227 KiB is the most one block may ask for: accepted.
  EXPECT_EQ(error_of(R"({"stream":"s","class":"hp","name":"k","grid":1,"block":64,"smem":232448,"block_us":5})"),
            "no error");
  const std::string grid = error_of(R"({"stream":"s","class":"hp","name":"k","grid":[1,70000],"block":64,"block_us":5})");
  EXPECT_NE(grid.find("65535"), std::string::npos) << grid;
}

TEST(ReplayPlan, PrintedPlanNamesStreamsClassesPrioritiesAndTotals) {
  const std::string text =
      format_plan(make_plan(sched::load_workload(OURGPIPE_WORKLOAD_DIR "/orion_inference_training.jsonl"), 132));
  EXPECT_NE(text.find("2 streams (1 high priority, 1 best effort, 0 communication, 0 unmanaged)"), std::string::npos) << text;
  EXPECT_NE(text.find("| inference | high_priority | greatest | inference | 4800 | 4800 |"), std::string::npos) << text;
  EXPECT_NE(text.find("| training | best_effort | least | training | 480 | 480 |"), std::string::npos) << text;
  EXPECT_NE(text.find("56 kernels"), std::string::npos);
  EXPECT_NE(text.find("total expected busy time: 166.560 ms"), std::string::npos) << text;
}

TEST(ReplayPlan, MoreKernelNamesThanCopiesShareSlots) {
  std::string text;
  for (int i = 0; i < kSpinKernelSlots + 3; ++i) {
    text += R"({"stream":"s","class":"hp","name":"k)" + std::to_string(i) + R"(","grid":1,"block":32,"block_us":1})" "\n";
  }
  const Plan plan = make_plan(replay_gpu_test::workload_from(text), 132);
  EXPECT_EQ(plan.kernels.back().slot, 2);
  ASSERT_FALSE(plan.notes.empty());
  EXPECT_NE(plan.notes.back().find("share"), std::string::npos);
}

}  // namespace
}  // namespace replay_gpu

// SimulatedGpu: wave timing, priority dispatch, bandwidth contention, stream/event order,
// determinism.
#include "scheduler/sim_gpu.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <vector>

namespace sched {
namespace {

Op kernel_op(StreamId stream, uint64_t seq, uint32_t blocks, double block_ns, uint32_t per_sm = 1,
             KernelProfile profile = KernelProfile::kComputeBound) {
  Op op;
  op.kind = OpKind::kKernel;
  op.stream = stream;
  op.seq = seq;
  op.kernel.id = 1000 + seq;
  op.kernel.grid.x = blocks;
  op.kernel.block.x = 128;
  op.kernel.sim_block_ns = block_ns;
  op.kernel.sim_blocks_per_sm = per_sm;
  op.kernel.profile_hint = profile;
  return op;
}

Op plain_op(OpKind kind, StreamId stream, uint64_t seq, EventId event = 0, uint64_t bytes = 0) {
  Op op;
  op.kind = kind;
  op.stream = stream;
  op.seq = seq;
  op.event = event;
  op.bytes = bytes;
  return op;
}

std::map<uint64_t, Completion> by_seq(const SimulatedGpu& gpu) {
  std::map<uint64_t, Completion> out;
  for (const Completion& c : gpu.completions()) out[c.seq] = c;
  return out;
}

SimGpuConfig small_gpu(int sms) {
  SimGpuConfig cfg;
  cfg.sm_count = sms;
  return cfg;
}

TEST(SimGpu, KernelAloneTakesWavesTimesBlockTime) {
  for (uint32_t blocks : {1u, 8u, 9u, 16u, 17u, 100u}) {
    SimulatedGpu gpu(small_gpu(4));
    ASSERT_EQ(gpu.submit(kernel_op(1, 1, blocks, 1000, /*per_sm=*/2)), 0);
    int64_t end = gpu.run_until_idle();
    int64_t waves = (blocks + 4 * 2 - 1) / (4 * 2);
    EXPECT_EQ(end, waves * 1000) << blocks << " blocks";
    ASSERT_EQ(gpu.completed_count(), 1u);
    EXPECT_EQ(gpu.completions()[0].start_ns, 0);
    EXPECT_EQ(gpu.completions()[0].end_ns, waves * 1000);
  }
}

// A green context's partition: a stream confined to 2 of 4 SMs takes twice the waves, leaves the
// other SMs to a stream on them, and cannot be given SMs the GPU does not have.
TEST(SimGpu, AStreamConfinedToAPartitionUsesOnlyItsSms) {
  SimulatedGpu alone(small_gpu(4));
  ASSERT_EQ(alone.submit(kernel_op(1, 1, 16, 1000)), 0);
  EXPECT_EQ(alone.run_until_idle(), 4000);  // 16 blocks, 4 SMs x 1: 4 waves
  SimulatedGpu gpu(small_gpu(4));
  gpu.set_stream_sms(1, 0, 2);
  gpu.set_stream_sms(2, 2, 2);
  ASSERT_EQ(gpu.submit(kernel_op(1, 1, 16, 1000)), 0);
  ASSERT_EQ(gpu.submit(kernel_op(2, 2, 4, 1000)), 0);
  gpu.run_until_idle();
  const auto done = by_seq(gpu);
  EXPECT_EQ(done.at(1).end_ns, 8000) << "confined to 2 SMs: 8 waves";
  EXPECT_EQ(done.at(2).start_ns, 0) << "the other partition's SMs are free at once";
  EXPECT_EQ(done.at(2).end_ns, 2000);
  EXPECT_NEAR(gpu.busy_sm_ns(), 2 * 8000.0 + 2 * 2000.0, 1e-6);
  EXPECT_THROW(gpu.set_stream_sms(3, 3, 2), std::invalid_argument);
  gpu.set_stream_sms(1, 0, 0);  // lifted: every SM again
  ASSERT_EQ(gpu.submit(kernel_op(1, 3, 16, 1000)), 0);
  const int64_t before = gpu.now_ns();
  EXPECT_EQ(gpu.run_until_idle() - before, 4000);
}

TEST(SimGpu, BlockSpreadFreesSlotsBeforeTheWaveEnds) {
  SimGpuConfig cfg = small_gpu(64);
  cfg.block_spread = 0.3;
  SimulatedGpu gpu(cfg);
  gpu.set_stream_priority(2, true);
  ASSERT_EQ(gpu.submit(kernel_op(1, 1, 256, 1000, 1)), 0);  // 4 waves of 64 blocks (4 groups each)
  gpu.advance_to(1);
  ASSERT_EQ(gpu.submit(kernel_op(2, 2, 1, 100, 1)), 0);  // HP: one block, waits for a slot
  gpu.run_until_idle();
  auto done = by_seq(gpu);
  // Without spread the HP block would start at exactly 1000 (the wave boundary).
  EXPECT_GE(done[2].start_ns, 700);
  EXPECT_LT(done[2].start_ns, 1000);
  // The kernel still takes about 4 block times (each group within +-30%).
  EXPECT_GE(done[1].end_ns, 4 * 700);
  EXPECT_LE(done[1].end_ns, 4 * 1300 + 100);
}

TEST(SimGpu, BlocksPerSmDerivedFromThreadsAndSharedMemory) {
  SimulatedGpu gpu;  // H100-like defaults
  KernelInfo k;
  k.block.x = 256;
  EXPECT_EQ(gpu.max_active_blocks_per_sm(k), 8);  // 2048 threads / 256
  k.block.x = 32;
  EXPECT_EQ(gpu.max_active_blocks_per_sm(k), 32);  // block limit
  k.block.x = 100;                                 // rounds up to 128 threads (whole warps)
  EXPECT_EQ(gpu.max_active_blocks_per_sm(k), 16);
  k.block.x = 128;
  k.shared_mem_bytes = 100 * 1024;
  EXPECT_EQ(gpu.max_active_blocks_per_sm(k), 2);  // 228 KB / 100 KB
  k.sim_blocks_per_sm = 3;
  EXPECT_EQ(gpu.max_active_blocks_per_sm(k), 3);  // explicit answer wins
  k.sim_blocks_per_sm = 0;
  k.block.x = 2048;
  EXPECT_EQ(gpu.max_active_blocks_per_sm(k), 0);  // cannot launch
  EXPECT_EQ(gpu.sm_count(), 132);
}

TEST(SimGpu, LaunchThatCannotFitIsRejected) {
  SimulatedGpu gpu(small_gpu(2));
  Op op = kernel_op(1, 1, 4, 100, 0);
  op.kernel.block.x = 4096;
  EXPECT_EQ(gpu.submit(op), kSimErrorInvalidValue);
  EXPECT_TRUE(gpu.idle());
}

TEST(SimGpu, HighPriorityBlocksDispatchBeforeWaitingBestEffortBlocks) {
  SimulatedGpu gpu(small_gpu(2));
  gpu.set_stream_priority(2, true);
  // Stream 1 fills both SMs for 1000 ns; then a BE kernel (stream 3) and an HP kernel (stream 2)
  // wait for the same freed slots.
  ASSERT_EQ(gpu.submit(kernel_op(1, 1, 2, 1000)), 0);
  gpu.advance_to(10);  // occupies both SMs
  ASSERT_EQ(gpu.submit(kernel_op(3, 2, 2, 1000)), 0);  // BE, waits (submitted first)
  ASSERT_EQ(gpu.submit(kernel_op(2, 3, 2, 1000)), 0);  // HP, waits
  gpu.run_until_idle();
  auto done = by_seq(gpu);
  EXPECT_EQ(done[3].start_ns, 1000);  // HP takes the freed slots first
  EXPECT_EQ(done[3].end_ns, 2000);
  EXPECT_EQ(done[2].start_ns, 2000);  // BE goes after, although it arrived earlier
  EXPECT_EQ(done[2].end_ns, 3000);
}

TEST(SimGpu, WithoutPriorityOlderKernelDispatchesFirst) {
  SimulatedGpu gpu(small_gpu(2));
  ASSERT_EQ(gpu.submit(kernel_op(1, 1, 2, 1000)), 0);
  gpu.advance_to(10);
  ASSERT_EQ(gpu.submit(kernel_op(3, 2, 2, 1000)), 0);
  ASSERT_EQ(gpu.submit(kernel_op(2, 3, 2, 1000)), 0);
  gpu.run_until_idle();
  auto done = by_seq(gpu);
  EXPECT_EQ(done[2].start_ns, 1000);
  EXPECT_EQ(done[3].start_ns, 2000);
}

TEST(SimGpu, SubmissionsAtTheSameTimeCompeteByPriority) {
  SimulatedGpu gpu(small_gpu(1));
  gpu.set_stream_priority(2, true);
  ASSERT_EQ(gpu.submit(kernel_op(1, 1, 1, 1000)), 0);  // BE first, same instant
  ASSERT_EQ(gpu.submit(kernel_op(2, 2, 1, 1000)), 0);
  gpu.run_until_idle();
  auto done = by_seq(gpu);
  EXPECT_EQ(done[2].start_ns, 0);
  EXPECT_EQ(done[1].start_ns, 1000);
}

TEST(SimGpu, RunningBlocksAreNotPreempted) {
  SimulatedGpu gpu(small_gpu(1));
  gpu.set_stream_priority(2, true);
  ASSERT_EQ(gpu.submit(kernel_op(1, 1, 1, 1000)), 0);
  gpu.advance_to(1);
  ASSERT_EQ(gpu.submit(kernel_op(2, 2, 1, 1000)), 0);
  gpu.run_until_idle();
  auto done = by_seq(gpu);
  EXPECT_EQ(done[1].end_ns, 1000);
  EXPECT_EQ(done[2].start_ns, 1000);
}

TEST(SimGpu, MemoryBoundKernelsSlowEachOtherWhileOverlapping) {
  // 8 SMs, 1 block per SM: a 4-block memory-bound kernel saturates bandwidth (fraction 0.5).
  SimulatedGpu alone(small_gpu(8));
  ASSERT_EQ(alone.submit(kernel_op(1, 1, 4, 1000, 1, KernelProfile::kMemoryBound)), 0);
  EXPECT_EQ(alone.run_until_idle(), 1000);

  SimulatedGpu both(small_gpu(8));
  ASSERT_EQ(both.submit(kernel_op(1, 1, 4, 1000, 1, KernelProfile::kMemoryBound)), 0);
  ASSERT_EQ(both.submit(kernel_op(2, 2, 4, 1000, 1, KernelProfile::kMemoryBound)), 0);
  both.run_until_idle();
  auto done = by_seq(both);
  EXPECT_EQ(done[1].end_ns, 2000);  // half the bandwidth each
  EXPECT_EQ(done[2].end_ns, 2000);

  // A compute-bound neighbour does not slow a memory-bound kernel.
  SimulatedGpu mixed(small_gpu(8));
  ASSERT_EQ(mixed.submit(kernel_op(1, 1, 4, 1000, 1, KernelProfile::kMemoryBound)), 0);
  ASSERT_EQ(mixed.submit(kernel_op(2, 2, 4, 1000, 1, KernelProfile::kComputeBound)), 0);
  mixed.run_until_idle();
  done = by_seq(mixed);
  EXPECT_EQ(done[1].end_ns, 1000);
  EXPECT_EQ(done[2].end_ns, 1000);
}

TEST(SimGpu, CoResidentComputeBlocksShareIssueCapacity) {
  // Stream 1: smem-limited blocks, 2 per SM, fill the single SM (issue share 1). Stream 2's
  // thread-limited block still fits next to them (share 1/8): both run at 1 / 1.125.
  SimulatedGpu gpu(small_gpu(1));
  Op big = kernel_op(1, 1, 2, 900, 0);
  big.kernel.block.x = 128;
  big.kernel.shared_mem_bytes = 100 * 1024;
  Op small = kernel_op(2, 2, 1, 900, 0);
  small.kernel.block.x = 256;
  ASSERT_EQ(gpu.submit(big), 0);
  ASSERT_EQ(gpu.submit(small), 0);
  gpu.run_until_idle();
  auto done = by_seq(gpu);
  EXPECT_EQ(done[1].start_ns, 0);
  EXPECT_EQ(done[2].start_ns, 0);
  EXPECT_EQ(done[1].end_ns, 1013);  // 900 * 1.125 = 1012.5, rounded up to whole ns
  EXPECT_EQ(done[2].end_ns, 1013);
}

TEST(SimGpu, SlowdownEndsWhenTheOverlapEnds) {
  SimulatedGpu gpu(small_gpu(8));
  ASSERT_EQ(gpu.submit(kernel_op(1, 1, 4, 1000, 1, KernelProfile::kMemoryBound)), 0);
  ASSERT_EQ(gpu.submit(kernel_op(2, 2, 4, 400, 1, KernelProfile::kMemoryBound)), 0);
  gpu.run_until_idle();
  auto done = by_seq(gpu);
  // Both at half speed until the short one finishes at 800 ns (400 ns of work); the long one has
  // 600 ns of work left at full speed: 1400 ns.
  EXPECT_EQ(done[2].end_ns, 800);
  EXPECT_EQ(done[1].end_ns, 1400);
}

TEST(SimGpu, StreamIsFifo) {
  SimulatedGpu gpu(small_gpu(8));
  ASSERT_EQ(gpu.submit(kernel_op(1, 1, 1, 1000)), 0);
  ASSERT_EQ(gpu.submit(kernel_op(1, 2, 1, 500)), 0);  // free SMs, but must wait for seq 1
  ASSERT_EQ(gpu.submit(plain_op(OpKind::kCopy, 1, 3, 0, 25'000)), 0);  // 1000 ns at 25 B/ns
  gpu.run_until_idle();
  auto done = by_seq(gpu);
  EXPECT_EQ(done[2].start_ns, 1000);
  EXPECT_EQ(done[2].end_ns, 1500);
  EXPECT_EQ(done[3].start_ns, 1500);
  EXPECT_EQ(done[3].end_ns, 2500);
  std::vector<uint64_t> order;
  for (const Completion& c : gpu.completions()) order.push_back(c.seq);
  EXPECT_EQ(order, (std::vector<uint64_t>{1, 2, 3}));
}

TEST(SimGpu, WaitEventHoldsStreamUntilTheRecordCompletes) {
  SimulatedGpu gpu(small_gpu(8));
  ASSERT_EQ(gpu.submit(kernel_op(1, 1, 1, 1000)), 0);
  ASSERT_EQ(gpu.submit(plain_op(OpKind::kEventRecord, 1, 2, /*event=*/7)), 0);
  ASSERT_EQ(gpu.submit(plain_op(OpKind::kStreamWaitEvent, 2, 3, 7)), 0);
  ASSERT_EQ(gpu.submit(kernel_op(2, 4, 1, 100)), 0);
  ASSERT_EQ(gpu.submit(kernel_op(3, 5, 1, 100)), 0);  // independent stream runs at once
  gpu.run_until_idle();
  auto done = by_seq(gpu);
  EXPECT_EQ(done[2].end_ns, 1000);
  EXPECT_EQ(done[3].end_ns, 1000);
  EXPECT_EQ(done[4].start_ns, 1000);
  EXPECT_EQ(done[5].start_ns, 0);
}

TEST(SimGpu, WaitEventUsesTheLatestRecordBeforeIt) {
  SimulatedGpu gpu(small_gpu(8));
  ASSERT_EQ(gpu.submit(plain_op(OpKind::kEventRecord, 1, 1, 7)), 0);  // completes at 0
  ASSERT_EQ(gpu.submit(plain_op(OpKind::kStreamWaitEvent, 2, 2, 7)), 0);
  ASSERT_EQ(gpu.submit(kernel_op(2, 3, 1, 100)), 0);
  ASSERT_EQ(gpu.submit(kernel_op(1, 4, 1, 1000)), 0);
  ASSERT_EQ(gpu.submit(plain_op(OpKind::kEventRecord, 1, 5, 7)), 0);  // after the wait: ignored by it
  gpu.run_until_idle();
  auto done = by_seq(gpu);
  EXPECT_EQ(done[3].start_ns, 0);
  EXPECT_EQ(done[3].end_ns, 100);
}

// A later record of the same event on an idle stream completes first; the wait still waits for
// its own record (the latest submitted before it), as CUDA's does.
TEST(SimGpu, WaitEventIsNotMetByALaterRecordThatFinishesFirst) {
  SimulatedGpu gpu(small_gpu(8));
  ASSERT_EQ(gpu.submit(kernel_op(1, 1, 1, 1000)), 0);
  ASSERT_EQ(gpu.submit(plain_op(OpKind::kEventRecord, 1, 2, 7)), 0);   // generation 1, done at 1000
  ASSERT_EQ(gpu.submit(plain_op(OpKind::kStreamWaitEvent, 3, 3, 7)), 0);
  ASSERT_EQ(gpu.submit(kernel_op(3, 4, 1, 100)), 0);
  ASSERT_EQ(gpu.submit(plain_op(OpKind::kEventRecord, 2, 5, 7)), 0);   // generation 2, done at 0
  gpu.run_until_idle();
  auto done = by_seq(gpu);
  EXPECT_EQ(done[5].end_ns, 0);
  EXPECT_EQ(done[4].start_ns, 1000);
}

TEST(SimGpu, WaitOnUnrecordedEventDoesNotBlock) {
  SimulatedGpu gpu(small_gpu(1));
  ASSERT_EQ(gpu.submit(plain_op(OpKind::kStreamWaitEvent, 1, 1, 9)), 0);
  ASSERT_EQ(gpu.submit(kernel_op(1, 2, 1, 100)), 0);
  EXPECT_EQ(gpu.run_until_idle(), 100);
}

TEST(SimGpu, CompletionsReachListenerOnPoll) {
  struct Recorder : CompletionListener {
    std::vector<uint64_t> seqs;
    void on_complete(const Completion& c) override { seqs.push_back(c.seq); }
  } rec;
  SimulatedGpu gpu(small_gpu(2));
  gpu.set_listener(&rec);
  ASSERT_EQ(gpu.submit(kernel_op(1, 1, 1, 100)), 0);
  ASSERT_EQ(gpu.submit(kernel_op(2, 2, 1, 300)), 0);
  EXPECT_EQ(gpu.next_event_ns(), 0);  // a dispatch is pending at the current time
  gpu.advance_to(200);
  EXPECT_TRUE(rec.seqs.empty());  // nothing before poll()
  gpu.poll();
  EXPECT_EQ(rec.seqs, (std::vector<uint64_t>{1}));
  EXPECT_EQ(gpu.next_event_ns(), 300);
  gpu.advance_to(gpu.next_event_ns());
  gpu.poll();
  EXPECT_EQ(rec.seqs, (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(gpu.next_event_ns(), -1);
  EXPECT_THROW(gpu.advance_to(10), std::invalid_argument);
}

TEST(SimGpu, BusySmIntegralCountsOccupiedSms) {
  SimulatedGpu gpu(small_gpu(4));
  ASSERT_EQ(gpu.submit(kernel_op(1, 1, 2, 1000)), 0);  // 2 of 4 SMs for 1000 ns
  gpu.run_until_idle();
  gpu.advance_to(2000);
  EXPECT_DOUBLE_EQ(gpu.busy_sm_ns(), 2000.0);
}

std::vector<Completion> random_run(uint64_t seed) {
  SimGpuConfig cfg = small_gpu(16);
  cfg.seed = seed;
  cfg.jitter = 0.1;
  SimulatedGpu gpu(cfg);
  gpu.set_stream_priority(1, true);
  uint64_t seq = 0;
  for (int i = 0; i < 60; ++i) {
    auto profile = i % 3 == 0 ? KernelProfile::kMemoryBound : KernelProfile::kComputeBound;
    EXPECT_EQ(gpu.submit(kernel_op(1 + i % 3, ++seq, 5 + (i * 7) % 40, 300 + i * 13, 2, profile)), 0);
    if (i % 4 == 0) gpu.advance_to(gpu.now_ns() + 250);
  }
  gpu.run_until_idle();
  return gpu.completions();
}

bool same(const std::vector<Completion>& a, const std::vector<Completion>& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (a[i].seq != b[i].seq || a[i].start_ns != b[i].start_ns || a[i].end_ns != b[i].end_ns) return false;
  }
  return true;
}

TEST(SimGpu, DeterministicForASeed) {
  auto first = random_run(42);
  ASSERT_EQ(first.size(), 60u);
  EXPECT_TRUE(same(first, random_run(42)));
  EXPECT_FALSE(same(first, random_run(43)));  // the seed drives the jitter
}

TEST(SimGpu, BadConfigIsRejected) {
  SimGpuConfig cfg;
  cfg.sm_count = 0;
  EXPECT_THROW(SimulatedGpu{cfg}, std::invalid_argument);
  cfg = SimGpuConfig{};
  cfg.jitter = -1;
  EXPECT_THROW(SimulatedGpu{cfg}, std::invalid_argument);
}

// Processes without MPS: one context's blocks at a time. Two small kernels that would share the
// GPU under MPS run one after the other, with a switch between them.
TEST(SimGpu, TimeSlicedContextsNeverOverlapAndPayASwitch) {
  for (ContextSharing sharing : {ContextSharing::kMps, ContextSharing::kTimeSlice}) {
    SimGpuConfig cfg = small_gpu(4);
    cfg.context_sharing = sharing;
    cfg.context_switch_ns = 300;
    SimulatedGpu gpu(cfg);
    gpu.set_stream_context(2, 1);
    ASSERT_EQ(gpu.submit(kernel_op(1, 1, 2, 1000)), 0);  // 2 of 4 SMs
    ASSERT_EQ(gpu.submit(kernel_op(2, 2, 2, 1000)), 0);  // the other process, 2 SMs
    gpu.run_until_idle();
    const auto done = by_seq(gpu);
    if (sharing == ContextSharing::kMps) {
      EXPECT_EQ(done.at(2).start_ns, 0) << "MPS: the second process's kernel takes the free SMs";
      EXPECT_EQ(gpu.context_switches(), 0u);
    } else {
      EXPECT_EQ(done.at(1).end_ns, 1000);
      EXPECT_EQ(done.at(2).start_ns, 1300) << "time slicing: after the first context's blocks and a switch";
      EXPECT_EQ(gpu.context_switches(), 1u);
    }
  }
}

// A context that keeps the GPU busy loses it after one time slice while another waits; its
// remaining kernels wait for the other's to finish (round robin), and the first context to use an
// idle GPU pays no switch.
TEST(SimGpu, ABusyContextYieldsAfterItsTimeSlice) {
  SimGpuConfig cfg = small_gpu(2);
  cfg.context_sharing = ContextSharing::kTimeSlice;
  cfg.time_slice_ns = 2500;
  cfg.context_switch_ns = 100;
  SimulatedGpu gpu(cfg);
  gpu.set_stream_context(2, 1);
  for (uint64_t i = 1; i <= 5; ++i) ASSERT_EQ(gpu.submit(kernel_op(1, i, 2, 1000)), 0);  // 5 x 1 us, context 0
  ASSERT_EQ(gpu.submit(kernel_op(2, 10, 2, 1000)), 0);                                 // 1 us, context 1
  gpu.run_until_idle();
  const auto done = by_seq(gpu);
  EXPECT_EQ(done.at(1).start_ns, 0) << "no switch onto an idle GPU";
  // Context 0 runs kernels 1-3 (its slice ends at 2500 inside kernel 3, whose blocks finish at
  // 3000), the switch takes 100, context 1 runs 3100-4100, the switch back 100, then kernels 4-5.
  EXPECT_EQ(done.at(3).end_ns, 3000);
  EXPECT_EQ(done.at(10).start_ns, 3100);
  EXPECT_EQ(done.at(10).end_ns, 4100);
  EXPECT_EQ(done.at(4).start_ns, 4200);
  EXPECT_EQ(done.at(5).end_ns, 6200);
  EXPECT_EQ(gpu.context_switches(), 2u);
}

// A context whose stream goes idle for a moment loses the GPU to a waiting one at once: this is
// what costs a pipeline its pace next to an unmanaged process without MPS.
TEST(SimGpu, AnIdleMomentHandsTheGpuToAWaitingContext) {
  SimGpuConfig cfg = small_gpu(2);
  cfg.context_sharing = ContextSharing::kTimeSlice;
  cfg.time_slice_ns = 10'000;
  cfg.context_switch_ns = 100;
  SimulatedGpu gpu(cfg);
  gpu.set_stream_context(2, 1);
  ASSERT_EQ(gpu.submit(kernel_op(1, 1, 2, 1000)), 0);
  ASSERT_EQ(gpu.submit(kernel_op(2, 2, 2, 5000)), 0);
  gpu.advance_to(1010);  // kernel 1 done at 1000; context 1 took over, switching until 1100
  ASSERT_EQ(gpu.submit(kernel_op(1, 3, 2, 1000)), 0);  // context 0's next kernel, 10 ns later
  gpu.run_until_idle();
  const auto done = by_seq(gpu);
  EXPECT_EQ(done.at(2).start_ns, 1100);
  EXPECT_EQ(done.at(3).start_ns, 6200) << "waits for the other context's kernel and a switch back";
}

TEST(SimGpu, RejectsABadTimeSliceOrContext) {
  SimGpuConfig cfg = small_gpu(2);
  cfg.time_slice_ns = 0;
  EXPECT_THROW(SimulatedGpu{cfg}, std::invalid_argument);
  SimulatedGpu gpu(small_gpu(2));
  EXPECT_THROW(gpu.set_stream_context(1, -1), std::invalid_argument);
}

}  // namespace
}  // namespace sched

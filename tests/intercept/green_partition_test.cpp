// ORION_POLICY=partition in the shim (green_partitions.h): best-effort kernels run in a green
// context of the policy's SM count, ordered with their stream by a fork and a join event; what
// cannot move stays in place. Run by ctest only as intercept.icpt_green_partition_test.partition
// (USE_ORION_SCHEDULER=1, ORION_POLICY=partition, ORION_POLICY_PARAMS=be_sm_frac=0.5: 64 of
// device 0's 132 SMs, 56 of device 1's 114).
#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "scheduling_fixture.h"

namespace {

using namespace icpt_test;

constexpr int kBeSms = 64;

class GreenPartition : public Scheduling {
 protected:
  void SetUp() override {
    Scheduling::SetUp();
    if (HasFatalFailure()) return;
    const char* p = std::getenv("ORION_POLICY");
    ASSERT_TRUE(scheduled_ && p != nullptr && std::string(p) == "partition")
        << "needs USE_ORION_SCHEDULER=1 ORION_POLICY=partition (as ctest runs it)";
    const size_t sizes[] = {sizeof(int), sizeof(double)};
    if (lib_ == 0) lib_ = fake_cuda_make_module();
    kernel_ = reinterpret_cast<CUfunction>(fake_cuda_make_kernel(lib_, "library_be_kernel", 2, sizes));
  }
  // The log entry of the successful launch of `f` (index), -1 if none.
  static long launched(const std::vector<fake_cuda_call>& log, CUfunction f) {
    return find_call(log, [&](const fake_cuda_call& c) {
      return is_launch(c) && c.function == h(f) && c.result == CUDA_SUCCESS;
    });
  }
  static size_t count_named(const std::vector<fake_cuda_call>& log, const char* name, uint64_t stream) {
    size_t n = 0;
    for (const auto& c : log) n += std::strcmp(c.name, name) == 0 && c.stream == stream;
    return n;
  }
  static uint64_t lib_;
  CUfunction kernel_ = nullptr;  // a CUkernel (context-independent), passed as CUfunction
};
uint64_t GreenPartition::lib_ = 0;

// The move, call by call: fork on the program's stream, the shadow waits for it, the kernel runs
// on the shadow in a green context of 64 SMs, the join comes back, and the program's stream waits
// for it. Both directions of program order hold on the fake's timelines.
TEST_F(GreenPartition, BestEffortKernelRunsInAGreenContextInProgramOrder) {
  fake_cuda_set_kernel_duration_ns(k_be_, 30'000);
  fake_cuda_set_kernel_duration_ns(kernel_, 50'000);
  const int64_t be_before = fake_cuda_stream_time_ns(be_);
  ASSERT_EQ(launch(k_be_, be_, 1), CUDA_SUCCESS);    // a module's CUfunction: stays on be_
  ASSERT_EQ(launch(kernel_, be_, 2), CUDA_SUCCESS);  // moves
  const auto log = calls();
  const long k = launched(log, kernel_);
  ASSERT_GE(k, 0);
  const fake_cuda_call& run = log[static_cast<size_t>(k)];
  const uint64_t shadow = run.stream;
  ASSERT_NE(shadow, h(be_)) << "the best-effort kernel ran on its own stream, not in a green context";
  EXPECT_EQ(fake_cuda_context_sm_count(reinterpret_cast<CUcontext>(run.context)), kBeSms);
  int first_arg = 0;
  std::memcpy(&first_arg, run.params, sizeof first_arg);
  EXPECT_EQ(first_arg, 2) << "the moved launch must carry its own arguments";
  // Fork before (the newest wait of the shadow before the launch, and that event's newest record
  // before the wait), join after.
  long fork = -1;
  for (long i = 0; i < k; ++i) {
    const auto& c = log[static_cast<size_t>(i)];
    if (std::strcmp(c.name, "cuStreamWaitEvent") == 0 && c.stream == shadow) fork = i;
  }
  ASSERT_GE(fork, 0) << "the shadow stream never waited for the program's stream";
  long fork_record = -1;
  for (long i = 0; i < fork; ++i) {
    const auto& c = log[static_cast<size_t>(i)];
    if (std::strcmp(c.name, "cuEventRecord") == 0 && c.event == log[static_cast<size_t>(fork)].event) fork_record = i;
  }
  ASSERT_GE(fork_record, 0);
  EXPECT_EQ(log[static_cast<size_t>(fork_record)].stream, h(be_));
  EXPECT_GT(fork_record, launched(log, k_be_)) << "the fork must follow the work before it on be_";
  const long join_record = find_named(log, "cuEventRecord", shadow);
  ASSERT_GT(join_record, k);
  const long join_wait = find_call(log, [&](const fake_cuda_call& c) {
    return std::strcmp(c.name, "cuStreamWaitEvent") == 0 && c.stream == h(be_) &&
           c.event == log[static_cast<size_t>(join_record)].event;
  });
  ASSERT_GT(join_wait, join_record) << "be_ never waited for the moved kernel";
  // Timelines: the shadow started after the 30 us kernel; be_ ends after the 50 us one.
  CUstream shadow_stream = reinterpret_cast<CUstream>(shadow);
  EXPECT_GE(fake_cuda_stream_time_ns(shadow_stream), be_before + 80'000);
  EXPECT_GE(fake_cuda_stream_time_ns(be_), be_before + 80'000);
  for (const auto& c : log) EXPECT_TRUE(c.result == CUDA_SUCCESS || is_launch(c)) << c.name << " failed";
  EXPECT_EQ(fake_cuda_green_ctx_violations(), 0u);
  ASSERT_TRUE(wait_idle());
}

// Issue 24, finding 4: a synchronous call reaches the driver outside the dispatcher (legacy-stream
// semantics: it runs after the blocking streams' work and before their later work). The next
// moved launch of a stream must fork again, so its shadow waits for the call; it skipped the fork
// and could run before the memset it reads.
TEST_F(GreenPartition, ASynchronousCallBetweenMovedLaunchesMakesTheNextOneForkAgain) {
  ASSERT_EQ(launch(kernel_, be_, 0), CUDA_SUCCESS);  // moved; the next one would share its fork
  fake_cuda_reset();
  ASSERT_EQ(cuMemsetD8(0x2000, 0, 64), CUDA_SUCCESS);
  ASSERT_EQ(launch(kernel_, be_, 1), CUDA_SUCCESS);
  const auto log = calls();
  const long set = find_call(log, [](const fake_cuda_call& c) { return std::strcmp(c.name, "cuMemsetD8_v2") == 0; });
  const long k = launched(log, kernel_);
  ASSERT_GE(set, 0);
  ASSERT_GT(k, set);
  const uint64_t shadow = log[static_cast<size_t>(k)].stream;
  ASSERT_NE(shadow, h(be_)) << "the second launch did not move";
  const long fork = find_call(log, [&](const fake_cuda_call& c) {
    return std::strcmp(c.name, "cuStreamWaitEvent") == 0 && c.stream == shadow;
  }, static_cast<size_t>(set));
  EXPECT_GE(fork, 0) << "the shadow stream did not wait for the program's stream after the synchronous memset";
  EXPECT_LT(fork, k);
  ASSERT_TRUE(wait_idle());
}

// Consecutive moved launches of a stream share one fork (be_ has had nothing but the join since);
// any other op on the stream makes the next move fork again.
TEST_F(GreenPartition, ConsecutiveLaunchesShareTheFork) {
  ASSERT_EQ(launch(kernel_, be_, 0), CUDA_SUCCESS);
  fake_cuda_reset();
  for (int i = 0; i < 5; ++i) ASSERT_EQ(launch(kernel_, be_, i), CUDA_SUCCESS);
  auto log = calls();
  const long first = launched(log, kernel_);
  ASSERT_GE(first, 0);
  const uint64_t shadow = log[static_cast<size_t>(first)].stream;
  EXPECT_EQ(count_launches(log, kernel_), 5u);
  EXPECT_EQ(count_named(log, "cuStreamWaitEvent", shadow), 0u) << "the first launch of the test already forked";
  EXPECT_EQ(count_named(log, "cuEventRecord", shadow), 5u) << "one join per launch";
  EXPECT_EQ(count_named(log, "cuStreamWaitEvent", h(be_)), 5u);
  CUevent e = nullptr;
  ASSERT_EQ(cuEventCreate(&e, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuEventRecord(e, be_), CUDA_SUCCESS);  // the program's own op on be_
  ASSERT_EQ(launch(kernel_, be_, 9), CUDA_SUCCESS);
  log = calls();
  EXPECT_EQ(count_named(log, "cuStreamWaitEvent", shadow), 1u) << "after an op in place the shadow must fork again";
  ASSERT_TRUE(wait_idle());
  EXPECT_EQ(cuEventDestroy(e), CUDA_SUCCESS);
}

// A module's CUfunction is bound to the context that loaded it: the driver refuses it in the green
// context once, and from then on it launches in place without asking. High-priority kernels
// never move.
TEST_F(GreenPartition, WhatCannotMoveStaysInPlace) {
  CUfunction f = fake_cuda_make_function("module_be_kernel", 0, nullptr);
  const orion_stats before = stats();
  ASSERT_EQ(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, be_, nullptr, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, be_, nullptr, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(launch(kernel_, hp_, 3), CUDA_SUCCESS);
  const auto log = calls();
  size_t refused = 0, on_be = 0;
  for (const auto& c : log) {
    if (!is_launch(c) || c.function != h(f)) continue;
    refused += c.result != CUDA_SUCCESS;
    on_be += c.result == CUDA_SUCCESS && c.stream == h(be_);
  }
  EXPECT_EQ(refused, 1u) << "the driver is asked once, then the kernel is known to stay";
  EXPECT_EQ(on_be, 2u);
  const long hp = launched(log, kernel_);
  ASSERT_GE(hp, 0);
  EXPECT_EQ(log[static_cast<size_t>(hp)].stream, h(hp_)) << "high priority must stay on its stream";
  ASSERT_TRUE(wait_idle());
  const orion_stats after = stats();
  EXPECT_EQ(after.partition_in_place - before.partition_in_place, 2u);
  EXPECT_EQ(after.backend_errors, before.backend_errors) << "a refused move is not the program's error";
}

// While a capture is active nothing moves (a fork/join would become nodes of the program's graph).
TEST_F(GreenPartition, CapturedLaunchesStayInPlace) {
  ASSERT_EQ(cuStreamBeginCapture(be_, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  ASSERT_EQ(launch(kernel_, be_, 1), CUDA_SUCCESS);
  CUgraph graph = nullptr;
  ASSERT_EQ(cuStreamEndCapture(be_, &graph), CUDA_SUCCESS);
  const auto log = calls();
  const long k = launched(log, kernel_);
  ASSERT_GE(k, 0);
  EXPECT_EQ(log[static_cast<size_t>(k)].stream, h(be_));
  EXPECT_EQ(log[static_cast<size_t>(k)].captured, 1);
  for (const auto& c : log) EXPECT_NE(std::strcmp(c.name, "cuStreamWaitEvent"), 0) << "a fork or join in the capture";
}

// A driver that cannot make the green context (here: device 1, cuGreenCtxCreate fails) leaves
// every best-effort launch in place, with correct results; other devices are not affected.
TEST_F(GreenPartition, NoGreenContextFallsBackInPlace) {
  std::thread other([&] {
    ASSERT_NE(use_device(1), nullptr);
    CUstream s = nullptr;
    ASSERT_EQ(cuStreamCreateWithPriority(&s, 0, 0), CUDA_SUCCESS);
    fake_cuda_fail_next("cuGreenCtxCreate", CUDA_ERROR_NOT_SUPPORTED);
    for (int i = 0; i < 3; ++i) ASSERT_EQ(launch(kernel_, s, i), CUDA_SUCCESS);
    const auto log = calls();
    EXPECT_EQ(count_launches(log, kernel_), 3u);
    for (const auto& c : log) {
      if (is_launch(c) && c.function == h(kernel_)) {
        EXPECT_EQ(c.stream, h(s));
      }
    }
    EXPECT_EQ(cuStreamSynchronize(s), CUDA_SUCCESS);
    EXPECT_TRUE(wait_idle());
    EXPECT_EQ(cuStreamDestroy(s), CUDA_SUCCESS);
  });
  other.join();
  fake_cuda_reset();
  ASSERT_EQ(launch(kernel_, be_, 1), CUDA_SUCCESS);
  const auto log = calls();
  const long k = launched(log, kernel_);
  ASSERT_GE(k, 0);
  EXPECT_NE(log[static_cast<size_t>(k)].stream, h(be_)) << "device 0 still moves";
}

// Several threads moving launches of their own streams at once: each stream gets its own shadow
// (best-effort streams never serialise on one), all succeed, and the green context is never
// current on two threads at a time. A destroyed stream takes its shadow with it.
TEST_F(GreenPartition, ThreadsGetTheirOwnShadowsAndDestroyTakesThemAlong) {
  constexpr int kThreads = 4, kLaunches = 50;
  std::vector<CUstream> streams(kThreads);
  for (auto& s : streams) ASSERT_EQ(cuStreamCreateWithPriority(&s, 0, 0), CUDA_SUCCESS);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      ASSERT_NE(use_device(0), nullptr);
      for (int i = 0; i < kLaunches; ++i) ASSERT_EQ(launch(kernel_, streams[static_cast<size_t>(t)], i), CUDA_SUCCESS);
    });
  }
  for (auto& th : threads) th.join();
  ASSERT_TRUE(wait_idle());
  auto log = calls();
  std::set<uint64_t> shadows;
  for (const auto& c : log) {
    if (is_launch(c) && c.function == h(kernel_)) {
      EXPECT_EQ(c.result, CUDA_SUCCESS);
      shadows.insert(c.stream);
    }
  }
  EXPECT_EQ(shadows.size(), static_cast<size_t>(kThreads));
  for (CUstream s : streams) EXPECT_EQ(shadows.count(h(s)), 0u);
  EXPECT_EQ(fake_cuda_green_ctx_violations(), 0u);
  fake_cuda_reset();
  for (CUstream s : streams) ASSERT_EQ(cuStreamDestroy(s), CUDA_SUCCESS);
  log = calls();
  for (uint64_t shadow : shadows) {
    EXPECT_GE(find_named(log, "cuStreamDestroy_v2", shadow), 0) << "shadow " << shadow << " outlived its stream";
  }
}

// A primary context's reset takes the program's streams there along, unnoticed by a destroy
// call, and "destroys and cleans up all resources associated with the device": the shim forgets
// the stream's binding (its fork event, of the program's context, went with it: never destroyed
// or recorded again, since its handle may be the program's next event's) and the green contexts
// with their shadow streams (which may have gone too: forgotten, not destroyed). The next move
// makes a new green context and shadow.
TEST_F(GreenPartition, APrimaryContextResetForgetsItsStreamsBindingsAndTheGreenContexts) {
  fake_cuda_set_handle_reuse(1);
  CUstream s = nullptr;
  ASSERT_EQ(cuStreamCreateWithPriority(&s, 0, 0), CUDA_SUCCESS);
  ASSERT_EQ(launch(kernel_, s, 1), CUDA_SUCCESS);  // moves: a fork on s, a shadow, a join
  ASSERT_TRUE(wait_idle());
  auto log = calls();
  const long k = launched(log, kernel_);
  ASSERT_GE(k, 0);
  const uint64_t shadow = log[static_cast<size_t>(k)].stream;
  ASSERT_NE(shadow, h(s)) << "the launch did not move";
  const long fork_record = find_named(log, "cuEventRecord", h(s));
  ASSERT_GE(fork_record, 0) << "no fork event recorded on the program's stream";
  const uint64_t fork = log[static_cast<size_t>(fork_record)].event;
  const size_t before = log.size();
  ASSERT_EQ(cuDevicePrimaryCtxReset(0), CUDA_SUCCESS);
  ASSERT_NE(use_device(0), nullptr);  // active again
  // The program's new events get the dead events' handles, the fork's among them.
  std::vector<CUevent> mine(64);
  for (CUevent& e : mine) ASSERT_EQ(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
  ASSERT_TRUE(std::any_of(mine.begin(), mine.end(), [&](CUevent e) { return h(e) == fork; }))
      << "the fake did not hand the fork event's handle out again";
  CUstream next = nullptr;
  ASSERT_EQ(cuStreamCreateWithPriority(&next, 0, 0), CUDA_SUCCESS);
  ASSERT_EQ(launch(kernel_, next, 2), CUDA_SUCCESS);
  ASSERT_TRUE(wait_idle());
  log = calls();
  long reset = -1, green_made = -1, moved = -1;
  for (size_t i = before; i < log.size(); ++i) {
    const auto& c = log[i];
    if (reset < 0 && std::strcmp(c.name, "cuDevicePrimaryCtxReset_v2") == 0) reset = static_cast<long>(i);
    if (reset >= 0 && std::strcmp(c.name, "cuGreenCtxCreate") == 0) green_made = static_cast<long>(i);
    if (is_launch(c) && c.function == h(kernel_) && c.result == CUDA_SUCCESS) moved = static_cast<long>(i);
    for (CUevent e : mine) EXPECT_NE(c.event, h(e)) << c.name << " on the program's event (the dead fork's handle?)";
    EXPECT_FALSE(std::strcmp(c.name, "cuStreamDestroy_v2") == 0 && c.stream == shadow)
        << "the shadow of a green context that may be gone was destroyed";
  }
  ASSERT_GE(reset, 0);
  EXPECT_GT(green_made, reset) << "the green context from before the reset was used again";
  ASSERT_GE(moved, 0);
  EXPECT_NE(log[static_cast<size_t>(moved)].stream, h(next)) << "the launch after the reset did not move";
  EXPECT_NE(log[static_cast<size_t>(moved)].stream, shadow);
  for (CUevent e : mine) EXPECT_EQ(cuEventDestroy(e), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamDestroy(next), CUDA_SUCCESS);
}

}  // namespace

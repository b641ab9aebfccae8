// Completion tracking in batches (DriverDevice, ORION_COMPLETION_BATCH_US): a burst of launches
// shares its completion events, its tail completes without another launch, and a tail record
// never lands in a capture or on a destroyed stream. Run by ctest only as
// intercept.icpt_completion_batching_test.scheduled_batched (USE_ORION_SCHEDULER=1,
// ORION_COMPLETION_BATCH_US=5000: a window wide enough that a burst's launches are uncovered
// even under a sanitizer on a loaded 2-core machine; the differential programs run with 1 ms).
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "scheduling_fixture.h"

namespace {

using namespace icpt_test;

class CompletionBatching : public Scheduling {
 protected:
  void SetUp() override {
    Scheduling::SetUp();
    if (HasFatalFailure()) return;
    const char* w = std::getenv("ORION_COMPLETION_BATCH_US");
    ASSERT_TRUE(scheduled_ && w != nullptr && std::atoi(w) >= 1000)
        << "needs USE_ORION_SCHEDULER=1 and ORION_COMPLETION_BATCH_US >= 1000 (as ctest runs it)";
    window_ = std::chrono::microseconds(std::atoi(w));
  }
  // Long enough for the helper thread to see several windows pass.
  void sleep_windows(int n) const { std::this_thread::sleep_for(window_ * n); }
  std::chrono::microseconds window_{0};
  // Launches `f` on `s` until its duration is learned (while it is learned every launch is timed,
  // two events each), waiting for each, then clears the fake's log.
  void learn_then_reset(CUfunction f, CUstream s) {
    for (int i = 0; i < 12; ++i) {
      ASSERT_EQ(launch(f, s, i), CUDA_SUCCESS);
      ASSERT_TRUE(wait_idle());
    }
    fake_cuda_reset();
  }
};

size_t count_calls(const std::vector<fake_cuda_call>& log, const char* prefix, uint64_t stream = 0) {
  size_t n = 0;
  for (const auto& c : log)
    if (std::strncmp(c.name, prefix, std::strlen(prefix)) == 0 && (stream == 0 || c.stream == stream)) ++n;
  return n;
}

// A burst of tracked launches costs one completion event per window, not one per launch; the
// burst's tail completes without another launch (the helper thread records its event).
TEST_F(CompletionBatching, ABurstOfLaunchesSharesItsCompletionEvents) {
  learn_then_reset(k_hp_, hp_);
  if (HasFatalFailure()) return;
  constexpr int kBurst = 200;
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < kBurst; ++i) ASSERT_EQ(launch(k_hp_, hp_, i), CUDA_SUCCESS);
  // The windows the launches spanned (after the last one, only the tail's record is due).
  const auto windows = static_cast<size_t>((std::chrono::steady_clock::now() - start) / window_) + 1;
  ASSERT_TRUE(wait_idle()) << "the burst's tail never completed: no tail event was recorded";
  const auto log = calls();
  EXPECT_EQ(count_launches(log, k_hp_), static_cast<size_t>(kBurst));
  const size_t records = count_calls(log, "cuEventRecord", h(hp_));
  // The bound is only meaningful while the burst spans far fewer windows than it has launches
  // (a sanitizer on a loaded machine slows it; the 5 ms window keeps this true by a wide margin).
  ASSERT_LT(windows, static_cast<size_t>(kBurst) / 4)
      << "the burst spanned " << windows << " windows: too slow to tell batching from none";
  // At most one record per window the launches spanned, the tail's, plus the periodic timed
  // re-samples (one launch in 32 gets its own pair): far below one per launch. A record per
  // launch, as without batching, is kBurst.
  const size_t bound = windows + 2 + 2 * (kBurst / 32 + 1);
  EXPECT_GE(records, 2u) << "the first launch and the tail each need an event";
  EXPECT_LE(records, bound) << records << " events for " << kBurst << " launches over " << windows
                            << " windows";
  for (const auto& c : log)
    if (std::strncmp(c.name, "cuEventRecord", 13) == 0) {
      EXPECT_EQ(c.result, CUDA_SUCCESS);
    }
}

// The helper thread's tail record never lands in a capture: uncovered launches on a stream that
// then begins a global-mode capture stay uncovered (no record) until the capture ends.
TEST_F(CompletionBatching, TailRecordsStayOutOfCaptures) {
  learn_then_reset(k_hp_, hp_);
  if (HasFatalFailure()) return;
  for (int i = 0; i < 5; ++i) ASSERT_EQ(launch(k_hp_, hp_, i), CUDA_SUCCESS);  // 4 uncovered
  ASSERT_EQ(cuStreamBeginCapture(hp_, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  // Several windows in which the helper thread wants a tail record on hp_.
  sleep_windows(3);
  CUfunction captured = fake_cuda_make_function("captured_kernel", 0, nullptr);
  ASSERT_EQ(cuLaunchKernel(captured, 1, 1, 1, 1, 1, 1, 0, hp_, nullptr, nullptr), CUDA_SUCCESS);
  CUgraph graph = nullptr;
  EXPECT_EQ(cuStreamEndCapture(hp_, &graph), CUDA_SUCCESS) << "the shim invalidated the capture";
  for (const auto& c : calls()) {
    if (c.captured != 0) {
      EXPECT_EQ(c.function, h(captured)) << c.name << " of the shim went into the program's graph";
    }
  }
  EXPECT_TRUE(wait_idle()) << "the uncovered launches before the capture never completed";
}

// A stream destroyed with uncovered launches: their event is recorded before the handle dies
// (the fake fails a record on a destroyed stream), and they complete.
TEST_F(CompletionBatching, DestroyingAStreamCoversItsUncoveredLaunches) {
  CUstream s = nullptr;
  ASSERT_EQ(cuStreamCreateWithPriority(&s, 0, -5), CUDA_SUCCESS);
  learn_then_reset(k_hp_, s);
  if (HasFatalFailure()) return;
  for (int i = 0; i < 6; ++i) ASSERT_EQ(launch(k_hp_, s, i), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamDestroy(s), CUDA_SUCCESS);
  EXPECT_TRUE(wait_idle()) << "the destroyed stream's launches never completed";
  const auto log = calls();
  size_t destroy_at = log.size(), last_record_at = 0;
  for (size_t i = 0; i < log.size(); ++i) {
    if (std::strncmp(log[i].name, "cuStreamDestroy", 15) == 0 && log[i].stream == h(s)) destroy_at = i;
    if (std::strncmp(log[i].name, "cuEventRecord", 13) == 0 && log[i].stream == h(s)) {
      EXPECT_EQ(log[i].result, CUDA_SUCCESS) << "a completion event on the destroyed stream";
      last_record_at = i;
    }
  }
  ASSERT_LT(destroy_at, log.size());
  EXPECT_GT(last_record_at, 0u) << "no event covered the last launches";
  EXPECT_LT(last_record_at, destroy_at) << "the covering event came after the destroy";
}

// Issue 24, finding 6: the helper thread's tail record on a stream whose event pool is empty must
// create its event in the stream's context (the helper thread has none current; the fake, like
// the driver, refuses cuEventCreate without one). Before the fix the creation failed and the
// uncovered launches were reported complete while still running, letting best-effort work in.
TEST_F(CompletionBatching, ATailRecordOnAFreshStreamCreatesItsEventInTheStreamsContext) {
  learn_then_reset(k_hp_, hp_);
  if (HasFatalFailure()) return;
  CUstream s = nullptr;
  ASSERT_EQ(cuStreamCreateWithPriority(&s, 0, -5), CUDA_SUCCESS);
  fake_cuda_set_stream_busy(s, 1);  // nothing on it completes until released
  constexpr int kLaunches = 6;
  for (int i = 0; i < kLaunches; ++i) ASSERT_EQ(launch(k_hp_, s, i), CUDA_SUCCESS);
  // Once its window has passed, the helper thread records the tail with a new event (polled: a
  // loaded machine may run the helper thread late).
  auto records_on_s = [&] {
    size_t n = 0;
    for (const auto& c : calls()) {
      if (std::strncmp(c.name, "cuEventRecord", 13) == 0 && c.stream == h(s)) {
        EXPECT_EQ(c.result, CUDA_SUCCESS);
        ++n;
      }
    }
    return n;
  };
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (records_on_s() < 2 && std::chrono::steady_clock::now() < deadline) sleep_windows(1);
  EXPECT_GE(records_on_s(), 2u) << "the burst's tail got no completion event";
  EXPECT_EQ(stats().tracked_in_flight, static_cast<uint64_t>(kLaunches))
      << "launches still running on a busy stream were reported complete";
  // High priority is in flight: a best-effort launch is held back.
  ASSERT_EQ(launch(k_be_, be_, 1), CUDA_SUCCESS);
  EXPECT_EQ(count_launches(calls(), k_be_), 0u) << "best-effort work was let in next to running HP work";
  fake_cuda_set_stream_busy(s, 0);
  EXPECT_EQ(cuStreamSynchronize(be_), CUDA_SUCCESS);
  EXPECT_TRUE(wait_idle());
  EXPECT_EQ(cuStreamDestroy(s), CUDA_SUCCESS);
}

}  // namespace

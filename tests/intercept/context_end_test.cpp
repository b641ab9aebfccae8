// A context's end takes its streams and events along, and the driver hands their handle values
// out again, to any thread, possibly for the program's next streams and events. The shim must
// drop what it tracked there (its completion events of the dead context are never queried, pooled
// or destroyed again; the dead streams' ops count as done) and track a stream that got a dead
// stream's handle afresh. It used to record its pooled events of the dead context on the new
// stream (or, where the program's new event had got that handle, the program's event) and,
// failing, count the new stream's work as done at once, so best-effort work ran beside it.
//
// Each way a context ends, run by one test body (ctest runs the program scheduled and
// pass-through):
//   cuCtxDestroy                the shim names the context (its argument);
//   past the shim               fake_cuda_end_context: a context's end the shim cannot name
//                               (a release through a retain it never saw); the reused stream
//                               handle shows it, at that stream's creation;
//   primary release / reset     device 1's primary context, which the shim knows from the
//                               program's cuDevicePrimaryCtxRetain: the last release (the driver
//                               then reports it inactive) or a reset ends it, and the next retain
//                               hands out the same handle again;
//   green context destroy       cuGreenCtxDestroy: its CUcontext ends (its streams stay, dead);
//                               what becomes of its events the driver does not say: the fake
//                               takes them along, the harder case.
#include <chrono>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "scheduling_fixture.h"

namespace {

using namespace icpt_test;

enum class Ending { kDestroy, kPastTheShim, kPrimaryRelease, kPrimaryReset, kGreenDestroy };

std::string name_of(const ::testing::TestParamInfo<Ending>& info) {
  switch (info.param) {
    case Ending::kDestroy: return "CtxDestroy";
    case Ending::kPastTheShim: return "PastTheShim";
    case Ending::kPrimaryRelease: return "PrimaryLastRelease";
    case Ending::kPrimaryReset: return "PrimaryReset";
    case Ending::kGreenDestroy: return "GreenCtxDestroy";
  }
  return "unknown";
}

class ContextEnds : public Scheduling, public ::testing::WithParamInterface<Ending> {
 protected:
  static constexpr CUdevice kPrimaryDevice = 1;  // the fixture's streams live on device 0's
  bool primary() const { return ending_ == Ending::kPrimaryRelease || ending_ == Ending::kPrimaryReset; }
  bool green() const { return ending_ == Ending::kGreenDestroy; }

  // The context that will end, pushed current on the calling thread.
  void begin_context() {
    if (primary()) {
      release_primary_retains(kPrimaryDevice);  // this test's retain is then the only one
      ASSERT_EQ(fake_cuda_primary_retains(kPrimaryDevice), 0);
      ASSERT_EQ(cuDevicePrimaryCtxRetain(&dying_, kPrimaryDevice), CUDA_SUCCESS);
      ASSERT_EQ(cuCtxPushCurrent(dying_), CUDA_SUCCESS);
    } else if (green()) {
      ASSERT_EQ(make_green_context(0, 16, &green_), CUDA_SUCCESS);
      ASSERT_EQ(cuCtxFromGreenCtx(&dying_, green_), CUDA_SUCCESS);
      ASSERT_EQ(cuCtxPushCurrent(dying_), CUDA_SUCCESS);
    } else {
      ASSERT_EQ(cuCtxCreate(&dying_, nullptr, 0, 0), CUDA_SUCCESS);  // pushed
    }
  }
  CUresult high_priority_stream(CUstream* s) const {
    return green() ? cuGreenCtxStreamCreate(s, green_, CU_STREAM_NON_BLOCKING, -5)
                   : cuStreamCreateWithPriority(s, CU_STREAM_NON_BLOCKING, -5);
  }
  // Ends the context (not current on the calling thread); returns the driver's log name of the
  // call the shim sees, or "" where it does not see one.
  std::string end_context() {
    CUresult rc = CUDA_ERROR_UNKNOWN;
    std::string seen;
    switch (ending_) {
      case Ending::kDestroy: rc = cuCtxDestroy(dying_); seen = "cuCtxDestroy_v2"; break;
      case Ending::kPastTheShim: rc = fake_cuda_end_context(dying_); break;
      case Ending::kPrimaryRelease: rc = cuDevicePrimaryCtxRelease(kPrimaryDevice); seen = "cuDevicePrimaryCtxRelease_v2"; break;
      case Ending::kPrimaryReset: rc = cuDevicePrimaryCtxReset(kPrimaryDevice); seen = "cuDevicePrimaryCtxReset_v2"; break;
      case Ending::kGreenDestroy: rc = cuGreenCtxDestroy(green_); seen = "cuGreenCtxDestroy"; break;
    }
    EXPECT_EQ(rc, CUDA_SUCCESS);
    if (primary()) {
      unsigned flags = 0;
      int active = 1;
      EXPECT_EQ(cuDevicePrimaryCtxGetState(kPrimaryDevice, &flags, &active), CUDA_SUCCESS);
      EXPECT_EQ(active, 0) << "device 1's primary context did not end";
    }
    return seen;
  }
  // The program's next context, pushed current: a primary context's next retain gets the same
  // handle; otherwise a new one.
  void next_context() {
    if (primary()) {
      ASSERT_EQ(cuDevicePrimaryCtxRetain(&next_, kPrimaryDevice), CUDA_SUCCESS);
      ASSERT_EQ(next_, dying_) << "the fake hands a primary context's handle out again";
      ASSERT_EQ(cuCtxPushCurrent(next_), CUDA_SUCCESS);
    } else {
      ASSERT_EQ(cuCtxCreate(&next_, nullptr, 0, 0), CUDA_SUCCESS);
    }
  }
  void end_next_context() {
    CUcontext popped = nullptr;
    ASSERT_EQ(cuCtxPopCurrent(&popped), CUDA_SUCCESS);
    ASSERT_EQ(popped, next_);
    if (primary()) {
      // Every retain of this test: a reset does not release.
      EXPECT_EQ(cuDevicePrimaryCtxRelease(kPrimaryDevice), CUDA_SUCCESS);
      if (ending_ == Ending::kPrimaryReset) {
        EXPECT_EQ(cuDevicePrimaryCtxRelease(kPrimaryDevice), CUDA_SUCCESS);
      }
    } else {
      EXPECT_EQ(cuCtxDestroy(next_), CUDA_SUCCESS);
    }
  }

  Ending ending_ = GetParam();
  CUcontext dying_ = nullptr, next_ = nullptr;
  CUgreenCtx green_ = nullptr;
};
INSTANTIATE_TEST_SUITE_P(Each, ContextEnds,
                         ::testing::Values(Ending::kDestroy, Ending::kPastTheShim, Ending::kPrimaryRelease,
                                           Ending::kPrimaryReset, Ending::kGreenDestroy),
                         name_of);

TEST_P(ContextEnds, TheShimDropsWhatItHadThereAndTracksReusedHandlesAfresh) {
  const size_t no_params[1] = {0};
  CUfunction any_ctx = reinterpret_cast<CUfunction>(  // a CUkernel: launches in any context
      fake_cuda_make_kernel(fake_cuda_make_module(), "reused_handle_kernel", 0, no_params));
  fake_cuda_set_handle_reuse(1);
  CUcontext fixture = nullptr;
  ASSERT_EQ(cuCtxGetCurrent(&fixture), CUDA_SUCCESS);
  ASSERT_NO_FATAL_FAILURE(begin_context());
  CUstream s2 = nullptr, s2_destroyed = nullptr;
  ASSERT_EQ(high_priority_stream(&s2), CUDA_SUCCESS);
  ASSERT_EQ(high_priority_stream(&s2_destroyed), CUDA_SUCCESS);
  for (int i = 0; i < 3; ++i) {  // finished: their completion events go back to s2's pool
    ASSERT_EQ(cuLaunchKernel(any_ctx, 1, 1, 1, 32, 1, 1, 0, s2, nullptr, nullptr), CUDA_SUCCESS);
    ASSERT_TRUE(wait_idle());
  }
  fake_cuda_set_stream_busy(s2, 1);
  ASSERT_EQ(cuLaunchKernel(any_ctx, 2, 1, 1, 32, 1, 1, 0, s2, nullptr, nullptr), CUDA_SUCCESS);  // pending
  // A stream of the context destroyed before the context ends, its completion event still
  // pending: an event of that context too.
  fake_cuda_set_stream_busy(s2_destroyed, 1);
  ASSERT_EQ(cuLaunchKernel(any_ctx, 4, 1, 1, 32, 1, 1, 0, s2_destroyed, nullptr, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamDestroy(s2_destroyed), CUDA_SUCCESS);
  CUcontext popped = nullptr;
  ASSERT_EQ(cuCtxPopCurrent(&popped), CUDA_SUCCESS);
  ASSERT_EQ(popped, dying_);
  const size_t before = calls().size();
  const std::string seen = end_context();
  // The program's events get the dead events' handles. Where the shim saw the end, at once: it
  // must not query, pool or destroy any of the context's events once the call reached the driver
  // (the helper thread may query them until then: they are alive). Where it did not, once the
  // helper thread has seen them answer as gone (it cannot know before), and from then on.
  size_t from = 0;
  if (!seen.empty()) {
    const auto log = calls();
    for (from = before; from < log.size() && log[from].name != seen;) ++from;
    ASSERT_LT(from, log.size()) << seen << " never reached the driver";
  } else {
    ASSERT_TRUE(wait_idle());
    from = calls().size();
  }
  ASSERT_NO_FATAL_FAILURE(next_context());
  std::vector<CUevent> mine(8);
  for (CUevent& e : mine) ASSERT_EQ(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
  EXPECT_TRUE(wait_idle()) << "the dead context's work is still counted in flight";

  CUstream s3 = nullptr;
  ASSERT_EQ(cuStreamCreateWithPriority(&s3, CU_STREAM_NON_BLOCKING, -5), CUDA_SUCCESS);
  if (green()) {
    // A green context's streams stay (dead) until destroyed, which CUDA 13 refuses: never reused,
    // so this variant checks the events half (and that the dead context's work stops counting).
    EXPECT_EQ(cuStreamDestroy(s2), CUDA_ERROR_CONTEXT_IS_DESTROYED);
  } else {
    ASSERT_TRUE(h(s3) == h(s2) || h(s3) == h(s2_destroyed)) << "the fake driver did not hand a dead stream's handle out again";
  }
  fake_cuda_set_stream_busy(s3, 1);
  ASSERT_EQ(cuLaunchKernel(any_ctx, 3, 1, 1, 32, 1, 1, 0, s3, nullptr, nullptr), CUDA_SUCCESS);  // HP, running
  ASSERT_EQ(cuCtxPushCurrent(fixture), CUDA_SUCCESS);
  ASSERT_EQ(launch(k_be_, be_, 1), CUDA_SUCCESS);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the helper thread polls meanwhile
  expect_deferred(k_be_);  // held behind the new stream's high-priority work
  auto log = calls();
  for (size_t i = from; i < log.size(); ++i) {
    for (CUevent e : mine) {
      EXPECT_NE(log[i].event, h(e)) << log[i].name << " on the program's event: the shim used a dead context's event";
    }
  }
  const long third = find_call(log, [&](const fake_cuda_call& c) { return is_launch(c) && c.grid[0] == 3; });
  ASSERT_GE(third, 0);
  EXPECT_EQ(log[third].result, CUDA_SUCCESS);
  ASSERT_EQ(cuCtxPopCurrent(&popped), CUDA_SUCCESS);
  fake_cuda_set_stream_busy(s3, 0);
  ASSERT_EQ(cuStreamSynchronize(s3), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamDestroy(s3), CUDA_SUCCESS);
  for (CUevent e : mine) EXPECT_EQ(cuEventDestroy(e), CUDA_SUCCESS);
  ASSERT_NO_FATAL_FAILURE(end_next_context());
  EXPECT_TRUE(wait_idle());
}

// A release that was not the last ends nothing: the shim keeps tracking the context's streams
// (their work still holds best-effort work back) and keeps polling its events.
TEST_F(Scheduling, APrimaryContextReleaseThatIsNotTheLastEndsNothing) {
  const size_t no_params[1] = {0};
  CUfunction any_ctx = reinterpret_cast<CUfunction>(
      fake_cuda_make_kernel(fake_cuda_make_module(), "still_alive_kernel", 0, no_params));
  CUcontext fixture = nullptr, dev1 = nullptr, again = nullptr;
  ASSERT_EQ(cuCtxGetCurrent(&fixture), CUDA_SUCCESS);
  ASSERT_EQ(cuDevicePrimaryCtxRetain(&dev1, 1), CUDA_SUCCESS);
  ASSERT_EQ(cuDevicePrimaryCtxRetain(&again, 1), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxPushCurrent(dev1), CUDA_SUCCESS);
  CUstream s = nullptr;
  ASSERT_EQ(cuStreamCreateWithPriority(&s, CU_STREAM_NON_BLOCKING, -5), CUDA_SUCCESS);
  fake_cuda_set_stream_busy(s, 1);
  ASSERT_EQ(cuLaunchKernel(any_ctx, 1, 1, 1, 32, 1, 1, 0, s, nullptr, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxPushCurrent(fixture), CUDA_SUCCESS);
  ASSERT_EQ(cuDevicePrimaryCtxRelease(1), CUDA_SUCCESS);  // one retain left: still active
  ASSERT_EQ(launch(k_be_, be_, 1), CUDA_SUCCESS);
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  expect_deferred(k_be_);  // the live context's high-priority work still holds it back
  fake_cuda_set_stream_busy(s, 0);
  ASSERT_TRUE(wait_idle()) << "the live context's completion was never seen";
  EXPECT_EQ(count_launches(calls(), k_be_), 1u);
  CUcontext popped = nullptr;
  ASSERT_EQ(cuCtxPopCurrent(&popped), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamDestroy(s), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxPopCurrent(&popped), CUDA_SUCCESS);
  EXPECT_EQ(cuDevicePrimaryCtxRelease(1), CUDA_SUCCESS);
}

// A retain on another thread right after a last release makes the primary context active again
// under the same handle. Were it let through before the shim has looked at what the release
// ended, the shim would see the context active and keep the dead context's events, whose handles
// the program's new events get (Shim::lock_context_lifecycle keeps the retain waiting).
TEST_F(Scheduling, ARetainRightAfterALastReleaseWaitsUntilTheShimHasSeenTheEnd) {
  const size_t no_params[1] = {0};
  CUfunction any_ctx = reinterpret_cast<CUfunction>(
      fake_cuda_make_kernel(fake_cuda_make_module(), "race_kernel", 0, no_params));
  fake_cuda_set_handle_reuse(1);
  release_primary_retains(1);
  ASSERT_EQ(fake_cuda_primary_retains(1), 0);
  CUcontext dev1 = nullptr, popped = nullptr;
  ASSERT_EQ(cuDevicePrimaryCtxRetain(&dev1, 1), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxPushCurrent(dev1), CUDA_SUCCESS);
  CUstream s = nullptr;
  ASSERT_EQ(cuStreamCreateWithPriority(&s, CU_STREAM_NON_BLOCKING, -5), CUDA_SUCCESS);
  fake_cuda_set_stream_busy(s, 1);
  ASSERT_EQ(cuLaunchKernel(any_ctx, 1, 1, 1, 32, 1, 1, 0, s, nullptr, nullptr), CUDA_SUCCESS);  // pending
  ASSERT_EQ(cuCtxPopCurrent(&popped), CUDA_SUCCESS);
  // The shim's look at the primary contexts' state after the release takes 150 ms.
  fake_cuda_delay_next("cuDevicePrimaryCtxGetState", 150'000);
  const size_t before = calls().size();
  std::vector<CUevent> mine(8);
  std::thread other([&] {
    ASSERT_NE(use_device(0), nullptr);
    for (;;) {  // until the release reached the driver (bounded by ctest's timeout)
      const auto log = calls();
      bool released = false;
      for (size_t i = before; i < log.size(); ++i) released |= std::strcmp(log[i].name, "cuDevicePrimaryCtxRelease_v2") == 0;
      if (released) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the release's caller is in the look
    CUcontext again = nullptr;
    ASSERT_EQ(cuDevicePrimaryCtxRetain(&again, 1), CUDA_SUCCESS);
    ASSERT_EQ(again, dev1);
    ASSERT_EQ(cuCtxPushCurrent(again), CUDA_SUCCESS);
    for (CUevent& e : mine) ASSERT_EQ(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    CUcontext out = nullptr;
    ASSERT_EQ(cuCtxPopCurrent(&out), CUDA_SUCCESS);
  });
  ASSERT_EQ(cuDevicePrimaryCtxRelease(1), CUDA_SUCCESS);  // the last
  other.join();
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the helper thread polls meanwhile
  const auto log = calls();
  long release = -1;
  for (size_t i = before; i < log.size() && release < 0; ++i) {
    if (std::strcmp(log[i].name, "cuDevicePrimaryCtxRelease_v2") == 0) release = static_cast<long>(i);
  }
  ASSERT_GE(release, 0);
  for (size_t i = static_cast<size_t>(release); i < log.size(); ++i) {
    for (CUevent e : mine) {
      EXPECT_NE(log[i].event, h(e)) << log[i].name << " on the program's event: the shim kept a dead context's event";
    }
  }
  EXPECT_TRUE(wait_idle()) << "the dead context's work is still counted in flight";
  ASSERT_EQ(cuCtxPushCurrent(dev1), CUDA_SUCCESS);
  for (CUevent e : mine) EXPECT_EQ(cuEventDestroy(e), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxPopCurrent(&popped), CUDA_SUCCESS);
  EXPECT_EQ(cuDevicePrimaryCtxRelease(1), CUDA_SUCCESS);
}

}  // namespace

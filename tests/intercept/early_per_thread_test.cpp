// Per-thread default-stream semantics asked for below the version that brought a name's per-thread
// variant (cuLaunchKernel with the flag at 4000; cuLaunchKernel_ptsz came at 7000). The shim has
// no per-thread wrapper there and used to pass the driver's answer through unwrapped: launches
// through it bypassed the shim's per-stream order. What the real driver answers there is
// unverified (GPU check f4 asks it), so the fake plays each possibility: the function it answers
// without the flag (the legacy wrapper is exact), or an entry point no table lists (handed out as
// the driver's, and the shim stops holding work back for good). The last test ends that way: keep
// it last (gtest runs a file's tests in order). Run twice by ctest (scheduled and pass-through).
#include "lookup_fixture.h"

namespace {

using namespace icpt_test;

using EarlyPerThread = ProcLookup;
constexpr cuuint64_t kPerThread = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;

TEST_F(EarlyPerThread, AnsweredWithTheLegacyFunctionItGetsTheLegacyWrapper) {
  fake_cuda_set_early_per_thread_answer(1);
  void* early = lookup("cuLaunchKernel", 4000, kPerThread);
  EXPECT_TRUE(in_shim(early)) << library_of(early);
  EXPECT_EQ(early, lookup("cuLaunchKernel", 4000));
  EXPECT_FALSE(holding_stopped());
  expect_best_effort_deferred_then_run();  // the shim still holds best-effort work back
}

TEST_F(EarlyPerThread, AnsweredWithAnUnlistedEntryPointTheShimStopsHoldingWork) {
  fake_cuda_set_early_per_thread_answer(2);
  hold_high_priority();
  ASSERT_EQ(launch(k_be_, be_, 1), CUDA_SUCCESS);
  expect_deferred(k_be_);
  void* early = lookup("cuLaunchKernel", 4000, kPerThread);
  EXPECT_EQ(early, reinterpret_cast<void*>(&fake_cuLaunchKernel_newer_abi)) << library_of(early);
  if (scheduled_) {
    EXPECT_TRUE(holding_stopped());
  }
  EXPECT_EQ(count_launches(calls(), k_be_), 1u) << "the held launch was not released before the handout";
  ASSERT_EQ(launch(k_be_, be_, 2), CUDA_SUCCESS);
  EXPECT_EQ(count_launches(calls(), k_be_), 2u) << "a best-effort launch was held after an unwrapped handout";
  fake_cuda_set_stream_busy(hp_, 0);
  EXPECT_EQ(cuStreamSynchronize(be_), CUDA_SUCCESS);
}

}  // namespace

// Issue 11: the device's SM count is not frozen at the shim's start. A program whose first call
// into the shim comes before any context is current (orion_is_active() at start-up) must still
// have the orion policy see the device's 132 SMs once a context exists. Run with the orion policy
// (set below, before the shim reads its settings at its first call).
#include <cstdlib>

#include "test_support.h"

namespace {

using namespace icpt_test;

// Runs before main, so before the shim's first call reads the environment.
const bool kOrionPolicy = [] {
  setenv("ORION_POLICY", "orion", 1);
  return true;
}();

TEST(SmCount, TheOrionPolicySeesTheDevicesSmsAfterAnEarlyFirstCall) {
  ASSERT_TRUE(kOrionPolicy);
  auto is_active = shim_fn<orion_is_active_fn>("orion_is_active");
  ASSERT_NE(is_active, nullptr) << "libgpu_scheduler.so is not loaded (LD_PRELOAD)";
  const bool scheduled = scheduled_mode();
  ASSERT_EQ(is_active() == 1, scheduled);  // the shim's first call: no context is current yet
  ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
  ASSERT_NE(use_device(0), nullptr);
  CUstream hp = nullptr, be = nullptr;
  ASSERT_EQ(cuStreamCreateWithPriority(&hp, 0, -5), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamCreateWithPriority(&be, 0, 0), CUDA_SUCCESS);
  CUfunction hp_k = fake_cuda_make_function("sm_hp", 0, nullptr);
  CUfunction be_a = fake_cuda_make_function("sm_be_a", 0, nullptr);
  CUfunction be_b = fake_cuda_make_function("sm_be_b", 0, nullptr);
  fake_cuda_set_stream_busy(hp, 1);
  fake_cuda_set_stream_busy(be, 1);  // the first best-effort kernel stays in flight too
  ASSERT_EQ(cuLaunchKernel(hp_k, 1, 1, 1, 128, 1, 1, 0, hp, nullptr, nullptr), CUDA_SUCCESS);
  // Two small best-effort kernels (one SM each) fit next to high priority on 132 SMs; on a
  // device the shim believed to have 1 SM the second one would wait.
  ASSERT_EQ(cuLaunchKernel(be_a, 2, 1, 1, 128, 1, 1, 0, be, nullptr, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(cuLaunchKernel(be_b, 2, 1, 1, 128, 1, 1, 0, be, nullptr, nullptr), CUDA_SUCCESS);
  auto log = calls();
  EXPECT_EQ(count_launches(log, be_a), 1u);
  EXPECT_EQ(count_launches(log, be_b), 1u) << "the policy saw a 1-SM device";
  fake_cuda_set_stream_busy(hp, 0);
  fake_cuda_set_stream_busy(be, 0);
  EXPECT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
  EXPECT_TRUE(wait_idle());
  EXPECT_EQ(cuStreamDestroy(hp), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamDestroy(be), CUDA_SUCCESS);
}

}  // namespace

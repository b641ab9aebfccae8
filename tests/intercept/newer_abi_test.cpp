// A driver newer than the shim's build: libcudart of a newer toolkit asks cuGetProcAddress for an
// entry point at a version above this build's CUDA_VERSION, and the driver answers with an ABI the
// shim's wrappers do not have (cudaTypedefs.h leaves each newest range open, so the shim used to
// hand out its older-ABI wrapper: wrong parameters). The shim asks again at its own version, hands
// the newer entry point out unwrapped, and, since calls through it bypass the shim, stops holding
// work back for good. A process of its own: that last state cannot be undone. Run twice by ctest
// (scheduled and pass-through).
#include <string>

#include "lookup_fixture.h"

namespace {

using namespace icpt_test;

using NewerAbi = NewerDriver;

TEST_F(NewerAbi, ANewerAbiIsHandedOutUnwrappedAndTheShimStopsHoldingWork) {
  // At this build's version, and above it for a function whose ABI did not change: the wrapper.
  EXPECT_TRUE(in_shim(lookup("cuLaunchKernel", CUDA_VERSION)));
  EXPECT_TRUE(in_shim(lookup("cuLaunchKernelEx", kNewer)));
  EXPECT_TRUE(in_shim(lookup("cuLaunchKernel", kNewer - 1)));  // no newer ABI yet at that version
  EXPECT_FALSE(holding_stopped());

  // An order-free function with a newer ABI (a query that sees no held work): the driver's entry
  // point, and the shim keeps holding work.
  void* attribute = lookup("cuDeviceGetAttribute", kNewer);
  EXPECT_EQ(attribute, reinterpret_cast<void*>(&fake_cuDeviceGetAttribute_newer_abi)) << library_of(attribute);
  EXPECT_TRUE(in_shim(lookup("cuDeviceGetAttribute", CUDA_VERSION)));
  int sms = 0;
  ASSERT_EQ(reinterpret_cast<decltype(&cuDeviceGetAttribute)>(attribute)(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, 0),
            CUDA_SUCCESS);
  EXPECT_GT(sms, 0);
  EXPECT_FALSE(holding_stopped()) << "an order-free function's newer ABI stopped the shim holding work";

  hold_high_priority();
  ASSERT_EQ(launch(k_be_, be_, 1), CUDA_SUCCESS);
  expect_deferred(k_be_);

  // The newer ABI: the driver's own entry point, never the older-ABI wrapper.
  void* newer = lookup("cuLaunchKernel", kNewer);
  EXPECT_EQ(newer, reinterpret_cast<void*>(&fake_cuLaunchKernel_newer_abi)) << library_of(newer);
  if (scheduled_) {
    EXPECT_TRUE(holding_stopped());
  }
  // What was held reached the driver at that moment, and nothing is held from then on.
  EXPECT_EQ(count_launches(calls(), k_be_), 1u) << "the held launch was not released";
  ASSERT_EQ(launch(k_be_, be_, 2), CUDA_SUCCESS);
  EXPECT_EQ(count_launches(calls(), k_be_), 2u) << "a best-effort launch was held after a newer ABI was handed out";

  // A launch through the newer entry point comes after every launch the program made before it.
  int a = 3;
  double b = 0.5;
  void* params[] = {&a, &b};
  ASSERT_EQ(reinterpret_cast<LaunchFn>(newer)(k_other_, 1, 1, 1, 32, 1, 1, 0, be_, params, nullptr), CUDA_SUCCESS);
  const auto log = calls();
  const long through_newer = find_named(log, "cuLaunchKernel_newer_abi", h(be_));
  ASSERT_GE(through_newer, 0);
  long last_be = -1;
  for (size_t i = 0; i < log.size(); ++i) {
    if (is_launch(log[i]) && log[i].function == reinterpret_cast<uint64_t>(k_be_)) last_be = static_cast<long>(i);
  }
  EXPECT_LT(last_be, through_newer);

  fake_cuda_set_stream_busy(hp_, 0);
  EXPECT_EQ(cuStreamSynchronize(be_), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamSynchronize(hp_), CUDA_SUCCESS);
}

}  // namespace

// A driver newer than the shim's build answers an order-free function that the shim wraps by hand
// with a newer ABI: cuEventCreate cannot observe held work, but its wrapper notes interprocess
// events, whose records the shim must never hold (another process waits on them). Handed out
// unwrapped, it leaves the shim blind to them, so the shim stops holding work, as for any other
// function it cannot wrap; an order-free function without such books (cuDeviceGetAttribute) keeps
// it holding. A process of its own: the stop cannot be undone. Run scheduled and pass-through.
#include "lookup_fixture.h"

namespace {

using namespace icpt_test;

using NewerAbiBookkeeping = NewerDriver;

TEST_F(NewerAbiBookkeeping, AnUnwrappedEventCreateStopsHoldingSoInterprocessRecordsAreNeverHeld) {
  ASSERT_NE(lookup("cuDeviceGetAttribute", kNewer), nullptr);
  EXPECT_FALSE(holding_stopped()) << "an order-free function without books of the shim stopped it holding work";

  void* create = lookup("cuEventCreate", kNewer);
  ASSERT_EQ(create, reinterpret_cast<void*>(&fake_cuEventCreate_newer_abi)) << library_of(create);
  if (scheduled_) {
    EXPECT_TRUE(holding_stopped()) << "cuEventCreate went out unwrapped and the shim kept holding work";
  }
  // An interprocess event the shim never saw created: its record on a best-effort stream behind
  // high-priority work reaches the driver before the call returns.
  CUevent ipc = nullptr;
  ASSERT_EQ(reinterpret_cast<decltype(&cuEventCreate)>(create)(&ipc, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING),
            CUDA_SUCCESS);
  hold_high_priority();
  ASSERT_EQ(cuEventRecord(ipc, be_), CUDA_SUCCESS);
  EXPECT_GE(find_named(calls(), "cuEventRecord", h(be_)), 0) << "the interprocess event's record was held";
  fake_cuda_set_stream_busy(hp_, 0);
  EXPECT_EQ(cuStreamSynchronize(be_), CUDA_SUCCESS);
  EXPECT_EQ(cuEventDestroy(ipc), CUDA_SUCCESS);
}

}  // namespace

// The fake driver's own rules (contexts, capture modes, event re-recording, mangled names), seen
// through the shim: the answers must be the driver's in both modes (errors reach the caller).
// These rules are what the shim's tests rely on to catch context and capture mistakes.
#include <thread>

#include "test_support.h"

namespace {

using namespace icpt_test;

class FakeDriverRules : public ShimTest {};

TEST_F(FakeDriverRules, EachThreadHasItsOwnContextStack) {
  CUcontext ctx0 = fake_cuda_primary_context(0), ctx1 = fake_cuda_primary_context(1);
  ASSERT_NE(ctx0, ctx1);
  CUcontext cur = nullptr;
  ASSERT_EQ(cuCtxGetCurrent(&cur), CUDA_SUCCESS);
  EXPECT_EQ(cur, ctx0);
  ASSERT_EQ(cuCtxPushCurrent(ctx1), CUDA_SUCCESS);
  CUdevice dev = -1;
  ASSERT_EQ(cuCtxGetDevice(&dev), CUDA_SUCCESS);
  EXPECT_EQ(dev, 1);
  std::thread other([&] {
    CUcontext none = ctx0;
    EXPECT_EQ(cuCtxGetCurrent(&none), CUDA_SUCCESS);
    EXPECT_EQ(none, nullptr) << "a new thread starts with no current context";
    CUdevice d = 0;
    EXPECT_EQ(cuCtxGetDevice(&d), CUDA_ERROR_INVALID_CONTEXT);
  });
  other.join();
  CUcontext popped = nullptr;
  ASSERT_EQ(cuCtxPopCurrent(&popped), CUDA_SUCCESS);
  EXPECT_EQ(popped, ctx1);
  ASSERT_EQ(cuCtxGetCurrent(&cur), CUDA_SUCCESS);
  EXPECT_EQ(cur, ctx0);
}

TEST_F(FakeDriverRules, StreamsEventsAndFunctionsBelongToTheirContext) {
  CUstream s0 = nullptr, s1 = nullptr;
  ASSERT_EQ(cuStreamCreate(&s0, 0), CUDA_SUCCESS);
  CUfunction f0 = fake_cuda_make_function("ctx0_kernel", 0, nullptr);
  CUevent e0 = nullptr;
  ASSERT_EQ(cuEventCreate(&e0, 0), CUDA_SUCCESS);
  ASSERT_NE(use_device(1), nullptr);
  ASSERT_EQ(cuStreamCreate(&s1, 0), CUDA_SUCCESS);
  CUfunction f1 = fake_cuda_make_function("ctx1_kernel", 0, nullptr);
  // Device 1 current: device 0's stream and function are foreign handles.
  EXPECT_EQ(cuLaunchKernel(f1, 1, 1, 1, 1, 1, 1, 0, s0, nullptr, nullptr), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cuLaunchKernel(f0, 1, 1, 1, 1, 1, 1, 0, s1, nullptr, nullptr), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cuLaunchKernel(f1, 1, 1, 1, 1, 1, 1, 0, s1, nullptr, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(cuEventRecord(e0, s1), CUDA_ERROR_INVALID_HANDLE) << "event and stream of two contexts";
  EXPECT_EQ(cuStreamWaitEvent(s1, e0, 0), CUDA_SUCCESS) << "a wait may name another context's event";
  EXPECT_EQ(cuStreamSynchronize(s1), CUDA_SUCCESS);
  ASSERT_NE(use_device(0), nullptr);
  std::thread no_context([&] {
    EXPECT_EQ(cuLaunchKernel(f0, 1, 1, 1, 1, 1, 1, 0, s0, nullptr, nullptr), CUDA_ERROR_INVALID_CONTEXT);
    CUevent e = nullptr;
    EXPECT_EQ(cuEventCreate(&e, 0), CUDA_ERROR_INVALID_CONTEXT);
  });
  no_context.join();
  EXPECT_EQ(cuStreamDestroy(s1), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamDestroy(s0), CUDA_SUCCESS);
  EXPECT_EQ(cuEventDestroy(e0), CUDA_SUCCESS);
}

TEST_F(FakeDriverRules, GlobalCaptureIsInvalidatedByAnotherThreadsQueryUnlessItIsRelaxed) {
  CUstream cap = nullptr, other = nullptr;
  ASSERT_EQ(cuStreamCreate(&cap, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamCreate(&other, 0), CUDA_SUCCESS);
  CUfunction f = fake_cuda_make_function("captured_kernel", 0, nullptr);
  auto query_from = [&](CUstreamCaptureMode mode) {
    CUresult rc = CUDA_SUCCESS;
    std::thread t([&] {
      ASSERT_NE(use_device(0), nullptr);
      CUstreamCaptureMode m = mode;
      ASSERT_EQ(cuThreadExchangeStreamCaptureMode(&m), CUDA_SUCCESS);
      rc = cuStreamQuery(other);
    });
    t.join();
    return rc;
  };
  // Relaxed: nothing is prohibited.
  ASSERT_EQ(cuStreamBeginCapture(cap, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  ASSERT_EQ(cuLaunchKernel(f, 1, 1, 1, 1, 1, 1, 0, cap, nullptr, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(query_from(CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  CUgraph g = nullptr;
  EXPECT_EQ(cuStreamEndCapture(cap, &g), CUDA_SUCCESS);
  auto log = calls();
  const long launch = find_launch(log, f);
  ASSERT_GE(launch, 0);
  EXPECT_EQ(log[launch].captured, 1) << "work on a capturing stream goes into the graph";
  // Global (every thread's default): the query invalidates the capture.
  ASSERT_EQ(cuStreamBeginCapture(cap, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  EXPECT_EQ(query_from(CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  EXPECT_EQ(cuStreamEndCapture(cap, &g), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  // Thread-local capture: another thread's query is fine.
  ASSERT_EQ(cuStreamBeginCapture(cap, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), CUDA_SUCCESS);
  EXPECT_EQ(query_from(CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamEndCapture(cap, &g), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamDestroy(cap), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamDestroy(other), CUDA_SUCCESS);
}

TEST_F(FakeDriverRules, AWaitBindsToTheRecordCurrentWhenItReachesTheDriver) {
  CUstream a = nullptr, b = nullptr;
  ASSERT_EQ(cuStreamCreate(&a, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamCreate(&b, 0), CUDA_SUCCESS);
  CUevent e = nullptr;
  ASSERT_EQ(cuEventCreate(&e, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuEventRecord(e, a), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamWaitEvent(b, e, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuEventRecord(e, b), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamWaitEvent(a, e, 0), CUDA_SUCCESS);
  std::vector<uint64_t> records, waits;
  for (const auto& c : calls()) {
    if (c.event != h(e)) continue;
    if (std::strcmp(c.name, "cuEventRecord") == 0) records.push_back(c.value);
    if (std::strcmp(c.name, "cuStreamWaitEvent") == 0) waits.push_back(c.value);
  }
  ASSERT_EQ(records.size(), 2u);
  ASSERT_EQ(waits.size(), 2u);
  EXPECT_NE(records[0], records[1]);
  EXPECT_EQ(waits[0], records[0]);
  EXPECT_EQ(waits[1], records[1]) << "a later record replaces the earlier one";
  EXPECT_EQ(cuEventDestroy(e), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamDestroy(a), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamDestroy(b), CUDA_SUCCESS);
}

TEST_F(FakeDriverRules, FunctionNamesAreTheLibrariesRealManglings) {
  const char* names[] = {kNcclAllReduceMangled, kNcclSymkName, kCublasName, kCudnnName, kTritonName};
  for (const char* n : names) {
    CUfunction f = fake_cuda_make_function(n, 0, nullptr);
    const char* got = nullptr;
    ASSERT_EQ(cuFuncGetName(&got, f), CUDA_SUCCESS);
    EXPECT_STREQ(got, n);
  }
}

}  // namespace

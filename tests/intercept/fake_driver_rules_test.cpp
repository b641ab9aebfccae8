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
  int blocks = 0;
  EXPECT_EQ(cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, f0, 128, 0), CUDA_ERROR_INVALID_HANDLE)
      << "occupancy of another context's function";
  EXPECT_EQ(cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, f1, 128, 0), CUDA_SUCCESS);
  EXPECT_GT(blocks, 0);
  EXPECT_EQ(cuStreamSynchronize(s1), CUDA_SUCCESS);
  ASSERT_NE(use_device(0), nullptr);
  std::thread no_context([&] {
    EXPECT_EQ(cuLaunchKernel(f0, 1, 1, 1, 1, 1, 1, 0, s0, nullptr, nullptr), CUDA_ERROR_INVALID_CONTEXT);
    int none = 0;
    EXPECT_EQ(cuOccupancyMaxActiveBlocksPerMultiprocessor(&none, f0, 128, 0), CUDA_ERROR_INVALID_CONTEXT)
        << "occupancy is the current context's (the shim's helper thread has none)";
    CUevent e = nullptr;
    EXPECT_EQ(cuEventCreate(&e, 0), CUDA_ERROR_INVALID_CONTEXT);
  });
  no_context.join();
  EXPECT_EQ(cuStreamDestroy(s1), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamDestroy(s0), CUDA_SUCCESS);
  // A destroyed stream's handle: work on it fails (held work the shim submitted after the
  // destroy would show), and nothing waits for it any more.
  EXPECT_EQ(cuLaunchKernel(f0, 1, 1, 1, 1, 1, 1, 0, s0, nullptr, nullptr), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cuEventRecord(e0, s0), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cuStreamQuery(s0), CUDA_ERROR_INVALID_HANDLE);
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

// Rules of every capture mode (relaxed here, so that no thread-mode rule applies): synchronizing
// a context that encompasses an active capture is invalid and invalidates it (CUDA programming
// guide); beside a blocking stream's capture the legacy stream is unusable, and asking whether
// it captures answers CUDA_ERROR_STREAM_CAPTURE_IMPLICIT without invalidating the capture (cuda.h).
TEST_F(FakeDriverRules, ACaptureMakesItsContextAndTheLegacyStreamUnusable) {
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  ASSERT_EQ(cuThreadExchangeStreamCaptureMode(&mode), CUDA_SUCCESS);
  CUstream non_blocking = nullptr, blocking = nullptr;
  ASSERT_EQ(cuStreamCreate(&non_blocking, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamCreate(&blocking, CU_STREAM_DEFAULT), CUDA_SUCCESS);
  CUgraph graph = nullptr;
  ASSERT_EQ(cuStreamBeginCapture(non_blocking, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  EXPECT_EQ(cuCtxSynchronize(), CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  EXPECT_EQ(cuStreamEndCapture(non_blocking, &graph), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
  ASSERT_EQ(cuStreamBeginCapture(blocking, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamIsCapturing(CU_STREAM_LEGACY, &status), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
  EXPECT_EQ(cuStreamEndCapture(blocking, &graph), CUDA_SUCCESS) << "asking does not invalidate the capture";
  ASSERT_EQ(cuStreamBeginCapture(blocking, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamQuery(CU_STREAM_LEGACY), CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
  EXPECT_EQ(cuStreamEndCapture(blocking, &graph), CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  EXPECT_EQ(cuStreamIsCapturing(CU_STREAM_LEGACY, &status), CUDA_SUCCESS);
  EXPECT_EQ(status, CU_STREAM_CAPTURE_STATUS_NONE);
  EXPECT_EQ(cuCtxSynchronize(), CUDA_SUCCESS) << "no capture any more";
  EXPECT_EQ(cuStreamDestroy(blocking), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamDestroy(non_blocking), CUDA_SUCCESS);
  ASSERT_EQ(cuThreadExchangeStreamCaptureMode(&mode), CUDA_SUCCESS);
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

// cuEventElapsedTime: CUDA_ERROR_INVALID_HANDLE "if either event was created with the
// CU_EVENT_DISABLE_TIMING flag" (the shim's timing events must never carry it). A record keeps the
// event's creation flags (the fake's records used to clear them, CU_EVENT_INTERPROCESS too).
TEST_F(FakeDriverRules, ElapsedTimeNeedsTwoTimingEvents) {
  CUevent a = nullptr, b = nullptr, untimed = nullptr;
  ASSERT_EQ(cuEventCreate(&a, CU_EVENT_DEFAULT), CUDA_SUCCESS);
  ASSERT_EQ(cuEventCreate(&b, CU_EVENT_DEFAULT), CUDA_SUCCESS);
  ASSERT_EQ(cuEventCreate(&untimed, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
  for (CUevent e : {a, b, untimed}) ASSERT_EQ(cuEventRecord(e, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
  float ms = -1;
  EXPECT_EQ(cuEventElapsedTime(&ms, a, b), CUDA_SUCCESS);
  EXPECT_GE(ms, 0.0f);
  EXPECT_EQ(cuEventElapsedTime(&ms, a, untimed), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cuEventElapsedTime(&ms, untimed, b), CUDA_ERROR_INVALID_HANDLE);
  for (CUevent e : {a, b, untimed}) EXPECT_EQ(cuEventDestroy(e), CUDA_SUCCESS);
}

// A graph executable is what instantiation made it (the driver copies the graph): it outlives its
// graph, is edited only through the graph's own nodes, is updated only from a graph of the same
// shape, and a handle the driver never made or already destroyed is refused. The shim's tests used
// made-up executables before, which no real driver accepts.
TEST_F(FakeDriverRules, GraphExecutablesLiveFromInstantiationToDestruction) {
  CUevent e = nullptr;
  CUstream s = nullptr;
  ASSERT_EQ(cuEventCreate(&e, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamCreateWithPriority(&s, CU_STREAM_NON_BLOCKING, -5), CUDA_SUCCESS);
  CUgraph graph = nullptr, other = nullptr;
  CUgraphNode record = nullptr, foreign = nullptr;
  ASSERT_EQ(cuGraphCreate(&graph, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuGraphAddEventRecordNode(&record, graph, nullptr, 0, e), CUDA_SUCCESS);
  ASSERT_EQ(cuGraphCreate(&other, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuGraphAddEmptyNode(&foreign, other, nullptr, 0), CUDA_SUCCESS);
  CUgraphExec exec = nullptr;
  ASSERT_EQ(cuGraphInstantiateWithFlags(&exec, graph, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuGraphDestroy(graph), CUDA_SUCCESS);

  // Its event-record node records where the launch sits, the graph gone or not.
  fake_cuda_set_stream_busy(s, 1);
  ASSERT_EQ(cuGraphLaunch(exec, s), CUDA_SUCCESS);
  EXPECT_EQ(cuEventQuery(e), CUDA_ERROR_NOT_READY) << "the executable lost its event-record node with its graph";
  fake_cuda_set_stream_busy(s, 0);
  ASSERT_EQ(cuStreamSynchronize(s), CUDA_SUCCESS);
  EXPECT_EQ(cuEventQuery(e), CUDA_SUCCESS);

  EXPECT_EQ(cuGraphNodeSetEnabled(exec, foreign, 0), CUDA_ERROR_INVALID_VALUE) << "a node of another graph";
  CUDA_KERNEL_NODE_PARAMS kernel{};
  EXPECT_EQ(cuGraphExecKernelNodeSetParams(exec, record, &kernel), CUDA_ERROR_INVALID_VALUE) << "not a kernel node";
  CUgraphExecUpdateResultInfo info{};
  EXPECT_EQ(cuGraphExecUpdate(exec, other, &info), CUDA_ERROR_GRAPH_EXEC_UPDATE_FAILURE) << "another node type";

  const auto made_up = reinterpret_cast<CUgraphExec>(0x4242);
  EXPECT_EQ(cuGraphLaunch(made_up, s), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cuGraphUpload(made_up, s), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cuGraphExecDestroy(exec), CUDA_SUCCESS);
  EXPECT_EQ(cuGraphLaunch(exec, s), CUDA_ERROR_INVALID_HANDLE) << "a destroyed executable";
  EXPECT_EQ(cuGraphExecDestroy(exec), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cuGraphInstantiateWithFlags(&exec, reinterpret_cast<CUgraph>(0x4343), 0), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuGraphInstantiateWithFlags(&exec, graph, 0), CUDA_ERROR_INVALID_VALUE) << "a destroyed graph";

  // A capture's graph is a graph like any other: instantiated, launched and destroyed.
  CUgraph captured = nullptr;
  ASSERT_EQ(cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamEndCapture(s, &captured), CUDA_SUCCESS);
  ASSERT_EQ(cuGraphInstantiateWithFlags(&exec, captured, 0), CUDA_SUCCESS);
  EXPECT_EQ(cuGraphLaunch(exec, s), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamSynchronize(s), CUDA_SUCCESS);
  EXPECT_EQ(cuGraphExecDestroy(exec), CUDA_SUCCESS);
  EXPECT_EQ(cuGraphDestroy(captured), CUDA_SUCCESS);
  EXPECT_EQ(cuGraphDestroy(other), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamDestroy(s), CUDA_SUCCESS);
  EXPECT_EQ(cuEventDestroy(e), CUDA_SUCCESS);
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

// Green contexts as the driver documents them (what the partition policy's tests rely on): a
// split rounds up to the device's granularity and cannot be split again, a descriptor takes one
// split, the required flags are required, and a green context is a context of its own: a
// module's CUfunction does not launch in it, a CUkernel does, and events record only on streams
// of their own context.
TEST_F(FakeDriverRules, GreenContextsFollowTheDriversRules) {
  CUdevResource all{}, groups[4]{}, rest{};
  ASSERT_EQ(cuDeviceGetDevResource(0, &all, CU_DEV_RESOURCE_TYPE_SM), CUDA_SUCCESS);
  EXPECT_EQ(all.sm.smCount, 132u);
  EXPECT_EQ(all.sm.minSmPartitionSize, 8u);
  unsigned n = 0;
  ASSERT_EQ(cuDevSmResourceSplitByCount(nullptr, &n, &all, nullptr, 0, 20), CUDA_SUCCESS);
  EXPECT_EQ(n, 5u) << "20 SMs round up to 24 (multiples of 8): 5 groups of 132";
  n = 1;
  ASSERT_EQ(cuDevSmResourceSplitByCount(groups, &n, &all, &rest, 0, 20), CUDA_SUCCESS);
  EXPECT_EQ(groups[0].sm.smCount, 24u);
  EXPECT_EQ(rest.sm.smCount, 108u);
  n = 1;
  EXPECT_EQ(cuDevSmResourceSplitByCount(&groups[1], &n, &groups[0], nullptr, 0, 8),
            CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION) << "a split's output cannot be split again";
  EXPECT_EQ(cuDevSmResourceSplitByCount(groups, &n, &all, nullptr, 0, 200), CUDA_ERROR_INVALID_VALUE);
  CUdevResource other{};
  n = 1;
  ASSERT_EQ(cuDevSmResourceSplitByCount(&other, &n, &all, nullptr, 0, 8), CUDA_SUCCESS);
  CUdevResource mixed[2] = {groups[0], other};
  CUdevResourceDesc desc = nullptr;
  EXPECT_EQ(cuDevResourceGenerateDesc(&desc, mixed, 2), CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION)
      << "resources of two splits in one descriptor";
  ASSERT_EQ(cuDevResourceGenerateDesc(&desc, groups, 1), CUDA_SUCCESS);
  CUgreenCtx green = nullptr;
  EXPECT_EQ(cuGreenCtxCreate(&green, desc, 0, 0), CUDA_ERROR_INVALID_VALUE) << "CU_GREEN_CTX_DEFAULT_STREAM is required";
  EXPECT_EQ(cuGreenCtxCreate(&green, desc, 1, CU_GREEN_CTX_DEFAULT_STREAM), CUDA_ERROR_INVALID_DEVICE);
  ASSERT_EQ(cuGreenCtxCreate(&green, desc, 0, CU_GREEN_CTX_DEFAULT_STREAM), CUDA_SUCCESS);
  CUcontext gctx = nullptr;
  ASSERT_EQ(cuCtxFromGreenCtx(&gctx, green), CUDA_SUCCESS);
  EXPECT_NE(reinterpret_cast<uintptr_t>(gctx), reinterpret_cast<uintptr_t>(green));
  EXPECT_EQ(fake_cuda_context_sm_count(gctx), 24);
  CUstream gs = nullptr;
  EXPECT_EQ(cuGreenCtxStreamCreate(&gs, green, 0, 0), CUDA_ERROR_INVALID_VALUE) << "CU_STREAM_NON_BLOCKING is required";
  ASSERT_EQ(cuGreenCtxStreamCreate(&gs, green, CU_STREAM_NON_BLOCKING, 0), CUDA_SUCCESS);
  CUcontext of_stream = nullptr;
  ASSERT_EQ(cuStreamGetCtx(gs, &of_stream), CUDA_SUCCESS);
  EXPECT_EQ(of_stream, gctx) << "the stream belongs to the green context whatever was current";
  CUfunction module_fn = fake_cuda_make_function("module_kernel", 0, nullptr);
  CUfunction lib_kernel = reinterpret_cast<CUfunction>(fake_cuda_make_kernel(fake_cuda_make_module(), "lib_kernel", 0, nullptr));
  CUevent primary_event = nullptr;
  ASSERT_EQ(cuEventCreate(&primary_event, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxPushCurrent(gctx), CUDA_SUCCESS);
  EXPECT_EQ(cuLaunchKernel(module_fn, 1, 1, 1, 32, 1, 1, 0, gs, nullptr, nullptr), CUDA_ERROR_INVALID_HANDLE)
      << "a module's function is bound to the context that loaded it";
  EXPECT_EQ(cuLaunchKernel(lib_kernel, 1, 1, 1, 32, 1, 1, 0, gs, nullptr, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(cuEventRecord(primary_event, gs), CUDA_ERROR_INVALID_HANDLE) << "an event of another context";
  EXPECT_EQ(fake_cuda_green_ctx_violations(), 0u);
  std::thread second([&] {
    ASSERT_EQ(cuCtxSetCurrent(gctx), CUDA_SUCCESS);
    EXPECT_EQ(fake_cuda_green_ctx_violations(), 1u) << "current on two threads at once is counted";
    ASSERT_EQ(cuCtxSetCurrent(nullptr), CUDA_SUCCESS);
  });
  second.join();
  CUcontext popped = nullptr;
  ASSERT_EQ(cuCtxPopCurrent(&popped), CUDA_SUCCESS);
  EXPECT_EQ(popped, gctx);
  EXPECT_EQ(cuStreamWaitEvent(gs, primary_event, 0), CUDA_ERROR_INVALID_HANDLE)
      << "the green context's stream is used with the green context current";
  ASSERT_EQ(cuCtxPushCurrent(gctx), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamDestroy(gs), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxPopCurrent(&popped), CUDA_SUCCESS);
  EXPECT_EQ(cuGreenCtxDestroy(green), CUDA_SUCCESS);
  EXPECT_EQ(cuCtxFromGreenCtx(&gctx, green), CUDA_ERROR_INVALID_CONTEXT);
  EXPECT_EQ(cuEventDestroy(primary_event), CUDA_SUCCESS);
}

// Primary contexts count retains: the last release (a green context's destroy releases the one
// its creation took) or a reset ends one: its streams go, work in it answers
// CUDA_ERROR_CONTEXT_IS_DESTROYED, cuDevicePrimaryCtxGetState reports it inactive, until a retain
// makes it active again under the same handle. A destroyed green context's streams answer
// CUDA_ERROR_CONTEXT_IS_DESTROYED, cuStreamDestroy included (CUDA 13's cuda.h).
// "The legacy default stream is an implicit stream which synchronizes with all other streams in
// the same CUcontext except for non-blocking streams": each context has its own, blind to the
// blocking streams of every other context (the fake's virtual clocks say which work waited).
TEST_F(FakeDriverRules, EachContextHasItsOwnLegacyStream) {
  CUstream blocking0 = nullptr, blocking1 = nullptr;
  ASSERT_EQ(cuStreamCreate(&blocking0, 0), CUDA_SUCCESS);
  CUfunction k0 = fake_cuda_make_function("legacy_order_kernel", 0, nullptr);
  fake_cuda_set_kernel_duration_ns(k0, 1'000'000);
  ASSERT_NE(use_device(1), nullptr);
  ASSERT_EQ(cuStreamCreate(&blocking1, 0), CUDA_SUCCESS);
  CUfunction k1 = fake_cuda_make_function("long_kernel_of_device_1", 0, nullptr);
  constexpr int64_t kLong = 1'000'000'000'000;  // far past anything earlier tests queued
  fake_cuda_set_kernel_duration_ns(k1, kLong);
  ASSERT_EQ(cuLaunchKernel(k1, 1, 1, 1, 32, 1, 1, 0, blocking1, nullptr, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);  // whatever the shim held is at the driver
  const int64_t device1_busy_until = fake_cuda_stream_time_ns(blocking1);
  ASSERT_GE(device1_busy_until, kLong);

  ASSERT_NE(use_device(0), nullptr);
  ASSERT_EQ(cuLaunchKernel(k0, 1, 1, 1, 32, 1, 1, 0, CU_STREAM_LEGACY, nullptr, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
  const int64_t legacy0 = fake_cuda_stream_time_ns(CU_STREAM_LEGACY);
  EXPECT_LT(legacy0, device1_busy_until) << "device 0's legacy stream waited for a blocking stream of device 1";
  ASSERT_EQ(cuLaunchKernel(k0, 1, 1, 1, 32, 1, 1, 0, blocking0, nullptr, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
  EXPECT_GE(fake_cuda_stream_time_ns(blocking0), legacy0 + 1'000'000)
      << "a blocking stream did not wait for its context's legacy stream";

  ASSERT_NE(use_device(1), nullptr);
  CUfunction k1_short = fake_cuda_make_function("legacy_order_kernel_of_device_1", 0, nullptr);
  ASSERT_EQ(cuLaunchKernel(k1_short, 1, 1, 1, 32, 1, 1, 0, nullptr, nullptr, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
  EXPECT_GT(fake_cuda_stream_time_ns(CU_STREAM_LEGACY), device1_busy_until)
      << "device 1's legacy stream did not wait for its own blocking stream";
  EXPECT_EQ(cuStreamDestroy(blocking1), CUDA_SUCCESS);
  ASSERT_NE(use_device(0), nullptr);
  EXPECT_EQ(cuStreamDestroy(blocking0), CUDA_SUCCESS);
}

TEST_F(FakeDriverRules, PrimaryContextsEndAtTheirLastReleaseOrAReset) {
  auto active = [](CUdevice d) {
    unsigned flags = 0;
    int a = -1;
    EXPECT_EQ(cuDevicePrimaryCtxGetState(d, &flags, &a), CUDA_SUCCESS);
    return a;
  };
  const CUfunction lib_kernel =
      reinterpret_cast<CUfunction>(fake_cuda_make_kernel(fake_cuda_make_module(), "any_context_kernel", 0, nullptr));
  CUcontext dev1 = nullptr, again = nullptr, popped = nullptr;
  release_primary_retains(1);
  ASSERT_EQ(fake_cuda_primary_retains(1), 0);
  ASSERT_EQ(cuDevicePrimaryCtxRetain(&dev1, 1), CUDA_SUCCESS);
  ASSERT_EQ(cuDevicePrimaryCtxRetain(&again, 1), CUDA_SUCCESS);
  EXPECT_EQ(again, dev1);
  ASSERT_EQ(cuCtxPushCurrent(dev1), CUDA_SUCCESS);
  CUstream s = nullptr;
  ASSERT_EQ(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  EXPECT_EQ(cuDevicePrimaryCtxRelease(1), CUDA_SUCCESS);
  EXPECT_EQ(active(1), 1) << "one retain left";
  EXPECT_EQ(cuLaunchKernel(lib_kernel, 1, 1, 1, 32, 1, 1, 0, s, nullptr, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(cuDevicePrimaryCtxRelease(1), CUDA_SUCCESS);
  EXPECT_EQ(active(1), 0) << "the last release ends it";
  EXPECT_EQ(cuLaunchKernel(lib_kernel, 1, 1, 1, 32, 1, 1, 0, s, nullptr, nullptr), CUDA_ERROR_CONTEXT_IS_DESTROYED);
  EXPECT_EQ(cuDevicePrimaryCtxRelease(1), CUDA_ERROR_INVALID_CONTEXT) << "released more often than retained";
  ASSERT_EQ(cuDevicePrimaryCtxRetain(&again, 1), CUDA_SUCCESS);
  EXPECT_EQ(again, dev1) << "active again under the same handle";
  EXPECT_EQ(active(1), 1);
  EXPECT_EQ(cuLaunchKernel(lib_kernel, 1, 1, 1, 32, 1, 1, 0, s, nullptr, nullptr), CUDA_ERROR_INVALID_HANDLE)
      << "the old context's stream went with it";
  ASSERT_EQ(cuStreamCreate(&s, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  EXPECT_EQ(cuDevicePrimaryCtxReset(1), CUDA_SUCCESS);
  EXPECT_EQ(active(1), 0) << "a reset ends it";
  EXPECT_EQ(cuLaunchKernel(lib_kernel, 1, 1, 1, 32, 1, 1, 0, s, nullptr, nullptr), CUDA_ERROR_CONTEXT_IS_DESTROYED);
  ASSERT_EQ(cuDevicePrimaryCtxRetain(&again, 1), CUDA_SUCCESS);
  EXPECT_EQ(cuDevicePrimaryCtxRelease(1), CUDA_SUCCESS);
  EXPECT_EQ(active(1), 1) << "a reset does not release: the retain from before it still holds";
  EXPECT_EQ(cuDevicePrimaryCtxRelease(1), CUDA_SUCCESS);
  EXPECT_EQ(active(1), 0);
  ASSERT_EQ(cuCtxPopCurrent(&popped), CUDA_SUCCESS);

  // A green context holds a retain of its device's primary context until its destroy.
  CUdevResource all{}, part{};
  unsigned n = 1;
  ASSERT_EQ(cuDeviceGetDevResource(1, &all, CU_DEV_RESOURCE_TYPE_SM), CUDA_SUCCESS);
  ASSERT_EQ(cuDevSmResourceSplitByCount(&part, &n, &all, nullptr, 0, 8), CUDA_SUCCESS);
  CUdevResourceDesc desc = nullptr;
  ASSERT_EQ(cuDevResourceGenerateDesc(&desc, &part, 1), CUDA_SUCCESS);
  ASSERT_EQ(cuDevicePrimaryCtxRetain(&again, 1), CUDA_SUCCESS);
  CUgreenCtx green = nullptr;
  ASSERT_EQ(cuGreenCtxCreate(&green, desc, 1, CU_GREEN_CTX_DEFAULT_STREAM), CUDA_SUCCESS);
  EXPECT_EQ(cuDevicePrimaryCtxRelease(1), CUDA_SUCCESS);
  EXPECT_EQ(active(1), 1) << "the green context's retain holds it";
  CUcontext gctx = nullptr;
  ASSERT_EQ(cuCtxFromGreenCtx(&gctx, green), CUDA_SUCCESS);
  CUstream gs = nullptr;
  ASSERT_EQ(cuGreenCtxStreamCreate(&gs, green, CU_STREAM_NON_BLOCKING, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuGreenCtxDestroy(green), CUDA_SUCCESS);
  EXPECT_EQ(active(1), 0) << "the green context's destroy was the last release";
  EXPECT_EQ(cuCtxPushCurrent(gctx), CUDA_ERROR_INVALID_CONTEXT) << "the green context is gone";
  EXPECT_EQ(cuLaunchKernel(lib_kernel, 1, 1, 1, 32, 1, 1, 0, gs, nullptr, nullptr), CUDA_ERROR_CONTEXT_IS_DESTROYED);
  EXPECT_EQ(cuStreamDestroy(gs), CUDA_ERROR_CONTEXT_IS_DESTROYED) << "its streams leak";
}

// Modules from PTX text: each entry a function of the current context, its parameters laid out
// from their declarations (arrays, .align); an entry without a list takes none; what the fake
// cannot size is refused; the module ends with its context.
TEST_F(FakeDriverRules, ModulesFromPtxLayOutParametersAndEndWithTheirContext) {
  const char* ptx = R"(.version 7.8
.target sm_80
.address_size 64
.visible .entry no_params
{
  ret;
}
.visible .entry laid_out(.param .u32 a, .param .u32 b[3], .param .align 16 .b8 c[20], .param .u64 d)
{
  ret;
}
)";
  CUcontext created = nullptr;
  ASSERT_EQ(cuCtxCreate(&created, nullptr, 0, 0), CUDA_SUCCESS);
  CUmodule m = nullptr;
  ASSERT_EQ(cuModuleLoadData(&m, ptx), CUDA_SUCCESS);
  CUfunction none = nullptr, laid = nullptr, missing = nullptr;
  ASSERT_EQ(cuModuleGetFunction(&none, m, "no_params"), CUDA_SUCCESS);
  ASSERT_EQ(cuModuleGetFunction(&laid, m, "laid_out"), CUDA_SUCCESS);
  EXPECT_EQ(cuModuleGetFunction(&missing, m, "nowhere"), CUDA_ERROR_NOT_FOUND);
  size_t off = 0, size = 0;
  EXPECT_EQ(cuFuncGetParamInfo(none, 0, &off, &size), CUDA_ERROR_INVALID_VALUE) << "the next entry's list is not its own";
  const size_t want[][2] = {{0, 4}, {4, 12}, {16, 20}, {40, 8}};
  for (size_t i = 0; i < 4; ++i) {
    ASSERT_EQ(cuFuncGetParamInfo(laid, i, &off, &size), CUDA_SUCCESS) << i;
    EXPECT_EQ(off, want[i][0]) << "parameter " << i;
    EXPECT_EQ(size, want[i][1]) << "parameter " << i;
  }
  const char* name = nullptr;
  ASSERT_EQ(cuFuncGetName(&name, laid), CUDA_SUCCESS);
  EXPECT_STREQ(name, "laid_out");
  CUmodule bad = nullptr;
  EXPECT_EQ(cuModuleLoadData(&bad, ".version 7.8\n.visible .entry k(.param .f128 x)\n{ ret; }"), CUDA_ERROR_INVALID_PTX)
      << "a type the fake cannot size";
  EXPECT_EQ(cuModuleLoadData(&bad, ".version 7.8\n.visible .entry k(.param .u32 x[ ])\n{ ret; }"), CUDA_ERROR_INVALID_PTX);
  EXPECT_EQ(cuModuleLoadData(&bad, ".visible .entry k()\n{ ret; }"), CUDA_ERROR_INVALID_PTX) << "no .version";
  // The module and its functions end with the context.
  CUcontext popped = nullptr;
  ASSERT_EQ(cuCtxPopCurrent(&popped), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxDestroy(created), CUDA_SUCCESS);
  CUfunction after = nullptr;
  EXPECT_EQ(cuModuleGetFunction(&after, m, "laid_out"), CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cuModuleUnload(m), CUDA_ERROR_INVALID_HANDLE) << "unloaded with its context";
}

}  // namespace

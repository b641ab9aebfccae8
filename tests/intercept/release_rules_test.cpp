// The shim against issue 24's findings: calls it did not wrap (frees, context events, ...) let
// work it held back run after them. Every driver function is now interposed and classified
// (intercept/src/driver_api_classes.csv); a release_all call first hands everything held to the
// driver. Each test fails on c9effad's shim. Graph executables: graph_release_rules_test.cpp.
// Run twice by ctest: scheduled and pass-through.
#include <cerrno>
#include <chrono>
#include <latch>
#include <cstdlib>
#include <thread>

#include "release_rules_fixture.h"

namespace {

using namespace icpt_test;

// Finding 3: cudaMemcpyAsync from pinned memory, then cudaFreeHost, is legal CUDA: the copy
// must read the memory before it is freed. The shim held the copy and let the free pass.
TEST_F(ReleaseRules, FreeingPinnedHostMemoryFirstReleasesTheCopyThatReadsIt) {
  void* host = nullptr;
  ASSERT_EQ(cuMemAllocHost(&host, 4096), CUDA_SUCCESS);
  hold_high_priority();
  ASSERT_EQ(cuMemcpyHtoDAsync(kDev, host, 4096, be_), CUDA_SUCCESS);
  expect_held("cuMemcpyHtoDAsync_v2", be_);
  ASSERT_EQ(cuMemFreeHost(host), CUDA_SUCCESS);
  auto log = calls();
  const long copy = find_named(log, "cuMemcpyHtoDAsync_v2", h(be_));
  const long freed = find_any(log, "cuMemFreeHost");
  ASSERT_GE(copy, 0) << "the held copy did not reach the driver before the free";
  EXPECT_LT(copy, freed);
  EXPECT_EQ(log[copy].result, CUDA_SUCCESS);
  fake_cuda_set_stream_busy(hp_, 0);
  EXPECT_EQ(cuStreamSynchronize(be_), CUDA_SUCCESS);
  EXPECT_EQ(fake_cuda_host_use_after_free(), 0u);
}

// CUDA runs a copy from host memory to host memory before the call returns, pinned or not (the
// API's synchronization rules: "fully synchronous with respect to the host"): the caller may read
// dst or refill src at once. The shim held such a copy when both sides were pinned.
TEST_F(ReleaseRules, AHostToHostCopyIsNeverHeld) {
  void* src = nullptr;
  void* dst = nullptr;
  ASSERT_EQ(cuMemAllocHost(&src, 256), CUDA_SUCCESS);
  ASSERT_EQ(cuMemAllocHost(&dst, 256), CUDA_SUCCESS);
  hold_high_priority();
  ASSERT_EQ(cuMemcpyHtoDAsync(kDev, src, 256, be_), CUDA_SUCCESS);  // pinned to device: held
  expect_held("cuMemcpyHtoDAsync_v2", be_);
  ASSERT_EQ(cuMemcpyAsync(reinterpret_cast<CUdeviceptr>(dst), reinterpret_cast<CUdeviceptr>(src), 256, be_),
            CUDA_SUCCESS);
  const auto log = calls();
  const long copy = find_named(log, "cuMemcpyAsync", h(be_));
  ASSERT_GE(copy, 0) << "the host-to-host copy was held past its call";
  EXPECT_LT(find_named(log, "cuMemcpyHtoDAsync_v2", h(be_)), copy);  // in stream order
  fake_cuda_set_stream_busy(hp_, 0);
  EXPECT_EQ(cuStreamSynchronize(be_), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFreeHost(src), CUDA_SUCCESS);
  EXPECT_EQ(cuMemFreeHost(dst), CUDA_SUCCESS);
}

TEST_F(ReleaseRules, UnregisteringHostMemoryFirstReleasesTheCopyThatWritesIt) {
  static char buffer[8192];
  ASSERT_EQ(cuMemHostRegister(buffer, sizeof buffer, 0), CUDA_SUCCESS);
  hold_high_priority();
  ASSERT_EQ(cuMemcpyDtoHAsync(buffer, kDev, sizeof buffer, be_), CUDA_SUCCESS);
  expect_held("cuMemcpyDtoHAsync_v2", be_);
  ASSERT_EQ(cuMemHostUnregister(buffer), CUDA_SUCCESS);
  auto log = calls();
  const long copy = find_named(log, "cuMemcpyDtoHAsync_v2", h(be_));
  ASSERT_GE(copy, 0);
  EXPECT_LT(copy, find_any(log, "cuMemHostUnregister"));
  fake_cuda_set_stream_busy(hp_, 0);
  EXPECT_EQ(cuStreamSynchronize(be_), CUDA_SUCCESS);
  EXPECT_EQ(fake_cuda_host_use_after_free(), 0u);
}

// The fake enforces the rule the tests above rely on: a copy that reaches the driver after its
// host memory was freed fails (so the tests above could fail).
TEST_F(ReleaseRules, TheFakeDriverFailsACopyFromFreedHostMemory) {
  void* host = nullptr;
  ASSERT_EQ(cuMemAllocHost(&host, 256), CUDA_SUCCESS);
  ASSERT_EQ(cuMemFreeHost(host), CUDA_SUCCESS);
  using CopyFn = CUresult (*)(CUdeviceptr, const void*, size_t, CUstream);
  auto copy = reinterpret_cast<CopyFn>(fake_cuda_own_symbol("cuMemcpyHtoDAsync_v2"));
  ASSERT_NE(copy, nullptr);
  const uint64_t before = fake_cuda_host_use_after_free();
  EXPECT_EQ(copy(kDev, host, 256, plain_), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(fake_cuda_host_use_after_free(), before + 1);
  // Every copy with a host side the shim may hold: unified (either side), and array copies.
  using UnifiedFn = CUresult (*)(CUdeviceptr, CUdeviceptr, size_t, CUstream);
  auto unified = reinterpret_cast<UnifiedFn>(fake_cuda_own_symbol("cuMemcpyAsync"));
  ASSERT_NE(unified, nullptr);
  EXPECT_EQ(unified(kDev, reinterpret_cast<CUdeviceptr>(host), 256, plain_), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(unified(reinterpret_cast<CUdeviceptr>(host), kDev, 256, plain_), CUDA_ERROR_INVALID_VALUE);
  using ToArrayFn = CUresult (*)(CUarray, size_t, const void*, size_t, CUstream);
  auto to_array = reinterpret_cast<ToArrayFn>(fake_cuda_own_symbol("cuMemcpyHtoAAsync_v2"));
  using FromArrayFn = CUresult (*)(void*, CUarray, size_t, size_t, CUstream);
  auto from_array = reinterpret_cast<FromArrayFn>(fake_cuda_own_symbol("cuMemcpyAtoHAsync_v2_ptsz"));
  ASSERT_NE(to_array, nullptr);
  ASSERT_NE(from_array, nullptr);
  EXPECT_EQ(to_array(nullptr, 0, host, 256, plain_), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(from_array(host, nullptr, 0, 256, plain_), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(fake_cuda_host_use_after_free(), before + 5);
  EXPECT_EQ(unified(kDev, kDev, 256, plain_), CUDA_SUCCESS) << "device memory on both sides";
}

// CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION answers the last location the program asked to
// prefetch the range to: a held prefetch goes to the driver before the question.
TEST_F(ReleaseRules, AskingARangesAttributesFirstReleasesAHeldPrefetch) {
  hold_high_priority();
  CUmemLocation device0{};
  device0.type = CU_MEM_LOCATION_TYPE_DEVICE;
  device0.id = 0;
  ASSERT_EQ(cuMemPrefetchAsync(0x5000, 4096, device0, 0, be_), CUDA_SUCCESS);  // the _v2 symbol
  expect_held("cuMemPrefetchAsync_v2", be_);
  int location = -1;
  ASSERT_EQ(cuMemRangeGetAttribute(&location, sizeof location, CU_MEM_RANGE_ATTRIBUTE_LAST_PREFETCH_LOCATION,
                                   0x5000, 4096),
            CUDA_SUCCESS);
  const auto log = calls();
  const long prefetch = find_named(log, "cuMemPrefetchAsync_v2", h(be_));
  const long ask = find_call(log, [](const fake_cuda_call& c) { return std::strcmp(c.name, "cuMemRangeGetAttribute") == 0; });
  ASSERT_GE(prefetch, 0) << "the held prefetch was still held when the program asked where it went";
  ASSERT_GE(ask, 0);
  EXPECT_LT(prefetch, ask);
  fake_cuda_set_stream_busy(hp_, 0);
}

// Finding 2: a context-wide record captures all work submitted to the context so far; a held
// best-effort kernel was left out of it.
TEST_F(ReleaseRules, AContextEventRecordsTheHeldWorkToo) {
  CUevent e = nullptr;
  ASSERT_EQ(cuEventCreate(&e, 0), CUDA_SUCCESS);
  CUcontext ctx = nullptr;
  ASSERT_EQ(cuCtxGetCurrent(&ctx), CUDA_SUCCESS);
  hold_high_priority();
  ASSERT_EQ(launch(k_be_, be_, 7), CUDA_SUCCESS);
  expect_deferred(k_be_);
  ASSERT_EQ(cuCtxRecordEvent(ctx, e), CUDA_SUCCESS);
  auto log = calls();
  const long kernel = find_launch(log, k_be_);
  ASSERT_GE(kernel, 0) << "the held kernel is not in the context's record";
  EXPECT_LT(kernel, find_any(log, "cuCtxRecordEvent"));
  fake_cuda_set_stream_busy(hp_, 0);
  EXPECT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
  EXPECT_EQ(cuEventDestroy(e), CUDA_SUCCESS);
}

// The release class is counted (orion_stats), so a program's cost of the default can be measured.
TEST_F(ReleaseRules, ReleaseCallsAreCounted) {
  if (!scheduled_) GTEST_SKIP() << "pass-through mode keeps no statistics";
  const orion_stats before = stats();
  void* host = nullptr;
  ASSERT_EQ(cuMemAllocHost(&host, 64), CUDA_SUCCESS);  // order-free: not counted
  hold_high_priority();
  ASSERT_EQ(launch(k_be_, be_, 1), CUDA_SUCCESS);
  ASSERT_EQ(cuMemFreeHost(host), CUDA_SUCCESS);           // releases the held kernel
  ASSERT_EQ(cuMemFreeHost(host), CUDA_ERROR_INVALID_VALUE);  // nothing held: counted, no release
  const orion_stats after = stats();
  EXPECT_EQ(after.release_calls - before.release_calls, 2u);
  EXPECT_EQ(after.release_calls_released - before.release_calls_released, 1u);
}

// Finding 7: a call that only needs held work in the driver before its own op (here a launch on
// the legacy stream, which waits for blocking streams) got another op's deferred error back and
// its own op was never submitted. Now its op runs, and the error stays for the call that
// synchronises with the failed op.
TEST_F(ReleaseRules, AnotherStreamsDeferredErrorNeitherFailsNorDropsALegacyStreamOp) {
  hold_high_priority();
  fake_cuda_fail_next("cuMemsetD8Async", CUDA_ERROR_INVALID_VALUE);
  const CUresult set = cuMemsetD8Async(kDev, 1, 64, be_);  // be_ is a blocking stream
  EXPECT_EQ(set, scheduled_ ? CUDA_SUCCESS : CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(launch(k_other_, nullptr, 3), CUDA_SUCCESS) << "the legacy-stream launch got another op's error";
  EXPECT_EQ(count_launches(calls(), k_other_), 1u) << "the legacy-stream launch never reached the driver";
  fake_cuda_set_stream_busy(hp_, 0);
  EXPECT_EQ(cuStreamSynchronize(be_), scheduled_ ? CUDA_ERROR_INVALID_VALUE : CUDA_SUCCESS)
      << "the deferred error was lost";
  EXPECT_EQ(cuStreamSynchronize(be_), CUDA_SUCCESS) << "a deferred error is reported once";
}

// Finding 7: a context synchronise took every stream's deferred error and returned the first;
// the others were lost. Each is now returned once, by successive synchronising calls.
TEST_F(ReleaseRules, EveryDeferredErrorIsReportedOnce) {
  CUstream be2 = nullptr;
  ASSERT_EQ(cuStreamCreateWithPriority(&be2, CU_STREAM_NON_BLOCKING, 0), CUDA_SUCCESS);
  hold_high_priority();
  fake_cuda_fail_next("cuMemsetD8Async", CUDA_ERROR_INVALID_VALUE);
  const CUresult first = cuMemsetD8Async(kDev, 1, 64, be_);
  fake_cuda_fail_next("cuMemsetD16Async", CUDA_ERROR_ILLEGAL_ADDRESS);
  const CUresult second = cuMemsetD16Async(kDev, 1, 64, be2);
  fake_cuda_set_stream_busy(hp_, 0);
  if (scheduled_) {
    EXPECT_EQ(first, CUDA_SUCCESS);
    EXPECT_EQ(second, CUDA_SUCCESS);
    const CUresult a = cuCtxSynchronize();
    const CUresult b = cuCtxSynchronize();
    EXPECT_NE(a, CUDA_SUCCESS);
    EXPECT_NE(b, CUDA_SUCCESS) << "the second deferred error was lost";
    EXPECT_NE(a, b);
  } else {
    EXPECT_EQ(first, CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(second, CUDA_ERROR_ILLEGAL_ADDRESS);
  }
  EXPECT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamDestroy(be2), CUDA_SUCCESS);
}

// The same through a legacy-stream query (cuStreamQuery(0) asks every blocking stream): it took
// every stream's deferred error and returned the first.
TEST_F(ReleaseRules, ALegacyQueryReportsEachDeferredErrorOnce) {
  if (!scheduled_) GTEST_SKIP() << "pass-through defers nothing: there is no deferred error to report";
  CUstream be2 = nullptr;  // blocking, like be_: the legacy stream waits on both
  ASSERT_EQ(cuStreamCreateWithPriority(&be2, 0, 0), CUDA_SUCCESS);
  hold_high_priority();
  fake_cuda_fail_next("cuMemsetD8Async", CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(cuMemsetD8Async(kDev, 1, 64, be_), CUDA_SUCCESS);
  fake_cuda_fail_next("cuMemsetD16Async", CUDA_ERROR_ILLEGAL_ADDRESS);
  ASSERT_EQ(cuMemsetD16Async(kDev, 1, 64, be2), CUDA_SUCCESS);
  fake_cuda_set_stream_busy(hp_, 0);
  ASSERT_TRUE(wait_idle()) << "the held memsets never reached the driver";
  const CUresult a = cuStreamQuery(nullptr);
  const CUresult b = cuStreamQuery(nullptr);
  EXPECT_TRUE(a == CUDA_ERROR_INVALID_VALUE || a == CUDA_ERROR_ILLEGAL_ADDRESS) << a;
  EXPECT_TRUE(b == CUDA_ERROR_INVALID_VALUE || b == CUDA_ERROR_ILLEGAL_ADDRESS) << "the second deferred error was lost: " << b;
  EXPECT_NE(a, b);
  EXPECT_EQ(cuStreamQuery(nullptr), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamDestroy(be2), CUDA_SUCCESS);
}

// Finding 2: another process waits on an interprocess event (PyTorch's CUDA IPC tensor sharing
// records one); it binds to whatever record the driver has, so a held record is a lost record.
// A record of such an event reaches the driver, behind its stream's earlier work, before the
// call returns; a record of an ordinary event is still held.
TEST_F(ReleaseRules, ARecordOfAnInterprocessEventIsNeverHeld) {
  CUevent ipc = nullptr;
  ASSERT_EQ(cuEventCreate(&ipc, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
  expect_interprocess_op_not_held("cuEventRecord", ipc, record_on);
  EXPECT_EQ(cuEventDestroy(ipc), CUDA_SUCCESS);
}

// A wait on an interprocess event binds to the record the driver has when the wait reaches it;
// another process may record the event again at any time, so a held wait could bind to a later
// record than the program's. The wait reaches the driver, behind its stream's earlier work,
// before the call returns; a wait on an ordinary event is still held.
TEST_F(ReleaseRules, AWaitOnAnInterprocessEventIsNeverHeld) {
  CUevent ipc = nullptr;
  ASSERT_EQ(cuEventCreate(&ipc, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
  expect_interprocess_op_not_held("cuStreamWaitEvent", ipc, wait_on);
  EXPECT_EQ(cuEventDestroy(ipc), CUDA_SUCCESS);
}

// The same for an event opened from another process's handle: the shim never saw it created
// with CU_EVENT_INTERPROCESS, but it is interprocess (the exporting process waits on its records).
TEST_F(ReleaseRules, ARecordOfAnEventOpenedFromAnIpcHandleIsNeverHeld) {
  CUevent exported = nullptr, opened = nullptr;
  ASSERT_EQ(cuEventCreate(&exported, CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
  CUipcEventHandle handle{};
  ASSERT_EQ(cuIpcGetEventHandle(&handle, exported), CUDA_SUCCESS);
  ASSERT_EQ(cuIpcOpenEventHandle(&opened, handle), CUDA_SUCCESS);
  ASSERT_NE(opened, exported);
  expect_interprocess_op_not_held("cuEventRecord", opened, record_on);
  EXPECT_EQ(cuEventDestroy(opened), CUDA_SUCCESS);
  EXPECT_EQ(cuEventDestroy(exported), CUDA_SUCCESS);
  // What the driver refuses: a handle of an event made without CU_EVENT_INTERPROCESS.
  CUevent plain = nullptr;
  ASSERT_EQ(cuEventCreate(&plain, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
  EXPECT_EQ(cuIpcGetEventHandle(&handle, plain), CUDA_ERROR_INVALID_VALUE);
  EXPECT_EQ(cuEventDestroy(plain), CUDA_SUCCESS);
}

// A stream the program makes in a green context of its own is classed by its priority, as
// cuStreamCreateWithPriority's are: at priority 0 it is best effort (held while high priority
// runs); unrecorded, it was unmanaged and never held.
TEST_F(ReleaseRules, AGreenContextStreamIsClassedByItsPriority) {
  const size_t no_params[1] = {0};
  auto k = reinterpret_cast<CUfunction>(fake_cuda_make_kernel(fake_cuda_make_module(), "green_kernel", 0, no_params));
  CUgreenCtx green = nullptr;
  ASSERT_EQ(make_green_context(0, 16, &green), CUDA_SUCCESS);
  CUcontext green_ctx = nullptr;
  ASSERT_EQ(cuCtxFromGreenCtx(&green_ctx, green), CUDA_SUCCESS);
  CUstream gs = nullptr;
  ASSERT_EQ(cuGreenCtxStreamCreate(&gs, green, CU_STREAM_NON_BLOCKING, 0), CUDA_SUCCESS);
  hold_high_priority();
  ASSERT_EQ(cuCtxPushCurrent(green_ctx), CUDA_SUCCESS);
  ASSERT_EQ(cuLaunchKernel(k, 1, 1, 1, 32, 1, 1, 0, gs, nullptr, nullptr), CUDA_SUCCESS);
  expect_deferred(k);
  fake_cuda_set_stream_busy(hp_, 0);
  EXPECT_EQ(cuStreamSynchronize(gs), CUDA_SUCCESS);
  EXPECT_EQ(count_launches(calls(), k), 1u);
  EXPECT_EQ(cuStreamDestroy(gs), CUDA_SUCCESS);
  CUcontext popped = nullptr;
  ASSERT_EQ(cuCtxPopCurrent(&popped), CUDA_SUCCESS);
  EXPECT_EQ(cuGreenCtxDestroy(green), CUDA_SUCCESS);
}

// Finding 8: the helper thread admitted queued work while holding the pump lock, and waited for a
// stream's mutex held by a thread inside a blocking driver call (here a launch the fake makes
// take 1 s, made by the caller of an op it must wait for): nothing else was admitted meanwhile.
// Now the pump skips a stream another thread is submitting to, and leaves an op whose caller
// waits to that caller.
TEST_F(ReleaseRules, ABlockingDriverCallOnOneStreamDoesNotStallAdmissionOfTheOthers) {
  if (!scheduled_) GTEST_SKIP() << "pass-through mode admits nothing";
  constexpr int kOthers = 6;
  std::vector<CUstream> others(kOthers);
  for (auto& o : others) ASSERT_EQ(cuStreamCreateWithPriority(&o, CU_STREAM_NON_BLOCKING, 0), CUDA_SUCCESS);
  CUfunction opaque = fake_cuda_make_function("opaque_kernel", 0, nullptr);  // no parameter info
  hold_high_priority();
  ASSERT_EQ(launch(k_other_, be_, 0), CUDA_SUCCESS);  // held
  for (int i = 0; i < kOthers; ++i) ASSERT_EQ(launch(k_be_, others[i], i), CUDA_SUCCESS);  // held
  ASSERT_EQ(count_launches(calls(), k_be_), 0u);
  // The next launch to reach the fake (be_'s held one, submitted by the waiting caller below
  // under be_'s stream mutex) takes 2 s. While high priority is busy only that caller can reach
  // the driver, so the delay is its.
  fake_cuda_delay_next("cuLaunchKernel", 2'000'000);
  std::thread caller([&] {
    ASSERT_NE(use_device(0), nullptr);
    int arg = 5;
    void* params[] = {&arg};
    // Its arguments cannot be copied: the caller drains be_ up to it and waits.
    EXPECT_EQ(cuLaunchKernel(opaque, 1, 1, 1, 32, 1, 1, 0, be_, params, nullptr), CUDA_SUCCESS);
  });
  // The caller is in the slow call (polled: on a loaded machine its thread may start late).
  const auto asleep_by = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (fake_cuda_delays_sleeping() == 0 && std::chrono::steady_clock::now() < asleep_by) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(fake_cuda_delays_sleeping(), 1) << "the caller never reached the slow driver call";
  fake_cuda_set_stream_busy(hp_, 0);  // HP done: the pump may admit the other streams' work
  const auto start = std::chrono::steady_clock::now();
  size_t admitted = 0;
  // Well inside the 2 s the caller's call takes: a pump stalled behind it admits nothing.
  while (std::chrono::steady_clock::now() - start < std::chrono::milliseconds(1500)) {
    admitted = count_launches(calls(), k_be_);
    if (admitted == kOthers) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_EQ(admitted, static_cast<size_t>(kOthers))
      << "the helper thread stalled behind a blocking driver call on another stream";
  caller.join();
  EXPECT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
  for (auto& o : others) EXPECT_EQ(cuStreamDestroy(o), CUDA_SUCCESS);
}

// Finding 1: every thread's per-thread default stream was one stream to the shim, and a held op
// was replayed as cuLaunchKernel_ptsz(..., NULL) by whichever thread submitted it: on that
// thread's stream. Work on a per-thread stream is now never held (only its own thread can name
// the stream), whatever the thread's class, and each thread's is a stream of its own.
TEST_F(ReleaseRules, PerThreadDefaultStreamWorkRunsOnItsOwnThreadsStream) {
  auto set_thread_class = shim_fn<orion_set_thread_class_fn>("orion_set_thread_class");
  ASSERT_NE(set_thread_class, nullptr);
  auto set_stream_class = shim_fn<orion_set_stream_class_fn>("orion_set_stream_class");
  ASSERT_NE(set_stream_class, nullptr);
  if (scheduled_) {
    EXPECT_EQ(set_stream_class(CU_STREAM_PER_THREAD, "best_effort"), EINVAL);
  }
  hold_high_priority();
  constexpr int kThreads = 3, kLaunches = 4;
  uint64_t token[kThreads] = {};
  std::latch launched(kThreads);  // every thread's launches are issued before any synchronises
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      ASSERT_NE(use_device(0), nullptr);
      token[t] = fake_cuda_thread_token();
      if (scheduled_) {
        ASSERT_EQ(set_thread_class("best_effort"), 0);
      }
      for (int i = 0; i < kLaunches; ++i) {
        EXPECT_EQ(launch(k_be_, CU_STREAM_PER_THREAD, 100 * t + i), CUDA_SUCCESS);
      }
      launched.arrive_and_wait();
      EXPECT_EQ(cuStreamSynchronize(CU_STREAM_PER_THREAD), CUDA_SUCCESS);
      if (scheduled_) set_thread_class("stream");
    });
  }
  for (auto& th : threads) th.join();
  size_t seen = 0;
  for (const auto& c : calls()) {
    if (!is_launch(c) || c.function != h(k_be_)) continue;
    int arg = 0;
    std::memcpy(&arg, c.params, sizeof arg);
    const int t = arg / 100;
    ASSERT_GE(t, 0);
    ASSERT_LT(t, kThreads);
    EXPECT_EQ(c.thread, token[t]) << "launch " << arg << " ran on another thread's per-thread stream";
    ++seen;
  }
  EXPECT_EQ(seen, static_cast<size_t>(kThreads * kLaunches)) << "per-thread stream work was held";
  fake_cuda_set_stream_busy(hp_, 0);
}

// Threads come and go (a pool per epoch, a worker per request), and each one's per-thread default
// stream was a stream the shim kept for good: what every pump pass and every legacy-stream op
// walks grew with each thread ever started. A thread that exits takes its stream with it, so the
// shim reuses its number, and the state behind it, for a later thread's, as a new stream: the
// communication class an exited thread's NCCL kernel gave its stream does not carry over.
TEST_F(ReleaseRules, AnExitedThreadsPerThreadStreamIsReusedAsANewStream) {
  if (!scheduled_) GTEST_SKIP() << "pass-through: the shim keeps no stream state to reuse";
  const CUfunction nccl = fake_cuda_make_function(kNcclAllReduceMangled, 0, nullptr);
  ASSERT_NE(nccl, nullptr);
  const orion_stats before = stats();
  constexpr int kThreads = 64;
  for (int t = 0; t < kThreads; ++t) {
    std::thread([&, t] {
      ASSERT_NE(use_device(0), nullptr);
      // Even threads run an NCCL kernel (their stream turns communication), odd ones a plain one.
      const CUresult rc = t % 2 == 0 ? cuLaunchKernel(nccl, 1, 1, 1, 32, 1, 1, 0, CU_STREAM_PER_THREAD, nullptr, nullptr)
                                     : launch(k_be_, CU_STREAM_PER_THREAD, t);
      EXPECT_EQ(rc, CUDA_SUCCESS);
      EXPECT_EQ(cuStreamSynchronize(CU_STREAM_PER_THREAD), CUDA_SUCCESS);
    }).join();
  }
  const orion_stats after = stats();
  EXPECT_LE(after.streams, before.streams + 2)
      << kThreads << " threads that ran one after another left " << after.streams - before.streams
      << " stream states behind";
  EXPECT_EQ(after.communication_streams - before.communication_streams, uint64_t{kThreads / 2})
      << "a later thread's per-thread stream kept the communication class of an exited thread's";
  EXPECT_EQ(count_launches(calls(), nccl), size_t{kThreads / 2});
}

// Lower finding: a function attribute set after a held launch applied to that launch. A change
// now releases it first; setting the value the function already has (what PyTorch's flash
// attention does before every launch) leaves held work held.
TEST_F(ReleaseRules, AChangedFunctionAttributeReleasesHeldLaunchesAndAnUnchangedOneDoesNot) {
  constexpr auto kSmem = CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES;
  ASSERT_EQ(cuFuncSetAttribute(k_be_, kSmem, 65536), CUDA_SUCCESS);
  hold_high_priority();
  ASSERT_EQ(launch(k_be_, be_, 1), CUDA_SUCCESS);
  expect_deferred(k_be_);
  ASSERT_EQ(cuFuncSetAttribute(k_be_, kSmem, 65536), CUDA_SUCCESS);  // unchanged
  expect_deferred(k_be_);
  ASSERT_EQ(cuFuncSetAttribute(k_be_, kSmem, 32768), CUDA_SUCCESS);  // changed
  auto log = calls();
  const long held = find_launch(log, k_be_);
  ASSERT_GE(held, 0) << "the held launch would run with the new attribute";
  long change = -1;
  for (size_t i = 0; i < log.size(); ++i) {
    if (std::strcmp(log[i].name, "cuFuncSetAttribute") == 0 && log[i].value == 32768) change = static_cast<long>(i);
  }
  EXPECT_LT(held, change);
  fake_cuda_set_stream_busy(hp_, 0);
  EXPECT_EQ(cuStreamSynchronize(be_), CUDA_SUCCESS);
}

// Finding 3: destroying (or resetting) a context with work held on its streams: the held work must
// reach the driver first, while the context lives; and the shim's completion events of a dead
// context never report, so it must not wait for them (best-effort work would wait out the
// starvation bound every time).
TEST_F(ReleaseRules, DestroyingAContextFirstReleasesItsHeldWorkAndForgetsItsCompletions) {
  const size_t no_params[1] = {0};  // known to have none (a null layout means unknown)
  CUfunction any_ctx = reinterpret_cast<CUfunction>(
      fake_cuda_make_kernel(fake_cuda_make_module(), "context_independent_kernel", 0, no_params));
  CUcontext primary = nullptr, c2 = nullptr;
  ASSERT_EQ(cuCtxGetCurrent(&primary), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxCreate(&c2, nullptr, 0, 0), CUDA_SUCCESS);
  CUstream s2 = nullptr;
  ASSERT_EQ(cuStreamCreateWithPriority(&s2, CU_STREAM_NON_BLOCKING, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuLaunchKernel(any_ctx, 1, 1, 1, 32, 1, 1, 0, s2, nullptr, nullptr), CUDA_SUCCESS);  // tracked
  ASSERT_EQ(cuCtxSetCurrent(primary), CUDA_SUCCESS);
  hold_high_priority();
  ASSERT_EQ(cuCtxPushCurrent(c2), CUDA_SUCCESS);
  ASSERT_EQ(cuLaunchKernel(any_ctx, 2, 1, 1, 32, 1, 1, 0, s2, nullptr, nullptr), CUDA_SUCCESS);  // held
  if (scheduled_) {
    EXPECT_EQ(count_launches(calls(), any_ctx), 1u) << "the second launch was not held";
  }
  CUcontext popped = nullptr;
  ASSERT_EQ(cuCtxPopCurrent(&popped), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxDestroy(c2), CUDA_SUCCESS);
  auto log = calls();
  long second = -1;
  for (size_t i = 0; i < log.size(); ++i) {
    if (is_launch(log[i]) && log[i].function == h(any_ctx) && log[i].grid[0] == 2) second = static_cast<long>(i);
  }
  ASSERT_GE(second, 0) << "the held launch never reached the driver";
  EXPECT_EQ(log[second].result, CUDA_SUCCESS) << "the held launch reached a destroyed context";
  EXPECT_LT(second, find_any(log, "cuCtxDestroy_v2"));
  fake_cuda_set_stream_busy(hp_, 0);
  EXPECT_TRUE(wait_idle()) << "the shim still waits for a dead context's work";
}

}  // namespace

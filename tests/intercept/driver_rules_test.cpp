// The shim against the driver's rules that the fake driver models (issue 11): contexts,
// communication kernels as libraries name them, event re-recording, stream flags, queries,
// capture bookkeeping and capture modes (graphs, kernel handles, modules and the helper thread:
// handle_rules_test.cpp). Each test failed on the shim before its fix. Run twice
// by ctest: scheduled (USE_ORION_SCHEDULER=1, priority policy) and pass-through (=0).
#include <chrono>
#include <cstring>
#include <thread>

#include "scheduling_fixture.h"

namespace {

using namespace icpt_test;

class DriverRules : public Scheduling {
 protected:
  // A best-effort launch, held behind high priority, that fails with `error` when it reaches the
  // driver. False without scheduling (the launch went through at once and returned the error).
  bool hold_a_launch_that_fails(CUresult error) {
    hold_high_priority();
    fake_cuda_fail_next("cuLaunchKernel", error);
    const CUresult at_launch = launch(k_be_, be_, 1);
    if (!scheduled_) {
      EXPECT_EQ(at_launch, error);
      return false;
    }
    EXPECT_EQ(at_launch, CUDA_SUCCESS);  // deferred
    return at_launch == CUDA_SUCCESS;
  }
};

// Finding 1: work of device 0 submitted from a thread of device 1 runs under device 0's context,
// and the thread gets its own context back.
TEST_F(DriverRules, SubmittingAnotherContextsDeferredWorkKeepsTheCallersContext) {
  hold_high_priority();
  ASSERT_EQ(launch(k_be_, be_, 1), CUDA_SUCCESS);
  expect_deferred(k_be_);
  CUcontext after = nullptr;
  CUresult own_launch = CUDA_ERROR_UNKNOWN;
  std::thread device1([&] {
    CUcontext ctx1 = use_device(1);
    ASSERT_NE(ctx1, nullptr);
    CUstream s1 = nullptr;
    ASSERT_EQ(cuStreamCreate(&s1, 0), CUDA_SUCCESS);
    CUfunction f1 = fake_cuda_make_function("device1_kernel", 0, nullptr);
    // cuMemFree synchronises with everything queued: device 0's deferred launch goes out here.
    ASSERT_EQ(cuMemFree(0x5000), CUDA_SUCCESS);
    ASSERT_EQ(cuCtxGetCurrent(&after), CUDA_SUCCESS);
    own_launch = cuLaunchKernel(f1, 1, 1, 1, 1, 1, 1, 0, s1, nullptr, nullptr);
    EXPECT_EQ(cuStreamDestroy(s1), CUDA_SUCCESS);
  });
  device1.join();
  EXPECT_EQ(after, fake_cuda_primary_context(1)) << "the shim left another context current";
  EXPECT_EQ(own_launch, CUDA_SUCCESS);
  auto log = calls();
  const long k = find_launch(log, k_be_);
  ASSERT_GE(k, 0);
  EXPECT_EQ(log[k].result, CUDA_SUCCESS);
  EXPECT_EQ(log[k].context, h(fake_cuda_primary_context(0))) << "submitted under the wrong context";
}

// Finding 1: completion tracking of device 1's high-priority work uses device 1's events, so the
// work counts as in flight and best-effort work of device 1 waits behind it.
TEST_F(DriverRules, CompletionTrackingWorksOnEveryContext) {
  // Device 0's tracked launches leave completion events of device 0 behind.
  for (int i = 0; i < 3; ++i) ASSERT_EQ(launch(k_hp_, hp_, i), CUDA_SUCCESS);
  ASSERT_TRUE(wait_idle());
  fake_cuda_reset();
  std::thread device1([&] {
    ASSERT_NE(use_device(1), nullptr);
    CUstream hp1 = nullptr, be1 = nullptr;
    ASSERT_EQ(cuStreamCreateWithPriority(&hp1, 0, -5), CUDA_SUCCESS);
    ASSERT_EQ(cuStreamCreateWithPriority(&be1, 0, 0), CUDA_SUCCESS);
    const size_t sizes[] = {sizeof(int), sizeof(double)};
    CUfunction hp_k = fake_cuda_make_function("device1_hp", 2, sizes);
    CUfunction be_k = fake_cuda_make_function("device1_be", 2, sizes);
    fake_cuda_set_stream_busy(hp1, 1);
    ASSERT_EQ(launch(hp_k, hp1, 1), CUDA_SUCCESS);
    ASSERT_EQ(launch(be_k, be1, 2), CUDA_SUCCESS);
    expect_deferred(be_k);
    fake_cuda_set_stream_busy(hp1, 0);
    if (scheduled_) {
      // Admitted because the shim saw device 1's high-priority work complete (its completion
      // event, recorded and queried in device 1's context), not by a synchronize: the
      // starvation bound is 60 s here.
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
      while (count_launches(calls(), be_k) == 0 && std::chrono::steady_clock::now() < deadline) {
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      EXPECT_EQ(count_launches(calls(), be_k), 1u) << "device 1's completion was not seen";
      size_t records = 0;
      for (const auto& c : calls()) {
        if (std::strncmp(c.name, "cuEventRecord", 13) == 0 && c.stream == h(hp1)) {
          EXPECT_EQ(c.result, CUDA_SUCCESS) << "completion event of another context";
          records += c.result == CUDA_SUCCESS;
        }
      }
      EXPECT_GE(records, 1u) << "no completion event recorded on device 1's stream";
    }
    EXPECT_EQ(cuStreamSynchronize(be1), CUDA_SUCCESS);
    EXPECT_EQ(count_launches(calls(), be_k), 1u);
    EXPECT_TRUE(wait_idle());
    EXPECT_EQ(cuStreamDestroy(hp1), CUDA_SUCCESS);
    EXPECT_EQ(cuStreamDestroy(be1), CUDA_SUCCESS);
  });
  device1.join();
}

// Finding 2: NCCL kernels as cuFuncGetName really names them (mangled, and the symmetric-memory
// family), and launches in the remote memory-synchronisation domain, are communication: never
// deferred. Kernels of other libraries stay best effort.
TEST_F(DriverRules, CommunicationIsRecognisedByRealNamesAndByTheRemoteSyncDomain) {
  auto set_class = shim_fn<orion_set_stream_class_fn>("orion_set_stream_class");
  ASSERT_NE(set_class, nullptr);
  auto launch_ex = [&](CUfunction f, bool remote_domain) {
    unsigned char args[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    size_t args_size = sizeof args;
    void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, args, CU_LAUNCH_PARAM_BUFFER_SIZE,
                     &args_size, CU_LAUNCH_PARAM_END};
    CUlaunchAttribute attr{};
    attr.id = CU_LAUNCH_ATTRIBUTE_MEM_SYNC_DOMAIN;
    attr.value.memSyncDomain = CU_LAUNCH_MEM_SYNC_DOMAIN_REMOTE;
    CUlaunchConfig cfg{};
    cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = 1;
    cfg.blockDimX = 256;
    cfg.blockDimY = cfg.blockDimZ = 1;
    cfg.hStream = be_;
    cfg.attrs = remote_domain ? &attr : nullptr;
    cfg.numAttrs = remote_domain ? 1 : 0;
    return cuLaunchKernelEx(&cfg, f, nullptr, extra);
  };
  struct Case {
    const char* name;
    bool remote_domain;
    bool communication;
  };
  const Case cases[] = {{kNcclAllReduceMangled, false, true}, {kNcclSymkName, false, true},
                        {"plain_kernel_in_remote_domain", true, true}, {kCublasName, false, false},
                        {kCudnnName, false, false}, {kTritonName, false, false}};
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    hold_high_priority();
    CUfunction f = fake_cuda_make_function(c.name, 0, nullptr);
    ASSERT_EQ(launch_ex(f, c.remote_domain), CUDA_SUCCESS);
    if (c.communication) {
      EXPECT_EQ(count_launches(calls(), f), 1u) << "communication was deferred";
    } else {
      expect_deferred(f);
    }
    fake_cuda_set_stream_busy(hp_, 0);
    ASSERT_EQ(cuStreamSynchronize(be_), CUDA_SUCCESS);
    EXPECT_EQ(count_launches(calls(), f), 1u);
    if (scheduled_) {
      ASSERT_EQ(set_class(be_, "best_effort"), 0);  // back to best effort for the next case
    }
    fake_cuda_reset();
  }
}

// The records of `e` in driver order (their fake record numbers), and the record each wait on
// `e` bound to, in driver order.
void records_and_waits(CUevent e, std::vector<uint64_t>* records, std::vector<uint64_t>* waits,
                       std::vector<uint64_t>* record_streams = nullptr) {
  for (const auto& c : calls()) {
    if (c.event != h(e) || c.result != CUDA_SUCCESS) continue;
    if (std::strcmp(c.name, "cuEventRecord") == 0) {
      records->push_back(c.value);
      if (record_streams != nullptr) record_streams->push_back(c.stream);
    }
    if (std::strcmp(c.name, "cuStreamWaitEvent") == 0) waits->push_back(c.value);
  }
}

// Finding 4: a later record of an event reaches the driver after the earlier one, so the event
// ends up meaning the program's latest record.
TEST_F(DriverRules, ReRecordingAnEventKeepsProgramOrder) {
  CUevent ev = nullptr;
  ASSERT_EQ(cuEventCreate(&ev, 0), CUDA_SUCCESS);
  hold_high_priority();
  ASSERT_EQ(launch(k_be_, be_, 1), CUDA_SUCCESS);
  ASSERT_EQ(cuEventRecord(ev, be_), CUDA_SUCCESS);     // queued behind the best-effort kernel
  ASSERT_EQ(cuEventRecord(ev, plain_), CUDA_SUCCESS);  // the program's latest record
  ASSERT_EQ(cuStreamSynchronize(be_), CUDA_SUCCESS);
  std::vector<uint64_t> records, waits, streams;
  records_and_waits(ev, &records, &waits, &streams);
  ASSERT_EQ(streams.size(), 2u);
  EXPECT_EQ(streams[0], h(be_));
  EXPECT_EQ(streams[1], h(plain_)) << "the event now means the older record";
  EXPECT_EQ(cuEventDestroy(ev), CUDA_SUCCESS);
}

// Finding 4: a queued wait binds to the record that was the latest when the program issued it,
// even when the program records the event again before the wait reaches the driver.
TEST_F(DriverRules, AQueuedWaitBindsToTheRecordBeforeIt) {
  CUevent ev = nullptr;
  ASSERT_EQ(cuEventCreate(&ev, 0), CUDA_SUCCESS);
  hold_high_priority();
  ASSERT_EQ(launch(k_be_, be_, 1), CUDA_SUCCESS);         // keeps be_'s queue non-empty
  ASSERT_EQ(cuEventRecord(ev, plain_), CUDA_SUCCESS);      // record #1
  ASSERT_EQ(cuStreamWaitEvent(be_, ev, 0), CUDA_SUCCESS);  // must wait for #1
  ASSERT_EQ(cuEventRecord(ev, plain_), CUDA_SUCCESS);      // record #2
  ASSERT_EQ(cuStreamSynchronize(be_), CUDA_SUCCESS);
  std::vector<uint64_t> records, waits;
  records_and_waits(ev, &records, &waits);
  ASSERT_EQ(records.size(), 2u);
  ASSERT_EQ(waits.size(), 1u);
  EXPECT_EQ(waits[0], records[0]) << "the wait bound to a record issued after it";
  // Destroying the event with a wait still queued: the wait reaches the driver first.
  CUevent ev2 = nullptr;
  ASSERT_EQ(cuEventCreate(&ev2, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuEventRecord(ev2, plain_), CUDA_SUCCESS);
  ASSERT_EQ(launch(k_be_, be_, 2), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamWaitEvent(be_, ev2, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuEventDestroy(ev2), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamSynchronize(be_), CUDA_SUCCESS);
  for (const auto& c : calls()) {
    if (std::strcmp(c.name, "cuStreamWaitEvent") == 0 && c.event == h(ev2)) {
      EXPECT_EQ(c.result, CUDA_SUCCESS) << "the wait reached the driver after the event was destroyed";
    }
  }
  EXPECT_EQ(cuEventDestroy(ev), CUDA_SUCCESS);
}

// Finding 5: work on the legacy NULL stream waits for blocking streams only. A non-blocking
// stream's queued best-effort work (all of LibTorch's pool streams) stays queued.
TEST_F(DriverRules, LegacyStreamWorkDrainsOnlyBlockingStreams) {
  CUstream nb = nullptr;
  ASSERT_EQ(cuStreamCreateWithPriority(&nb, CU_STREAM_NON_BLOCKING, 0), CUDA_SUCCESS);
  unsigned flags = 0;
  ASSERT_EQ(cuStreamGetFlags(nb, &flags), CUDA_SUCCESS);
  ASSERT_EQ(flags, unsigned{CU_STREAM_NON_BLOCKING});
  hold_high_priority();
  ASSERT_EQ(launch(k_be_, be_, 1), CUDA_SUCCESS);   // blocking best-effort stream
  ASSERT_EQ(launch(k_other_, nb, 2), CUDA_SUCCESS);  // non-blocking best-effort stream
  expect_deferred(k_be_);
  expect_deferred(k_other_);
  CUfunction legacy_k = fake_cuda_make_function("legacy_kernel", 0, nullptr);
  ASSERT_EQ(cuLaunchKernel(legacy_k, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr), CUDA_SUCCESS);
  auto log = calls();
  ASSERT_GE(find_launch(log, k_be_), 0) << "the blocking stream's work must precede legacy work";
  EXPECT_LT(find_launch(log, k_be_), find_launch(log, legacy_k));
  if (scheduled_) {
    EXPECT_EQ(count_launches(log, k_other_), 0u) << "a non-blocking stream was drained";
  }
  // Synchronising the legacy stream does not wait for non-blocking streams either.
  ASSERT_EQ(cuStreamSynchronize(nullptr), CUDA_SUCCESS);
  if (scheduled_) {
    EXPECT_EQ(count_launches(calls(), k_other_), 0u) << "a non-blocking stream was drained";
  }
  ASSERT_EQ(cuStreamSynchronize(nb), CUDA_SUCCESS);
  EXPECT_EQ(count_launches(calls(), k_other_), 1u);
  EXPECT_EQ(cuStreamDestroy(nb), CUDA_SUCCESS);
}

// Finding 7: ops issued while a capture begins do not overtake older ops of their stream that the
// capture's drain is still submitting.
TEST_F(DriverRules, OpsIssuedWhileACaptureBeginsKeepTheirStreamsOrder) {
  hold_high_priority();
  CUfunction k3 = fake_cuda_make_function("after_begin", 0, nullptr);
  ASSERT_EQ(launch(k_be_, be_, 1), CUDA_SUCCESS);
  ASSERT_EQ(launch(k_other_, be_, 2), CUDA_SUCCESS);
  expect_deferred(k_be_);
  // The capture's drain is slow to submit the first queued launch.
  fake_cuda_delay_next("cuLaunchKernel", scheduled_ ? 200000 : 0);
  CUresult begun = CUDA_ERROR_UNKNOWN;
  std::thread capturer([&] {
    ASSERT_NE(use_device(0), nullptr);
    begun = cuStreamBeginCapture(plain_, CU_STREAM_CAPTURE_MODE_RELAXED);
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_EQ(cuLaunchKernel(k3, 1, 1, 1, 1, 1, 1, 0, be_, nullptr, nullptr), CUDA_SUCCESS);
  capturer.join();
  ASSERT_EQ(begun, CUDA_SUCCESS);
  CUgraph graph = nullptr;
  ASSERT_EQ(cuStreamEndCapture(plain_, &graph), CUDA_SUCCESS);
  auto log = calls();
  const long a = find_launch(log, k_be_), b = find_launch(log, k_other_), c = find_launch(log, k3);
  ASSERT_GE(a, 0);
  ASSERT_GE(b, 0);
  ASSERT_GE(c, 0);
  EXPECT_LT(a, b);
  EXPECT_LT(b, c) << "a launch issued during the capture's drain overtook older work of its stream";
}

// Another stream's deferred launch error used to be taken by the capture's begin, which then
// refused the capture (PyTorch's graph capture failed naming an error of a launch it did not
// make) and the stream's own synchronize found nothing. The capture begins; the error stays for
// the call that synchronises with its launch, as without the shim (where the launch returned it).
TEST_F(DriverRules, AnotherStreamsDeferredErrorDoesNotRefuseACapture) {
  if (!hold_a_launch_that_fails(CUDA_ERROR_INVALID_VALUE)) return;
  ASSERT_EQ(cuStreamBeginCapture(plain_, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  CUgraph graph = nullptr;
  ASSERT_EQ(cuStreamEndCapture(plain_, &graph), CUDA_SUCCESS);
  fake_cuda_set_stream_busy(hp_, 0);
  EXPECT_EQ(cuStreamSynchronize(be_), CUDA_ERROR_INVALID_VALUE) << "the launch's error was lost";
  EXPECT_EQ(cuStreamSynchronize(be_), CUDA_SUCCESS);  // returned once
}

// A begin the driver refuses is not counted: scheduling stays on (nothing would be deferred again
// while the shim believed a capture active).
TEST_F(DriverRules, ARefusedCaptureBeginLeavesSchedulingOn) {
  fake_cuda_fail_next("cuStreamBeginCapture_v2", CUDA_ERROR_ILLEGAL_ADDRESS);
  EXPECT_EQ(cuStreamBeginCapture(plain_, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_ERROR_ILLEGAL_ADDRESS);
  CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_ACTIVE;
  ASSERT_EQ(cuStreamIsCapturing(plain_, &status), CUDA_SUCCESS);
  EXPECT_EQ(status, CU_STREAM_CAPTURE_STATUS_NONE);
  hold_high_priority();
  ASSERT_EQ(launch(k_other_, be_, 2), CUDA_SUCCESS);
  expect_deferred(k_other_);
  fake_cuda_set_stream_busy(hp_, 0);
}

// A destroy the driver refuses leaves the stream alive: it used to lose its class (reset before
// the call), and its best-effort work went unscheduled from then on.
TEST_F(DriverRules, ARefusedStreamDestroyKeepsTheStreamsClass) {
  fake_cuda_fail_next("cuStreamDestroy_v2", CUDA_ERROR_INVALID_HANDLE);
  EXPECT_EQ(cuStreamDestroy(be_), CUDA_ERROR_INVALID_HANDLE);
  expect_best_effort_deferred_then_run();
}

// A synchronous copy synchronises, under legacy semantics, with the blocking streams only: it
// returns their deferred errors, and a non-blocking stream's stays for that stream's synchronize.
TEST_F(DriverRules, ASynchronousCopyReturnsOnlyTheBlockingStreamsDeferredErrors) {
  if (!scheduled_) GTEST_SKIP() << "pass-through: no launch is deferred (each returns its own error)";
  CUstream non_blocking = nullptr;
  ASSERT_EQ(cuStreamCreateWithPriority(&non_blocking, CU_STREAM_NON_BLOCKING, 0), CUDA_SUCCESS);
  char host[64] = {};
  constexpr CUdeviceptr kDev = 0x1000;  // the fake's device addresses: below 0x10000000
  hold_high_priority();
  fake_cuda_fail_next("cuLaunchKernel", CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(launch(k_be_, non_blocking, 1), CUDA_SUCCESS);  // deferred
  EXPECT_EQ(cuMemcpyHtoD(kDev, host, sizeof host), CUDA_SUCCESS) << "took a non-blocking stream's error";
  EXPECT_EQ(cuStreamSynchronize(non_blocking), CUDA_ERROR_INVALID_VALUE) << "the launch's error was lost";
  // A blocking stream's deferred error is the copy's to return.
  hold_high_priority();
  fake_cuda_fail_next("cuLaunchKernel", CUDA_ERROR_INVALID_VALUE);
  ASSERT_EQ(launch(k_be_, be_, 2), CUDA_SUCCESS);
  EXPECT_EQ(cuMemcpyHtoD(kDev, host, sizeof host), CUDA_ERROR_INVALID_VALUE);
  fake_cuda_set_stream_busy(hp_, 0);
  EXPECT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamDestroy(non_blocking), CUDA_SUCCESS);
}

// Destroying an event does not synchronise with anything: a deferred launch's error must stay
// for the call that does (the stream's synchronize), not come back from cuEventDestroy, whose
// callers (PyTorch's ~CUDAEvent) only warn about it.
TEST_F(DriverRules, DestroyingAnEventLeavesADeferredErrorForTheSynchronize) {
  if (!hold_a_launch_that_fails(CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES)) return;
  CUevent e = nullptr;
  ASSERT_EQ(cuEventCreate(&e, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
  ASSERT_EQ(cuEventRecord(e, be_), CUDA_SUCCESS);
  EXPECT_EQ(cuEventDestroy(e), CUDA_SUCCESS);
  EXPECT_GE(find_named(calls(), "cuEventRecord", h(be_)), 0) << "the record did not reach the driver before the destroy";
  fake_cuda_set_stream_busy(hp_, 0);
  EXPECT_EQ(cuStreamSynchronize(be_), CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES);
}

// Finding 3: PyTorch captures in global mode. The shim's own polling of completion events must
// not invalidate the capture (its helper thread is in relaxed mode, program threads do not poll
// during a capture), and work captured on a scheduled stream gets no completion event of the
// shim in the graph.
TEST_F(DriverRules, TheShimsPollingDoesNotInvalidateAGlobalModeCapture) {
  hold_high_priority();  // a tracked op in flight: the shim polls its completion event
  CUstream cap = nullptr;
  ASSERT_EQ(cuStreamCreateWithPriority(&cap, 0, -5), CUDA_SUCCESS);  // a high-priority stream
  ASSERT_EQ(cuStreamBeginCapture(cap, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
  CUfunction captured = fake_cuda_make_function("captured_kernel", 0, nullptr);
  std::thread other([&] {  // another program thread (global mode) launching best-effort work
    ASSERT_NE(use_device(0), nullptr);
    for (int i = 0; i < 20; ++i) {
      EXPECT_EQ(launch(k_other_, be_, i), CUDA_SUCCESS);
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
  });
  for (int i = 0; i < 20; ++i) {
    ASSERT_EQ(cuLaunchKernel(captured, 1, 1, 1, 1, 1, 1, 0, cap, nullptr, nullptr), CUDA_SUCCESS);
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  other.join();
  CUgraph graph = nullptr;
  EXPECT_EQ(cuStreamEndCapture(cap, &graph), CUDA_SUCCESS) << "the shim invalidated the capture";
  for (const auto& c : calls()) {
    if (c.captured != 0) {
      EXPECT_EQ(c.function, h(captured)) << c.name << " of the shim went into the program's graph";
    }
  }
  fake_cuda_set_stream_busy(hp_, 0);
  EXPECT_EQ(cuStreamDestroy(cap), CUDA_SUCCESS);
}

// A program thread (global capture mode) whose poll passed its capture check just before another
// thread began a global-mode capture must not query events beside it: the capture waits for
// that poll to end. The poller's event query is held 1 s in the fake to open the window (long
// enough that a loaded machine's scheduler does not close it before this thread sees it).
TEST_F(DriverRules, ACaptureBegunDuringAProgramThreadsPollIsNotInvalidatedByIt) {
  if (!scheduled_) GTEST_SKIP() << "pass-through: the shim polls nothing";
  hold_high_priority();  // a tracked op in flight: a poll queries its completion event
  std::thread poller([&] {  // a program thread launching best-effort work; its launches poll
    ASSERT_NE(use_device(0), nullptr);
    fake_cuda_delay_next_on_this_thread("cuEventQuery", 1'000'000);
    for (int i = 0; i < 5000 && fake_cuda_delay_pending_on_this_thread("cuEventQuery"); ++i) {
      EXPECT_EQ(launch(k_other_, be_, i), CUDA_SUCCESS);
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  });
  bool in_query = false;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!in_query && std::chrono::steady_clock::now() < deadline) {
    in_query = fake_cuda_delays_sleeping() > 0;
    if (!in_query) std::this_thread::sleep_for(std::chrono::microseconds(500));
  }
  CUstream cap = nullptr;
  ASSERT_EQ(cuStreamCreateWithPriority(&cap, 0, -5), CUDA_SUCCESS);
  CUgraph graph = nullptr;
  CUresult end = CUDA_ERROR_UNKNOWN;
  if (in_query) {  // the program thread is inside its poll's query now
    ASSERT_EQ(cuStreamBeginCapture(cap, CU_STREAM_CAPTURE_MODE_GLOBAL), CUDA_SUCCESS);
    CUfunction captured = fake_cuda_make_function("captured_beside_a_poll", 0, nullptr);
    EXPECT_EQ(cuLaunchKernel(captured, 1, 1, 1, 1, 1, 1, 0, cap, nullptr, nullptr), CUDA_SUCCESS);
    // The capture stays open until the poller's held query has gone to the driver.
    while (fake_cuda_delays_sleeping() > 0 && std::chrono::steady_clock::now() < deadline + std::chrono::seconds(10)) {
      std::this_thread::sleep_for(std::chrono::microseconds(500));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    end = cuStreamEndCapture(cap, &graph);
  }
  poller.join();
  ASSERT_TRUE(in_query) << "the program thread's launches never polled: the race was not set up";
  EXPECT_EQ(end, CUDA_SUCCESS) << "a program thread's poll invalidated the capture";
  fake_cuda_set_stream_busy(hp_, 0);
  EXPECT_EQ(cuStreamDestroy(cap), CUDA_SUCCESS);
}

}  // namespace

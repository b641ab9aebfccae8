// The shim's scheduling behaviour seen from a program linked directly against the driver:
// per-stream order, drains at blocking calls and queries, cross-stream events, deep copies of
// deferred arguments, communication and captured work, and error propagation. Run twice by
// ctest: scheduled (USE_ORION_SCHEDULER=1, priority policy) and pass-through (=0).
#include <atomic>
#include <cerrno>
#include <fstream>
#include <functional>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "scheduling_fixture.h"

namespace {

using namespace icpt_test;

// One block of 512 threads through cuLaunchKernelEx with its arguments in `extra`, as NCCL launches.
CUresult launch_ex_with_extra(CUfunction f, CUstream stream, unsigned char* args, size_t args_size) {
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, args, CU_LAUNCH_PARAM_BUFFER_SIZE, &args_size,
                   CU_LAUNCH_PARAM_END};
  CUlaunchConfig cfg{};
  cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = 1;
  cfg.blockDimX = 512;
  cfg.blockDimY = cfg.blockDimZ = 1;
  cfg.hStream = stream;
  return cuLaunchKernelEx(&cfg, f, nullptr, extra);
}

TEST_F(Scheduling, UnmanagedAndHighPriorityLaunchesReachTheDriverAtOnceWithIdenticalBytes) {
  ASSERT_EQ(launch(k_hp_, hp_, 7, 2.25), CUDA_SUCCESS);
  ASSERT_EQ(launch(k_other_, plain_, 8, -1.0), CUDA_SUCCESS);
  auto log = calls();
  ASSERT_EQ(count_launches(log, k_hp_), 1u);
  ASSERT_EQ(count_launches(log, k_other_), 1u);
  const fake_cuda_call& c = log[find_launch(log, k_hp_)];
  EXPECT_STREQ(c.name, "cuLaunchKernel");
  EXPECT_EQ(c.stream, h(hp_));
  EXPECT_EQ(c.grid[0], 2u);
  EXPECT_EQ(c.block[0], 128u);
  int a = 0;
  double b = 0;
  std::memcpy(&a, c.params, sizeof a);
  std::memcpy(&b, c.params + 8, sizeof b);
  EXPECT_EQ(a, 7);
  EXPECT_EQ(b, 2.25);
}

TEST_F(Scheduling, PassThroughMakesExactlyTheProgramsCallsInItsOrder) {
  CUevent ev = nullptr;
  ASSERT_EQ(cuEventCreate(&ev, 0), CUDA_SUCCESS);
  fake_cuda_reset();
  ASSERT_EQ(launch(k_hp_, hp_, 1), CUDA_SUCCESS);
  ASSERT_EQ(launch(k_be_, be_, 2), CUDA_SUCCESS);
  ASSERT_EQ(cuEventRecord(ev, be_), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamWaitEvent(plain_, ev, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuMemsetD8Async(0x1000, 1, 8, plain_), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamSynchronize(plain_), CUDA_SUCCESS);
  const std::vector<std::string> program = {"cuLaunchKernel", "cuLaunchKernel", "cuEventRecord",
                                            "cuStreamWaitEvent", "cuMemsetD8Async",
                                            "cuStreamSynchronize"};
  std::vector<std::string> seen;
  for (const auto& c : calls()) {
    // The scheduler's own completion tracking records and polls events the program never
    // created (scheduled mode only).
    if (std::strncmp(c.name, "cuEvent", 7) == 0 && c.event != h(ev)) continue;
    seen.push_back(c.name);
  }
  EXPECT_EQ(seen, program);
  if (!scheduled_) {
    EXPECT_EQ(calls().size(), program.size()) << "pass-through added driver calls";
  }
  EXPECT_EQ(cuEventDestroy(ev), CUDA_SUCCESS);
}

TEST_F(Scheduling, StreamSynchronizeDrainsDeferredWorkInOrder) {
  hold_high_priority();
  ASSERT_EQ(launch(k_be_, be_, 1), CUDA_SUCCESS);
  ASSERT_EQ(launch(k_other_, be_, 2), CUDA_SUCCESS);
  expect_deferred(k_be_);
  if (scheduled_) {
    EXPECT_GE(stats().deferred, 2u);
  }
  ASSERT_EQ(cuStreamSynchronize(be_), CUDA_SUCCESS);
  auto log = calls();
  long first = find_launch(log, k_be_), second = find_launch(log, k_other_);
  long sync = find_named(log, "cuStreamSynchronize", h(be_));
  ASSERT_GE(first, 0);
  ASSERT_GE(second, 0);
  EXPECT_LT(first, second) << "per-stream FIFO order broken";
  EXPECT_LT(second, sync) << "synchronize reached the driver before the work it waits for";
  EXPECT_EQ(count_launches(log, k_be_), 1u);
}

TEST_F(Scheduling, DeferredLaunchOwnsACopyOfItsArguments) {
  hold_high_priority();
  int a = 41;
  double b = 3.5;
  void* params[] = {&a, &b};
  ASSERT_EQ(cuLaunchKernel(k_be_, 1, 1, 1, 32, 1, 1, 0, be_, params, nullptr), CUDA_SUCCESS);
  // The caller's frame is gone as far as CUDA is concerned: overwrite it.
  a = -1;
  b = -1.0;
  unsigned char packed[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
  size_t packed_size = sizeof packed;
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, packed, CU_LAUNCH_PARAM_BUFFER_SIZE,
                   &packed_size, CU_LAUNCH_PARAM_END};
  ASSERT_EQ(cuLaunchKernel(k_other_, 1, 1, 1, 32, 1, 1, 0, be_, nullptr, extra), CUDA_SUCCESS);
  std::memset(packed, 0xEE, sizeof packed);
  ASSERT_EQ(cuStreamSynchronize(be_), CUDA_SUCCESS);
  auto log = calls();
  const fake_cuda_call& k = log.at(find_launch(log, k_be_));
  int got_a = 0;
  double got_b = 0;
  std::memcpy(&got_a, k.params, sizeof got_a);
  std::memcpy(&got_b, k.params + 8, sizeof got_b);
  EXPECT_EQ(got_a, 41);
  EXPECT_EQ(got_b, 3.5);
  const fake_cuda_call& e = log.at(find_launch(log, k_other_));
  ASSERT_EQ(e.param_bytes, 12u);
  for (int i = 0; i < 12; ++i) EXPECT_EQ(e.params[i], i + 1) << "extra byte " << i;
}

// Finding 6 (issue 11): a query forces nothing out. Work still queued in the shim is not done:
// CUDA_ERROR_NOT_READY, as the driver would answer for work it has not finished.
TEST_F(Scheduling, QueriesAnswerNotReadyForQueuedWorkWithoutForcingIt) {
  hold_high_priority();
  CUevent ev = nullptr;
  ASSERT_EQ(cuEventCreate(&ev, 0), CUDA_SUCCESS);
  ASSERT_EQ(launch(k_be_, be_, 1), CUDA_SUCCESS);
  ASSERT_EQ(cuEventRecord(ev, be_), CUDA_SUCCESS);
  expect_deferred(k_be_);
  const CUresult queued = scheduled_ ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
  EXPECT_EQ(cuEventQuery(ev), queued);
  EXPECT_EQ(cuStreamQuery(be_), queued);
  EXPECT_EQ(cuStreamQuery(nullptr), queued) << "the legacy stream waits for blocking streams";
  expect_deferred(k_be_);  // nothing was forced out
  // Once the work is in the driver, the driver answers.
  fake_cuda_set_stream_busy(hp_, 0);
  ASSERT_EQ(cuStreamSynchronize(be_), CUDA_SUCCESS);
  EXPECT_EQ(cuEventQuery(ev), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamQuery(be_), CUDA_SUCCESS);
  auto log = calls();
  long k = find_launch(log, k_be_);
  long rec = find_call(log, [&](const fake_cuda_call& c) {
    return std::strcmp(c.name, "cuEventRecord") == 0 && c.event == h(ev);
  });
  ASSERT_GE(k, 0);
  EXPECT_LT(k, rec);
  // A deferred op's error is what a query of its stream answers.
  if (scheduled_) {
    hold_high_priority();
    fake_cuda_fail_next("cuLaunchKernel", CUDA_ERROR_ILLEGAL_ADDRESS);
    ASSERT_EQ(launch(k_be_, be_, 2), CUDA_SUCCESS);
    fake_cuda_set_stream_busy(hp_, 0);
    CUresult rc = CUDA_ERROR_NOT_READY;
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (rc == CUDA_ERROR_NOT_READY && std::chrono::steady_clock::now() < deadline) {
      rc = cuStreamQuery(be_);
      if (rc == CUDA_ERROR_NOT_READY) std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    EXPECT_EQ(rc, CUDA_ERROR_ILLEGAL_ADDRESS);
  }
  EXPECT_EQ(cuEventDestroy(ev), CUDA_SUCCESS);
}

TEST_F(Scheduling, EventsOrderWorkAcrossStreams) {
  hold_high_priority();
  CUevent ev = nullptr;
  ASSERT_EQ(cuEventCreate(&ev, 0), CUDA_SUCCESS);
  ASSERT_EQ(launch(k_be_, be_, 1), CUDA_SUCCESS);
  ASSERT_EQ(cuEventRecord(ev, be_), CUDA_SUCCESS);
  expect_deferred(k_be_);
  // High priority waits for the best-effort producer: the producer is drained up to the record.
  ASSERT_EQ(cuStreamWaitEvent(hp_, ev, 0), CUDA_SUCCESS);
  ASSERT_EQ(launch(k_other_, hp_, 2), CUDA_SUCCESS);
  auto log = calls();
  long k = find_launch(log, k_be_);
  long rec = find_call(log, [&](const fake_cuda_call& c) {
    return std::strcmp(c.name, "cuEventRecord") == 0 && c.event == h(ev);
  });
  long wait = find_named(log, "cuStreamWaitEvent", h(hp_));
  long consumer = find_launch(log, k_other_);
  ASSERT_GE(k, 0);
  ASSERT_GE(rec, 0);
  ASSERT_GE(wait, 0);
  EXPECT_LT(k, rec);
  EXPECT_LT(rec, wait);
  EXPECT_LT(wait, consumer);
  EXPECT_EQ(cuEventDestroy(ev), CUDA_SUCCESS);
}

TEST_F(Scheduling, CopiesSetsHostFunctionsAndGraphsKeepStreamOrder) {
  const CUgraphExec exec = make_graph_exec();
  ASSERT_NE(exec, nullptr);
  hold_high_priority();
  static std::atomic<int> host_calls{0};
  host_calls = 0;
  ASSERT_EQ(launch(k_be_, be_, 1), CUDA_SUCCESS);
  ASSERT_EQ(cuMemcpyDtoDAsync(0x1000, 0x2000, 64, be_), CUDA_SUCCESS);
  ASSERT_EQ(cuMemcpyAsync(0x3000, 0x4000, 32, be_), CUDA_SUCCESS);  // device to device
  ASSERT_EQ(cuMemsetD32Async(0x1000, 7, 16, be_), CUDA_SUCCESS);
  ASSERT_EQ(cuLaunchHostFunc(be_, [](void*) { host_calls.fetch_add(1); }, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(cuGraphLaunch(exec, be_), CUDA_SUCCESS);
  EXPECT_EQ(host_calls.load(), scheduled_ ? 0 : 1);
  ASSERT_EQ(cuStreamSynchronize(be_), CUDA_SUCCESS);
  EXPECT_EQ(host_calls.load(), 1);
  auto log = calls();
  long k = find_launch(log, k_be_);
  long cp = find_named(log, "cuMemcpyDtoDAsync_v2", h(be_));
  long unified = find_named(log, "cuMemcpyAsync", h(be_));
  long set = find_named(log, "cuMemsetD32Async", h(be_));
  long host = find_named(log, "cuLaunchHostFunc", h(be_));
  long graph = find_named(log, "cuGraphLaunch", h(be_));
  ASSERT_GE(k, 0);
  EXPECT_LT(k, cp);
  EXPECT_LT(cp, unified);
  EXPECT_LT(unified, set);
  EXPECT_LT(set, host);
  EXPECT_LT(host, graph);
  EXPECT_EQ(log.at(cp).value, 64u);
  EXPECT_EQ(log.at(graph).value, h(exec));
  EXPECT_EQ(log.at(graph).result, CUDA_SUCCESS);
  EXPECT_EQ(cuGraphExecDestroy(exec), CUDA_SUCCESS);
}

TEST_F(Scheduling, LegacyStreamAndDeviceWideCallsWaitForBestEffortWork) {
  hold_high_priority();
  ASSERT_EQ(launch(k_be_, be_, 1), CUDA_SUCCESS);
  expect_deferred(k_be_);
  ASSERT_EQ(launch(k_other_, nullptr, 2), CUDA_SUCCESS);  // legacy NULL stream
  auto log = calls();
  ASSERT_GE(find_launch(log, k_be_), 0);
  EXPECT_LT(find_launch(log, k_be_), find_launch(log, k_other_));

  ASSERT_EQ(launch(k_be_, be_, 3), CUDA_SUCCESS);
  ASSERT_EQ(cuMemFree(0x5000), CUDA_SUCCESS);
  log = calls();
  EXPECT_EQ(count_launches(log, k_be_), 2u);
  long last_be = -1;
  for (size_t i = 0; i < log.size(); ++i) {
    if (is_launch(log[i]) && log[i].function == h(k_be_)) last_be = static_cast<long>(i);
  }
  EXPECT_LT(last_be, find_named(log, "cuMemFree_v2", 0));
}

TEST_F(Scheduling, StreamAndEventDestroyDrainFirst) {
  hold_high_priority();
  CUstream extra_be = nullptr;
  ASSERT_EQ(cuStreamCreateWithPriority(&extra_be, 0, 0), CUDA_SUCCESS);
  CUevent ev = nullptr;
  ASSERT_EQ(cuEventCreate(&ev, 0), CUDA_SUCCESS);
  ASSERT_EQ(launch(k_be_, extra_be, 1), CUDA_SUCCESS);
  ASSERT_EQ(cuEventRecord(ev, be_), CUDA_SUCCESS);
  ASSERT_EQ(cuEventDestroy(ev), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamDestroy(extra_be), CUDA_SUCCESS);
  auto log = calls();
  long rec = find_call(log, [&](const fake_cuda_call& c) {
    return std::strcmp(c.name, "cuEventRecord") == 0 && c.event == h(ev);
  });
  long destroy_ev = find_call(log, [&](const fake_cuda_call& c) {
    return std::strcmp(c.name, "cuEventDestroy_v2") == 0 && c.event == h(ev);
  });
  ASSERT_GE(rec, 0);
  EXPECT_LT(rec, destroy_ev);
  ASSERT_GE(find_launch(log, k_be_), 0);
  EXPECT_LT(find_launch(log, k_be_), find_named(log, "cuStreamDestroy_v2", h(extra_be)));
}

TEST_F(Scheduling, CommunicationKernelsAreNeverDeferred) {
  hold_high_priority();
  CUfunction nccl = fake_cuda_make_function("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 0, nullptr);
  unsigned char args[16] = {9, 8, 7, 6, 5, 4, 3, 2, 1};
  ASSERT_EQ(launch_ex_with_extra(nccl, be_, args, sizeof args), CUDA_SUCCESS);
  auto log = calls();
  ASSERT_EQ(count_launches(log, nccl), 1u) << "NCCL kernel was deferred";
  const fake_cuda_call& c = log.at(find_launch(log, nccl));
  EXPECT_STREQ(c.name, "cuLaunchKernelEx");
  ASSERT_EQ(c.param_bytes, sizeof args);
  EXPECT_EQ(std::memcmp(c.params, args, sizeof args), 0);
  // The stream now carries communication: later work on it is not deferred either.
  ASSERT_EQ(launch(k_be_, be_, 1), CUDA_SUCCESS);
  EXPECT_EQ(count_launches(calls(), k_be_), 1u);
  if (scheduled_) {
    EXPECT_GE(stats().communication_streams, 1u);
  }
  // Give the stream back its best-effort class for the next tests' streams.
  if (scheduled_) {
    auto set_class = shim_fn<orion_set_stream_class_fn>("orion_set_stream_class");
    ASSERT_NE(set_class, nullptr);
    EXPECT_EQ(set_class(be_, "best_effort"), 0);
  }
}

// torch.distributed's NCCL pattern: the tensor is produced on the caller's (best-effort) stream,
// which records an event; the NCCL stream waits on it and launches the collective. The collective
// must go out at once, and only after the producer and the record it waits on (else it reads the
// tensor before it is written, or its peers spin waiting for it behind the policy).
TEST_F(Scheduling, ACollectiveWaitingOnHeldBestEffortWorkReleasesItInOrder) {
  hold_high_priority();
  CUevent ready = nullptr;
  ASSERT_EQ(cuEventCreate(&ready, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
  ASSERT_EQ(launch(k_be_, be_, 1), CUDA_SUCCESS);
  ASSERT_EQ(cuEventRecord(ready, be_), CUDA_SUCCESS);
  expect_deferred(k_be_);
  ASSERT_EQ(cuStreamWaitEvent(plain_, ready, 0), CUDA_SUCCESS);
  CUfunction nccl = fake_cuda_make_function(
      "_Z40ncclDevKernel_AllReduce_Sum_f32_RING_LL24ncclDevKernelArgsStorageILm4096EE", 0, nullptr);
  unsigned char args[16] = {1, 2, 3};
  ASSERT_EQ(launch_ex_with_extra(nccl, plain_, args, sizeof args), CUDA_SUCCESS);
  auto log = calls();
  ASSERT_EQ(count_launches(log, nccl), 1u) << "the collective was deferred";
  long producer = find_launch(log, k_be_);
  long rec = find_call(log, [&](const fake_cuda_call& c) {
    return std::strcmp(c.name, "cuEventRecord") == 0 && c.event == h(ready);
  });
  long wait = find_named(log, "cuStreamWaitEvent", h(plain_));
  long collective = find_launch(log, nccl);
  ASSERT_GE(producer, 0) << "the producer is still held";
  ASSERT_GE(rec, 0) << "the record the collective waits on is still held";
  ASSERT_GE(wait, 0);
  EXPECT_LT(producer, rec);
  EXPECT_LT(rec, wait);
  EXPECT_LT(wait, collective);
  if (scheduled_) {
    auto set_class = shim_fn<orion_set_stream_class_fn>("orion_set_stream_class");
    ASSERT_NE(set_class, nullptr);
    EXPECT_EQ(set_class(plain_, "best_effort"), 0);
  }
  EXPECT_EQ(cuEventDestroy(ready), CUDA_SUCCESS);
}

TEST_F(Scheduling, NothingIsDeferredWhileACaptureIsActive) {
  hold_high_priority();
  ASSERT_EQ(launch(k_be_, be_, 1), CUDA_SUCCESS);
  expect_deferred(k_be_);
  ASSERT_EQ(cuStreamBeginCapture(plain_, CU_STREAM_CAPTURE_MODE_RELAXED), CUDA_SUCCESS);
  auto log = calls();
  ASSERT_GE(find_launch(log, k_be_), 0) << "capture begin did not drain";
  EXPECT_LT(find_launch(log, k_be_), find_named(log, "cuStreamBeginCapture_v2", h(plain_)));
  ASSERT_EQ(launch(k_other_, be_, 2), CUDA_SUCCESS);
  EXPECT_EQ(count_launches(calls(), k_other_), 1u) << "work deferred during a capture";
  CUgraph graph = nullptr;
  ASSERT_EQ(cuStreamEndCapture(plain_, &graph), CUDA_SUCCESS);
  CUfunction after = fake_cuda_make_function("after_capture", 0, nullptr);
  ASSERT_EQ(cuLaunchKernel(after, 1, 1, 1, 1, 1, 1, 0, be_, nullptr, nullptr), CUDA_SUCCESS);
  expect_deferred(after);
}

TEST_F(Scheduling, UnknownArgumentSizesMakeTheCallerWaitInsteadOfCopying) {
  hold_high_priority();
  CUfunction opaque = fake_cuda_make_function("opaque_args", 2, nullptr);
  Releaser releaser = release_high_priority_once_a_caller_waits();
  int a = 5;
  double b = 6;
  void* params[] = {&a, &b};
  ASSERT_EQ(cuLaunchKernel(opaque, 1, 1, 1, 1, 1, 1, 0, be_, params, nullptr), CUDA_SUCCESS);
  // Returned: the launch must already be in the driver (its arguments were only borrowed).
  EXPECT_EQ(count_launches(calls(), opaque), 1u);
  releaser.join();
  if (scheduled_) {
    EXPECT_GE(stats().caller_waits, 1u);
  }
}

TEST_F(Scheduling, CopiesFromPageableHostMemoryAreNotDeferredPastTheCall) {
  hold_high_priority();
  ASSERT_EQ(launch(k_be_, be_, 1), CUDA_SUCCESS);
  Releaser releaser = release_high_priority_once_a_caller_waits();
  std::vector<unsigned char> pageable(4096, 1);
  ASSERT_EQ(cuMemcpyHtoDAsync(0x1000, pageable.data(), pageable.size(), be_), CUDA_SUCCESS);
  // The copy (and the kernel before it) reached the driver before the call returned: the
  // program may now reuse its buffer.
  auto log = calls();
  long k = find_launch(log, k_be_);
  long cp = find_named(log, "cuMemcpyHtoDAsync_v2", h(be_));
  ASSERT_GE(k, 0);
  ASSERT_GE(cp, 0);
  EXPECT_LT(k, cp);
  EXPECT_EQ(log.at(cp).value, 4096u);
  releaser.join();
}

TEST_F(Scheduling, DriverErrorsReachTheCaller) {
  fake_cuda_fail_next("cuLaunchKernel", CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES);
  EXPECT_EQ(launch(k_other_, plain_, 1), CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES);

  hold_high_priority();
  fake_cuda_fail_next("cuLaunchKernel", CUDA_ERROR_ILLEGAL_ADDRESS);
  CUresult at_launch = launch(k_be_, be_, 1);
  if (scheduled_) {
    // Deferred: the error comes back at the first call that synchronises with the op.
    EXPECT_EQ(at_launch, CUDA_SUCCESS);
    EXPECT_EQ(cuStreamSynchronize(be_), CUDA_ERROR_ILLEGAL_ADDRESS);
    EXPECT_GE(stats().backend_errors, 1u);
  } else {
    EXPECT_EQ(at_launch, CUDA_ERROR_ILLEGAL_ADDRESS);
  }
  EXPECT_EQ(cuStreamSynchronize(be_), CUDA_SUCCESS) << "an error is reported once";
}

TEST_F(Scheduling, StreamClassCanBeSetThroughTheCApi) {
  auto set_class = shim_fn<orion_set_stream_class_fn>("orion_set_stream_class");
  ASSERT_NE(set_class, nullptr);
  EXPECT_EQ(set_class(plain_, "no_such_class"), EINVAL);
  int rc = set_class(plain_, "best_effort");
  if (!scheduled_) {
    EXPECT_EQ(rc, ENODEV);
    return;
  }
  ASSERT_EQ(rc, 0);
  hold_high_priority();
  ASSERT_EQ(launch(k_be_, plain_, 1), CUDA_SUCCESS);
  expect_deferred(k_be_);
  auto flush = shim_fn<orion_flush_fn>("orion_flush");
  ASSERT_NE(flush, nullptr);
  EXPECT_EQ(flush(), 0);
  EXPECT_EQ(count_launches(calls(), k_be_), 1u);
}

// The per-thread class (issue 12): a pipeline runtime marks forward best effort and backward high
// priority on the thread that issues them, whatever stream autograd picks.
TEST_F(Scheduling, ThreadClassOverridesStreamClassesForThatThreadOnly) {
  auto set_thread = shim_fn<orion_set_thread_class_fn>("orion_set_thread_class");
  ASSERT_NE(set_thread, nullptr);
  EXPECT_EQ(set_thread("no_such_class"), EINVAL);
  hold_high_priority();  // before the thread class: this launch is the HP work in flight
  const orion_stats before = scheduled_ ? stats() : orion_stats{};
  const int rc = set_thread("best_effort");
  if (!scheduled_) {
    EXPECT_EQ(rc, ENODEV);
    return;
  }
  ASSERT_EQ(rc, 0);
  // Forward phase: best effort on an unmanaged stream and on a high-priority one.
  ASSERT_EQ(launch(k_be_, plain_, 1), CUDA_SUCCESS);
  ASSERT_EQ(launch(k_other_, hp_, 2), CUDA_SUCCESS);
  EXPECT_EQ(count_launches(calls(), k_be_), 0u) << "best-effort thread's launch on an unmanaged stream was not deferred";
  EXPECT_EQ(count_launches(calls(), k_other_), 0u) << "best-effort thread's launch on a high-priority stream was not deferred";
  // Another thread has no class: its launch on a best-effort stream follows the stream rule
  // (deferred), and on the unmanaged stream it goes at once, promoting the queued forward kernel.
  CUfunction other_thread = fake_cuda_make_function("other_thread", 0, nullptr);
  CUcontext ctx = nullptr;
  ASSERT_EQ(cuCtxGetCurrent(&ctx), CUDA_SUCCESS);
  std::thread([&] {
    ASSERT_EQ(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
    ASSERT_EQ(cuLaunchKernel(other_thread, 1, 1, 1, 1, 1, 1, 0, plain_, nullptr, nullptr), CUDA_SUCCESS);
  }).join();
  auto log = calls();
  ASSERT_EQ(count_launches(log, other_thread), 1u) << "another thread's unmanaged launch was deferred";
  ASSERT_EQ(count_launches(log, k_be_), 1u) << "queued work ahead of it was not promoted";
  EXPECT_LT(find_launch(log, k_be_), find_launch(log, other_thread)) << "stream order broken";
  // The legacy stream is never deferred by thread (every blocking stream orders with it).
  CUfunction on_legacy = fake_cuda_make_function("on_legacy", 0, nullptr);
  ASSERT_EQ(cuLaunchKernel(on_legacy, 1, 1, 1, 1, 1, 1, 0, nullptr, nullptr, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(count_launches(calls(), on_legacy), 1u);
  // Backward phase: high priority on a best-effort stream goes at once while HP is in flight.
  ASSERT_EQ(set_thread("high_priority"), 0);
  CUfunction backward = fake_cuda_make_function("backward", 0, nullptr);
  ASSERT_EQ(cuLaunchKernel(backward, 1, 1, 1, 1, 1, 1, 0, be_, nullptr, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(count_launches(calls(), backward), 1u) << "high-priority thread's launch was deferred";
  // Back to each stream's class: the best-effort stream defers again.
  ASSERT_EQ(set_thread("stream"), 0);
  CUfunction plain_again = fake_cuda_make_function("plain_again", 0, nullptr);
  ASSERT_EQ(cuLaunchKernel(plain_again, 1, 1, 1, 1, 1, 1, 0, be_, nullptr, nullptr), CUDA_SUCCESS);
  EXPECT_EQ(count_launches(calls(), plain_again), 0u) << "the best-effort stream's rule did not come back";
  ASSERT_EQ(set_thread(nullptr), 0);
  const orion_stats after = stats();
  EXPECT_GE(after.promoted - before.promoted, 1u);
  EXPECT_EQ(after.thread_classed - before.thread_classed, 3u);  // be, other (hp_ stream), backward; not legacy
  fake_cuda_set_stream_busy(hp_, 0);
  auto flush = shim_fn<orion_flush_fn>("orion_flush");
  ASSERT_EQ(flush(), 0);
  EXPECT_EQ(count_launches(calls(), k_other_), 1u);
  EXPECT_EQ(count_launches(calls(), plain_again), 1u);
}

TEST_F(Scheduling, TraceShowsKernelDurationsLearnedFromTheDriver) {
  auto flush = shim_fn<orion_flush_fn>("orion_flush");
  ASSERT_NE(flush, nullptr);
  if (!scheduled_) {
    EXPECT_EQ(flush(), ENODEV);
    return;
  }
  const char* path = std::getenv("ORION_TRACE");
  ASSERT_NE(path, nullptr) << "ctest sets ORION_TRACE";
  CUfunction timed = fake_cuda_make_function("timed_kernel", 0, nullptr);
  fake_cuda_set_kernel_duration_ns(timed, 5000);
  // Two launches queued behind each other on a held stream. A kernel still being learned is timed
  // on every launch (Op::wants_timing) by events recorded right before and right after it, so
  // both are timed exactly, the first one too although nothing ran before it on the stream.
  fake_cuda_set_stream_busy(hp_, 1);
  ASSERT_EQ(cuLaunchKernel(timed, 1, 1, 1, 1, 1, 1, 0, hp_, nullptr, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(cuLaunchKernel(timed, 1, 1, 1, 1, 1, 1, 0, hp_, nullptr, nullptr), CUDA_SUCCESS);
  fake_cuda_set_stream_busy(hp_, 0);
  ASSERT_TRUE(wait_idle());
  ASSERT_EQ(flush(), 0);
  std::ifstream in(path);
  ASSERT_TRUE(in.good()) << path;
  nlohmann::json trace = nlohmann::json::parse(in);
  int timed_events = 0;
  for (const auto& e : trace.at("traceEvents")) {
    if (e.value("name", "") != "timed_kernel" || e.value("ph", "") != "X") continue;
    const double dur = e.value("dur", 0.0);
    if (dur > 0) {
      // cuEventElapsedTime answers in float milliseconds: ~1 ns of rounding at this size.
      EXPECT_NEAR(dur, 5.0, 0.01) << "microseconds, from the fake driver timeline";
      ++timed_events;
    }
  }
  EXPECT_EQ(timed_events, 2);
}

// --- stream memory ops, batch copies, synchronous 2D/3D/peer copies, cuCtxSynchronize_v2 ---

}  // namespace

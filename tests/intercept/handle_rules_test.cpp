// The shim against the driver's rules on graphs and handles (issue 11): graphs that record or wait
// on events and signal semaphores, kernel handles reused after a module unload or a context
// destroy, ops that cannot be copied, events recorded by launch attributes; and the helper
// thread: idle without burning a core, and forked children exit. Each test failed on the shim
// before its fix. Run twice by ctest: scheduled (USE_ORION_SCHEDULER=1, priority policy) and
// pass-through (=0).
#include <sys/wait.h>
#include <time.h>

#include <atomic>
#include <csignal>
#include <cstdlib>
#include <chrono>
#include <cstring>
#include <functional>
#include <thread>

#include "scheduling_fixture.h"

namespace {

using namespace icpt_test;

class DriverRules : public Scheduling {
 protected:
  void expect_held_with_its_own_layout(CUfunction g);
};

// Finding 8: events recorded and waited on by the nodes of a graph. The shim's event bookkeeping
// never sees them, so a launch of such an executable must not be deferred past later waits on
// the events it records, nor run before the queued records of the events it waits on.

long log_index(const std::vector<fake_cuda_call>& log, const char* prefix, uint64_t handle, bool by_event) {
  return find_call(log, [&](const fake_cuda_call& c) {
    return std::strncmp(c.name, prefix, std::strlen(prefix)) == 0 && (by_event ? c.event : c.value) == handle;
  });
}

// The record node sits in a child graph: the shim walks child graphs.
TEST_F(DriverRules, AGraphThatRecordsAnEventIsNotDeferredPastALaterWait) {
  CUevent e = nullptr;
  ASSERT_EQ(cuEventCreate(&e, 0), CUDA_SUCCESS);
  CUgraph outer = nullptr, inner = nullptr;
  CUgraphNode node = nullptr;
  ASSERT_EQ(cuGraphCreate(&inner, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuGraphAddEventRecordNode(&node, inner, nullptr, 0, e), CUDA_SUCCESS);
  ASSERT_EQ(cuGraphCreate(&outer, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuGraphAddEmptyNode(&node, outer, nullptr, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuGraphAddChildGraphNode(&node, outer, nullptr, 0, inner), CUDA_SUCCESS);
  CUgraphExec exec = nullptr;
  ASSERT_EQ(cuGraphInstantiateWithFlags(&exec, outer, 0), CUDA_SUCCESS);
  CUstream hp2 = nullptr;
  ASSERT_EQ(cuStreamCreateWithPriority(&hp2, 0, -5), CUDA_SUCCESS);
  hold_high_priority();                             // best-effort work is deferred now
  ASSERT_EQ(launch(k_be_, be_, 1), CUDA_SUCCESS);   // queued (scheduled)
  ASSERT_EQ(cuGraphLaunch(exec, be_), CUDA_SUCCESS);  // records e
  ASSERT_EQ(cuStreamWaitEvent(hp2, e, 0), CUDA_SUCCESS);  // high priority: reaches the driver now
  const auto log = calls();
  const long graph_at = log_index(log, "cuGraphLaunch", h(exec), false);
  const long wait_at = log_index(log, "cuStreamWaitEvent", h(e), true);
  ASSERT_GE(wait_at, 0);
  ASSERT_GE(graph_at, 0) << "the graph launch was deferred past the wait on the event it records";
  EXPECT_LT(graph_at, wait_at) << "the wait reached the driver before the record it follows in program order";
  if (scheduled_) {
    EXPECT_LT(find_launch(log, k_be_), graph_at) << "the graph overtook its stream's queued kernel";
  }
  fake_cuda_set_stream_busy(hp_, 0);
  EXPECT_TRUE(wait_idle());
  EXPECT_EQ(cuGraphExecDestroy(exec), CUDA_SUCCESS);
  EXPECT_EQ(cuGraphDestroy(outer), CUDA_SUCCESS);
  EXPECT_EQ(cuGraphDestroy(inner), CUDA_SUCCESS);
  EXPECT_EQ(cuEventDestroy(e), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamDestroy(hp2), CUDA_SUCCESS);
}

// A graph that signals an external semaphore (a Vulkan renderer or another process waits on it)
// is never held, as cuSignalExternalSemaphoresAsync itself is not: its queued stream work reaches
// the driver first, then the launch, at once.
TEST_F(DriverRules, AGraphThatSignalsAnExternalSemaphoreIsNotHeld) {
  CUgraph graph = nullptr;
  CUgraphNode node = nullptr;
  ASSERT_EQ(cuGraphCreate(&graph, 0), CUDA_SUCCESS);
  CUDA_EXT_SEM_SIGNAL_NODE_PARAMS signal{};
  ASSERT_EQ(cuGraphAddExternalSemaphoresSignalNode(&node, graph, nullptr, 0, &signal), CUDA_SUCCESS);
  CUgraphExec exec = nullptr;
  ASSERT_EQ(cuGraphInstantiateWithFlags(&exec, graph, 0), CUDA_SUCCESS);
  hold_high_priority();
  ASSERT_EQ(launch(k_be_, be_, 1), CUDA_SUCCESS);
  ASSERT_EQ(cuGraphLaunch(exec, be_), CUDA_SUCCESS);
  const auto log = calls();
  const long graph_at = log_index(log, "cuGraphLaunch", h(exec), false);
  ASSERT_GE(graph_at, 0) << "the graph that signals an external semaphore was held back";
  if (scheduled_) {
    EXPECT_LT(find_launch(log, k_be_), graph_at) << "the graph overtook its stream's queued kernel";
  }
  fake_cuda_set_stream_busy(hp_, 0);
  EXPECT_TRUE(wait_idle());
  EXPECT_EQ(cuGraphExecDestroy(exec), CUDA_SUCCESS);
  EXPECT_EQ(cuGraphDestroy(graph), CUDA_SUCCESS);
}

TEST_F(DriverRules, AGraphThatWaitsOnAnEventRunsAfterItsQueuedRecord) {
  CUevent e = nullptr;
  ASSERT_EQ(cuEventCreate(&e, 0), CUDA_SUCCESS);
  CUgraph graph = nullptr;
  CUgraphNode node = nullptr;
  ASSERT_EQ(cuGraphCreate(&graph, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuGraphAddEventWaitNode(&node, graph, nullptr, 0, e), CUDA_SUCCESS);
  CUgraphExec exec = nullptr;
  CUDA_GRAPH_INSTANTIATE_PARAMS params{};
  ASSERT_EQ(cuGraphInstantiateWithParams(&exec, graph, &params), CUDA_SUCCESS);
  CUstream hp2 = nullptr;
  ASSERT_EQ(cuStreamCreateWithPriority(&hp2, 0, -5), CUDA_SUCCESS);
  hold_high_priority();
  ASSERT_EQ(launch(k_be_, be_, 1), CUDA_SUCCESS);
  ASSERT_EQ(cuEventRecord(e, be_), CUDA_SUCCESS);     // queued behind the kernel (scheduled)
  ASSERT_EQ(cuGraphLaunch(exec, hp2), CUDA_SUCCESS);  // waits on e: high priority, not deferred
  const auto log = calls();
  const long record_at = log_index(log, "cuEventRecord", h(e), true);
  const long graph_at = log_index(log, "cuGraphLaunch", h(exec), false);
  ASSERT_GE(graph_at, 0);
  ASSERT_GE(record_at, 0) << "the graph reached the driver while the record it waits on was still queued";
  EXPECT_LT(record_at, graph_at);
  fake_cuda_set_stream_busy(hp_, 0);
  EXPECT_TRUE(wait_idle());
  EXPECT_EQ(cuGraphExecDestroy(exec), CUDA_SUCCESS);
  EXPECT_EQ(cuGraphDestroy(graph), CUDA_SUCCESS);
  EXPECT_EQ(cuEventDestroy(e), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamDestroy(hp2), CUDA_SUCCESS);
}

// Finding 9: a CUkernel passed as a CUfunction (cuFuncGetParamInfo answers INVALID_VALUE for it at
// index 0) is not taken for a kernel without parameters: its arguments are copied with the sizes
// cuKernelGetParamInfo gives.
TEST_F(DriverRules, InvalidValueAtIndexZeroIsNotAKernelWithoutParameters) {
  const uint64_t lib = fake_cuda_make_module();
  const size_t sizes[] = {sizeof(int), sizeof(double)};
  CUkernel kernel = fake_cuda_make_kernel(lib, "library_kernel", 2, sizes);
  auto f = reinterpret_cast<CUfunction>(kernel);
  hold_high_priority();
  ASSERT_EQ(launch(f, be_, 1234, 5.5), CUDA_SUCCESS);
  expect_deferred(f);
  fake_cuda_set_stream_busy(hp_, 0);
  ASSERT_EQ(cuStreamSynchronize(be_), CUDA_SUCCESS);
  auto log = calls();
  const long k = find_launch(log, f);
  ASSERT_GE(k, 0);
  ASSERT_EQ(log[k].param_bytes, 16u);
  int a = 0;
  double b = 0;
  std::memcpy(&a, log[k].params, sizeof a);
  std::memcpy(&b, log[k].params + 8, sizeof b);
  EXPECT_EQ(a, 1234) << "the deferred launch lost its arguments";
  EXPECT_EQ(b, 5.5);
  EXPECT_EQ(cuLibraryUnload(reinterpret_cast<CUlibrary>(lib)), CUDA_SUCCESS);
}

// `g` (an (int, double) kernel whose handle value another kernel had before) launched on the
// best-effort stream while high priority holds it: held, then copied with g's own layout.
void DriverRules::expect_held_with_its_own_layout(CUfunction g) {
  hold_high_priority();
  ASSERT_EQ(launch(g, be_, 77, 1.25), CUDA_SUCCESS);
  expect_deferred(g);
  fake_cuda_set_stream_busy(hp_, 0);
  ASSERT_EQ(cuStreamSynchronize(be_), CUDA_SUCCESS);
  const auto log = calls();
  const long k = find_launch(log, g);
  ASSERT_GE(k, 0);
  ASSERT_EQ(log[k].param_bytes, 16u) << "copied with the old function's parameter layout";
  int a = 0;
  double b = 0;
  std::memcpy(&a, log[k].params, sizeof a);
  std::memcpy(&b, log[k].params + 8, sizeof b);
  EXPECT_EQ(a, 77);
  EXPECT_EQ(b, 1.25);
}

// Finding 9: unloading a module first submits queued launches of its functions, and forgets what
// the shim knew about them: a function of a later module that gets the same handle value is
// catalogued afresh (name, communication, parameter layout).
TEST_F(DriverRules, ModuleUnloadDrainsItsLaunchesAndForgetsItsFunctions) {
  const uint64_t mod = fake_cuda_make_module();
  const size_t one_int[] = {sizeof(int)};
  CUfunction old_f = fake_cuda_make_function_in(mod, "ncclDevKernel_Old", 1, one_int);
  int x = 3;
  void* args[] = {&x};
  ASSERT_EQ(cuLaunchKernel(old_f, 1, 1, 1, 1, 1, 1, 0, plain_, args, nullptr), CUDA_SUCCESS);
  CUfunction queued_f = fake_cuda_make_function_in(mod, "queued_kernel", 1, one_int);
  hold_high_priority();
  ASSERT_EQ(cuLaunchKernel(queued_f, 1, 1, 1, 1, 1, 1, 0, be_, args, nullptr), CUDA_SUCCESS);
  expect_deferred(queued_f);
  ASSERT_EQ(cuModuleUnload(reinterpret_cast<CUmodule>(mod)), CUDA_SUCCESS);
  auto log = calls();
  const long q = find_launch(log, queued_f);
  ASSERT_GE(q, 0) << "a queued launch of the module was not submitted before the unload";
  EXPECT_EQ(log[q].result, CUDA_SUCCESS);
  EXPECT_LT(q, find_named(log, "cuModuleUnload", 0));
  // The next functions made reuse the unloaded handles (last freed first).
  const uint64_t mod2 = fake_cuda_make_module();
  const size_t sizes[] = {sizeof(int), sizeof(double)};
  CUfunction g1 = fake_cuda_make_function_in(mod2, "reused_kernel", 2, sizes);
  CUfunction g2 = fake_cuda_make_function_in(mod2, "reused_kernel", 2, sizes);
  ASSERT_TRUE(g1 == old_f || g2 == old_f) << "the fake did not reuse the handle";
  CUfunction g = g1 == old_f ? g1 : g2;
  fake_cuda_reset();
  expect_held_with_its_own_layout(g);  // and not the old NCCL kernel's communication class
  if (scheduled_) {
    auto set_class = shim_fn<orion_set_stream_class_fn>("orion_set_stream_class");
    ASSERT_NE(set_class, nullptr);
    EXPECT_EQ(set_class(be_, "best_effort"), 0);
  }
}

// Destroying a context unloads its modules, as cuModuleUnload does, so the shim must forget their
// functions too: a kernel of a later module that gets a reused handle value is held with the
// old kernel's parameter layout otherwise (too few bytes copied; the driver reads past them).
// cuCtxDestroy, cuCtxDetach, cuDevicePrimaryCtxRelease/Reset and cuGreenCtxDestroy all do this
// (gen_driver_api.py's CONTEXT_ENDING); the fake models cuCtxDestroy's unload.
TEST_F(DriverRules, ContextDestroyForgetsItsFunctions) {
  CUcontext primary = nullptr, c2 = nullptr;
  ASSERT_EQ(cuCtxGetCurrent(&primary), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxCreate(&c2, nullptr, 0, 0), CUDA_SUCCESS);
  const uint64_t mod = fake_cuda_make_module();
  const size_t one_int[] = {sizeof(int)};
  CUfunction old_f = fake_cuda_make_function_in(mod, "kernel_of_a_destroyed_context", 1, one_int);
  int x = 3;
  void* args[] = {&x};
  CUstream s2 = nullptr;  // a stream of the context (the driver refuses another context's)
  ASSERT_EQ(cuStreamCreate(&s2, CU_STREAM_NON_BLOCKING), CUDA_SUCCESS);
  ASSERT_EQ(cuLaunchKernel(old_f, 1, 1, 1, 1, 1, 1, 0, s2, args, nullptr), CUDA_SUCCESS);  // catalogued
  CUcontext popped = nullptr;
  ASSERT_EQ(cuCtxPopCurrent(&popped), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxDestroy(c2), CUDA_SUCCESS);
  const uint64_t mod2 = fake_cuda_make_module();
  const size_t sizes[] = {sizeof(int), sizeof(double)};
  CUfunction g = fake_cuda_make_function_in(mod2, "kernel_with_a_reused_handle", 2, sizes);
  ASSERT_EQ(g, old_f) << "the fake did not reuse the handle of the destroyed context's function";
  fake_cuda_reset();
  expect_held_with_its_own_layout(g);
}

// Finding 9: a graph executable destroyed (or updated) while its launch is queued: the launch
// reaches the driver first.
TEST_F(DriverRules, GraphExecDestroyWaitsForItsQueuedLaunch) {
  const CUgraphExec exec = make_graph_exec();
  ASSERT_NE(exec, nullptr);
  hold_high_priority();
  ASSERT_EQ(cuGraphLaunch(exec, be_), CUDA_SUCCESS);
  if (scheduled_) {
    EXPECT_EQ(find_named(calls(), "cuGraphLaunch", h(be_)), -1) << "the graph launch was not deferred";
  }
  ASSERT_EQ(cuGraphExecDestroy(exec), CUDA_SUCCESS);
  fake_cuda_set_stream_busy(hp_, 0);
  EXPECT_EQ(cuStreamSynchronize(be_), CUDA_SUCCESS) << "the queued graph launch failed";
  auto log = calls();
  const long launch_at = find_named(log, "cuGraphLaunch", h(be_));
  ASSERT_GE(launch_at, 0);
  EXPECT_EQ(log[launch_at].result, CUDA_SUCCESS);
}

// Finding 10: an op the shim cannot copy (unknown argument sizes, cuMemAllocAsync, a pageable
// copy) is not held back by the policy while its caller waits: its stream is drained at once.
TEST_F(DriverRules, OpsThatCannotBeCopiedDrainTheirStreamAtOnce) {
  CUfunction opaque = fake_cuda_make_function("opaque_args", 2, nullptr);
  std::vector<unsigned char> pageable(256, 1);
  struct Case {
    const char* what;
    std::function<CUresult()> call;
  };
  const Case cases[] = {
      {"kernel with unknown argument sizes", [&] { return launch(opaque, be_, 9); }},
      {"cuMemAllocAsync", [&] {
         CUdeviceptr p = 0;
         return cuMemAllocAsync(&p, 128, be_);
       }},
      {"pageable copy", [&] { return cuMemcpyHtoDAsync(0x1000, pageable.data(), pageable.size(), be_); }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    fake_cuda_reset();
    hold_high_priority();
    ASSERT_EQ(launch(k_be_, be_, 1), CUDA_SUCCESS);  // queued ahead of the op
    expect_deferred(k_be_);
    // The old behaviour waited for high priority to finish: only the watchdog ends that wait (after
    // 10 s), so whether it had to is the verdict, not the call's wall-clock time.
    std::atomic<bool> returned{false}, released{false};
    std::thread watchdog([&] {
      for (int i = 0; i < 2000 && !returned.load(); ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      released = !returned.load();
      fake_cuda_set_stream_busy(hp_, 0);
    });
    const CUresult rc = c.call();
    returned = true;
    watchdog.join();
    EXPECT_EQ(rc, CUDA_SUCCESS);
    EXPECT_FALSE(released.load()) << "the caller waited for the policy";
    auto log = calls();
    ASSERT_GE(find_launch(log, k_be_), 0);
    ASSERT_EQ(cuStreamSynchronize(be_), CUDA_SUCCESS);
  }
}

// Finding 8: a launch that records an event itself (launch-completion attribute) is a record of
// that event: a later wait on the event binds to it, and cuEventElapsedTime answers NOT_READY
// while it is queued.
TEST_F(DriverRules, EventsRecordedByLaunchAttributesOrderLaterWaits) {
  CUevent done = nullptr, start = nullptr;
  ASSERT_EQ(cuEventCreate(&done, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuEventCreate(&start, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuEventRecord(start, plain_), CUDA_SUCCESS);
  hold_high_priority();
  CUfunction f = fake_cuda_make_function("completion_kernel", 0, nullptr);
  CUlaunchAttribute attr{};
  attr.id = CU_LAUNCH_ATTRIBUTE_LAUNCH_COMPLETION_EVENT;
  attr.value.launchCompletionEvent.event = done;
  CUlaunchConfig cfg{};
  cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = 1;
  cfg.blockDimX = cfg.blockDimY = cfg.blockDimZ = 1;
  cfg.hStream = be_;
  cfg.attrs = &attr;
  cfg.numAttrs = 1;
  ASSERT_EQ(cuLaunchKernelEx(&cfg, f, nullptr, nullptr), CUDA_SUCCESS);
  expect_deferred(f);
  float ms = -1;
  EXPECT_EQ(cuEventElapsedTime(&ms, start, done),
            scheduled_ ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS);
  ASSERT_EQ(cuStreamWaitEvent(plain_, done, 0), CUDA_SUCCESS);
  auto log = calls();
  const long k = find_launch(log, f);
  const long wait = find_named(log, "cuStreamWaitEvent", h(plain_));
  ASSERT_GE(k, 0) << "the wait reached the driver before the launch that records its event";
  ASSERT_GE(wait, 0);
  EXPECT_LT(k, wait);
  EXPECT_NE(log[k].value, 0u);
  EXPECT_EQ(log[wait].value, log[k].value) << "the wait bound to another record";
  ASSERT_EQ(cuStreamSynchronize(be_), CUDA_SUCCESS);
  EXPECT_EQ(cuEventDestroy(done), CUDA_SUCCESS);
  EXPECT_EQ(cuEventDestroy(start), CUDA_SUCCESS);
}

// A launch recording two events (a launch-completion and a programmatic event): the wait on the
// second one must not reach the driver before the launch either.
TEST_F(DriverRules, ALaunchRecordingTwoEventsOrdersWaitsOnBoth) {
  CUevent done = nullptr, programmatic = nullptr;
  ASSERT_EQ(cuEventCreate(&done, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuEventCreate(&programmatic, 0), CUDA_SUCCESS);
  CUstream hp2 = nullptr;
  ASSERT_EQ(cuStreamCreateWithPriority(&hp2, 0, -5), CUDA_SUCCESS);
  hold_high_priority();
  CUfunction f = fake_cuda_make_function("two_event_kernel", 0, nullptr);
  CUlaunchAttribute attrs[2]{};
  attrs[0].id = CU_LAUNCH_ATTRIBUTE_LAUNCH_COMPLETION_EVENT;
  attrs[0].value.launchCompletionEvent.event = done;
  attrs[1].id = CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT;
  attrs[1].value.programmaticEvent.event = programmatic;
  CUlaunchConfig cfg{};
  cfg.gridDimX = cfg.gridDimY = cfg.gridDimZ = 1;
  cfg.blockDimX = cfg.blockDimY = cfg.blockDimZ = 1;
  cfg.hStream = be_;
  cfg.attrs = attrs;
  cfg.numAttrs = 2;
  ASSERT_EQ(cuLaunchKernelEx(&cfg, f, nullptr, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamWaitEvent(hp2, programmatic, 0), CUDA_SUCCESS);  // high priority: at once
  const auto log = calls();
  const long k = find_launch(log, f);
  const long wait = find_named(log, "cuStreamWaitEvent", h(hp2));
  ASSERT_GE(wait, 0);
  ASSERT_GE(k, 0) << "the wait on the launch's second event reached the driver before the launch";
  EXPECT_LT(k, wait);
  fake_cuda_set_stream_busy(hp_, 0);
  EXPECT_TRUE(wait_idle());
  EXPECT_EQ(cuEventDestroy(done), CUDA_SUCCESS);
  EXPECT_EQ(cuEventDestroy(programmatic), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamDestroy(hp2), CUDA_SUCCESS);
}

// Finding 6 (idle wake-ups): with nothing queued and nothing in flight the shim's helper thread
// has nothing to admit or retire: it must not wake every pump interval (20 us) and burn a core.
TEST_F(DriverRules, AnIdleShimDoesNotBurnCpu) {
  ASSERT_TRUE(wait_idle());
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the helper notices it is idle
  timespec a{}, b{};
  ASSERT_EQ(clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &a), 0);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  ASSERT_EQ(clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &b), 0);
  const double cpu_ms = static_cast<double>(b.tv_sec - a.tv_sec) * 1e3 +
                        static_cast<double>(b.tv_nsec - a.tv_nsec) / 1e6;
  EXPECT_LT(cpu_ms, 15.0) << "CPU time of the process over 300 ms of idling";
  // And it still admits work queued after the idle period.
  hold_high_priority();
  ASSERT_EQ(launch(k_be_, be_, 1), CUDA_SUCCESS);
  expect_deferred(k_be_);
  fake_cuda_set_stream_busy(hp_, 0);
  ASSERT_TRUE(wait_idle());
  EXPECT_EQ(count_launches(calls(), k_be_), 1u) << "queued work was not admitted after idling";
}

// Issue 11: with ORION_TRACE set (ctest sets it), a child forked while other threads use the
// shim exits without hanging (it must not flush or join what only the parent has).
TEST_F(DriverRules, ForkedChildrenExitWithoutHanging) {
#if defined(__SANITIZE_THREAD__) || defined(__SANITIZE_ADDRESS__)
  // The sanitizer runtimes misbehave in a child forked from a multi-threaded process, in
  // pass-through too: ThreadSanitizer's can deadlock; LeakSanitizer's exit-time check hangs or
  // reports memory that only the parent's other threads reference. This test runs in the normal
  // build.
  GTEST_SKIP() << "fork() of a multi-threaded process under a sanitizer";
#endif
  std::atomic<bool> stop{false};
  std::thread busy([&] {
    ASSERT_NE(use_device(0), nullptr);
    for (int i = 0; !stop.load(); ++i) {
      EXPECT_EQ(launch(k_hp_, hp_, i), CUDA_SUCCESS);
      EXPECT_EQ(launch(k_be_, be_, i), CUDA_SUCCESS);
      EXPECT_EQ(cuStreamSynchronize(be_), CUDA_SUCCESS);
    }
  });
  int hung = 0, failed = 0;
  for (int i = 0; i < 12; ++i) {
    const pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) std::exit(0);  // runs the atexit handlers, the shim's among them
    int status = 0;
    pid_t done = 0;
    // 10 s: a child that hangs at exit hangs for good; a loaded machine is only slow.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (done == 0 && std::chrono::steady_clock::now() < deadline) {
      done = waitpid(pid, &status, WNOHANG);
      if (done == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    if (done == 0) {
      ++hung;
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
    } else if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
      ++failed;
    }
  }
  stop = true;
  busy.join();
  EXPECT_EQ(hung, 0) << "forked children hung at exit";
  EXPECT_EQ(failed, 0);
}

}  // namespace

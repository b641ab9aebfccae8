// The fixture of the release-rule suites (release_rules_test.cpp, graph_release_rules_test.cpp):
// the scheduling fixture plus checks that a call reaches the driver only after the held work it
// depends on, and only that work.
#pragma once

#include <cstring>

#include "scheduling_fixture.h"

namespace icpt_test {

class ReleaseRules : public Scheduling {
 protected:
  // Index of the first call named `name` (any stream), or -1.
  static long find_any(const std::vector<fake_cuda_call>& log, const char* name) {
    return find_call(log, [&](const fake_cuda_call& c) { return std::strcmp(c.name, name) == 0; });
  }
  // The copy must be held while HP is in flight (scheduled), or in the driver at once.
  void expect_held(const char* name, CUstream s) {
    if (scheduled_) {
      EXPECT_EQ(find_named(calls(), name, h(s)), -1) << name << " was not held back";
    } else {
      EXPECT_GE(find_named(calls(), name, h(s)), 0);
    }
  }
  // An interprocess event `ipc` on the best-effort stream while high priority runs: `op` (logged as
  // `name`) on an ordinary event is held, on `ipc` it reaches the driver before the call returns,
  // behind the kernel queued before it.
  void expect_interprocess_op_not_held(const char* name, CUevent ipc, CUresult (*op)(CUevent, CUstream)) {
    CUevent plain = nullptr;
    ASSERT_EQ(cuEventCreate(&plain, CU_EVENT_DISABLE_TIMING), CUDA_SUCCESS);
    hold_high_priority();
    ASSERT_EQ(launch(k_be_, be_, 1), CUDA_SUCCESS);
    ASSERT_EQ(op(plain, be_), CUDA_SUCCESS);
    expect_held(name, be_);
    ASSERT_EQ(op(ipc, be_), CUDA_SUCCESS);
    const auto log = calls();
    const long kernel = find_launch(log, k_be_);
    const long at = find_call(log, [&](const fake_cuda_call& c) { return std::strcmp(c.name, name) == 0 && c.event == h(ipc); });
    ASSERT_GE(at, 0) << name << " of an interprocess event was held back";
    ASSERT_GE(kernel, 0) << "the work before " << name << " did not reach the driver before it";
    EXPECT_LT(kernel, at);
    fake_cuda_set_stream_busy(hp_, 0);
    EXPECT_EQ(cuStreamSynchronize(be_), CUDA_SUCCESS);
    EXPECT_EQ(cuEventDestroy(plain), CUDA_SUCCESS);
  }
  static CUresult record_on(CUevent e, CUstream s) { return cuEventRecord(e, s); }
  static CUresult wait_on(CUevent e, CUstream s) { return cuStreamWaitEvent(s, e, 0); }
  // Held best-effort launches of `exec` then of another executable; then `call` (named `name` in the
  // driver's log) on the high-priority stream, which CUDA orders behind exec's earlier launches.
  // The held launch of exec reaches the driver first; the other executable's stays held.
  void expect_behind_the_executables_held_launch(const char* name, CUresult (*call)(CUgraphExec, CUstream)) {
    const CUgraphExec exec = make_graph_exec(), other = make_graph_exec();
    ASSERT_NE(exec, nullptr);
    ASSERT_NE(other, nullptr);
    hold_high_priority();
    ASSERT_EQ(cuGraphLaunch(exec, be_), CUDA_SUCCESS);
    ASSERT_EQ(cuGraphLaunch(other, be_), CUDA_SUCCESS);
    expect_held("cuGraphLaunch", be_);
    ASSERT_EQ(call(exec, hp_), CUDA_SUCCESS);
    auto log = calls();
    const long first = find_named(log, "cuGraphLaunch", h(be_));
    const long second = find_named(log, name, h(hp_));
    ASSERT_GE(first, 0) << "the earlier launch of the executable is still held";
    ASSERT_GE(second, 0);
    EXPECT_LT(first, second);
    EXPECT_EQ(log[first].value, h(exec));
    if (scheduled_) {
      // Only what the call depends on was released: the other executable's launch stays held.
      EXPECT_EQ(find_call(log, [&](const fake_cuda_call& c) {
                  return std::strcmp(c.name, "cuGraphLaunch") == 0 && c.value == h(other);
                }), -1);
    }
    fake_cuda_set_stream_busy(hp_, 0);
    EXPECT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
    EXPECT_EQ(cuGraphExecDestroy(exec), CUDA_SUCCESS);
    EXPECT_EQ(cuGraphExecDestroy(other), CUDA_SUCCESS);
  }
  static constexpr CUdeviceptr kDev = 0x1000;  // the fake's device addresses: below 0x10000000
};

}  // namespace icpt_test

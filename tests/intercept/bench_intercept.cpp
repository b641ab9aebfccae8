// Added cost per kernel launch of libgpu_scheduler.so over calling the (fake) driver directly.
// Run it twice, since the shim reads its mode once per process:
//   USE_ORION_SCHEDULER=0 LD_PRELOAD=<build>/intercept/libgpu_scheduler.so bench_intercept
//       -> BM_DriverDirect vs BM_ShimLaunch/passthrough
//   USE_ORION_SCHEDULER=1 ORION_POLICY=priority LD_PRELOAD=<same> bench_intercept
//       -> BM_DriverDirect vs BM_ShimLaunch/{unmanaged,high_priority,best_effort}
// (bench_intercept finds the fake libcuda.so.1 through its run path.)
// The difference of the medians is the shim's cost per launch.
#include <dlfcn.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <vector>

#include <cudaTypedefs.h>

#include <benchmark/benchmark.h>

#include "fake_cuda.h"
#include "orion.h"

namespace {

struct Fixture {
  CUfunction kernel = nullptr;
  CUstream hp = nullptr, be = nullptr, plain = nullptr;
  PFN_cuLaunchKernel_v4000 direct = nullptr;
  bool scheduled = false;
  Fixture() {
    fake_cuda_set_logging(0);
    cuInit(0);
    CUcontext ctx = nullptr;
    cuDevicePrimaryCtxRetain(&ctx, 0);
    cuCtxSetCurrent(ctx);
    const size_t sizes[] = {sizeof(void*), sizeof(int), sizeof(float)};
    kernel = fake_cuda_make_function("bench_kernel", 3, sizes);
    cuStreamCreateWithPriority(&hp, 0, -5);
    cuStreamCreateWithPriority(&be, 0, 0);
    cuStreamCreate(&plain, 0);
    direct = reinterpret_cast<PFN_cuLaunchKernel_v4000>(fake_cuda_own_symbol("cuLaunchKernel"));
    auto active = reinterpret_cast<orion_is_active_fn>(dlsym(RTLD_DEFAULT, "orion_is_active"));
    scheduled = active != nullptr && active() == 1;
  }
};
Fixture& fixture() {
  static Fixture f;
  return f;
}

void launch_loop(benchmark::State& state, PFN_cuLaunchKernel_v4000 fn, CUstream stream) {
  Fixture& f = fixture();
  void* ptr = nullptr;
  int n = 1;
  float x = 2;
  void* params[] = {&ptr, &n, &x};
  const uint64_t calls_before = fake_cuda_calls_made();
  for (auto _ : state) {
    CUresult rc = fn(f.kernel, 4, 1, 1, 128, 1, 1, 0, stream, params, nullptr);
    benchmark::DoNotOptimize(rc);
  }
  // Driver calls the fake saw per launch (1 = the launch itself).
  state.counters["driver_calls"] = benchmark::Counter(
      static_cast<double>(fake_cuda_calls_made() - calls_before) /
      static_cast<double>(std::max<benchmark::IterationCount>(state.iterations(), 1)));
  cuStreamSynchronize(stream);
}

// The driver-call cost model: ORION_BENCH_CALL_COST_NS (default 0) per driver call.
const bool kCostModel = [] {
  const char* ns = std::getenv("ORION_BENCH_CALL_COST_NS");
  fake_cuda_set_call_cost_ns(ns != nullptr ? std::atoll(ns) : 0);
  return true;
}();

void BM_DriverDirect(benchmark::State& state) {
  launch_loop(state, fixture().direct, fixture().plain);
}
BENCHMARK(BM_DriverDirect);

void BM_ShimLaunch(benchmark::State& state) {
  Fixture& f = fixture();
  const int which = static_cast<int>(state.range(0));
  if (!f.scheduled && which != 0) {
    state.SkipWithError("needs USE_ORION_SCHEDULER=1");
    return;
  }
  if (f.scheduled && which == 0) {
    state.SkipWithError("needs USE_ORION_SCHEDULER=0");
    return;
  }
  CUstream s = which == 2 ? f.hp : which == 3 ? f.be : f.plain;
  state.SetLabel(which == 0   ? "passthrough"
                 : which == 1 ? "unmanaged"
                 : which == 2 ? "high_priority"
                              : "best_effort");
  launch_loop(state, &cuLaunchKernel, s);  // binds to the preloaded shim
}
BENCHMARK(BM_ShimLaunch)->Arg(0)->Arg(1)->Arg(2)->Arg(3);

// A best-effort launch (admitted at once: no high-priority work in flight) while N other
// best-effort streams each have a tracked op in flight (held busy in the fake): the launch's cost
// must not grow with N.
void BM_BestEffortWithBusyStreams(benchmark::State& state) {
  Fixture& f = fixture();
  if (!f.scheduled) {
    state.SkipWithError("needs USE_ORION_SCHEDULER=1");
    return;
  }
  const int busy = static_cast<int>(state.range(0));
  std::vector<CUstream> held(static_cast<size_t>(busy));
  void* ptr = nullptr;
  int n = 1;
  float x = 2;
  void* params[] = {&ptr, &n, &x};
  for (CUstream& s : held) {
    cuStreamCreateWithPriority(&s, 0, 0);
    fake_cuda_set_stream_busy(s, 1);
    cuLaunchKernel(f.kernel, 4, 1, 1, 128, 1, 1, 0, s, params, nullptr);
  }
  state.SetLabel(std::to_string(busy) + " busy streams");
  launch_loop(state, &cuLaunchKernel, f.be);
  for (CUstream s : held) {
    fake_cuda_set_stream_busy(s, 0);
    cuStreamSynchronize(s);
    cuStreamDestroy(s);
  }
}
BENCHMARK(BM_BestEffortWithBusyStreams)->Arg(0)->Arg(8)->Arg(128);

// A launch on the legacy NULL stream while LibTorch's 128 non-blocking pool streams exist (with
// and without the shim: compare with BM_LegacyDirect128).
void legacy_with_pool(benchmark::State& state, PFN_cuLaunchKernel_v4000 fn) {
  std::vector<CUstream> pool(128);
  for (CUstream& s : pool) cuStreamCreateWithPriority(&s, CU_STREAM_NON_BLOCKING, 0);
  launch_loop(state, fn, nullptr);
  for (CUstream s : pool) cuStreamDestroy(s);
}
void BM_LegacyDirect128(benchmark::State& state) { legacy_with_pool(state, fixture().direct); }
BENCHMARK(BM_LegacyDirect128);
void BM_LegacyShim128(benchmark::State& state) { legacy_with_pool(state, &cuLaunchKernel); }
BENCHMARK(BM_LegacyShim128);

}  // namespace

BENCHMARK_MAIN();

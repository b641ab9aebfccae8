// The fake driver's profiler calls (cudaProfiler.h): cuProfilerStart/Stop bound the range a
// profiler (Nsight Systems' --capture-range=cudaProfilerApi, nvprof) collects. No profiler runs
// here, so the fake only logs them, in order with the work around them, which is what a test of
// the shim can check: work the program issued before a stop reached the driver before it.
// Like other calls that act on a context, each needs one current (driver_model probe
// profiler.start_without_context; assumed until a GPU answers it).
#include "fake_cuda_state.h"  // first: it selects cuda.h's internal (all-variants) mode

#include <cudaProfiler.h>

using namespace fake_cuda_impl;

namespace {
CUresult profiler_call(const char* name) {
  State& s = st();
  std::lock_guard lock(s.mu);
  fake_cuda_call& c = begin(s, name);
  return finish(s, c, current_ctx() == 0 ? CUDA_ERROR_INVALID_CONTEXT : CUDA_SUCCESS);
}
}  // namespace

FAKE_EXPORT CUresult CUDAAPI cuProfilerStart() { return profiler_call("cuProfilerStart"); }
FAKE_EXPORT CUresult CUDAAPI cuProfilerStop() { return profiler_call("cuProfilerStop"); }

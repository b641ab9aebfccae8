// The fake driver's functions from the headers beside cuda.h (cudaProfiler.h, cudaGL.h), enough
// to check that the shim's generated wrappers for them release held work first.
//  - cuProfilerStart/Stop bound the range a profiler (Nsight Systems'
//    --capture-range=cudaProfilerApi) collects. No profiler runs here: they are logged, in order
//    with the work around them, and need a current context like other calls that act on one
//    (driver_model probe profiler.start_without_context; assumed until a GPU answers it).
//  - cuGLUnmapBufferObjectAsync (legacy OpenGL interop) is stream work. No GL context can be made
//    here, so which buffers are registered and mapped is not modelled (any buffer is accepted):
//    only the stream is checked, as for other work enqueued on one, and the call logged on it.
#include "fake_cuda_state.h"  // first: it selects cuda.h's internal (all-variants) mode

#include <GL/gl.h>
#include <cudaGL.h>
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

FAKE_EXPORT CUresult CUDAAPI cuGLUnmapBufferObjectAsync(GLuint buffer, CUstream hs) {
  State& s = st();
  std::lock_guard lock(s.mu);
  fake_cuda_call& c = begin(s, "cuGLUnmapBufferObjectAsync");
  c.stream = reinterpret_cast<uint64_t>(hs);
  c.value = buffer;
  const uint64_t id = sid(hs, false);
  if (CUresult rc = check_enqueue(s, id); rc != CUDA_SUCCESS) return finish(s, c, rc);
  advance(s, id, 100, c);
  return finish(s, c);
}

// The driver functions declared outside cuda.h (cudaProfiler.h, cudaGL.h, cudaEGL.h, cudaVDPAU.h)
// are the driver's too: libcuda exports them and libcudart looks cuProfilerStart/Stop up at
// start-up. Before, the shim had no wrapper for them, so cudaProfilerStop() reached the driver
// while best-effort work was still held: Nsight's capture range (--capture-range=cudaProfilerApi)
// ended before kernels the program issued inside it. Now each gets a generated wrapper that
// releases everything held first, whichever way the program reaches it (direct linking, dlsym,
// cuGetProcAddress). The fake driver has the profiler calls and one graphics-interop call,
// cuGLUnmapBufferObjectAsync, as stream work without its GL buffer (no GL, EGL or VDPAU context
// can be made here; intercept.driver_api_table checks that the shim exports and classifies every
// interop function). Run scheduled and pass-through.
#include <GL/gl.h>
#include <cudaGL.h>
#include <cudaProfiler.h>

#include <functional>

#include "lookup_fixture.h"

namespace {

using namespace icpt_test;

class InteropRules : public ProcLookup {
 protected:
  // A best-effort launch held behind high-priority work, then `call` (logged as `name`): the
  // launch reaches the driver before it, and only then.
  void expect_releases_the_held_launch(const char* name, const std::function<CUresult()>& call) {
    hold_high_priority();
    ASSERT_EQ(launch(k_be_, be_, 1), CUDA_SUCCESS);
    expect_deferred(k_be_);
    ASSERT_EQ(call(), CUDA_SUCCESS);
    const auto log = calls();
    const long kernel = find_launch(log, k_be_);
    const long at = find_call(log, [&](const fake_cuda_call& c) { return std::strcmp(c.name, name) == 0; });
    ASSERT_GE(at, 0) << name << " did not reach the driver";
    ASSERT_GE(kernel, 0) << "the launch issued before " << name << " was still held when it reached the driver";
    EXPECT_LT(kernel, at);
    EXPECT_FALSE(holding_stopped()) << name << " made the shim stop holding work";
    fake_cuda_set_stream_busy(hp_, 0);
    EXPECT_EQ(cuStreamSynchronize(be_), CUDA_SUCCESS);
  }
};

TEST_F(InteropRules, AProfilerStopComesAfterTheWorkIssuedBeforeIt) {
  expect_releases_the_held_launch("cuProfilerStop", [] { return cuProfilerStop(); });
}

TEST_F(InteropRules, AProfilerStartComesAfterTheWorkIssuedBeforeIt) {
  expect_releases_the_held_launch("cuProfilerStart", [] { return cuProfilerStart(); });
}

// libcudart's path: cudaProfilerStop() calls the entry point cuGetProcAddress handed it.
TEST_F(InteropRules, TheLookedUpProfilerStopIsTheShimsAndKeepsItHolding) {
  void* looked_up = lookup("cuProfilerStop", CUDA_VERSION);
  ASSERT_NE(looked_up, nullptr);
  EXPECT_TRUE(in_shim(looked_up)) << "cuGetProcAddress handed out " << library_of(looked_up);
  EXPECT_TRUE(in_shim(lookup("cuProfilerStart", 4000)));
  EXPECT_FALSE(holding_stopped()) << "looking the profiler up made the shim stop holding work";
  expect_releases_the_held_launch("cuProfilerStop",
                                  [&] { return reinterpret_cast<CUresult(CUDAAPI*)()>(looked_up)(); });
}

TEST_F(InteropRules, DlsymOnTheDriverFindsTheShimsProfilerWrappers) {
  EXPECT_TRUE(in_shim(dlsym(driver_, "cuProfilerStart")));
  EXPECT_TRUE(in_shim(dlsym(driver_, "cuProfilerStop")));
  // An interop function the driver here does not have stays absent (the real one has it).
  EXPECT_EQ(dlsym(driver_, "cuGraphicsGLRegisterBuffer"), nullptr);
}

// An interop call ordered on a stream: the work held before it reaches the driver first.
TEST_F(InteropRules, AnOpenGlUnmapOnAStreamComesAfterTheWorkIssuedBeforeIt) {
  expect_releases_the_held_launch("cuGLUnmapBufferObjectAsync", [&] { return cuGLUnmapBufferObjectAsync(7, be_); });
  EXPECT_GE(find_named(calls(), "cuGLUnmapBufferObjectAsync", h(be_)), 0) << "the unmap was not on its stream";
}

// The driver's answer comes back unchanged: no current context is an error the caller sees.
TEST_F(InteropRules, TheDriversErrorReachesTheCaller) {
  CUcontext ctx = nullptr;
  ASSERT_EQ(cuCtxGetCurrent(&ctx), CUDA_SUCCESS);
  ASSERT_EQ(cuCtxSetCurrent(nullptr), CUDA_SUCCESS);
  EXPECT_EQ(cuProfilerStart(), CUDA_ERROR_INVALID_CONTEXT);
  ASSERT_EQ(cuCtxSetCurrent(ctx), CUDA_SUCCESS);
  EXPECT_EQ(cuProfilerStart(), CUDA_SUCCESS);
}

}  // namespace

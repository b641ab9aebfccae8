// The CUDA driver API, opened at run time: dlopen("libcuda.so.1") (so the replayer starts, and
// --dry-run works, on a machine without a driver) and every entry point looked up by its versioned
// name through the global scope, so a preloaded libgpu_scheduler.so's wrappers come first.
#pragma once

#include <cuda.h>

#include <stdexcept>
#include <string>

namespace replay_gpu {

// Names as cuda.h spells them: the macros there turn e.g. cuMemAlloc into cuMemAlloc_v2, in the
// member names below as at every call site.
#define REPLAY_DRIVER_FUNCTIONS(X)                                                                    \
  X(cuInit) X(cuDriverGetVersion) X(cuGetErrorName) X(cuGetErrorString) X(cuDeviceGetCount)           \
  X(cuDeviceGet) X(cuDeviceGetName) X(cuDeviceGetAttribute) X(cuDevicePrimaryCtxRetain)              \
  X(cuDevicePrimaryCtxRelease) X(cuDevicePrimaryCtxSetFlags) X(cuCtxSetCurrent) X(cuCtxSynchronize)   \
  X(cuCtxGetStreamPriorityRange) X(cuLibraryLoadData) X(cuLibraryUnload) X(cuLibraryGetKernel)       \
  X(cuKernelSetAttribute) X(cuLaunchKernel) X(cuStreamCreateWithPriority) X(cuStreamDestroy)          \
  X(cuStreamSynchronize) X(cuStreamWaitEvent) X(cuStreamBeginCapture) X(cuStreamEndCapture)           \
  X(cuGraphInstantiate) X(cuGraphLaunch) X(cuGraphExecDestroy) X(cuGraphDestroy) X(cuEventCreate)     \
  X(cuEventDestroy) X(cuEventRecord) X(cuEventQuery) X(cuEventSynchronize) X(cuEventElapsedTime)      \
  X(cuMemAlloc) X(cuMemFree) X(cuMemHostAlloc) X(cuMemFreeHost) X(cuMemcpyHtoDAsync) X(cuMemsetD8Async) \
  X(cuLaunchHostFunc) X(cuMemAllocAsync) X(cuMemFreeAsync)

// No usable GPU (no driver, cuInit failed, no device): the message says what to do.
class NoGpuError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};
// A driver call failed: names the call and the CUresult.
class DriverError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct Driver {
#define REPLAY_DRIVER_MEMBER(f) decltype(&::f) f = nullptr;
  REPLAY_DRIVER_FUNCTIONS(REPLAY_DRIVER_MEMBER)
#undef REPLAY_DRIVER_MEMBER

  // Opens libcuda.so.1 and resolves every entry point. Throws NoGpuError when there is no driver.
  static const Driver& get();
  // Throws DriverError "<what>: <CUDA_ERROR_NAME> (<description>)" unless rc is CUDA_SUCCESS.
  void check(CUresult rc, const char* what) const;
  std::string describe(CUresult rc) const;
};

struct DeviceInfo {
  int ordinal = 0;
  std::string name;
  int sm_count = 0;
  int cc_major = 0, cc_minor = 0;
  int clock_khz = 0;  // SM clock (clock64 spin mode)
  int driver_version = 0;
};

// cuInit, then device `ordinal`: NoGpuError ("no CUDA device ...") when the driver is missing,
// cuInit fails or there is no such device.
DeviceInfo probe_device(int ordinal);

}  // namespace replay_gpu

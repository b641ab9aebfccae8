// The probes of driver_model_check (see driver_model_check.cpp): short driver-API programs whose
// one-line answers tests/intercept/fake_cuda/driver_model.json states. Each runs in a fresh
// process, on the driver library it is handed.
#pragma once

#include <functional>
#include <map>
#include <stdexcept>
#include <string>

#include "cuda.h"
#include "cudaProfiler.h"

namespace driver_model {

// The driver functions the probes call, each looked up under the ABI name cuda.h maps it to
// (cuStreamDestroy -> cuStreamDestroy_v2): the same symbol a program built against cuda.h links.
#define DRIVER_MODEL_FUNCTIONS(X)                                                                  \
  X(cuInit) X(cuDeviceGet) X(cuDevicePrimaryCtxRetain) X(cuDevicePrimaryCtxRelease)                \
  X(cuDevicePrimaryCtxReset) X(cuDevicePrimaryCtxGetState) X(cuCtxSetCurrent) X(cuCtxCreate)      \
  X(cuCtxDestroy) X(cuStreamCreate) X(cuStreamQuery) X(cuStreamDestroy) X(cuStreamGetFlags)       \
  X(cuEventCreate) X(cuEventQuery) X(cuEventDestroy) X(cuStreamBeginCapture) X(cuStreamEndCapture) \
  X(cuDeviceGetDevResource) X(cuDevSmResourceSplitByCount) X(cuDevResourceGenerateDesc)           \
  X(cuGreenCtxCreate) X(cuGreenCtxDestroy) X(cuCtxFromGreenCtx) X(cuGreenCtxStreamCreate)         \
  X(cuEventRecord) X(cuStreamWaitEvent) X(cuThreadExchangeStreamCaptureMode)                      \
  X(cuStreamGetPriority) X(cuStreamCreateWithPriority) X(cuCtxGetStreamPriorityRange)            \
  X(cuModuleLoadData) X(cuModuleGetFunction) X(cuModuleUnload) X(cuLaunchKernel)                 \
  X(cuStreamSynchronize) X(cuFuncGetName) X(cuOccupancyMaxActiveBlocksPerMultiprocessor) \
  X(cuCtxSynchronize) X(cuStreamIsCapturing) X(cuProfilerStart) X(cuProfilerStop)

struct Driver {
#define DRIVER_MODEL_FIELD(fn) decltype(&::fn) fn = nullptr;
  DRIVER_MODEL_FUNCTIONS(DRIVER_MODEL_FIELD)
#undef DRIVER_MODEL_FIELD
  decltype(&::cuGetErrorName) error_name = nullptr;  // optional: answers fall back to the number
};

// Opens `path` (dlopen) and looks every function up; throws naming the first that is missing.
Driver open_driver(const std::string& path);

// A probe: called in a child process after cuInit, on device 0; returns its one-line answer, or
// throws SetupFailed naming the set-up call that failed.
using Probe = std::function<std::string(const Driver&, CUdevice)>;

// name -> probe. Names are what driver_model.json lists.
const std::map<std::string, Probe>& probes();

// A set-up call that failed: the probe's answer says which (and it will not agree).
struct SetupFailed : std::runtime_error {
  using std::runtime_error::runtime_error;
};
void must(const Driver& d, CUresult rc, const char* call);
#define MUST(d, call) ::driver_model::must(d, (call), #call)

// The result's name as the driver gives it (cuGetErrorName), else "CUresult <number>".
std::string name_of(const Driver& d, CUresult rc);

}  // namespace driver_model

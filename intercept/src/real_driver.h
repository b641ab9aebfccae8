// The real driver: libcuda.so.1 opened with dlopen at run time (the shim never links it), and a
// typed pointer per wrapped entry point and per helper function the shim itself calls.
#pragma once

#include <cstdint>
#include <span>

#include "cuda_api.h"

namespace orion {

enum class Entry : uint16_t {
#define ORION_ENTRY(base, sym, pfn, lo, hi, pt) sym,
#include "entry_points.def"
#undef ORION_ENTRY
  kCount
};

// One row of entry_points.def plus the shim's wrapper for it.
struct EntryInfo {
  const char* base;
  const char* symbol;
  int min_version;
  int max_version;  // exclusive
  bool per_thread;
  void* wrapper;
};
std::span<const EntryInfo> entry_table();

// Driver functions the shim calls itself but does not wrap (the dlsym'd symbol, its type).
#define ORION_HELPER_FUNCTIONS(X)                                                   \
  X(cuCtxGetCurrent, PFN_cuCtxGetCurrent_v4000)                                     \
  X(cuCtxSetCurrent, PFN_cuCtxSetCurrent_v4000)                                     \
  X(cuCtxPushCurrent_v2, PFN_cuCtxPushCurrent_v4000)                                \
  X(cuCtxPopCurrent_v2, PFN_cuCtxPopCurrent_v4000)                                  \
  X(cuCtxGetDevice, PFN_cuCtxGetDevice_v2000)                                       \
  X(cuCtxGetStreamPriorityRange, PFN_cuCtxGetStreamPriorityRange_v5050)             \
  X(cuDeviceGetAttribute, PFN_cuDeviceGetAttribute_v2000)                           \
  X(cuFuncGetName, PFN_cuFuncGetName_v12030)                                        \
  X(cuFuncGetAttribute, PFN_cuFuncGetAttribute_v2020)                               \
  X(cuKernelGetAttribute, PFN_cuKernelGetAttribute_v12000)                          \
  X(cuKernelGetName, PFN_cuKernelGetName_v12030)                                    \
  X(cuFuncGetParamInfo, PFN_cuFuncGetParamInfo_v12040)                              \
  X(cuKernelGetParamInfo, PFN_cuKernelGetParamInfo_v12040)                          \
  X(cuKernelGetFunction, PFN_cuKernelGetFunction_v12000)                            \
  X(cuOccupancyMaxActiveBlocksPerMultiprocessor,                                    \
    PFN_cuOccupancyMaxActiveBlocksPerMultiprocessor_v6050)                          \
  X(cuPointerGetAttribute, PFN_cuPointerGetAttribute_v4000)                         \
  X(cuStreamGetCtx, PFN_cuStreamGetCtx_v9020)                                       \
  X(cuGraphGetNodes, PFN_cuGraphGetNodes_v10000)                                    \
  X(cuGraphNodeGetType, PFN_cuGraphNodeGetType_v10000)                              \
  X(cuGraphEventRecordNodeGetEvent, PFN_cuGraphEventRecordNodeGetEvent_v11010)      \
  X(cuGraphEventWaitNodeGetEvent, PFN_cuGraphEventWaitNodeGetEvent_v11010)          \
  X(cuGraphChildGraphNodeGetGraph, PFN_cuGraphChildGraphNodeGetGraph_v10000)        \
  X(cuGraphKernelNodeGetParams_v2, PFN_cuGraphKernelNodeGetParams_v12000)           \
  X(cuThreadExchangeStreamCaptureMode, PFN_cuThreadExchangeStreamCaptureMode_v10010) \
  X(cuDevicePrimaryCtxGetState, PFN_cuDevicePrimaryCtxGetState_v7000)               \
  X(cuDeviceGetDevResource, PFN_cuDeviceGetDevResource_v12040)                      \
  X(cuDevSmResourceSplitByCount, PFN_cuDevSmResourceSplitByCount_v12040)            \
  X(cuDevResourceGenerateDesc, PFN_cuDevResourceGenerateDesc_v12040)                \
  X(cuCtxFromGreenCtx, PFN_cuCtxFromGreenCtx_v12040)

namespace real {
#define ORION_ENTRY(base, sym, pfn, lo, hi, pt) inline pfn sym = nullptr;
#include "entry_points.def"
#undef ORION_ENTRY
#define ORION_DECLARE_HELPER(sym, pfn) inline pfn sym = nullptr;
ORION_HELPER_FUNCTIONS(ORION_DECLARE_HELPER)
#undef ORION_DECLARE_HELPER
}  // namespace real

// Opens libcuda.so.1 once and fills real::*. Thread-safe and idempotent; cheap after the first
// call. False when the driver cannot be opened (every wrapper then answers
// CUDA_ERROR_SHARED_OBJECT_INIT_FAILED).
bool load_real_driver();

// glibc's own dlsym (the one our interposer forwards to), for lookups that must not come back
// to the shim. Resolves itself on first use.
void* real_dlsym(void* handle, const char* name);

}  // namespace orion

// The fake driver's cuGetProcAddress: the entry points of entry_points.def (the list the shim's
// hand-written wrappers come from) and a few more, per version range and per-thread flag, and
// the answers of a driver newer than the shim (fake_cuda_set_newer_launch_abi) or one that answers
// early per-thread lookups its own way (fake_cuda_set_early_per_thread_answer).
#include "fake_cuda_state.h"  // first: it selects cuda.h's internal (all-variants) mode

#include <cstring>

#include <cudaProfiler.h>
#include <cudaTypedefs.h>

using namespace fake_cuda_impl;

namespace {

struct ProcEntry {
  const char* base;
  const char* symbol;
  int min_version;
  int max_version;
  bool per_thread;
  void* fn;
};

// The same entry-point list the shim is generated from, pointing at the fake's functions; plus
// driver functions the shim does not wrap.
const ProcEntry kProcs[] = {
#define ORION_ENTRY(base, sym, pfn, lo, hi, pt) {#base, #sym, lo, hi, pt != 0, reinterpret_cast<void*>(&::sym)},
#define ORION_ALIAS(base, sym, lo, hi, pt) {#base, #sym, lo, hi, pt != 0, reinterpret_cast<void*>(&::sym)},
#include "entry_points.def"
#undef ORION_ALIAS
#undef ORION_ENTRY
    {"cuInit", "cuInit", 2000, 0x7fffffff, false, reinterpret_cast<void*>(&cuInit)},
    {"cuCtxGetCurrent", "cuCtxGetCurrent", 4000, 0x7fffffff, false, reinterpret_cast<void*>(&cuCtxGetCurrent)},
    {"cuFuncGetName", "cuFuncGetName", 12030, 0x7fffffff, false, reinterpret_cast<void*>(&cuFuncGetName)},
    {"cuDeviceGetAttribute", "cuDeviceGetAttribute", 2000, 0x7fffffff, false,
     reinterpret_cast<void*>(&cuDeviceGetAttribute)},
    {"cuProfilerStart", "cuProfilerStart", 4000, 0x7fffffff, false, reinterpret_cast<void*>(&cuProfilerStart)},
    {"cuProfilerStop", "cuProfilerStop", 4000, 0x7fffffff, false, reinterpret_cast<void*>(&cuProfilerStop)},
};

CUresult lookup(const char* symbol, void** pfn, int version, cuuint64_t flags,
                CUdriverProcAddressQueryResult* status) {
  int newer_launch_abi_from = 0, early_per_thread_answer = 0;
  {
    std::lock_guard lock(st().mu);
    ++st().proc_lookups;
    newer_launch_abi_from = st().newer_launch_abi_from;
    early_per_thread_answer = st().early_per_thread_answer;
  }
  if (pfn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pfn = nullptr;
  auto set_status = [&](CUdriverProcAddressQueryResult r) { if (status) *status = r; };
  if (symbol == nullptr || symbol[0] == '\0') {  // libcudart's probe of a real (non-stub) driver
    set_status(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    return CUDA_ERROR_NOT_FOUND;
  }
  const bool per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
  bool known = false, has_pt = false;
  const ProcEntry* legacy = nullptr;
  const ProcEntry* threaded = nullptr;
  for (const ProcEntry& e : kProcs) {
    if (std::strcmp(e.base, symbol) != 0) continue;
    known = true;
    has_pt |= e.per_thread;
    if (version >= e.min_version && version < e.max_version) (e.per_thread ? threaded : legacy) = &e;
  }
  if (newer_launch_abi_from != 0 && version >= newer_launch_abi_from && !per_thread &&
      std::strcmp(symbol, "cuLaunchKernel") == 0) {
    *pfn = reinterpret_cast<void*>(&fake_cuLaunchKernel_newer_abi);
    set_status(CU_GET_PROC_ADDRESS_SUCCESS);
    return CUDA_SUCCESS;
  }
  if (newer_launch_abi_from != 0 && version >= newer_launch_abi_from && !per_thread &&
      std::strcmp(symbol, "cuDeviceGetAttribute") == 0) {
    *pfn = reinterpret_cast<void*>(&fake_cuDeviceGetAttribute_newer_abi);
    set_status(CU_GET_PROC_ADDRESS_SUCCESS);
    return CUDA_SUCCESS;
  }
  if (newer_launch_abi_from != 0 && version >= newer_launch_abi_from && !per_thread &&
      std::strcmp(symbol, "cuEventCreate") == 0) {
    *pfn = reinterpret_cast<void*>(&fake_cuEventCreate_newer_abi);
    set_status(CU_GET_PROC_ADDRESS_SUCCESS);
    return CUDA_SUCCESS;
  }
  const ProcEntry* hit = (per_thread && has_pt) ? threaded : legacy;
  if (hit == nullptr && per_thread && has_pt && legacy != nullptr && early_per_thread_answer != 0) {
    if (early_per_thread_answer == 1) {
      hit = legacy;
    } else if (std::strcmp(symbol, "cuLaunchKernel") == 0) {
      *pfn = reinterpret_cast<void*>(&fake_cuLaunchKernel_newer_abi);
      set_status(CU_GET_PROC_ADDRESS_SUCCESS);
      return CUDA_SUCCESS;
    }
  }
  if (hit == nullptr) {
    set_status(known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    return CUDA_ERROR_NOT_FOUND;
  }
  *pfn = hit->fn;
  set_status(CU_GET_PROC_ADDRESS_SUCCESS);
  return CUDA_SUCCESS;
}

}  // namespace

FAKE_EXPORT void fake_cuda_set_logging(int enabled) {
  std::lock_guard lock(st().mu);
  st().logging = enabled != 0;
}
FAKE_EXPORT void* fake_cuda_own_symbol(const char* symbol) {
  for (const ProcEntry& e : kProcs) {
    if (std::strcmp(e.symbol, symbol) == 0) return e.fn;
  }
  return nullptr;
}

FAKE_EXPORT CUresult CUDAAPI cuGetProcAddress(const char* symbol, void** pfn, int version,
                                              cuuint64_t flags) {
  return lookup(symbol, pfn, version, flags, nullptr);
}
FAKE_EXPORT CUresult CUDAAPI cuGetProcAddress_v2(const char* symbol, void** pfn, int version,
                                                 cuuint64_t flags,
                                                 CUdriverProcAddressQueryResult* status) {
  return lookup(symbol, pfn, version, flags, status);
}


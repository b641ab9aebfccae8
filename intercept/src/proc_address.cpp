// cuGetProcAddress / cuGetProcAddress_v2: how libcudart and NCCL reach the driver. The real
// lookup runs first; a non-NULL answer for an entry point we wrap is replaced by our wrapper for
// the same ABI: the one for the requested version range, and the _ptsz/_ptds one when the caller
// asked for per-thread default-stream semantics. Anything we do not wrap, or whose requested
// version we do not know, is left as the driver answered.
#include <cstring>

#include "wrapper_support.h"

namespace orion {

// The wrapper for (base name, version, flags), or nullptr.
void* wrapper_for(const char* symbol, int version, cuuint64_t flags) {
  if (symbol == nullptr || symbol[0] != 'c' || symbol[1] != 'u') return nullptr;
  const bool per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
  bool base_has_per_thread = false;
  const EntryInfo* legacy = nullptr;
  const EntryInfo* threaded = nullptr;
  for (const EntryInfo& e : entry_table()) {
    if (std::strcmp(e.base, symbol) != 0) continue;
    if (e.per_thread) base_has_per_thread = true;
    if (version < e.min_version || version >= e.max_version) continue;
    (e.per_thread ? threaded : legacy) = &e;
  }
  if (per_thread && base_has_per_thread) {
    // Never hand a legacy-stream wrapper to a per-thread caller.
    return threaded ? threaded->wrapper : nullptr;
  }
  return legacy ? legacy->wrapper : nullptr;
}

}  // namespace orion

ORION_EXPORT CUresult CUDAAPI cuGetProcAddress(const char* symbol, void** pfn, int version,
                                               cuuint64_t flags) {
  ORION_REQUIRE_REAL(cuGetProcAddress);
  CUresult rc = orion::real::cuGetProcAddress(symbol, pfn, version, flags);
  if (rc == CUDA_SUCCESS && pfn != nullptr && *pfn != nullptr) {
    if (void* ours = orion::wrapper_for(symbol, version, flags)) *pfn = ours;
  }
  return rc;
}

ORION_EXPORT CUresult CUDAAPI cuGetProcAddress_v2(const char* symbol, void** pfn, int version,
                                                  cuuint64_t flags,
                                                  CUdriverProcAddressQueryResult* status) {
  ORION_REQUIRE_REAL(cuGetProcAddress_v2);
  CUresult rc = orion::real::cuGetProcAddress_v2(symbol, pfn, version, flags, status);
  if (rc == CUDA_SUCCESS && pfn != nullptr && *pfn != nullptr) {
    if (void* ours = orion::wrapper_for(symbol, version, flags)) *pfn = ours;
  }
  return rc;
}

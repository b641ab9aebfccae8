// cuGetProcAddress / cuGetProcAddress_v2: how libcudart and NCCL reach the driver. The real
// lookup runs first; a non-NULL answer for any function cuda.h declares is replaced by our
// wrapper for the same ABI: the one for the requested version range, and the _ptsz/_ptds one when
// the caller asked for per-thread default-stream semantics. The ranges come from cudaTypedefs.h
// (gen_driver_api.py; the hand-written entry_points.def must agree, the build checks it); the
// hand-written table is asked first for its aliases (cuGraphInstantiate at 12000+ answers
// cuGraphInstantiateWithFlags). A name cuda.h does not declare, or a version outside every known
// range, is left as the driver answered.
//
// A request above this build's CUDA_VERSION (a newer libcudart on a newer driver) may name an ABI
// this build does not know: cudaTypedefs.h leaves each function's newest range open-ended, so the
// newest wrapper would be handed out for an entry point whose parameters changed since. The
// driver is asked again at CUDA_VERSION: the same function means no ABI change in between, and the
// wrapper fits. Another function is a newer ABI: the caller gets the driver's, and since calls
// through it bypass the shim, the shim stops holding work back for good (Shim::stop_holding_work).
#include <cstring>
#include <string>

#include "driver_functions.h"
#include "wrapper_support.h"

namespace orion {
namespace {

// Over `entries` (anything with an EntryInfo): whether the base name is there at all, and the
// wrapper for (version, flags).
template <typename Range, typename Get>
bool lookup(const Range& entries, Get get, const char* symbol, int version, bool per_thread,
            void** out) {
  bool known = false, base_has_per_thread = false;
  const EntryInfo* legacy = nullptr;
  const EntryInfo* threaded = nullptr;
  for (const auto& item : entries) {
    const EntryInfo& e = get(item);
    if (std::strcmp(e.base, symbol) != 0) continue;
    known = true;
    if (e.per_thread) base_has_per_thread = true;
    if (version < e.min_version || version >= e.max_version) continue;
    (e.per_thread ? threaded : legacy) = &e;
  }
  if (per_thread && base_has_per_thread) {
    // Never hand a legacy-stream wrapper to a per-thread caller.
    *out = threaded ? threaded->wrapper : nullptr;
  } else {
    *out = legacy ? legacy->wrapper : nullptr;
  }
  return known;
}

}  // namespace

// The wrapper for (base name, version, flags), or nullptr.
void* wrapper_for(const char* symbol, int version, cuuint64_t flags) {
  if (symbol == nullptr || symbol[0] != 'c' || symbol[1] != 'u') return nullptr;
  const bool per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
  void* out = nullptr;
  if (lookup(entry_table(), [](const EntryInfo& e) -> const EntryInfo& { return e; }, symbol,
             version, per_thread, &out)) {
    return out;
  }
  lookup(driver_functions(), [](const DriverFunction& f) -> const EntryInfo& { return f.entry; },
         symbol, version, per_thread, &out);
  return out;
}

// The pointer to hand out for a successful lookup of `symbol` that found `driver_fn`.
// `at_build_version(pfn)` repeats the lookup at CUDA_VERSION with the same flags.
template <typename LookupAtBuildVersion>
void* answer_for(const char* symbol, void* driver_fn, int version, cuuint64_t flags,
                 LookupAtBuildVersion at_build_version) {
  void* ours = wrapper_for(symbol, version, flags);
  if (ours == nullptr || version <= CUDA_VERSION) return ours ? ours : driver_fn;
  void* known = nullptr;
  if (at_build_version(&known) == CUDA_SUCCESS && known == driver_fn) return ours;
  if (Shim* shim = active_shim()) {
    shim->stop_holding_work(std::string(symbol) + " was asked for at CUDA version " + std::to_string(version) +
                            ", and the driver answers it with another ABI than at " +
                            std::to_string(CUDA_VERSION) +
                            " (this shim's build) that the shim cannot wrap; rebuild it against a newer CUDA toolkit");
  }
  return driver_fn;
}

}  // namespace orion

ORION_EXPORT CUresult CUDAAPI cuGetProcAddress(const char* symbol, void** pfn, int version,
                                               cuuint64_t flags) {
  ORION_REQUIRE_REAL(cuGetProcAddress);
  CUresult rc = orion::real::cuGetProcAddress(symbol, pfn, version, flags);
  if (rc == CUDA_SUCCESS && pfn != nullptr && *pfn != nullptr) {
    *pfn = orion::answer_for(symbol, *pfn, version, flags, [&](void** known) {
      return orion::real::cuGetProcAddress(symbol, known, CUDA_VERSION, flags);
    });
  }
  return rc;
}

ORION_EXPORT CUresult CUDAAPI cuGetProcAddress_v2(const char* symbol, void** pfn, int version,
                                                  cuuint64_t flags,
                                                  CUdriverProcAddressQueryResult* status) {
  ORION_REQUIRE_REAL(cuGetProcAddress_v2);
  CUresult rc = orion::real::cuGetProcAddress_v2(symbol, pfn, version, flags, status);
  if (rc == CUDA_SUCCESS && pfn != nullptr && *pfn != nullptr) {
    *pfn = orion::answer_for(symbol, *pfn, version, flags, [&](void** known) {
      return orion::real::cuGetProcAddress_v2(symbol, known, CUDA_VERSION, flags, nullptr);
    });
  }
  return rc;
}

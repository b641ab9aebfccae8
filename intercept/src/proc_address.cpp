// cuGetProcAddress / cuGetProcAddress_v2: how libcudart and NCCL reach the driver. The real
// lookup runs first; a non-NULL answer for any function the driver headers declare (cuda.h, cudaProfiler.h,
// the GL/EGL/VDPAU interop headers) is replaced by our
// wrapper for the same ABI: the one for the requested version range, and the _ptsz/_ptds one when
// the caller asked for per-thread default-stream semantics. The ranges come from cudaTypedefs.h
// (gen_driver_api.py; the hand-written entry_points.def must agree, the build checks it); the
// hand-written table is asked first for its aliases (cuGraphInstantiate at 12000+ answers
// cuGraphInstantiateWithFlags). A name no driver header declares is left as the driver answered.
// A name it declares that the driver answers where the table has no wrapper (a version outside
// every known range) would bypass the shim: unless the function is order-free, the shim then
// stops holding work back for good. One
// such case has an exact answer: per-thread semantics asked for below the version that brought
// the name's _ptsz variant, answered with the function the driver gives without the flag, gets
// the legacy wrapper.
//
// A request above this build's CUDA_VERSION (a newer libcudart on a newer driver) may name an ABI
// this build does not know: cudaTypedefs.h leaves each function's newest range open-ended, so the
// newest wrapper would be handed out for an entry point whose parameters changed since. The
// driver is asked again at CUDA_VERSION: the same function means no ABI change in between, and the
// wrapper fits. Another function is a newer ABI: the caller gets the driver's, and since calls
// through it bypass the shim, the shim stops holding work back for good (Shim::stop_holding_work)
// unless the function is order-free (a query such as cuDeviceGetAttribute sees no held work).
#include <cstring>
#include <string>

#include <fmt/format.h>

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

// The wrapper for (base name, version, flags), or nullptr; *known: whether a driver header declares the name.
void* wrapper_for(const char* symbol, int version, cuuint64_t flags, bool* known) {
  *known = false;
  if (symbol == nullptr || symbol[0] != 'c' || symbol[1] != 'u') return nullptr;
  const bool per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
  void* out = nullptr;
  if (lookup(entry_table(), [](const EntryInfo& e) -> const EntryInfo& { return e; }, symbol,
             version, per_thread, &out)) {
    *known = true;
    return out;
  }
  *known = lookup(driver_functions(), [](const DriverFunction& f) -> const EntryInfo& { return f.entry; },
                  symbol, version, per_thread, &out);
  return out;
}

// Whether calls to `base` may bypass the shim: every ABI of it is order-free
// (driver_api_classes.csv: it cannot observe or change held work) and none has a hand-written
// wrapper. An order-free function with one keeps the shim's own books (cuEventCreate notes
// interprocess events, whose records are never held; cuGraphInstantiate walks the graph for its
// event nodes; cuStreamCreate notes stream flags; cuGetProcAddress wraps later lookups):
// bypassing it leaves the shim holding work on stale books.
bool may_bypass_the_shim(const char* base) {
  bool any = false;
  for (const DriverFunction& f : driver_functions()) {
    if (std::strcmp(f.entry.base, base) != 0) continue;
    if (f.call_class != CallClass::kOrderFree || f.hand_written) return false;
    any = true;
  }
  return any;
}

// A known entry point goes to the caller as the driver answered it: calls through it bypass the
// shim, so, unless that is harmless (may_bypass_the_shim), the shim stops holding work back for good.
void handed_out_unwrapped(const char* symbol, int version, cuuint64_t flags, const char* why) {
  if (may_bypass_the_shim(symbol)) return;
  if (Shim* shim = active_shim()) {
    shim->stop_holding_work(fmt::format("{} was asked for at CUDA version {}{}: {}", symbol, version,
                                        (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0
                                            ? " with per-thread default-stream semantics"
                                            : "",
                                        why));
  }
}

// The pointer to hand out for a successful lookup of `symbol` that found `driver_fn`.
// `again(version, flags, pfn)` asks the driver once more.
template <typename Again>
void* answer_for(const char* symbol, void* driver_fn, int version, cuuint64_t flags, Again again) {
  bool known = false;
  void* ours = wrapper_for(symbol, version, flags, &known);
  if (!known) return driver_fn;  // not a function a driver header declares: nothing to wrap
  const cuuint64_t legacy_flags = flags & ~cuuint64_t{CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM};
  if (ours == nullptr && legacy_flags != flags) {
    // Per-thread semantics asked for below the version that brought the name's per-thread variant
    // (cuLaunchKernel_ptsz came at 7000): a driver that answers with the function it gives
    // without the flag has no per-thread variant to offer there, and the legacy wrapper is exact.
    void* without_flag = nullptr;
    bool unused = false;
    if (again(version, legacy_flags, &without_flag) == CUDA_SUCCESS && without_flag == driver_fn) {
      ours = wrapper_for(symbol, version, legacy_flags, &unused);
    }
  }
  if (ours == nullptr) {
    handed_out_unwrapped(symbol, version, flags, "the driver answers it where this shim's table has no wrapper");
    return driver_fn;
  }
  if (version <= CUDA_VERSION) return ours;
  void* at_build = nullptr;
  if (again(CUDA_VERSION, flags, &at_build) == CUDA_SUCCESS && at_build == driver_fn) return ours;
  handed_out_unwrapped(symbol, version, flags,
                       fmt::format("the driver answers it with another ABI than at {} (this shim's build), which "
                                   "the shim cannot wrap; rebuild it against a newer CUDA toolkit",
                                   CUDA_VERSION)
                           .c_str());
  return driver_fn;
}

}  // namespace orion

ORION_EXPORT CUresult CUDAAPI cuGetProcAddress(const char* symbol, void** pfn, int version,
                                               cuuint64_t flags) {
  ORION_REQUIRE_REAL(cuGetProcAddress);
  CUresult rc = orion::real::cuGetProcAddress(symbol, pfn, version, flags);
  if (rc == CUDA_SUCCESS && pfn != nullptr && *pfn != nullptr) {
    *pfn = orion::answer_for(symbol, *pfn, version, flags, [&](int v, cuuint64_t f, void** again) {
      return orion::real::cuGetProcAddress(symbol, again, v, f);
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
    *pfn = orion::answer_for(symbol, *pfn, version, flags, [&](int v, cuuint64_t f, void** again) {
      return orion::real::cuGetProcAddress_v2(symbol, again, v, f, nullptr);
    });
  }
  return rc;
}

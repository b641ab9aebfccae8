// Every function the toolkit's cuda.h declares, in every ABI (cuMemFree, cuMemFree_v2,
// cuLaunchKernel_ptsz, ...), with what the shim does with it. Generated at build time by
// tools/gen_driver_api.py from cuda.h, cudaTypedefs.h and driver_api_classes.csv into
// driver_functions.inc; each symbol's wrapper is the shim's own definition of it, hand-written
// (entry_points.def) or generated (driver_wrappers.cpp). dlsym and cuGetProcAddress hand these out.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>

#include "driver_device.h"
#include "real_driver.h"

namespace orion {

// What a call does to the work the shim holds back (driver_api_classes.csv explains each).
enum class CallClass : uint8_t {
  kHeld,           // may itself be held (launches, async copies and sets)
  kStreamOrdered,  // in order behind its stream's held work, never held
  kSynchronising,  // releases exactly what it waits on
  kOrderFree,      // cannot observe or change held work: straight to the driver
  kReleaseAll,     // everything held reaches the driver first (the default)
};

enum class DriverFunctionId : uint16_t {
#define ORION_DRIVER_FUNCTION(base, sym, lo, hi, pt, cls, hand) sym,
#include "driver_functions.inc"
#undef ORION_DRIVER_FUNCTION
  kCount
};

struct DriverFunction {
  EntryInfo entry;  // base name, ABI symbol, cuGetProcAddress versions, the shim's wrapper
  CallClass call_class;
  bool hand_written;
};

// Sorted by symbol; index = DriverFunctionId.
std::span<const DriverFunction> driver_functions();
const DriverFunction* find_driver_function(const char* symbol);

namespace generated {
// The real driver's function for generated wrapper `i` (driver_wrappers.cpp), or nullptr.
extern void* g_real[];
inline void* real(size_t i) { return load_real_driver() ? g_real[i] : nullptr; }
// Fills g_real from the opened driver (load_real_driver calls it before publishing).
void resolve(void* driver_handle);
// What a generated wrapper answers when the driver lacks its symbol.
CUresult missing();
// Before a release_all call: everything the shim holds reaches the driver (errors of that work
// stay pending for the call that synchronises with it). Counted per function.
void release_held_work(DriverFunctionId id);
// Around a call that may end a context (cuCtxDestroy, cuDevicePrimaryCtxReset, ...; the
// generator's CONTEXT_ENDING). `destroyed`: the context cuCtxDestroy ends (its streams and events
// go with it, and the driver may hand their handle values to new ones at once, to any thread),
// null where the call may not end one. For a named context, polls of completion events wait from
// construction until the shim has dropped what it had there (DriverDevice::PollsBlocked).
class ContextEnd {
 public:
  explicit ContextEnd(CUcontext destroyed);
  // The call succeeded: its modules are gone, so the shim forgets what it knew of their
  // functions; a named context's streams and the shim's events there are forgotten too.
  void ended();

 private:
  CUcontext destroyed_;
  std::optional<DriverDevice::PollsBlocked> polls_blocked_;
};
}  // namespace generated

// Release-class calls so far: all of them, and those that found held work to release.
struct ReleaseCallCounts {
  uint64_t calls = 0;
  uint64_t released = 0;
};
ReleaseCallCounts release_call_counts();
// "N calls released held work: cuFuncSetAttribute 12, ..." (the most frequent few), or "".
std::string release_call_summary();

}  // namespace orion

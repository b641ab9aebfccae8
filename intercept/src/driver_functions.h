// Every function the toolkit's driver headers (cuda.h, cudaProfiler.h, GL/EGL/VDPAU interop) declare, in every ABI (cuMemFree, cuMemFree_v2,
// cuLaunchKernel_ptsz, ...), with what the shim does with it. Generated at build time by
// tools/gen_driver_api.py from those headers, their *Typedefs.h and driver_api_classes.csv into
// driver_functions.inc; each symbol's wrapper is the shim's own definition of it, hand-written
// (entry_points.def) or generated (driver_wrappers.cpp). dlsym and cuGetProcAddress hand these out.
#pragma once

#include <cstddef>
#include <cstdint>
#include <mutex>
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
// Around a call that may end a context (the generator's CONTEXT_ENDING). A context's streams and
// events go with it, and the driver may hand their handle values to new ones at once, to any
// thread. Where the shim can name the context that ends (or had primary contexts retained, any of
// which a release may end), polls of completion events wait from construction until the shim has
// dropped what it had there (DriverDevice::PollsBlocked).
class ContextEnd {
 public:
  static ContextEnd destroy(CUcontext ctx);      // cuCtxDestroy: ctx ends
  static ContextEnd primary_reset(CUdevice dev); // dev's primary context ends (its retains stay)
  // cuDevicePrimaryCtxRelease: a primary context ends if it was the last retain.
  static ContextEnd primary_release(CUdevice dev);
  // cuGreenCtxDestroy: the green context's CUcontext ends (its streams stay, dead: CUDA 13 answers
  // CUDA_ERROR_CONTEXT_IS_DESTROYED for them), and its release of the primary context may be
  // the last.
  static ContextEnd green_destroy(CUgreenCtx green);
  static ContextEnd unnamed();                   // cuCtxDetach: the shim cannot tell
  // The call succeeded: its modules are gone, so the shim forgets what it knew of their
  // functions; what it had in the contexts that ended (streams, its events) is forgotten too.
  void ended();

 private:
  ContextEnd(CUcontext ends, CUdevice primary_of, bool primaries_may_end);
  CUcontext ends_;        // certainly ends (null: none the shim can name)
  CUdevice primary_of_;   // cuDevicePrimaryCtxReset: ends_ is this device's primary context (else -1)
  bool primaries_may_end_;
  std::unique_lock<std::mutex> lifecycle_;  // Shim::lock_context_lifecycle
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

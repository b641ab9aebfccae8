// Opening the real driver and the table of wrapped entry points.
#include "real_driver.h"

#include <dlfcn.h>

#include <atomic>
#include <mutex>
#include <type_traits>

#include "driver_functions.h"
#include "log.h"

// Each wrapper must have exactly the ABI the toolkit documents for its symbol.
#define ORION_ENTRY(base, sym, pfn, lo, hi, pt)                                         \
  static_assert(std::is_same_v<decltype(&::sym), pfn>,                                \
                #sym " does not match " #pfn " from cudaTypedefs.h");                 \
  static_assert((lo) < (hi), #sym ": empty version range");
#include "entry_points.def"
#undef ORION_ENTRY

namespace orion {
namespace {

// 0 = not tried, 1 = loaded, 2 = failed.
std::atomic<int> g_driver_state{0};
std::mutex g_driver_mutex;

template <typename Fn>
void resolve(void* handle, const char* symbol, Fn* slot) {
  *slot = reinterpret_cast<Fn>(real_dlsym(handle, symbol));
}

}  // namespace

bool load_real_driver() {
  int state = g_driver_state.load(std::memory_order_acquire);
  if (state != 0) return state == 1;
  std::lock_guard lock(g_driver_mutex);
  state = g_driver_state.load(std::memory_order_relaxed);
  if (state != 0) return state == 1;

  // RTLD_NOLOAD first: when the program already has a libcuda, use exactly that one.
  void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);
  if (handle == nullptr) handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (handle == nullptr) {
    const char* why = dlerror();
    shim_log().error("cannot open the CUDA driver libcuda.so.1 ({}); every CUDA driver call "
                  "will fail. Check that the NVIDIA driver is installed and on the library path.",
                  why ? why : "unknown reason");
    g_driver_state.store(2, std::memory_order_release);
    return false;
  }
#define ORION_ENTRY(base, sym, pfn, lo, hi, pt) resolve(handle, #sym, &real::sym);
#include "entry_points.def"
#undef ORION_ENTRY
#define ORION_RESOLVE_HELPER(sym, pfn) resolve(handle, #sym, &real::sym);
  ORION_HELPER_FUNCTIONS(ORION_RESOLVE_HELPER)
#undef ORION_RESOLVE_HELPER
  generated::resolve(handle);
  g_driver_state.store(1, std::memory_order_release);
  return true;
}

}  // namespace orion

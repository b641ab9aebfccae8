// parallel.use_orion_scheduler: true, as the seed's users expect it to work. The Orion scheduler
// (libgpu_scheduler.so) must be in the process before the CUDA runtime loads the driver, so a
// config cannot switch it on from inside; the runner starts itself again with the library
// preloaded, as `USE_ORION_SCHEDULER=1 LD_PRELOAD=.../libgpu_scheduler.so gpipe_runner ...` would.
#pragma once

#include <optional>
#include <ostream>
#include <string>

namespace gpipe {

// The scheduler library for the executable at `executable`: $ORION_SCHEDULER_LIB when set (it
// must exist), else the first of <dir>/../intercept/ (a build tree), <dir>/ and <dir>/../lib/
// that holds libgpu_scheduler.so. nullopt when none does.
std::optional<std::string> find_scheduler_library(const std::string& executable);

// True when libgpu_scheduler.so is loaded in this process (its C API is visible).
bool orion_scheduler_loaded();

// Unless the library is loaded already, replaces this process (execv of the same executable and
// arguments) by one with LD_PRELOAD=<library>[:<previous LD_PRELOAD>] and, when unset,
// USE_ORION_SCHEDULER=1, after saying so on `log`. Returns only when it is loaded. Throws
// WorldError (exit code 2) naming ORION_SCHEDULER_LIB when the library cannot be found, or when a
// restart already happened and the library is still not loaded (never restarts twice).
void ensure_orion_scheduler_loaded(char** argv, std::ostream& log);

}  // namespace gpipe

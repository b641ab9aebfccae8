// Restarting gpipe_runner with the Orion scheduler library preloaded.
#include "trainer/launch/orion_preload.h"

#include <dlfcn.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <string>

#include "trainer/launch/launcher.h"
#include "trainer/launch/world.h"

namespace gpipe {
namespace {
constexpr const char* kLibrary = "libgpu_scheduler.so";
// Set in the restarted process: a second restart would loop.
constexpr const char* kRestartedMarker = "OURGPIPE_ORION_PRELOAD_RESTARTED";
}  // namespace

std::optional<std::string> find_scheduler_library(const std::string& executable) {
  if (const char* forced = std::getenv("ORION_SCHEDULER_LIB"); forced != nullptr && *forced != '\0') {
    if (!std::filesystem::is_regular_file(forced)) {
      throw WorldError(std::string("ORION_SCHEDULER_LIB=") + forced + " is not a file: point it at libgpu_scheduler.so " +
                     "or unset it to use the one built beside gpipe_runner");
    }
    return std::filesystem::absolute(forced).string();
  }
  const std::filesystem::path dir = std::filesystem::path(executable).parent_path();
  for (const auto& candidate : {dir / ".." / "intercept" / kLibrary, dir / kLibrary, dir / ".." / "lib" / kLibrary}) {
    if (std::filesystem::is_regular_file(candidate)) return std::filesystem::weakly_canonical(candidate).string();
  }
  return std::nullopt;
}

bool orion_scheduler_loaded() { return dlsym(RTLD_DEFAULT, "orion_set_stream_class") != nullptr; }

void ensure_orion_scheduler_loaded(char** argv, std::ostream& log) {
  if (orion_scheduler_loaded()) return;
  if (std::getenv(kRestartedMarker) != nullptr) {
    throw WorldError("parallel.use_orion_scheduler: restarted with LD_PRELOAD=" +
                   std::string(std::getenv("LD_PRELOAD") ? std::getenv("LD_PRELOAD") : "") +
                   " but the Orion scheduler is still not loaded (is it a libgpu_scheduler.so? check "
                   "ORION_SCHEDULER_LIB)");
  }
  const std::string self = self_executable_path();
  const auto library = find_scheduler_library(self);
  if (!library) {
    throw WorldError("parallel.use_orion_scheduler is true but libgpu_scheduler.so is not beside " + self +
                   " (it is built with the CUDA toolkit): set ORION_SCHEDULER_LIB to its path, or run with "
                   "--set parallel.use_orion_scheduler=false");
  }
  const char* previous = std::getenv("LD_PRELOAD");
  const std::string preload = *library + (previous != nullptr && *previous != '\0' ? ":" + std::string(previous) : "");
  ::setenv("LD_PRELOAD", preload.c_str(), 1);
  ::setenv("USE_ORION_SCHEDULER", "1", /*overwrite=*/0);
  ::setenv(kRestartedMarker, "1", 1);
  log << "gpipe_runner: parallel.use_orion_scheduler: restarting with LD_PRELOAD=" << preload
      << " USE_ORION_SCHEDULER=" << std::getenv("USE_ORION_SCHEDULER") << std::endl;
  ::execv(self.c_str(), argv);
  throw std::runtime_error("parallel.use_orion_scheduler: could not restart " + self + ": " + std::strerror(errno));
}

}  // namespace gpipe

#include "log.h"

#include <memory>

#include <spdlog/sinks/stdout_color_sinks.h>

namespace orion {

spdlog::logger& shim_log() {
  // Never destroyed: the shim logs from atexit handlers.
  static spdlog::logger* logger = [] {
    auto* l = new spdlog::logger("libgpu_scheduler",
                                 std::make_shared<spdlog::sinks::stderr_color_sink_mt>());
    l->set_pattern("[%H:%M:%S.%e] [libgpu_scheduler] [%l] %v");
    return l;
  }();
  return *logger;
}

void set_log_level(const std::string& level) { shim_log().set_level(spdlog::level::from_str(level)); }

}  // namespace orion

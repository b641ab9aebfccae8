// spdlog behind plain functions (see trainer/engine_log.h for why).
#include "trainer/engine_log.h"

#include <spdlog/spdlog.h>

namespace gpipe {

void engine_log_info(const std::string& message) { spdlog::info("{}", message); }
void engine_log_warn(const std::string& message) { spdlog::warn("{}", message); }

}  // namespace gpipe

// spdlog behind plain functions (see trainer/engine_log.h for why).
#include "trainer/log/engine_log.h"

#include <spdlog/spdlog.h>

namespace gpipe {

void engine_log_info(const std::string& message) { spdlog::info("{}", message); }
void engine_log_warn(const std::string& message) { spdlog::warn("{}", message); }
void engine_log_error(const std::string& message) { spdlog::error("{}", message); }

void engine_log_set_rank(int rank, int world_size) {
  spdlog::set_pattern("[%Y-%m-%d %H:%M:%S.%e] [rank " + std::to_string(rank) + "/" + std::to_string(world_size) +
                      "] [%^%l%$] %v");
}

}  // namespace gpipe

// The shim's logger: its own spdlog logger on stderr, not registered in spdlog's registry and
// never the default logger, so a program that also uses spdlog keeps its logging untouched.
#pragma once

#include <spdlog/spdlog.h>

namespace orion {

spdlog::logger& shim_log();
void set_log_level(const std::string& level);  // one of spdlog's level names

}  // namespace orion

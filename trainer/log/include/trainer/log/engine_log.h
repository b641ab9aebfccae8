// Logging for the engine without spdlog in LibTorch translation units: LibTorch's include folder
// carries its own fmt (12.x), which shadows the system fmt 9 that Debian's spdlog 1.10 is built
// against. engine_log.cpp is compiled without LibTorch's include path and forwards to spdlog.
#pragma once

#include <string>

namespace gpipe {

void engine_log_info(const std::string& message);
void engine_log_warn(const std::string& message);
void engine_log_error(const std::string& message);
// Multi-process runs: every log line (spdlog's default logger, shared by all of the trainer's
// code) starts with "[rank R/W]", so interleaved logs of many ranks stay readable.
void engine_log_set_rank(int rank, int world_size);

}  // namespace gpipe

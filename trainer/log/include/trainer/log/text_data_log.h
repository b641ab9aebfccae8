// Logging for the data code without spdlog in LibTorch translation units: LibTorch's include
// folder carries its own fmt (12.x), which shadows the system fmt 9 that Debian's spdlog 1.10 is
// built against, so spdlog cannot be included next to LibTorch. text_data_log.cpp is compiled
// without LibTorch's include path and forwards to spdlog.
#pragma once

#include <string>

namespace gpipe {

void log_data_info(const std::string& message);

}  // namespace gpipe

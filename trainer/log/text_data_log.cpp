// spdlog behind a plain function (see trainer/text_data_log.h for why).
#include "trainer/log/text_data_log.h"

#include <spdlog/spdlog.h>

namespace gpipe {

void log_data_info(const std::string& message) { spdlog::info("{}", message); }

}  // namespace gpipe

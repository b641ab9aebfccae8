// Internal to trainer/config: the cross-field rules (config_rules.cpp), run by
// PipelineConfig::validate() after every field passed its own check.
#pragma once

#include "trainer/config/config.h"

namespace gpipe::detail {

// Throws ConfigError naming the fields that cannot go together and what to change.
void check_cross_fields(const PipelineConfig& c);

}  // namespace gpipe::detail

// The shim's settings, read once from the environment (see docs in intercept/README.md).
// Parsing is strict: a bad value is reported naming the variable and the allowed values, and the
// process exits with status 2 (a researcher would rather lose a run at start than silently get
// unscheduled numbers).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "scheduler/policy.h"

namespace orion {

struct Settings {
  bool enabled = false;                // USE_ORION_SCHEDULER=1
  std::string policy = "orion";        // ORION_POLICY
  sched::PolicyParams policy_params;   // ORION_POLICY_PARAMS="k=v,k=v"
  std::string log_level = "info";      // ORION_LOG_LEVEL
  // Priority -> class for cuStreamCreateWithPriority (CUDA: lower number = higher priority).
  int hp_priority_max = -1;            // ORION_HP_PRIORITY: priority <= this -> high priority
  int be_priority_min = 0;             // ORION_BE_PRIORITY: priority >= this -> best effort
  int64_t be_max_wait_us = 2000;       // ORION_BE_MAX_WAIT_US: starvation bound of a BE head
  int64_t pump_interval_us = 20;       // ORION_PUMP_INTERVAL_US: background admission period
  // ORION_COMPLETION_BATCH_US: a stream records a completion event at most once per this window
  // (the ops between complete with the next one; DriverDevice); 0: one event per tracked op.
  int64_t completion_batch_us = 20;
  std::string trace_path;              // ORION_TRACE
  std::string profile_import;          // ORION_PROFILE_IMPORT
  std::string profile_export;          // ORION_PROFILE_EXPORT

  std::string describe() const;  // one line for the start-up log
};

// Reads the environment. On a bad value returns std::nullopt and puts the message in *error.
std::optional<Settings> settings_from_env(std::string* error);

// Exposed for tests: strict integer and "k=v,k=v" parsing.
bool parse_int(const std::string& text, int64_t lo, int64_t hi, int64_t* out);
bool parse_params(const std::string& text, sched::PolicyParams* out, std::string* error);

}  // namespace orion

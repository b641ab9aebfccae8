#include "settings.h"

#include <unistd.h>

#include <charconv>
#include <cstdlib>
#include <filesystem>
#include <system_error>

#include <fmt/format.h>

namespace orion {
namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return (v != nullptr && v[0] != '\0') ? v : nullptr;
}

bool is_log_level(const std::string& s) {
  for (const char* l : {"trace", "debug", "info", "warn", "error", "critical", "off"}) {
    if (s == l) return true;
  }
  return false;
}

// An output file the shim writes at exit: checked now, so that a run is not lost to a typo found
// only at its end. The folder must exist and be writable (and the file, if it exists).
bool read_output_path(const char* name, std::string* out, std::string* error) {
  const char* v = env(name);
  if (v == nullptr) return true;
  const std::filesystem::path path(v);
  const std::filesystem::path dir = path.has_parent_path() ? path.parent_path() : std::filesystem::path(".");
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) {
    *error = fmt::format("{}='{}': the folder '{}' does not exist", name, v, dir.string());
    return false;
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0 || (::access(v, F_OK) == 0 && ::access(v, W_OK) != 0)) {
    *error = fmt::format("{}='{}': not writable by this user", name, v);
    return false;
  }
  *out = v;
  return true;
}

bool read_int(const char* name, int64_t lo, int64_t hi, int64_t* out, std::string* error) {
  const char* v = env(name);
  if (v == nullptr) return true;
  if (!parse_int(v, lo, hi, out)) {
    *error = fmt::format("{}='{}' is not an integer in [{}, {}]", name, v, lo, hi);
    return false;
  }
  return true;
}

}  // namespace

bool parse_int(const std::string& text, int64_t lo, int64_t hi, int64_t* out) {
  // from_chars, not strtoll: no leading blanks, no '+', nothing after the digits.
  int64_t v = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (text.empty() || ec != std::errc() || ptr != end || v < lo || v > hi) return false;
  *out = v;
  return true;
}

bool parse_params(const std::string& text, sched::PolicyParams* out, std::string* error) {
  size_t pos = 0;
  while (pos <= text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    std::string item = text.substr(pos, comma - pos);
    size_t eq = item.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == item.size()) {
      *error = fmt::format("ORION_POLICY_PARAMS item '{}' is not key=value (expected "
                           "\"k=v,k=v\")", item);
      return false;
    }
    if (!out->emplace(item.substr(0, eq), item.substr(eq + 1)).second) {
      *error = fmt::format("ORION_POLICY_PARAMS names '{}' twice (which one was meant?)", item.substr(0, eq));
      return false;
    }
    pos = comma + 1;
  }
  return true;
}

std::optional<Settings> settings_from_env(std::string* error) {
  Settings s;
  if (const char* v = env("USE_ORION_SCHEDULER")) {
    std::string t = v;
    if (t == "1") {
      s.enabled = true;
    } else if (t != "0") {
      *error = fmt::format("USE_ORION_SCHEDULER='{}': use 1 (schedule) or 0 (pass-through)", t);
      return std::nullopt;
    }
  }
  if (const char* v = env("ORION_POLICY")) s.policy = v;
  if (const char* v = env("ORION_POLICY_PARAMS")) {
    if (!parse_params(v, &s.policy_params, error)) return std::nullopt;
  }
  if (const char* v = env("ORION_LOG_LEVEL")) {
    s.log_level = v;
    if (!is_log_level(s.log_level)) {
      *error = fmt::format("ORION_LOG_LEVEL='{}': use trace, debug, info, warn, error, critical "
                           "or off", s.log_level);
      return std::nullopt;
    }
  }
  int64_t hp = s.hp_priority_max, be = s.be_priority_min;
  if (!read_int("ORION_HP_PRIORITY", -1000, 1000, &hp, error)) return std::nullopt;
  if (!read_int("ORION_BE_PRIORITY", -1000, 1000, &be, error)) return std::nullopt;
  if (hp >= be) {
    *error = fmt::format("ORION_HP_PRIORITY={} must be lower (= more urgent) than "
                         "ORION_BE_PRIORITY={}", hp, be);
    return std::nullopt;
  }
  s.hp_priority_max = static_cast<int>(hp);
  s.be_priority_min = static_cast<int>(be);
  if (!read_int("ORION_BE_MAX_WAIT_US", 0, int64_t{3600} * 1'000'000, &s.be_max_wait_us, error)) {
    return std::nullopt;
  }
  if (!read_int("ORION_PUMP_INTERVAL_US", 1, 1'000'000, &s.pump_interval_us, error)) {
    return std::nullopt;
  }
  if (!read_int("ORION_COMPLETION_BATCH_US", 0, 1'000'000, &s.completion_batch_us, error)) {
    return std::nullopt;
  }
  if (!read_output_path("ORION_TRACE", &s.trace_path, error)) return std::nullopt;
  if (const char* v = env("ORION_PROFILE_IMPORT")) s.profile_import = v;
  if (!read_output_path("ORION_PROFILE_EXPORT", &s.profile_export, error)) return std::nullopt;
  return s;
}

std::string Settings::describe() const {
  std::string params;
  for (const auto& [k, v] : policy_params) params += fmt::format("{}{}={}", params.empty() ? "" : ",", k, v);
  return fmt::format(
      "scheduler={} policy={} params='{}' hp_priority<={} be_priority>={} be_max_wait_us={} "
      "pump_interval_us={} completion_batch_us={} trace='{}' profile_import='{}' profile_export='{}' log_level={}",
      enabled ? "on" : "off (pass-through)", policy, params, hp_priority_max, be_priority_min,
      be_max_wait_us, pump_interval_us, completion_batch_us, trace_path, profile_import, profile_export, log_level);
}

}  // namespace orion

#include "policy_params.h"

#include <charconv>
#include <cstdlib>
#include <sstream>
#include <stdexcept>

namespace sched::detail {

ParamReader::ParamReader(std::string policy, const PolicyParams& params,
                         std::vector<std::string> known)
    : policy_(std::move(policy)), params_(params) {
  for (const auto& [name, value] : params_) {
    bool found = false;
    for (const auto& k : known) found = found || (k == name);
    if (found) continue;
    std::string list;
    for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
    throw std::invalid_argument("policy '" + policy_ + "': unknown parameter '" + name +
                                "' (known: " + (list.empty() ? "none" : list) + ")");
  }
}

bool ParamReader::has(const std::string& name) const { return params_.count(name) != 0; }

void ParamReader::fail(const std::string& name, const std::string& what) const {
  throw std::invalid_argument("policy '" + policy_ + "': parameter '" + name + "'='" +
                              params_.at(name) + "': " + what);
}

namespace {
std::string compact(double v) {  // 0.01, 1, 1e+06: not std::to_string's 0.010000
  std::ostringstream out;
  out << v;
  return out.str();
}
}  // namespace

long long ParamReader::integer(const std::string& name, long long fallback, long long min,
                               long long max) const {
  auto it = params_.find(name);
  if (it == params_.end()) return fallback;
  const std::string& text = it->second;
  long long value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || text.empty()) {
    fail(name, "expected an integer");
  }
  if (value < min || value > max) {
    fail(name, "must be in [" + std::to_string(min) + ", " + std::to_string(max) + "]");
  }
  return value;
}

double ParamReader::number(const std::string& name, double fallback, double min, double max) const {
  auto it = params_.find(name);
  if (it == params_.end()) return fallback;
  const std::string& text = it->second;
  char* end = nullptr;
  const double value = std::strtod(text.c_str(), &end);
  if (text.empty() || end != text.c_str() + text.size() || value != value) {
    fail(name, "expected a number");
  }
  if (value < min || value > max) {
    // A tiny positive minimum stands for "above 0" (a fraction that must be positive).
    const std::string low = min > 0 && min < 1e-6 ? "(0" : "[" + compact(min);
    fail(name, "must be in " + low + ", " + compact(max) + "]");
  }
  return value;
}

bool ParamReader::flag(const std::string& name, bool fallback) const {
  auto it = params_.find(name);
  if (it == params_.end()) return fallback;
  if (it->second == "1" || it->second == "true") return true;
  if (it->second == "0" || it->second == "false") return false;
  fail(name, "expected 0, 1, true or false");
}

}  // namespace sched::detail

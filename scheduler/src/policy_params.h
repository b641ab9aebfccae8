// Parsing of policy parameters (name=value strings) into typed values, with errors that name the
// policy, the parameter and what is allowed. Internal to the scheduler library.
#pragma once

#include <string>
#include <vector>

#include "scheduler/policy.h"

namespace sched::detail {

class ParamReader {
 public:
  // Throws std::invalid_argument if `params` holds a name not in `known`.
  ParamReader(std::string policy, const PolicyParams& params, std::vector<std::string> known);

  bool has(const std::string& name) const;
  // Each returns `fallback` when the parameter is absent and throws std::invalid_argument when
  // the value does not parse or is out of range.
  long long integer(const std::string& name, long long fallback, long long min, long long max) const;
  double number(const std::string& name, double fallback, double min, double max) const;
  bool flag(const std::string& name, bool fallback) const;  // 0/1/true/false

 private:
  [[noreturn]] void fail(const std::string& name, const std::string& what) const;
  std::string policy_;
  const PolicyParams& params_;
};

std::unique_ptr<Policy> make_orion_policy(const PolicyParams& params);
// gpud_policy.cpp: connects to the GPU's orion-gpud (throws std::invalid_argument naming why not).
std::unique_ptr<Policy> make_gpud_policy(const PolicyParams& params);
std::string gpud_param_docs();
std::string orion_param_docs();

}  // namespace sched::detail

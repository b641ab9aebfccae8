// The policy factory and the two simple policies; `orion` lives in orion_policy.cpp.
#include "scheduler/policy.h"

#include <stdexcept>

#include "policy_params.h"

namespace sched {

namespace {

// Submits everything at once in arrival order: the scheduler only observes (trace, profiles).
class PassthroughPolicy final : public Policy {
 public:
  const char* name() const override { return "passthrough"; }
  bool admit(const Op&, const OpEstimate&, const DeviceState&) const override { return true; }
  bool defers_best_effort() const override { return false; }
};

// Best-effort work goes only while no high-priority op is in flight (any op kind).
class PriorityPolicy final : public Policy {
 public:
  const char* name() const override { return "priority"; }
  bool admit(const Op&, const OpEstimate&, const DeviceState& state) const override {
    return state.hp_in_flight == 0;
  }
};

}  // namespace

std::unique_ptr<Policy> make_policy(const std::string& name, const PolicyParams& params) {
  if (name == "passthrough") {
    detail::ParamReader reader(name, params, {});
    return std::make_unique<PassthroughPolicy>();
  }
  if (name == "priority") {
    detail::ParamReader reader(name, params, {});
    return std::make_unique<PriorityPolicy>();
  }
  if (name == "orion") return detail::make_orion_policy(params);
  std::string list;
  for (const auto& n : policy_names()) list += (list.empty() ? "" : ", ") + n;
  throw std::invalid_argument("unknown scheduling policy '" + name + "' (choose one of: " + list + ")");
}

std::vector<std::string> policy_names() { return {"passthrough", "priority", "orion"}; }

std::string policy_param_docs() {
  return "passthrough: no parameters; submits every op at once in arrival order.\n"
         "priority: no parameters; best-effort ops go only while no high-priority op is in flight.\n" +
         detail::orion_param_docs();
}

}  // namespace sched

// The policy factory and the two simple policies; `orion` lives in orion_policy.cpp.
#include "scheduler/policy.h"

#include <algorithm>
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

// Best-effort streams on a partition of the SMs (the backend confines them: SimulatedGpu's
// set_stream_sms, green contexts on a GPU), admitted inside it as `gate` says: 0 at once
// (space alone), 1 as `priority`, 2 as `orion` with its defaults.
class PartitionPolicy final : public Policy {
 public:
  PartitionPolicy(SmPartition partition, std::unique_ptr<Policy> gate)
      : partition_(partition), gate_(std::move(gate)) {}
  const char* name() const override { return "partition"; }
  bool admit(const Op& op, const OpEstimate& est, const DeviceState& state) const override {
    return gate_ == nullptr || gate_->admit(op, est, state);
  }
  bool defers_best_effort() const override { return gate_ != nullptr; }
  std::optional<SmPartition> sm_partition() const override { return partition_; }

 private:
  SmPartition partition_;
  std::unique_ptr<Policy> gate_;
};

}  // namespace

int SmPartition::best_effort_sms(int sm_count) const {
  const int steps = granularity > 0 ? sm_count / granularity : 0;
  if (steps < 2) return 0;
  const int wanted = static_cast<int>(best_effort_fraction * sm_count) / granularity;
  return std::clamp(wanted, 1, steps - 1) * granularity;
}

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
  if (name == "partition") {
    detail::ParamReader r(name, params, {"be_sm_frac", "granularity", "hp_rest", "gate"});
    SmPartition p;
    p.best_effort_fraction = r.number("be_sm_frac", 0.5, 0.01, 0.99);
    p.granularity = static_cast<int>(r.integer("granularity", 8, 1, 64));
    p.high_priority_on_rest = r.flag("hp_rest", false);
    const long long gate = r.integer("gate", 0, 0, 2);
    std::unique_ptr<Policy> inner;
    if (gate == 1) inner = make_policy("priority");
    if (gate == 2) inner = make_policy("orion");
    return std::make_unique<PartitionPolicy>(p, std::move(inner));
  }
  std::string list;
  for (const auto& n : policy_names()) list += (list.empty() ? "" : ", ") + n;
  throw std::invalid_argument("unknown scheduling policy '" + name + "' (choose one of: " + list + ")");
}

std::vector<std::string> policy_names() { return {"passthrough", "priority", "orion", "partition"}; }

std::string policy_param_docs() {
  return "passthrough: no parameters; submits every op at once in arrival order.\n"
         "priority: no parameters; best-effort ops go only while no high-priority op is in flight.\n" +
         detail::orion_param_docs() +
         "partition: best-effort streams confined to a partition of the SMs (green contexts).\n"
         "  be_sm_frac=0.5   share of the SMs for best effort, rounded down to the granularity\n"
         "  granularity=8    SMs per partition step (sm_90 green contexts come in multiples of 8)\n"
         "  hp_rest=0        1: high priority on the other SMs only; 0: on every SM\n"
         "  gate=0           admission inside the partition: 0 at once, 1 as priority, 2 as orion\n";
}

}  // namespace sched

// The policy factory and the two simple policies; `orion` lives in orion_policy.cpp.
#include "scheduler/policy.h"

#include <algorithm>
#include <stdexcept>

#include "adaptive_partition.h"
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
// adaptive=1: the partition's size follows high-priority latency (detail::PartitionController).
class PartitionPolicy final : public Policy {
 public:
  PartitionPolicy(SmPartition partition, std::unique_ptr<Policy> gate,
                  std::unique_ptr<detail::PartitionController> controller, int be_depth)
      : partition_(partition), gate_(std::move(gate)), controller_(std::move(controller)), be_depth_(be_depth) {}
  const char* name() const override { return "partition"; }
  bool admit(const Op& op, const OpEstimate& est, const DeviceState& state) const override {
    if (controller_) {
      if (controller_->probing(state.now_ns)) return false;  // high priority runs alone for a moment
      if (state.be_in_flight >= be_depth_) return false;
    }
    return gate_ == nullptr || gate_->admit(op, est, state);
  }
  bool defers_best_effort() const override { return gate_ != nullptr || controller_ != nullptr; }
  // The gate's estimates (gate=2: orion's duration threshold counts untimed kernels and graphs).
  double non_kernel_duration_ns(const Op& op) const override { return gate_ ? gate_->non_kernel_duration_ns(op) : 0; }
  double untimed_kernel_duration_ns() const override { return gate_ ? gate_->untimed_kernel_duration_ns() : 0; }
  std::optional<SmPartition> sm_partition() const override {
    return controller_ ? controller_->current() : partition_;
  }
  bool wants_observations() const override { return controller_ != nullptr; }
  void observe(const KernelCompletion& done) override {
    if (controller_) controller_->observe(done);
  }

 private:
  SmPartition partition_;
  std::unique_ptr<Policy> gate_;
  std::unique_ptr<detail::PartitionController> controller_;
  int be_depth_ = 0;
};

}  // namespace

int SmPartition::best_effort_sms(int sm_count) const {
  const int steps = granularity > 0 ? sm_count / granularity : 0;
  if (steps < 2) return 0;
  const int wanted =
      best_effort_steps > 0 ? best_effort_steps : static_cast<int>(best_effort_fraction * sm_count) / granularity;
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
  if (name == "gpud") return detail::make_gpud_policy(params);
  if (name == "partition") {
    detail::ParamReader r(name, params,
                          {"be_sm_frac", "granularity", "hp_rest", "gate", "adaptive", "hp_latency_target",
                           "window", "margin", "idle_us", "probe_us", "probe_every_ms", "be_depth"});
    SmPartition p;
    p.best_effort_fraction = r.number("be_sm_frac", 0.5, 0.01, 0.99);
    p.granularity = static_cast<int>(r.integer("granularity", 8, 1, 64));
    p.high_priority_on_rest = r.flag("hp_rest", false);
    const long long gate = r.integer("gate", 0, 0, 2);
    std::unique_ptr<Policy> inner;
    if (gate == 1) inner = make_policy("priority");
    if (gate == 2) inner = make_policy("orion");
    const bool adaptive = r.flag("adaptive", false);
    std::unique_ptr<detail::PartitionController> controller;
    int be_depth = 0;
    if (!adaptive) {
      for (const char* only : {"hp_latency_target", "window", "margin", "idle_us", "probe_us", "probe_every_ms", "be_depth"}) {
        if (r.has(only)) {
          throw std::invalid_argument(std::string("policy 'partition': parameter '") + only +
                                      "' applies only with adaptive=1");
        }
      }
    } else {
      detail::AdaptiveParams a;
      a.target = r.number("hp_latency_target", 1.10, 1.01, 100.0);
      a.window = static_cast<int>(r.integer("window", 32, 1, 1'000'000));
      a.margin = r.number("margin", std::min(0.05, (a.target - 1.0) / 2), 0.0, 1.0);
      a.idle_ns = static_cast<int64_t>(r.number("idle_us", 2000.0, 1.0, 1e9) * 1000.0);
      a.probe_ns = static_cast<int64_t>(r.number("probe_us", 1500.0, 0.0, 1e9) * 1000.0);
      a.probe_every_ns = static_cast<int64_t>(r.number("probe_every_ms", 50.0, 0.0, 1e6) * 1e6);
      be_depth = static_cast<int>(r.integer("be_depth", 2, 1, 1'000'000));
      if (a.target - a.margin <= 1.0) {
        // Growing needs actual/alone below target - margin: at or under 1.0 it would not grow.
        throw std::invalid_argument("policy 'partition': parameter 'margin'='" + params.at("margin") +
                                    "': must be below hp_latency_target - 1 (" + std::to_string(a.target - 1.0) +
                                    ")");
      }
      controller = std::make_unique<detail::PartitionController>(p, a);
    }
    return std::make_unique<PartitionPolicy>(p, std::move(inner), std::move(controller), be_depth);
  }
  std::string list;
  for (const auto& n : policy_names()) list += (list.empty() ? "" : ", ") + n;
  throw std::invalid_argument("unknown scheduling policy '" + name + "' (choose one of: " + list +
                              ", or gpud with a running orion-gpud)");
}

// The policies a process or the simulator can run on its own; gpud (make_policy("gpud", {gpu=...}))
// needs a running orion-gpud and is not among them.
std::vector<std::string> policy_names() { return {"passthrough", "priority", "orion", "partition"}; }

std::string policy_param_docs() {
  return "passthrough: no parameters; submits every op at once in arrival order.\n"
         "priority: no parameters; best-effort ops go only while no high-priority op is in flight.\n" +
         detail::orion_param_docs() +
         "partition: best-effort streams confined to a partition of the SMs (green contexts).\n"
         "  be_sm_frac=0.5   share of the SMs for best effort, rounded down to the granularity\n"
         "  granularity=8    SMs per partition step (sm_90 green contexts come in multiples of 8)\n"
         "  hp_rest=0        1: high priority on the other SMs only; 0: on every SM\n"
         "  gate=0           admission inside the partition: 0 at once, 1 as priority, 2 as orion\n"
         "  adaptive=0       1: the partition's size moves at run time (starting from be_sm_frac), one step at a\n"
         "                   time within [1 step, steps - 1], from high-priority kernels' durations against their\n"
         "                   alone durations learned online (no offline profiling)\n"
         "  hp_latency_target=1.10  adaptive (> 1): shrink when a window's mean of actual / alone duration of\n"
         "                   high-priority kernels is above this\n"
         "  window=32        adaptive: high-priority kernel completions per decision\n"
         "  margin=min(0.05, (hp_latency_target-1)/2)  adaptive: grow when the window's mean is below\n"
         "                   hp_latency_target - margin (must be below hp_latency_target - 1)\n"
         "  idle_us=2000     adaptive: grow when no high-priority kernel completed for this long\n"
         "  probe_us=1500    adaptive: a high-priority kernel without an alone duration yet pauses best-effort\n"
         "                   admission for at most this long, so that it runs alone once (0: never pause; alone\n"
         "                   durations then come only from gaps in best-effort work)\n"
         "  probe_every_ms=50  adaptive: at most one such pause per this\n"
         "  be_depth=2       adaptive: best-effort ops in flight at most (work already on the GPU cannot be\n"
         "                   paused: a shallow queue lets a pause, and a shrink, take effect soon)\n" +
         detail::gpud_param_docs();
}

}  // namespace sched

// Scheduling policies: which best-effort op may go to the GPU now. Chosen by name; every
// parameter has a documented default (see policy_param_docs()).
#pragma once

#include <map>
#include <optional>
#include <memory>
#include <string>
#include <vector>

#include "scheduler/op.h"

namespace sched {

// What the policy knows about an op it is asked to admit.
struct OpEstimate {
  double duration_ns = 0;  // learned (or imported); unknown: Policy::untimed_kernel_duration_ns()
  int sms_needed = 0;      // from the backend's occupancy answer
  KernelProfile profile = KernelProfile::kUnknown;
};

// The dispatcher's view of the device when it asks.
struct DeviceState {
  int sm_count = 0;
  int hp_in_flight = 0;                     // high-priority ops submitted and not yet complete
  KernelProfile hp_running_profile = KernelProfile::kUnknown;  // of the newest HP kernel still in flight
  int be_in_flight = 0;                     // best-effort ops submitted and not yet complete
  int be_sms_in_flight = 0;                 // summed SM need of best-effort kernels in flight
  double be_outstanding_ns = 0;             // summed estimated duration of BE kernels in flight
  int64_t now_ns = 0;                       // the device's clock (Device::now_ns) when asked
};

// Space instead of time: best-effort streams confined to a partition of the GPU's SMs (CUDA green
// contexts), so that high-priority blocks always find free SMs (the `partition` policy).
//
// Backends read Policy::sm_partition() at each best-effort launch (the adaptive partition changes
// over time) and confine the launch to best_effort_sms(sm_count) SMs: a new size applies to blocks
// dispatched from then on, blocks already running keep their SMs (as a launch into a new green
// context would). Sizes always stay on the granularity ladder (one step .. steps - 1).
struct SmPartition {
  double best_effort_fraction = 0.5;  // of the SMs, rounded down to the granularity
  int granularity = 8;                // SMs per partition step (sm_90 green contexts: 8)
  bool high_priority_on_rest = false; // high priority on the other SMs only (else on all of them)
  // > 0: exactly this many granularity steps (clamped to the ladder), best_effort_fraction
  // ignored. The adaptive partition sets it once it knows the device's SM count.
  int best_effort_steps = 0;
  // The best-effort partition's size on a GPU of `sm_count` SMs: a multiple of the granularity,
  // at least one step and at most sm_count minus one step (0 when the GPU has fewer than 2 steps).
  int best_effort_sms(int sm_count) const;
};

// A kernel the dispatcher saw complete (Policy::observe), with what it knew at its submission.
struct KernelCompletion {
  StreamClass cls = StreamClass::kUnmanaged;  // high priority or best effort (others are not reported)
  KernelId kernel = 0;
  OpEstimate est;              // the profile store's estimate when it was submitted
  int64_t ready_ns = 0;        // when it could start: submitted, and its stream's previous op done
  int64_t start_ns = 0;        // device clock; start == end when the backend did not time it
  int64_t end_ns = 0;
  // No best-effort op was in flight at any time from its submission to its completion (it ran as
  // if alone, as far as best effort goes).
  bool be_free = false;
  int sm_count = 0;            // the device's, at completion
};

class Policy {
 public:
  virtual ~Policy() = default;
  virtual const char* name() const = 0;
  // Should `op` (head of a best-effort stream queue) be submitted now?
  virtual bool admit(const Op& op, const OpEstimate& est, const DeviceState& state) const = 0;
  // Whether best-effort ops are deferred at all (passthrough: no).
  virtual bool defers_best_effort() const { return true; }
  // False: the dispatcher's starvation bound (be_max_wait_ns) does not force this policy's
  // best-effort heads out (gpud: the pipeline's windows decide, and the lease bounds the wait).
  virtual bool bounds_best_effort_wait() const { return true; }
  // True: the whole process is best effort (gpud: another process owns the GPU's busy time). The
  // shim then classes every stream best effort whatever its priority or the calling thread's
  // class, the legacy default stream included (its order with blocking streams kept while held:
  // Dispatcher::order_legacy_stream); communication streams stay communication.
  virtual bool gates_whole_process() const { return false; }
  // Estimated length of a non-kernel op (copy, memset, ...) for admission and the best-effort
  // in-flight total; 0: not estimated (the dispatcher's default for every policy but gpud).
  virtual double non_kernel_duration_ns(const Op& /*op*/) const { return 0; }
  // What a kernel whose duration is not known yet (never timed, no imported profile) counts for
  // in its estimate and the best-effort in-flight total; 0: nothing (orion: its whole duration
  // threshold, so that untimed kernels do not pass the threshold unseen).
  virtual double untimed_kernel_duration_ns() const { return 0; }
  // The SM partition the backend should confine best-effort streams to (partition: yes), as it
  // stands now: the adaptive partition resizes it at run time, so backends ask at each
  // best-effort launch. Thread-safe and cheap (atomic loads, no lock): called from launch paths.
  virtual std::optional<SmPartition> sm_partition() const { return std::nullopt; }
  // Whether the policy wants observe() calls (the dispatcher skips the bookkeeping otherwise).
  virtual bool wants_observations() const { return false; }
  // Feedback: every high-priority and best-effort kernel completion the dispatcher learns about
  // (timed or not), in completion order per stream. May be called from several threads at once;
  // must not call back into the dispatcher.
  virtual void observe(const KernelCompletion& /*done*/) {}
};

using PolicyParams = std::map<std::string, std::string>;

// "passthrough", "priority", "orion", "partition" (adaptive=1: resized at run time). Unknown names or parameters, and bad values, throw
// std::invalid_argument naming the parameter and what is allowed.
std::unique_ptr<Policy> make_policy(const std::string& name, const PolicyParams& params = {});
std::vector<std::string> policy_names();
// One line per parameter: name, default, meaning.
std::string policy_param_docs();

}  // namespace sched

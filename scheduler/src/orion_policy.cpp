// Orion's admission rule (EuroSys'24, eth-easl/orion, scheduler_eval.cpp): a best-effort kernel
// goes when no high-priority work is in flight, or if (1) it fits next to what BE already holds
// under an SM threshold and (2) its profile (compute vs memory bound) complements the running HP
// kernel's (as in Orion, an unknown profile on either side counts as complementary unless
// allow_unknown=0); and in both cases only while (3) the summed estimated duration of BE kernels
// already outstanding is at or under a duration threshold (as in Orion, the kernel that crosses
// the threshold still goes; the ones after it wait until outstanding BE work drains below it).
// (3) is what bounds the wait of the next HP kernel: "no HP in flight" is only a gap between two
// HP launches, and Orion's `large_found` gate holds on its HP-idle path too. Orion sets (3) as a
// fraction of the HP request latency; we take an absolute `dur_threshold_us` (default 100 us)
// because a pipeline stage has no single request latency to anchor it. Orion knows every
// kernel's duration from an offline profile; a kernel we have not timed yet counts as the whole
// threshold (untimed_kernel_duration_ns), so first-seen kernels do not flood the GPU.
#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

#include "policy_params.h"

namespace sched::detail {

namespace {

struct OrionParams {
  int sm_threshold = 0;            // absolute SM count; 0: use the fraction
  double sm_threshold_frac = 1.0;  // of the device's SMs
  double dur_threshold_ns = 100'000;
  // Review fix: Orion's rule is `profile == -1 || hp_profile == -1 || profile != hp_profile`.
  // The default used to be false, and since profiles are never learned online (only durations),
  // every kernel without an imported profile or hint was held back for as long as HP work was in
  // flight: the shim's default policy behaved like "priority".
  bool allow_unknown = true;
};

class OrionPolicy final : public Policy {
 public:
  explicit OrionPolicy(OrionParams p) : p_(p) {}
  const char* name() const override { return "orion"; }

  // A kernel never timed, or a graph (an opaque bundle of them), counts as the whole threshold.
  // The gate admits while the outstanding sum is at or under it, so one more kernel still goes
  // beside it (Orion's own check also lets the kernel that crosses the threshold go), and the one
  // after that waits. At least 1 ns, so that with a threshold of 0 one alone is outstanding.
  double untimed_kernel_duration_ns() const override { return std::max(p_.dur_threshold_ns, 1.0); }
  double non_kernel_duration_ns(const Op& op) const override {
    return op.kind == OpKind::kGraphLaunch ? untimed_kernel_duration_ns() : 0;
  }

  bool admit(const Op& op, const OpEstimate& est, const DeviceState& state) const override {
    // Copies, memsets, event ops, host functions hold no SMs: ordering ops, not contention.
    if (op.kind != OpKind::kKernel && op.kind != OpKind::kGraphLaunch) return true;
    const bool under_duration_threshold = state.be_outstanding_ns <= p_.dur_threshold_ns;
    if (state.hp_in_flight == 0) return under_duration_threshold;
    // Graphs are opaque bundles of unknown size: only next to an idle HP stream.
    if (op.kind == OpKind::kGraphLaunch) return false;

    const int threshold = p_.sm_threshold > 0
                              ? p_.sm_threshold
                              : static_cast<int>(std::ceil(p_.sm_threshold_frac * state.sm_count));
    if (state.be_sms_in_flight + est.sms_needed > threshold) return false;

    const bool known = est.profile != KernelProfile::kUnknown &&
                       state.hp_running_profile != KernelProfile::kUnknown;
    if (known ? est.profile == state.hp_running_profile : !p_.allow_unknown) return false;

    // Review fix: this used to be `outstanding + est.duration_ns <= threshold`, which never
    // co-scheduled a BE kernel longer than the threshold (typical training kernels at 100 us).
    // Orion checks the outstanding sum only (its `large_found` flag is set once the sum passes
    // the threshold, after the kernel that crossed it was scheduled).
    return under_duration_threshold;
  }

 private:
  OrionParams p_;
};

}  // namespace

std::unique_ptr<Policy> make_orion_policy(const PolicyParams& params) {
  ParamReader r("orion", params, {"sm_threshold", "sm_threshold_frac", "dur_threshold_us", "allow_unknown"});
  if (r.has("sm_threshold") && r.has("sm_threshold_frac")) {
    throw std::invalid_argument(
        "policy 'orion': give either 'sm_threshold' (an SM count) or 'sm_threshold_frac' (a "
        "fraction of the device's SMs), not both");
  }
  OrionParams p;
  p.sm_threshold = static_cast<int>(r.integer("sm_threshold", 0, 1, 1'000'000));
  p.sm_threshold_frac = r.number("sm_threshold_frac", 1.0, 1e-9, 1.0);
  p.dur_threshold_ns = r.number("dur_threshold_us", 100.0, 0.0, 1e9) * 1000.0;
  p.allow_unknown = r.flag("allow_unknown", true);
  return std::make_unique<OrionPolicy>(p);
}

std::string orion_param_docs() {
  return "orion: sm_threshold=<int, default: unset>  best-effort kernels in flight (plus the new one) may hold at most this many SMs while high-priority work runs\n"
         "orion: sm_threshold_frac=<(0,1], default 1.0>  the same threshold as a fraction of the device's SMs (used when sm_threshold is unset)\n"
         "orion: dur_threshold_us=<us, default 100>  a best-effort kernel goes only while the summed estimated duration of best-effort kernels already outstanding is at or under this, high-priority work in flight or not (a kernel not timed yet counts as all of it)\n"
         "orion: allow_unknown=<0|1, default 1>  1 (Orion's rule): a kernel whose profile (or the running HP kernel's) is unknown counts as complementary; 0: it waits\n";
}

}  // namespace sched::detail

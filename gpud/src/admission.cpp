// The best-effort side's decision per launch: pure, so it is tested under a fake clock and costs
// a few loads and compares in the launching thread.
#include <algorithm>

#include "gpud/gpud.h"

namespace gpud {

Decision admit(const WindowView& window, const GrantView& grant, int64_t now_ns, int64_t kernel_ns,
               int64_t inflight_ns, const AdmissionConfig& config) {
  // A grant being written: no verdict of the daemon's this time (see GrantView::torn).
  if (grant.torn) return {Verdict::kHold, "grant being written"};
  // A grant the daemon revoked (it dropped this client) holds while its lease runs: the client
  // connects again meanwhile, or, the daemon gone, the lease runs out into the fallback.
  if (grant.mode == GrantMode::kRevoked && grant.lease_expiry_ns > now_ns) return {Verdict::kHold, "grant revoked"};
  // The daemon renews the lease every tick: past it, the daemon is gone or stuck, and what the
  // grant says can no longer be trusted. The user chose what happens then.
  if (grant.lease_expiry_ns <= now_ns) {
    return config.fallback == Fallback::kPassThrough ? Decision{Verdict::kRun, "lease expired: passing through"}
                                                     : Decision{Verdict::kHold, "lease expired: holding"};
  }
  switch (grant.mode) {
    case GrantMode::kRevoked:
      return {Verdict::kHold, "grant revoked"};
    case GrantMode::kFree:
      return {Verdict::kRun, "no pipeline: free"};
    case GrantMode::kGated:
      break;
  }
  // A window being published (read torn): no window this time, not "no pipeline". The daemon's
  // kept snapshot goes stale (and the grant free) if the writer never finishes.
  if (window.torn) return {Verdict::kHold, "window being published"};
  // A pipeline gone quiet while the grant says gated: hold. The daemon frees the grant within a
  // tick of noticing (a dead pipeline at once, by its pidfd), and a daemon that is gone lets the
  // lease run out into the user's fallback; running here would put best-effort work beside a
  // pipeline that may be live (a page nobody writes any more after a daemon restart).
  // Written as comparisons against `now - stale` so that a page value of INT64_MIN cannot overflow.
  if (window.heartbeat_ns <= 0 || window.heartbeat_ns < now_ns - config.stale_after_ns ||
      window.heartbeat_ns > now_ns + config.stale_after_ns) {  // ahead of now: not this clock's, not live
    return {Verdict::kHold, "pipeline heartbeat stale: holding until the daemon frees the grant"};
  }
  if (window.windows_published == 0 || now_ns < window.open_ns || now_ns >= window.close_ns) {
    return {Verdict::kHold, "outside a window"};
  }
  // now < close here, so close - now is positive and cannot overflow.
  const int64_t left = (window.close_ns - now_ns) - config.guard_ns;
  if (kernel_ns < 0) {
    // Unknown length: only into a long window, and alone.
    if (left >= config.unknown_kernel_min_window_ns && inflight_ns == 0) return {Verdict::kRun, "unknown kernel, long window", true};
    return {Verdict::kHold, "unknown kernel, window too short"};
  }
  // inflight and kernel are the caller's own estimates (>= 0, well under 2^62).
  const int64_t need = std::max<int64_t>(inflight_ns, 0) + kernel_ns;
  // The budget bounds work in flight. A kernel longer than the budget may still go alone (else a
  // job whose longest kernel exceeds the budget stalls at it for good: the simulator's study found
  // exactly that at 250 us), up to max_alone_ns when the user capped it.
  if (inflight_ns > 0 && need > grant.inflight_budget_ns) return {Verdict::kHold, "in-flight budget full"};
  if (inflight_ns <= 0 && config.max_alone_ns > 0 && kernel_ns > grant.inflight_budget_ns &&
      kernel_ns > config.max_alone_ns) {
    return {Verdict::kHold, "kernel longer than max_alone"};
  }
  if (need > left) return {Verdict::kHold, "does not fit before the window closes"};
  return {Verdict::kRun, "fits the window", true};
}

}  // namespace gpud

// Dispatcher admission accounting: what the policy is told about the device (DeviceState), the
// high-priority kernels in flight whose profile Orion's rule pairs with, and the best-effort ops
// reserved and released (rules in dispatcher.h; locking in dispatcher_impl.h).
#include <algorithm>
#include <optional>

#include "dispatcher_impl.h"

namespace sched {

using detail::InFlightOp;

OpEstimate Dispatcher::Impl::estimate(const Op& op) {
  if (op.kind != OpKind::kKernel) {
    OpEstimate est;
    est.duration_ns = policy->non_kernel_duration_ns(op);
    return est;
  }
  OpEstimate est = opt.profiles->estimate(op.kernel, device);
  if (est.duration_ns <= 0) est.duration_ns = policy->untimed_kernel_duration_ns();
  return est;
}

// What the policy is told about the device, without the best-effort fields (admit_locked adds
// them under admit_mu).
DeviceState Dispatcher::Impl::device_state() {
  DeviceState state;
  // Asked each time, not frozen at construction: a backend may learn it late (the real driver
  // only once a context is current).
  state.sm_count = device.sm_count();
  state.now_ns = device.now_ns();
  state.hp_in_flight = hp_in_flight.load(std::memory_order_acquire);
  std::optional<HpKernel> newest;
  {
    std::lock_guard lock(hp_mu);
    if (!hp_kernels.empty()) newest = hp_kernels.back();
  }
  if (newest) {
    state.hp_running_profile =
        newest->hint != KernelProfile::kUnknown ? newest->hint : opt.profiles->profile_of(newest->kernel);
  }
  return state;
}

uint64_t Dispatcher::Impl::hp_kernel_started(const Op& op) {
  std::lock_guard lock(hp_mu);
  hp_kernels.push_back({op.kernel.id, op.kernel.profile_hint, false});
  return hp_front_ticket + hp_kernels.size() - 1;
}

void Dispatcher::Impl::hp_kernel_done(uint64_t ticket) {
  std::lock_guard lock(hp_mu);
  if (ticket < hp_front_ticket || ticket - hp_front_ticket >= hp_kernels.size()) return;
  hp_kernels[ticket - hp_front_ticket].done = true;
  while (!hp_kernels.empty() && hp_kernels.front().done) {
    hp_kernels.pop_front();
    ++hp_front_ticket;
  }
  while (!hp_kernels.empty() && hp_kernels.back().done) hp_kernels.pop_back();
}

// The policy's answer for `op` (admit_mu held by the caller).
bool Dispatcher::Impl::admit_locked(const Op& op, const OpEstimate& est, DeviceState state) {
  state.be_in_flight = be_in_flight;
  state.be_sms_in_flight = be_sms;
  state.be_outstanding_ns = be_outstanding_ns;
  return policy->admit(op, est, state);
}

bool Dispatcher::Impl::policy_admits(const Op& op) {
  const OpEstimate est = estimate(op);
  const DeviceState state = device_state();
  std::lock_guard lock(admit_mu);
  return admit_locked(op, est, state);
}

// Asks the policy (unless `force`) and, if admitted, counts the op as in flight.
bool Dispatcher::Impl::reserve_best_effort(const Op& op, const OpEstimate& est, bool force) {
  DeviceState state;
  if (!force) state = device_state();
  std::lock_guard lock(admit_mu);
  if (!force && !admit_locked(op, est, state)) return false;
  ++be_in_flight;
  be_sms += est.sms_needed;
  be_outstanding_ns += est.duration_ns;
  be_reserved.fetch_add(1, std::memory_order_release);
  be_in_flight_now.store(be_in_flight, std::memory_order_release);
  return true;
}

void Dispatcher::Impl::release(const InFlightOp& done) {
  if (done.cls == StreamClass::kHighPriority) {
    if (done.hp_ticket != 0) hp_kernel_done(done.hp_ticket);
    hp_in_flight.fetch_sub(1, std::memory_order_release);
  } else if (done.cls == StreamClass::kBestEffort) {
    std::lock_guard lock(admit_mu);
    --be_in_flight;
    be_sms -= done.sms;
    be_outstanding_ns = std::max(0.0, be_outstanding_ns - done.est_ns);
    be_in_flight_now.store(be_in_flight, std::memory_order_release);
  }
}

}  // namespace sched

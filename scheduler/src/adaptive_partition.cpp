// The adaptive SM partition's controller (rules in adaptive_partition.h).
#include "adaptive_partition.h"

#include <algorithm>

namespace sched::detail {

namespace {
constexpr uint64_t kMinAlone = 3;  // alone samples before their mean is a kernel's alone duration
}  // namespace

PartitionController::PartitionController(SmPartition start, AdaptiveParams params) : start_(start), p_(params) {}

SmPartition PartitionController::current() const {
  SmPartition now = start_;
  now.best_effort_steps = steps_.load(std::memory_order_acquire);
  return now;
}

PartitionController::Stats PartitionController::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

bool PartitionController::all_known() const {
  for (const auto& [id, k] : kernels_) {
    if (!k.confined && k.alone_n < kMinAlone) return false;
  }
  return true;
}

void PartitionController::resize(int delta, int64_t now_ns) {
  const int steps = steps_.load(std::memory_order_relaxed);
  const int next = std::clamp(steps + delta, 1, total_steps_ - 1);
  ++stats_.windows;
  window_sum_ = 0;
  window_n_ = 0;
  idle_since_ns_ = now_ns;
  if (next == steps) return;
  steps_.store(next, std::memory_order_release);
  if (next < steps) ++stats_.shrinks;
  if (next > steps) ++stats_.grows;
  // Best-effort blocks placed under the old size keep their SMs until they finish.
  changed_ns_ = now_ns;
  settled_ = false;
}

void PartitionController::end_probe(int64_t now_ns) {
  probing_.store(false, std::memory_order_release);
  last_probe_ns_ = now_ns;
  window_sum_ = 0;
  window_n_ = 0;
  changed_ns_ = now_ns;  // kernels that ran during the probe are alone, not evidence
  idle_since_ns_ = now_ns;
}

void PartitionController::observe(const KernelCompletion& done) {
  std::lock_guard lock(mu_);
  if (total_steps_ == 0) {
    if (done.sm_count <= 0 || start_.granularity <= 0) return;
    total_steps_ = done.sm_count / start_.granularity;
    sm_count_ = done.sm_count;
    if (total_steps_ < 2) return;  // no partition possible: best_effort_sms() says 0 anyway
    steps_.store(start_.best_effort_sms(done.sm_count) / start_.granularity, std::memory_order_release);
    changed_ns_ = idle_since_ns_ = done.end_ns;
  }
  if (total_steps_ < 2) return;
  const int64_t now = done.end_ns;
  if (probing_.load(std::memory_order_relaxed) && now - probe_start_ns_ >= p_.probe_ns) end_probe(now);

  if (done.cls != StreamClass::kHighPriority) {
    if (!settled_ && done.ready_ns >= changed_ns_) {
      settled_ = true;
      settled_ns_ = now;
    }
    // Best effort completing while high priority has been quiet: room to grow.
    if (now - idle_since_ns_ >= p_.idle_ns) resize(+1, now);
    return;
  }
  idle_since_ns_ = std::max(idle_since_ns_, now);
  if (done.end_ns <= done.start_ns) return;  // untimed: activity, but no sample
  const double sample = static_cast<double>(done.end_ns - done.ready_ns);
  if (sample <= 0) return;

  const int steps = steps_.load(std::memory_order_relaxed);
  // What high priority has beside best effort's steps: the SM count's remainder past the last
  // whole step included (132 SMs, steps of 8, 15 to best effort: 12 left, not 8).
  const int rest_sms = sm_count_ - steps * start_.granularity;
  // On the rest only, a kernel needing more SMs than the rest has is slowed by the confinement
  // itself (more waves): never an alone sample, and at least that much slower.
  const bool confined = start_.high_priority_on_rest && done.est.sms_needed > rest_sms;
  const double confined_ratio = confined ? static_cast<double>(done.est.sms_needed) / rest_sms : 1.0;
  KernelStats& k = kernels_[done.kernel];
  k.confined = confined;
  if (done.be_free && !confined) {
    k.alone_sum += sample;
    ++k.alone_n;
    if (!settled_ && done.ready_ns >= changed_ns_) {
      settled_ = true;
      settled_ns_ = now;
    }
  }
  if (probing_.load(std::memory_order_relaxed)) {
    if (all_known()) end_probe(now);
    return;
  }
  // Without best effort in flight the partition's size did not matter: no evidence either way.
  if (done.be_free) return;
  double ratio = 0;
  if (k.alone_n >= kMinAlone) {
    ratio = std::max(sample / (k.alone_sum / static_cast<double>(k.alone_n)), confined_ratio);
  } else if (confined) {
    ratio = confined_ratio;  // known slower, without an alone duration (it can have none)
  } else if (p_.probe_ns > 0 && (last_probe_ns_ < 0 || now - last_probe_ns_ >= p_.probe_every_ns)) {
    probe_start_ns_ = now;
    probe_end_ns_.store(now + p_.probe_ns, std::memory_order_relaxed);
    probing_.store(true, std::memory_order_release);
    ++stats_.probes;
    return;
  }
  if (ratio <= 0 || !settled_ || done.ready_ns < std::max(changed_ns_, settled_ns_)) return;
  window_sum_ += ratio;
  if (++window_n_ < p_.window) return;
  const double mean = window_sum_ / window_n_;
  resize(mean > p_.target ? -1 : (mean < p_.target - p_.margin ? +1 : 0), now);
}

}  // namespace sched::detail

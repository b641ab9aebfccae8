// The adaptive SM partition (`partition` with adaptive=1): the best-effort partition's size K
// moves at run time, one granularity step at a time, toward the largest size that keeps
// high-priority kernels within `hp_latency_target` of their alone duration. Internal to the
// scheduler library; the policy wrapper is in policy.cpp.
//
// Learned online from completions, no offline profiling:
//  - A sample's duration is end - ready (ready: submitted and its stream's previous op done), so
//    time a high-priority kernel spends waiting for SMs held by best-effort blocks counts.
//  - Alone duration of each high-priority kernel: the mean of its samples that ran with no
//    best-effort op in flight from submission to completion (KernelCompletion::be_free). Only
//    those: the fastest sample, or a low quantile, of samples taken next to best effort is biased
//    (low by the jitter, high by the contention), and either bias misleads the controller.
//  - Probes: when a high-priority kernel completes that has too few alone samples, best-effort
//    admission pauses (probing() is true) for at most `probe_us`, or until every high-priority
//    kernel seen has its alone samples. Best-effort work in flight drains, high-priority kernels
//    then run alone and teach their durations. At most one probe per `probe_every_us`; a
//    workload whose best effort leaves gaps on its own never needs one. The dispatcher's
//    starvation bound still applies to paused best-effort work.
//  - Evidence after a resize counts only once the new size is in effect: after a best-effort
//    kernel that became ready after the resize completed (its blocks were all placed under the
//    new size), or a high-priority kernel ran alone.
//  - Decision per window of `window` high-priority completions with a known alone duration that
//    ran next to best effort (a be_free one says nothing about the size): the
//    window's mean of actual / alone. Above the target: shrink one step. Below target - margin:
//    grow one step. No high-priority completion for `idle_us` while best effort completes: grow
//    one step. Always within [1 step, steps - 1].
//  - hp_rest=1: a kernel needing more SMs than the rest holds (KernelCompletion::est.sms_needed)
//    is slowed by the confinement itself: its ratio is at least needed / rest, and its samples
//    never count as alone.
#pragma once

#include <atomic>
#include <cstdint>
#include <mutex>
#include <unordered_map>

#include "scheduler/policy.h"

namespace sched::detail {

struct AdaptiveParams {
  double target = 1.10;            // hp_latency_target: actual / alone
  int window = 32;                 // HP completions per decision
  double margin = 0.05;            // grow below target - margin
  int64_t idle_ns = 2'000'000;     // no HP completion for this long: grow
  int64_t probe_ns = 1'500'000;    // longest best-effort pause of one probe (0: never probe)
  int64_t probe_every_ns = 50'000'000;  // at most one probe per this
};

class PartitionController {
 public:
  PartitionController(SmPartition start, AdaptiveParams params);

  // The partition now (atomic loads only).
  SmPartition current() const;
  // Best-effort admission paused for a probe at `now_ns` (the device clock; atomic loads). The
  // probe's end is checked here too, not only at the next completion: in a pipeline bubble none
  // may come, and best effort would wait for its starvation bound instead of probe_us.
  bool probing(int64_t now_ns) const {
    return probing_.load(std::memory_order_acquire) && now_ns < probe_end_ns_.load(std::memory_order_relaxed);
  }
  void observe(const KernelCompletion& done);

  struct Stats {
    uint64_t shrinks = 0, grows = 0, windows = 0, probes = 0;
  };
  Stats stats() const;

 private:
  struct KernelStats {
    double alone_sum = 0;
    uint64_t alone_n = 0;
    // Last seen needing more SMs than the rest (hp_rest): it can never run alone there, and its
    // slowdown is known from the confinement, so no probe waits for its alone duration.
    bool confined = false;
  };
  void resize(int delta, int64_t now_ns);
  void end_probe(int64_t now_ns);
  bool all_known() const;

  const SmPartition start_;
  const AdaptiveParams p_;
  std::atomic<int> steps_{0};  // 0 until the SM count is known (start_'s fraction applies)
  std::atomic<bool> probing_{false};
  std::atomic<int64_t> probe_end_ns_{0};  // written before probing_ is set

  mutable std::mutex mu_;
  int total_steps_ = 0;
  int sm_count_ = 0;  // the device's (its remainder past the last whole step is the rest's too)
  std::unordered_map<KernelId, KernelStats> kernels_;
  double window_sum_ = 0;
  int window_n_ = 0;
  int64_t changed_ns_ = 0;      // last resize or probe end: evidence must be ready after it ...
  bool settled_ = true;         // ... and after the change took effect
  int64_t settled_ns_ = 0;
  int64_t idle_since_ns_ = 0;   // last HP completion or decision
  int64_t probe_start_ns_ = 0;
  int64_t last_probe_ns_ = -1;
  Stats stats_;
};

}  // namespace sched::detail

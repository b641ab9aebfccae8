// The scheduler's Device backed by the real CUDA driver. submit() makes the intercepted call;
// completion of tracked ops (high-priority and best-effort classes) is observed with a
// CUevent (pooled per stream, so of the stream's context) recorded after each one and polled with cuEventQuery. Kernel durations are learned
// from the elapsed time between consecutive tracked ops of a busy stream. Polling queries the
// newest pending event of a stream first: when it is done, the whole backlog retires with one
// driver call (the dispatcher retires earlier ops of the stream with the latest completion).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "cuda_api.h"
#include "scheduler/device.h"

namespace orion {

class DriverDevice final : public sched::Device {
 public:
  DriverDevice() = default;
  ~DriverDevice() override = default;

  int submit(const sched::Op& op) override;
  void poll() override;
  void set_listener(sched::CompletionListener* listener) override;
  int sm_count() const override;
  int max_active_blocks_per_sm(const sched::KernelInfo& kernel) override;
  int64_t now_ns() const override;

  // Function handles may have been reused (module/library unloaded): ask the driver again.
  void forget_occupancy();

  // Ops submitted and not yet seen complete (for statistics and tests).
  uint64_t tracked_in_flight() const;

  // Stream captures the shim counts (owned by the Shim). While one is active: no completion event
  // is recorded (it would become a node of the program's graph: the op counts as done at once),
  // and only the shim's own threads, which run in relaxed capture mode, query events (a query from
  // a thread in global mode invalidates a global-mode capture).
  void set_capture_counter(const std::atomic<int>* captures) { captures_ = captures; }
  // Marks the calling thread as one of the shim's own (relaxed capture mode).
  static void mark_shim_thread();

 private:
  struct Pending {
    uint64_t seq;
    sched::OpKind kind;
    sched::KernelId kernel;
    CUevent done;
    bool stream_was_busy;  // the previous tracked op of this stream was still running at submit
  };
  // Completion events belong to the stream's context (an event can only be recorded on a stream
  // of its own context), so each stream keeps its own pool.
  struct StreamTrack {
    std::deque<Pending> pending;
    CUevent last_done = nullptr;  // kept until the next completion, to time it
    std::vector<CUevent> free_events;
  };

  // Called under the op's context (submit's ContextGuard).
  void track(const sched::Op& op, CUstream stream);
  static CUevent take_event(StreamTrack& t);  // under mutex_
  void report(const std::vector<sched::Completion>& done);

  std::mutex poll_mutex_;  // one poller at a time (taken with try_lock); guards the scratch below
  struct Look {
    sched::StreamId stream;
    CUevent newest;
    size_t pending;
  };
  std::vector<Look> looks_;
  std::vector<CUevent> oldest_;
  std::vector<sched::Completion> done_;
  mutable std::mutex mutex_;  // the pending queues and the event pool; never held across a query
  std::unordered_map<sched::StreamId, StreamTrack> streams_;
  std::atomic<sched::CompletionListener*> listener_{nullptr};
  std::atomic<uint64_t> in_flight_{0};

  const std::atomic<int>* captures_ = nullptr;
  bool capturing() const {
    return captures_ != nullptr && captures_->load(std::memory_order_acquire) > 0;
  }

  mutable std::atomic<int> sm_count_{0};
  std::mutex occupancy_mutex_;
  std::map<std::tuple<sched::KernelId, uint64_t, uint32_t>, int> occupancy_;
};

}  // namespace orion

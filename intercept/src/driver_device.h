// The scheduler's Device backed by the real CUDA driver. submit() makes the intercepted call;
// completion of tracked ops (high-priority and best-effort classes) is observed with CUevents
// (pooled per stream, so of the stream's context) polled with cuEventQuery, tracked in batches:
//  * A tracked op records a completion event only when its stream's newest record is at least
//    the batch window old (set_completion_batch_ns; ORION_COMPLETION_BATCH_US, default 20 us);
//    the ops in between are uncovered and complete with the next event on the stream (streams run
//    in order; the dispatcher retires earlier ops of a stream with a later completion). A burst of
//    launches costs one record per window, not one per launch.
//  * The shim's helper thread (poll(), in relaxed capture mode) records a tail event on a stream
//    whose uncovered ops are a window old, so the end of a burst is seen without a next launch.
//    It records under mutex_, which a capture begin (with_records_blocked) and a stream destroy
//    (stream_destroying) also take: a tail record never lands in a capture or on a dead stream.
//  * Kernel durations are learned only from kernels the dispatcher asks to time (Op::wants_timing:
//    while a kernel is being learned, then re-samples): an event recorded right before the launch
//    and one right after give its exact duration, whether the stream was busy or idle.
// Polling queries the newest pending event of a stream first: when it is done, the whole backlog
// retires with one driver call. Streams with high-priority work are polled on every pass, the
// others kPolledPerPass at a time, round robin.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <optional>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "cuda_api.h"
#include "scheduler/device.h"

namespace orion {

class GreenPartitions;

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

  // The partition policy's green contexts (null: every op on its own stream). Best-effort kernels
  // are handed to it at submit; every other op of a stream is reported to it (note_in_place).
  void set_partitions(GreenPartitions* partitions) { partitions_ = partitions; }

  // Stream captures the shim counts (owned by the Shim). While one is active: no completion event
  // is recorded (it would become a node of the program's graph: the op counts as done at once),
  // and only the shim's own threads, which run in relaxed capture mode, query events (a query from
  // a thread in global mode invalidates a global-mode capture).
  void set_capture_counter(const std::atomic<int>* captures) { captures_ = captures; }
  // Marks the calling thread as one of the shim's own (relaxed capture mode).
  static void mark_shim_thread();

  // The batch window (see the top): 0 records an event after every tracked op.
  void set_completion_batch_ns(int64_t ns) { batch_ns_.store(ns, std::memory_order_relaxed); }
  // Runs `raise_capture_count` under the lock the helper's tail records take and the one every
  // poll holds, so that once a capture begins (Shim::begin_capture) no tail record is in progress
  // and no program thread is still querying events: a poll that passed its capturing() check
  // before the count went up would otherwise query from a thread in global capture mode during
  // the new capture, and invalidate it. poll() checks again once it holds the lock.
  template <typename F>
  void with_records_blocked(F&& raise_capture_count) {
    std::lock_guard poll_lock(poll_mutex_);
    std::lock_guard lock(mutex_);
    raise_capture_count();
  }
  // Before a stream is destroyed (the handle is still valid): its uncovered ops get their event
  // now, from the calling thread, or are reported complete if no event can be recorded; no tail
  // record touches the handle afterwards.
  void stream_destroying(sched::StreamId id);
  // Held while a context may be ending (from before cuCtxDestroy's driver call until the shim has
  // dropped what it had there): no poll queries, pools or destroys an event of the dying context,
  // whose handle value the driver may hand to another thread's new event meanwhile.
  class PollsBlocked {
   private:
    friend class DriverDevice;
    PollsBlocked() = default;  // only block_polls() makes one
    std::unique_lock<std::mutex> lock_;
  };
  PollsBlocked block_polls();
  // cuCtxDestroy(ctx) succeeded: the streams of ctx and every event of ctx are gone. Their tracked
  // ops are reported complete, and the shim's events of ctx are dropped, never queried, pooled
  // or destroyed again (their handle values may come back for the program's new events).
  // Returns the streams that went with it.
  std::vector<sched::StreamId> context_destroyed(CUcontext ctx, const PollsBlocked& polls_blocked);
  // A stream was created with a handle value still tracked here (the old stream never reached
  // stream_destroying: it went with a context the shim could not tell had ended). Everything
  // tracked of the old stream's context is dropped as in context_destroyed (streams of a new
  // context that got the same handle value too: their events leak, their ops count as done
  // early); returns the streams dropped.
  std::vector<sched::StreamId> stream_handle_reused(sched::StreamId id);

 private:
  struct Pending {
    uint64_t seq;  // the newest op the event covers
    sched::OpKind kind;
    sched::KernelId kernel;
    CUevent done;
    CUevent started;  // recorded right before the op (Op::wants_timing), else null
    uint32_t ops;     // tracked ops the event covers: this one and the uncovered ones before it
    uint32_t generation;  // StreamTrack::generation when recorded
    CUcontext context;    // the context its events belong to (StreamTrack::context), or null
  };
  // Completion events belong to the stream's context (an event can only be recorded on a stream
  // of its own context), so each stream keeps its own pool.
  struct StreamTrack {
    std::deque<Pending> pending;
    std::vector<CUevent> free_events;
    // Tracked ops submitted after the newest record, covered by none yet; the newest of them.
    uint32_t uncovered = 0;
    uint64_t uncovered_seq = 0;
    sched::OpKind uncovered_kind = sched::OpKind::kKernel;
    sched::KernelId uncovered_kernel = 0;
    int64_t last_record_ns = 0;
    CUstream handle = nullptr;    // for tail records; null once the stream is being destroyed
    CUcontext context = nullptr;  // the stream's context (cuStreamGetCtx, asked once per stream)
    bool context_known = false;
    bool high_priority = false;   // its newest tracked op was high priority: polled every pass
    // Bumped when the stream is destroyed: events recorded before belong to the old stream's
    // context and are destroyed when they retire, never pooled for a reused handle.
    uint32_t generation = 0;
  };
  // Streams with pending events but no high-priority work queried per poll, round robin: the
  // helper thread's driver calls per pass stay bounded however many streams are busy (each such
  // stream is looked at every ceil(busy / kPolledPerPass) passes).
  static constexpr size_t kPolledPerPass = 16;
  size_t poll_cursor_ = 0;  // under poll_mutex_

  // Called under the op's context (submit's ContextGuard); `started` is the op's start marker.
  void track(const sched::Op& op, CUstream stream, CUevent started);
  // Records an event covering t's uncovered ops (under mutex_; `ctx`: make it current first, for
  // a thread that may have another one). False when no event could be recorded.
  bool cover_uncovered(StreamTrack& t, CUcontext ctx, int64_t now);
  // The uncovered ops reported done now (an event cannot be recorded: a capture, a dead stream).
  void complete_uncovered(StreamTrack& t, sched::StreamId id, int64_t now, std::vector<sched::Completion>& out);
  void record_tails();  // the helper thread's tail records (poll())
  // Under poll_mutex_ and mutex_: everything tracked of context `ctx` goes (its streams' tracks
  // and ops, reported done into `out`; pending events of ctx left by streams destroyed earlier),
  // its events forgotten without a driver call. `also` (if tracked) goes whatever its context.
  // Returns the streams dropped.
  std::vector<sched::StreamId> drop_context(CUcontext ctx, std::optional<sched::StreamId> also, int64_t now,
                                            std::vector<sched::Completion>& out);
  // After drop_context, outside mutex_: the partition policy forgets the dropped streams (their
  // fork events went with their context) and the dropped ops are reported done.
  void dropped(const std::vector<sched::StreamId>& gone, const std::vector<sched::Completion>& done);
  // A pooled or new event, created in the calling thread's current context: the caller makes the
  // stream's context current first (under mutex_).
  static CUevent take_event(StreamTrack& t);
  // Back to t's pool, or destroyed when it was recorded for an earlier stream of that handle.
  static void return_event(StreamTrack& t, CUevent e, uint32_t generation);
  void report(const std::vector<sched::Completion>& done);

  std::mutex poll_mutex_;  // one poller at a time (taken with try_lock); guards the scratch below
  struct Look {
    sched::StreamId stream;
    CUevent newest;
    size_t pending;
  };
  std::vector<Look> looks_, looks_others_;
  std::vector<CUevent> oldest_;
  std::vector<sched::Completion> done_;
  std::vector<sched::Completion> tails_done_;
  std::atomic<int64_t> batch_ns_{20'000};
  mutable std::mutex mutex_;  // the pending queues and the event pool; never held across a query
  std::unordered_map<sched::StreamId, StreamTrack> streams_;
  std::atomic<sched::CompletionListener*> listener_{nullptr};
  std::atomic<uint64_t> in_flight_{0};

  const std::atomic<int>* captures_ = nullptr;
  GreenPartitions* partitions_ = nullptr;
  bool capturing() const {
    return captures_ != nullptr && captures_->load(std::memory_order_acquire) > 0;
  }

  mutable std::atomic<int> sm_count_{0};
  std::mutex occupancy_mutex_;
  std::map<std::tuple<sched::KernelId, uint64_t, uint32_t>, int> occupancy_;
};

}  // namespace orion

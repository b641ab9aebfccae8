// The dispatcher's implementation state, shared by dispatcher.cpp (stream lookup, submit paths,
// admission bookkeeping) and dispatcher_pump.cpp (drains, pumping, completions). Internal.
//
// Locking (acquired in this order, never the reverse):
//   pump_mu -> StreamState::mu (one stream at a time) -> events_mu | ProfileStore | admit_mu
//   wait_mu and deferred_mu are taken alone or innermost.
// A stream's mutex is held across device.submit() so that ops of one stream reach the device in
// seq order whichever thread submits them. No thread holds two stream mutexes: when an op needs
// another stream's work first (an event dependency), the stream's mutex is released, the producer
// is drained, and the head is looked at again. Completions the device reports from inside
// submit() (while a stream mutex is held) are queued and applied at the next pump.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <limits>
#include <memory>
#include <mutex>
#include <optional>
#include <shared_mutex>
#include <thread>
#include <unordered_map>
#include <vector>

#include "scheduler/dispatcher.h"
#include "scheduler/profile_store.h"
#include "stream_state.h"

namespace sched {

namespace detail {
// An event's latest record (the stream it was recorded on and its seq), and the
// stream-wait-event ops on it that are queued and not yet submitted.
using EventRecordRef = Dep;
struct EventState {
  EventRecordRef latest;
  std::vector<Dep> queued_waits;
};
}  // namespace detail

struct Dispatcher::Impl final : CompletionListener {
  using StreamState = detail::StreamState;
  using QueuedOp = detail::QueuedOp;
  using InFlightOp = detail::InFlightOp;
  using CallerWait = detail::CallerWait;
  using EventRecordRef = detail::EventRecordRef;
  using Dep = detail::Dep;

  Impl(Device& dev, std::unique_ptr<Policy> pol, DispatcherOptions o);
  ~Impl() override;

  // ---- streams and events (dispatcher.cpp) ----
  // Finds or creates; a small per-thread cache keeps the inline path off the map lock.
  StreamState& stream(StreamId id);
  StreamState* find_stream(StreamId id) const;
  std::vector<StreamState*> all_streams() const;
  // order_legacy_stream(): the legacy stream, null when its ops are never held.
  std::atomic<StreamState*> legacy_stream{nullptr};
  // The queued ops of other streams an op arriving on `s` must follow by legacy-stream order
  // (no stream mutex held on entry).
  std::vector<Dep> legacy_order_deps(StreamState& s);
  DeviceState device_state();          // without the best-effort fields (admit_mu)
  bool admit_locked(const Op& op, const OpEstimate& est, DeviceState state);  // admit_mu held
  bool policy_admits(const Op& op);    // Dispatcher::policy_admits
  // The event's latest record if it has not been submitted yet.
  EventRecordRef pending_record(EventId event);
  // What a new record of `event` on `s` must follow into the device (ops of other streams not yet
  // submitted): the previous record, so the event ends up meaning the latest one, and the queued
  // waits on it, which must bind to the record before the new one.
  std::vector<Dep> record_deps(EventId event, const StreamState& s);
  // Called at an event record's arrival (stream mutex held): waits issued later refer to it.
  void note_record(EventId event, StreamState& s, uint64_t seq);
  // A stream-wait-event queued on `s` (stream mutex held): a later record waits for it.
  void note_queued_wait(EventId event, StreamState& s, uint64_t seq);
  // Submits every dependency in `deps` (no stream mutex held).
  void drain_deps(const std::vector<Dep>& deps);
  // The first dependency of `q` not yet submitted, or null.
  static const Dep* first_unmet(const QueuedOp& q);

  // ---- admission accounting (dispatcher_admission.cpp) and submit paths (dispatcher.cpp) ----
  // The class `op` is scheduled with on `s`: its own (Op::requested_class) or the stream's; a
  // communication stream keeps its class.
  static StreamClass class_of(const StreamState& s, const Op& op);
  OpEstimate estimate(const Op& op);
  // Asks the policy (unless `force`) and, if admitted, counts the op as in flight.
  bool reserve_best_effort(const Op& op, const OpEstimate& est, bool force);
  void release(const InFlightOp& done);
  // Hands `op` to the device; s.mu held. A best-effort op must already be reserved with `est`.
  int submit_locked(StreamState& s, Op& op, const OpEstimate& est);
  // Submits the head of s.queue (already reserved with `est` if best-effort); s.mu held.
  void submit_head_locked(StreamState& s, const OpEstimate& est);
  int submit(Op&& op, bool may_defer = true);
  int submit_best_effort(StreamState& s, Op&& op);

  // ---- drains and pumping (dispatcher_pump.cpp) ----
  // Submits s's queued ops with seq <= upto, ignoring the policy (the caller must not wait).
  void drain_until(StreamState& s, uint64_t upto);
  // Takes s's deferred error if its op is at or before `up_to_seq` (an event's record: an error
  // of a later op belongs to whoever waits for that op).
  int take_error(StreamState& s, uint64_t up_to_seq = std::numeric_limits<uint64_t>::max());
  // The oldest orphan error (see orphan_errors), or 0.
  int take_orphan_error();
  int drain_stream(StreamId id);
  // The event's latest record (its stream and seq), if it has one.
  std::optional<EventRecordRef> latest_record(EventId event);
  int drain_event(EventId event);
  int drain_all();
  // The drains without taking errors (Dispatcher::release_all and co.).
  template <typename Pred>
  void release_streams(Pred pred);
  void release_all();
  void release_stream(StreamId id);
  void release_event(EventId event);
  void release_legacy_sync();
  // Nothing queued and no deferred error waiting on any stream (two atomic loads).
  bool holds_nothing() const;
  // Whether an op on the legacy stream must wait for `s`: a blocking stream holding queued work
  // (or holding anything while a deferred error waits to be returned somewhere).
  bool legacy_waits_on(const StreamState& s) const;
  int drain_legacy_sync();
  // A query's view of s (s.mu not held): queued work and, with take_error, its deferred error (taken).
  QueryState query(StreamState& s, bool take_error = true);
  QueryState query_stream(StreamId id);
  QueryState query_event(EventId event);
  QueryState query_legacy_sync();
  // Drains every stream with queued work that `pred` selects; the first deferred error (with
  // with_orphans, a destroyed stream's when no drained stream had one).
  template <typename Pred>
  int drain_streams(Pred pred, bool with_orphans);
  void try_pump();
  // try_pump() from a caller's submit(), rate-limited by opt.inline_poll_interval_ns.
  void try_pump_inline();
  void pump();
  void pump_locked();
  // Offers s's queue head to the policy; forces it after be_max_wait_ns. True if it made progress.
  bool admit_head(StreamState& s);
  void wake_background();
  void background_loop();
  // Completions put off (reported from inside submit(), or their stream's mutex was held),
  // applied now where their stream's mutex is free; `wait`: wait for it (the destructor only).
  void apply_deferred_completions(bool wait = false);
  DispatcherStats stats();

  // ---- completions (dispatcher.cpp) ----
  void on_complete(const Completion& done) override;
  // Retires in-flight ops up to `done` on `s` (its stream; null: forgotten), teaches the profile
  // store, completes the trace record. Without `wait`, false (nothing done) when s's mutex is held
  // by another thread: that thread may be inside a blocking driver call (a pageable copy, a full
  // launch queue), and the pump, which reports completions, must never wait on one.
  bool apply_completion(StreamState* s, const Completion& done, bool wait);
  void defer_completion(StreamState* s, const Completion& done);

  Device& device;
  std::unique_ptr<Policy> policy;
  DispatcherOptions opt;
  std::unique_ptr<ProfileStore> own_profiles;
  const uint64_t uid;
  bool defers = true;
  bool observes = false;  // policy->wants_observations()

  std::atomic<uint64_t> next_seq{1};
  std::atomic<size_t> total_queued{0};
  std::atomic<int> hp_in_flight{0};
  // HP kernels in flight, oldest first: the policy is told the profile of the newest one still
  // running (Orion pairs a BE kernel with the HP kernel on the device; the latest one submitted
  // may be done while an older one, on another HP stream, still runs). A completed entry is
  // marked, and leaves once nothing older (front) or newer (back) is left; tickets number the
  // entries from hp_front_ticket. A ring: the HP path allocates nothing in steady state.
  struct HpKernel {
    KernelId kernel = 0;
    KernelProfile hint = KernelProfile::kUnknown;
    bool done = false;
  };
  std::mutex hp_mu;
  detail::FifoRing<HpKernel> hp_kernels;  // guarded by hp_mu
  uint64_t hp_front_ticket = 1;           // guarded by hp_mu
  uint64_t hp_kernel_started(const Op& op);
  void hp_kernel_done(uint64_t ticket);

  std::mutex admit_mu;  // guards the BE counters and makes admit + reserve one step
  int be_in_flight = 0;
  int be_sms = 0;
  double be_outstanding_ns = 0;
  // Mirrors for Policy::observe's be_free, readable without admit_mu: best-effort ops in flight,
  // and best-effort ops reserved so far.
  std::atomic<int> be_in_flight_now{0};
  std::atomic<uint64_t> be_reserved{0};

  mutable std::shared_mutex streams_mu;
  std::unordered_map<StreamId, std::unique_ptr<StreamState>> streams;
  std::vector<StreamState*> stream_list;

  std::mutex events_mu;
  std::unordered_map<EventId, detail::EventState> events;

  // Deferred errors of streams forgotten (destroyed) before a drain returned them, oldest first:
  // each reported by a later drain_all() (a context-wide synchronize, where CUDA reports such
  // errors too), never by a legacy-stream synchronize, which does not wait on that stream.
  std::mutex orphan_mu;
  std::deque<int> orphan_errors;
  std::atomic<int> orphans{0};
  // Deferred errors waiting in streams' deferred_errors (lets drain_legacy_sync skip every stream
  // when zero).
  std::atomic<int> sticky_errors{0};

  std::mutex deferred_mu;  // completions put off (see apply_completion), applied at the next pump
  std::vector<Completion> deferred_completions;
  std::atomic<bool> have_deferred{false};

  std::mutex wait_mu;
  std::condition_variable wait_cv;

  std::atomic<int64_t> last_inline_poll_ns{0};  // see DispatcherOptions::inline_poll_interval_ns

  std::mutex pump_mu;  // one pump at a time; guards the two below
  size_t rr_next = 0;
  std::vector<StreamState*> pump_scratch;

  std::mutex bg_mu;
  std::condition_variable bg_cv;
  bool stop = false;
  bool bg_wake = false;
  std::thread background;
};

}  // namespace sched

// Dispatcher: per-stream FIFO queues in front of a Device (rules in dispatcher.h; locking in
// dispatcher_impl.h). This file: stream lookup, event bookkeeping and the submit paths; what the
// policy is told and the in-flight accounting are in dispatcher_admission.cpp; drains, pumping
// and completions in dispatcher_pump.cpp.
#include <algorithm>
#include <chrono>
#include <limits>
#include <stdexcept>
#include <utility>

#include "dispatcher_impl.h"
#include "scheduler/trace.h"

namespace sched {

using detail::CallerWait;
using detail::Dep;
using detail::EventRecordRef;
using detail::InFlightOp;
using detail::QueuedOp;
using detail::StreamState;

namespace {

std::atomic<uint64_t> g_next_dispatcher_uid{1};

// Small per-thread cache of stream lookups, so the inline path usually takes no map lock.
// Entries are valid while the dispatcher lives: stream states are never freed before it.
struct StreamCacheEntry {
  uint64_t dispatcher_uid = 0;
  StreamId id = 0;
  StreamState* state = nullptr;
};
thread_local StreamCacheEntry t_stream_cache[8];

size_t cache_slot(StreamId id) { return (id ^ (id >> 5) ^ (id >> 12)) & 7; }

// Set while this thread is inside device.submit(): completions reported then are deferred.
thread_local int t_inside_device_submit = 0;

// Op::wants_timing: every launch of a kernel with fewer samples than this, then one tracked
// kernel in kResampleEvery per stream (the duration estimate is an EWMA that follows drift).
constexpr uint64_t kLearnSamples = 8;
constexpr uint64_t kResampleEvery = 32;

}  // namespace

Dispatcher::Impl::Impl(Device& dev, std::unique_ptr<Policy> pol, DispatcherOptions o)
    : device(dev), policy(std::move(pol)), opt(o), uid(g_next_dispatcher_uid.fetch_add(1)) {
  if (!policy) throw std::invalid_argument("Dispatcher: policy must not be null");
  if (opt.be_max_wait_ns < 0) throw std::invalid_argument("Dispatcher: be_max_wait_ns must be >= 0");
  // A policy whose own rule bounds the wait (gpud: the pipeline's windows, and the lease) gets no
  // starvation bound: a head is never forced out by the clock.
  if (!policy->bounds_best_effort_wait()) opt.be_max_wait_ns = std::numeric_limits<int64_t>::max();
  if (opt.background_thread && opt.pump_interval_ns <= 0) {
    throw std::invalid_argument("Dispatcher: pump_interval_ns must be > 0 with the background thread");
  }
  if (opt.profiles == nullptr) {
    own_profiles = std::make_unique<ProfileStore>();
    opt.profiles = own_profiles.get();
  }
  defers = policy->defers_best_effort();
  observes = policy->wants_observations();
  device.set_listener(this);
  if (opt.background_thread) background = std::thread([this] { background_loop(); });
}

Dispatcher::Impl::~Impl() {
  {
    std::lock_guard lock(bg_mu);
    stop = true;
  }
  bg_cv.notify_all();
  if (background.joinable()) background.join();
  drain_all();
  {
    std::lock_guard lock(pump_mu);
    device.poll();
  }
  device.set_listener(nullptr);
  apply_deferred_completions(/*wait=*/true);
}

StreamState& Dispatcher::Impl::stream(StreamId id) {
  StreamCacheEntry& slot = t_stream_cache[cache_slot(id)];
  if (slot.dispatcher_uid == uid && slot.id == id) return *slot.state;
  StreamState* st = find_stream(id);
  if (st == nullptr) {
    std::unique_lock lock(streams_mu);
    auto& owned = streams[id];
    if (!owned) {
      owned = std::make_unique<StreamState>(id, opt.default_class);
      stream_list.push_back(owned.get());
    }
    st = owned.get();
  }
  slot = {uid, id, st};
  return *st;
}

StreamState* Dispatcher::Impl::find_stream(StreamId id) const {
  std::shared_lock lock(streams_mu);
  auto it = streams.find(id);
  return it == streams.end() ? nullptr : it->second.get();
}

std::vector<StreamState*> Dispatcher::Impl::all_streams() const {
  std::shared_lock lock(streams_mu);
  return stream_list;
}

namespace {
bool submitted(const Dep& d) {
  return d.stream->last_submitted_seq.load(std::memory_order_acquire) >= d.seq;
}
}  // namespace

// Called at an event record's arrival (stream mutex held): waits issued later refer to it.
void Dispatcher::Impl::note_record(EventId event, StreamState& s, uint64_t seq) {
  std::lock_guard lock(events_mu);
  events[event].latest = {&s, seq};
}

void Dispatcher::Impl::note_queued_wait(EventId event, StreamState& s, uint64_t seq) {
  std::lock_guard lock(events_mu);
  auto& waits = events[event].queued_waits;
  std::erase_if(waits, submitted);
  waits.push_back({&s, seq});
}

// The event's latest record if it has not been submitted yet.
EventRecordRef Dispatcher::Impl::pending_record(EventId event) {
  std::lock_guard lock(events_mu);
  auto it = events.find(event);
  if (it == events.end() || it->second.latest.stream == nullptr) return {};
  const EventRecordRef ref = it->second.latest;
  if (submitted(ref)) return {};
  return ref;
}

std::vector<Dep> Dispatcher::Impl::record_deps(EventId event, const StreamState& s) {
  std::vector<Dep> deps;
  std::lock_guard lock(events_mu);
  auto it = events.find(event);
  if (it == events.end()) return deps;
  // Ops of `s` itself come first anyway (stream order).
  const EventRecordRef& latest = it->second.latest;
  if (latest.stream != nullptr && latest.stream != &s && !submitted(latest)) deps.push_back(latest);
  auto& waits = it->second.queued_waits;
  std::erase_if(waits, submitted);
  for (const Dep& w : waits) {
    if (w.stream != &s) deps.push_back(w);
  }
  return deps;
}

void Dispatcher::Impl::drain_deps(const std::vector<Dep>& deps) {
  for (const Dep& d : deps) drain_until(*d.stream, d.seq);
}

const Dep* Dispatcher::Impl::first_unmet(const QueuedOp& q) {
  for (const Dep& d : q.deps) {
    if (!submitted(d)) return &d;
  }
  return nullptr;
}

// Hands `op` to the device; s.mu held. A best-effort op must already be reserved with `est`.
int Dispatcher::Impl::submit_locked(StreamState& s, Op& op, const OpEstimate& est) {
  const bool tracked = op.cls == StreamClass::kHighPriority || op.cls == StreamClass::kBestEffort;
  if (tracked) {
    InFlightOp f{op.seq, op.cls, est.sms_needed, est.duration_ns};
    if (op.cls == StreamClass::kHighPriority && op.kind == OpKind::kKernel) f.hp_ticket = hp_kernel_started(op);
    if (observes && op.kind == OpKind::kKernel) {
      f.kernel = true;
      f.kernel_id = op.kernel.id;
      f.profile = est.profile;
      f.submitted_ns = op.submitted_ns;
      // Read before the op reaches the device: a best-effort op reserved from here on counts.
      f.be_mark = be_reserved.load(std::memory_order_acquire);
      f.be_busy = be_in_flight_now.load(std::memory_order_acquire) > 0;
      if (op.cls == StreamClass::kBestEffort) f.be_busy = true;
    }
    s.in_flight.push_back(f);
  }
  if (op.cls == StreamClass::kHighPriority) hp_in_flight.fetch_add(1, std::memory_order_release);
  if (tracked && op.kind == OpKind::kKernel) {
    // Exact timing while a kernel's duration is being learned, then one launch in
    // kResampleEvery per stream: a backend that tracks completions in batches times only these.
    op.wants_timing = opt.profiles->samples(op.kernel.id) < kLearnSamples || ++s.timing_tick % kResampleEvery == 0;
  }
  ++t_inside_device_submit;
  const int rc = device.submit(op);
  --t_inside_device_submit;
  s.last_submitted_seq.store(op.seq, std::memory_order_release);
  ++s.submitted;
  if (rc != 0) {
    ++s.errors;
    // The device did not take it: no completion will come, so stop counting it now.
    if (tracked) {
      const InFlightOp undone = s.in_flight.back();
      s.in_flight.pop_back();
      release(undone);
    }
  } else if (opt.trace != nullptr) {
    opt.trace->on_submit(op);
  }
  return rc;
}

// Submits the head of s.queue (already reserved with `est` if best-effort); s.mu held.
void Dispatcher::Impl::submit_head_locked(StreamState& s, const OpEstimate& est) {
  QueuedOp q = std::move(s.queue.front());
  s.queue.pop_front();
  q.op.submitted_ns = device.now_ns();
  if (!s.queue.empty()) s.head_since_ns = q.op.submitted_ns;
  const int rc = submit_locked(s, q.op, est);
  if (q.waiter != nullptr) {
    {
      std::lock_guard lock(wait_mu);
      q.waiter->status = rc;
      q.waiter->done = true;
    }
    wait_cv.notify_all();
  } else if (rc != 0) {
    s.deferred_errors.emplace_back(q.op.seq, rc);
    sticky_errors.fetch_add(1, std::memory_order_acq_rel);
  }
  // Counted as queued until the device has it and its error is recorded: a lock-free look at
  // the counts (queries, legacy drains) must not take it for done while it is on its way.
  s.queued.fetch_sub(1, std::memory_order_release);
  total_queued.fetch_sub(1, std::memory_order_release);
}

StreamClass Dispatcher::Impl::class_of(const StreamState& s, const Op& op) {
  const StreamClass stream_cls = s.cls.load(std::memory_order_relaxed);
  if (!op.requested_class || stream_cls == StreamClass::kCommunication) return stream_cls;
  return *op.requested_class;
}

int Dispatcher::Impl::submit(Op&& op, bool may_defer) {
  StreamState& s = stream(op.stream);
  const bool defers_here = defers && may_defer;
  if (defers_here && class_of(s, op) == StreamClass::kBestEffort) {
    return submit_best_effort(s, std::move(op));
  }
  // Legacy-stream order for an op that goes now: held legacy work ahead of a blocking stream's
  // op goes first; held blocking-stream work ahead of a legacy op goes first.
  if (StreamState* legacy = legacy_stream.load(std::memory_order_acquire); legacy != nullptr) {
    if (legacy == &s) {
      release_legacy_sync();
    } else if (s.syncs_with_legacy.load(std::memory_order_relaxed) && legacy->queued.load(std::memory_order_acquire) != 0) {
      drain_until(*legacy, std::numeric_limits<uint64_t>::max());
    }
  }
  if (op.kind == OpKind::kStreamWaitEvent) {
    if (EventRecordRef dep = pending_record(op.event); dep.stream != nullptr) {
      drain_until(*dep.stream, dep.seq);
    }
  } else if (op.records_event()) {
    drain_deps(record_deps(op.event, s));
  }
  std::unique_lock lock(s.mu);
  // The class may have changed since the unlocked read, leaving queued work ahead of this op.
  while (!s.queue.empty() || (defers_here && class_of(s, op) == StreamClass::kBestEffort)) {
    if (defers_here && class_of(s, op) == StreamClass::kBestEffort) {
      lock.unlock();
      return submit_best_effort(s, std::move(op));
    }
    // Queued best-effort work ahead of an op that may not wait (high priority arriving behind a
    // forward's kernels on the same stream): promote it, in order, ignoring the policy.
    s.promoted += s.queue.size();
    lock.unlock();
    drain_until(s, std::numeric_limits<uint64_t>::max());
    lock.lock();
  }
  op.cls = class_of(s, op);
  if (op.requested_class && s.cls.load(std::memory_order_relaxed) != StreamClass::kCommunication) ++s.op_classed;
  op.seq = next_seq.fetch_add(1, std::memory_order_relaxed);
  op.arrival_ns = op.submitted_ns = device.now_ns();
  if (op.records_event()) note_record(op.event, s, op.seq);
  OpEstimate est;
  if (op.cls == StreamClass::kBestEffort) {
    est = estimate(op);  // counted in flight by its length, like admitted work
    reserve_best_effort(op, est, /*force=*/true);
  }
  ++s.submitted_inline;
  return submit_locked(s, op, est);
}

int Dispatcher::Impl::submit_best_effort(StreamState& s, Op&& op) {
  try_pump_inline();  // fresh completions first, and queued work of other streams gets its turn
  std::vector<Dep> legacy_deps = legacy_order_deps(s);
  std::unique_lock lock(s.mu);
  if (class_of(s, op) != StreamClass::kBestEffort) {
    lock.unlock();
    return submit(std::move(op));
  }
  op.cls = StreamClass::kBestEffort;
  if (op.requested_class) ++s.op_classed;
  op.seq = next_seq.fetch_add(1, std::memory_order_relaxed);
  op.arrival_ns = device.now_ns();
  QueuedOp q;
  q.deps = std::move(legacy_deps);
  if (op.records_event()) {
    std::vector<Dep> record = record_deps(op.event, s);
    q.deps.insert(q.deps.end(), record.begin(), record.end());
    note_record(op.event, s, op.seq);
  }
  if (op.kind == OpKind::kStreamWaitEvent) {
    if (const EventRecordRef dep = pending_record(op.event); dep.stream != nullptr) {
      q.deps.push_back(dep);
    }
  }
  if (s.queue.empty() && q.deps.empty()) {
    const OpEstimate est = estimate(op);
    if (reserve_best_effort(op, est, /*force=*/false)) {
      op.submitted_ns = op.arrival_ns;
      ++s.submitted_inline;
      return submit_locked(s, op, est);
    }
  }
  // Deferred: the op must own its payload, or its caller waits until it is submitted.
  if (op.borrowed != nullptr && !op.owned && op.clone != nullptr) {
    op.owned = op.clone(*op.borrowed);
    if (op.owned) op.borrowed = nullptr;
  }
  CallerWait waiter;
  const bool caller_waits = op.borrowed != nullptr && !op.owned;
  if (caller_waits) {
    q.waiter = &waiter;
    ++s.caller_waits;
  }
  if (op.kind == OpKind::kStreamWaitEvent) note_queued_wait(op.event, s, op.seq);
  const uint64_t seq = op.seq;
  q.op = std::move(op);
  if (s.queue.empty()) s.head_since_ns = q.op.arrival_ns;
  s.queue.push_back(std::move(q));
  s.queued.fetch_add(1, std::memory_order_relaxed);
  ++s.deferred;
  const bool first_queued = total_queued.fetch_add(1, std::memory_order_relaxed) == 0;
  lock.unlock();
  if (first_queued) wake_background();
  if (!caller_waits) return 0;

  // The caller cannot wait for the policy (up to the starvation bound per queued op ahead of it):
  // its stream is drained now, up to and including its op, in order.
  drain_until(s, seq);
  std::unique_lock wait_lock(wait_mu);
  wait_cv.wait(wait_lock, [&] { return waiter.done; });
  return waiter.status;
}

void Dispatcher::Impl::on_complete(const Completion& done) {
  // Reported from inside device.submit(), this thread may hold a stream mutex: put off. So is one
  // behind a completion of its stream already put off.
  StreamState* s = find_stream(done.stream);
  const bool behind = s != nullptr && s->completions_put_off.load(std::memory_order_acquire) > 0;
  if (t_inside_device_submit > 0 || behind || !apply_completion(s, done, /*wait=*/false)) defer_completion(s, done);
}

void Dispatcher::Impl::defer_completion(StreamState* s, const Completion& done) {
  if (s != nullptr) s->completions_put_off.fetch_add(1, std::memory_order_acq_rel);
  std::lock_guard lock(deferred_mu);
  deferred_completions.push_back(done);
  have_deferred.store(true, std::memory_order_release);
}

bool Dispatcher::Impl::apply_completion(StreamState* s, const Completion& done, bool wait) {
  InFlightOp finished;  // the op `done` names, when the policy wants to hear of it
  int64_t ready_ns = 0;
  if (s != nullptr) {
    std::unique_lock lock(s->mu, std::defer_lock);
    if (wait) {
      lock.lock();
    } else if (!lock.try_lock()) {
      return false;
    }
    // Ops of a stream finish in order: a completion also retires earlier unreported ops.
    while (!s->in_flight.empty() && s->in_flight.front().seq <= done.seq) {
      const InFlightOp& f = s->in_flight.front();
      if (observes && f.seq == done.seq && f.kernel) {
        finished = f;
        ready_ns = std::max(f.submitted_ns, s->last_done_ns);
      }
      release(f);
      s->in_flight.pop_front();
    }
    s->last_done_ns = std::max(s->last_done_ns, done.end_ns);
  }
  if (done.kind == OpKind::kKernel) opt.profiles->record_completion(done.kernel, done.start_ns, done.end_ns);
  if (opt.trace != nullptr) opt.trace->on_complete(done);
  if (finished.kernel) {
    KernelCompletion k;
    k.cls = finished.cls;
    k.kernel = finished.kernel_id;
    k.est.duration_ns = finished.est_ns;
    k.est.sms_needed = finished.sms;
    k.est.profile = finished.profile;
    k.ready_ns = std::min(ready_ns, done.end_ns);
    k.start_ns = done.start_ns;
    k.end_ns = done.end_ns;
    k.be_free = !finished.be_busy && be_reserved.load(std::memory_order_acquire) == finished.be_mark;
    k.sm_count = device.sm_count();
    policy->observe(k);
  }
  return true;
}

Dispatcher::Dispatcher(Device& device, std::unique_ptr<Policy> policy, DispatcherOptions options)
    : impl_(std::make_unique<Impl>(device, std::move(policy), options)) {}

Dispatcher::~Dispatcher() = default;

void Dispatcher::set_stream_class(StreamId id, StreamClass cls) {
  StreamState& s = impl_->stream(id);
  for (;;) {
    impl_->drain_until(s, std::numeric_limits<uint64_t>::max());
    std::lock_guard lock(s.mu);
    if (s.queue.empty()) {
      s.cls.store(cls);
      return;
    }
  }
}

StreamClass Dispatcher::stream_class(StreamId id) const {
  const StreamState* s = impl_->find_stream(id);
  return s == nullptr ? impl_->opt.default_class : s->cls.load();
}

int Dispatcher::submit(Op&& op, bool may_defer) { return impl_->submit(std::move(op), may_defer); }
int Dispatcher::drain_stream(StreamId id) { return impl_->drain_stream(id); }
int Dispatcher::drain_event(EventId event) { return impl_->drain_event(event); }
int Dispatcher::drain_all() { return impl_->drain_all(); }
void Dispatcher::release_all() { impl_->release_all(); }
void Dispatcher::release_stream(StreamId stream) { impl_->release_stream(stream); }
void Dispatcher::release_event(EventId event) { impl_->release_event(event); }
void Dispatcher::release_legacy_sync() { impl_->release_legacy_sync(); }
int Dispatcher::drain_legacy_sync() { return impl_->drain_legacy_sync(); }
QueryState Dispatcher::query_stream(StreamId id) { return impl_->query_stream(id); }
QueryState Dispatcher::query_event(EventId event) { return impl_->query_event(event); }
QueryState Dispatcher::query_legacy_sync() { return impl_->query_legacy_sync(); }

bool Dispatcher::policy_admits(const Op& op) { return impl_->policy_admits(op); }

void Dispatcher::order_legacy_stream(StreamId legacy) { impl_->legacy_stream.store(&impl_->stream(legacy)); }

std::vector<Dispatcher::Impl::Dep> Dispatcher::Impl::legacy_order_deps(StreamState& s) {
  std::vector<Dep> deps;
  StreamState* legacy = legacy_stream.load(std::memory_order_acquire);
  if (legacy == nullptr || !s.syncs_with_legacy.load(std::memory_order_relaxed) ||
      total_queued.load(std::memory_order_acquire) == 0) {
    return deps;  // nothing held anywhere: nothing to follow (the common case costs no stream walk)
  }
  // One stream mutex at a time, none held by the caller: each stream's newest queued op.
  auto newest_queued = [&deps](StreamState& t) {
    if (t.queued.load(std::memory_order_acquire) == 0) return;
    std::lock_guard lock(t.mu);
    if (!t.queue.empty()) deps.push_back({&t, t.queue.back().op.seq});
  };
  if (&s == legacy) {
    for (StreamState* t : all_streams()) {
      if (t != &s && t->syncs_with_legacy.load(std::memory_order_relaxed)) newest_queued(*t);
    }
  } else {
    newest_queued(*legacy);
  }
  return deps;
}

void Dispatcher::set_syncs_with_legacy(StreamId id, bool syncs) {
  impl_->stream(id).syncs_with_legacy.store(syncs, std::memory_order_relaxed);
}

void Dispatcher::forget_stream(StreamId id) {
  StreamState* s = impl_->find_stream(id);
  if (s == nullptr) return;
  impl_->drain_until(*s, std::numeric_limits<uint64_t>::max());
  // The handle value may be reused by a new stream, which starts with the default class. The
  // state itself stays (threads may cache it); in-flight entries retire as completions arrive.
  std::lock_guard lock(s->mu);
  // Review fix: the pending deferred errors used to be cleared here and so never reached the
  // program. The handle may be reused, so they must not stay on the stream: each goes to a later
  // drain_all() (a context-wide synchronize, where CUDA reports such errors too).
  if (!s->deferred_errors.empty()) {
    const auto n = static_cast<int>(s->deferred_errors.size());
    {
      std::lock_guard orphans(impl_->orphan_mu);
      for (const auto& [seq, rc] : s->deferred_errors) impl_->orphan_errors.push_back(rc);
    }
    impl_->orphans.fetch_add(n, std::memory_order_acq_rel);
    s->deferred_errors.clear();
    impl_->sticky_errors.fetch_sub(n, std::memory_order_acq_rel);
  }
  if (s->queue.empty()) s->cls.store(impl_->opt.default_class);
}

void Dispatcher::forget_event(EventId event) {
  // Queued waits on the event must reach the device while it still exists.
  std::vector<detail::Dep> waits;
  {
    std::lock_guard lock(impl_->events_mu);
    auto it = impl_->events.find(event);
    if (it == impl_->events.end()) return;
    waits = it->second.queued_waits;
  }
  impl_->drain_deps(waits);
  std::lock_guard lock(impl_->events_mu);
  impl_->events.erase(event);
}

void Dispatcher::pump() { impl_->pump(); }
DispatcherStats Dispatcher::stats() const { return impl_->stats(); }
uint64_t Dispatcher::queued_now() const {
  return impl_->total_queued.load(std::memory_order_acquire);
}
int64_t Dispatcher::next_forced_admission_ns() const {
  if (impl_->total_queued.load(std::memory_order_acquire) == 0 ||
      impl_->opt.be_max_wait_ns == std::numeric_limits<int64_t>::max()) {
    return -1;
  }
  int64_t next = -1;
  for (StreamState* s : impl_->all_streams()) {
    std::lock_guard lock(s->mu);
    // A head whose caller waits is submitted by that caller, not forced.
    if (s->queue.empty() || s->queue.front().waiter != nullptr) continue;
    const int64_t at = s->head_since_ns + impl_->opt.be_max_wait_ns;
    if (next < 0 || at < next) next = at;
  }
  return next;
}
const Policy& Dispatcher::policy() const { return *impl_->policy; }

}  // namespace sched

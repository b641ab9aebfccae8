// Dispatcher: drains, pumping (admission of queued best-effort heads, starvation bound, the
// background thread) and completions. See dispatcher_impl.h for the locking rules.
#include <algorithm>
#include <chrono>
#include <limits>
#include <utility>

#include "dispatcher_impl.h"
#include "scheduler/trace.h"

namespace sched {

using detail::EventRecordRef;
using detail::QueuedOp;
using detail::StreamState;

// Submits s's queued ops with seq <= upto, ignoring the policy (the caller must not wait).
void Dispatcher::Impl::drain_until(StreamState& s, uint64_t upto) {
  std::unique_lock lock(s.mu);
  while (!s.queue.empty() && s.queue.front().op.seq <= upto) {
    QueuedOp& head = s.queue.front();
    if (const detail::Dep* dep = first_unmet(head)) {
      const detail::Dep d = *dep;
      lock.unlock();
      drain_until(*d.stream, d.seq);  // d.seq < head's seq: the recursion ends
      lock.lock();
      continue;
    }
    const OpEstimate est = estimate(head.op);
    reserve_best_effort(head.op, est, /*force=*/true);
    submit_head_locked(s, est);
  }
}

int Dispatcher::Impl::take_error(StreamState& s, uint64_t up_to_seq) {
  std::lock_guard lock(s.mu);
  if (s.deferred_errors.empty() || s.deferred_errors.front().first > up_to_seq) return 0;
  const int err = s.deferred_errors.front().second;
  s.deferred_errors.pop_front();
  sticky_errors.fetch_sub(1, std::memory_order_acq_rel);
  return err;
}

int Dispatcher::Impl::take_orphan_error() {
  if (orphans.load(std::memory_order_acquire) == 0) return 0;
  std::lock_guard lock(orphan_mu);
  if (orphan_errors.empty()) return 0;
  const int err = orphan_errors.front();
  orphan_errors.pop_front();
  orphans.fetch_sub(1, std::memory_order_acq_rel);
  return err;
}

int Dispatcher::Impl::drain_stream(StreamId id) {
  try_pump();
  StreamState& s = stream(id);
  drain_until(s, std::numeric_limits<uint64_t>::max());
  return take_error(s);
}

std::optional<Dispatcher::Impl::EventRecordRef> Dispatcher::Impl::latest_record(EventId event) {
  std::lock_guard lock(events_mu);
  auto it = events.find(event);
  if (it == events.end() || it->second.latest.stream == nullptr) return std::nullopt;
  return it->second.latest;
}

int Dispatcher::Impl::drain_event(EventId event) {
  const std::optional<EventRecordRef> ref = latest_record(event);
  if (!ref) return 0;
  drain_until(*ref->stream, ref->seq);
  return take_error(*ref->stream, ref->seq);
}

void Dispatcher::Impl::release_event(EventId event) {
  if (const std::optional<EventRecordRef> ref = latest_record(event)) drain_until(*ref->stream, ref->seq);
}

template <typename Pred>
int Dispatcher::Impl::drain_streams(Pred pred, bool with_orphans) {
  int first = 0;
  for (StreamState* s : all_streams()) {
    if (!pred(*s)) continue;
    drain_until(*s, std::numeric_limits<uint64_t>::max());
    // One error per drain: the others stay for the next call that synchronises (taking and
    // dropping them would lose them).
    if (first == 0) first = take_error(*s);
  }
  // A forgotten stream's deferred error (see forget_stream()): a context-wide drain only.
  if (first == 0 && with_orphans) first = take_orphan_error();
  return first;
}

int Dispatcher::Impl::drain_all() {
  return drain_streams([](const StreamState&) { return true; }, /*with_orphans=*/true);
}

template <typename Pred>
void Dispatcher::Impl::release_streams(Pred pred) {
  if (total_queued.load(std::memory_order_acquire) == 0) return;
  for (StreamState* s : all_streams()) {
    if (pred(*s)) drain_until(*s, std::numeric_limits<uint64_t>::max());
  }
}

void Dispatcher::Impl::release_all() {
  release_streams([](const StreamState&) { return true; });
}

void Dispatcher::Impl::release_stream(StreamId id) {
  if (StreamState* s = find_stream(id)) drain_until(*s, std::numeric_limits<uint64_t>::max());
}

void Dispatcher::Impl::release_legacy_sync() {
  release_streams([this](const StreamState& s) { return legacy_waits_on(s); });
}

bool Dispatcher::Impl::holds_nothing() const {
  return total_queued.load(std::memory_order_acquire) == 0 && sticky_errors.load(std::memory_order_acquire) == 0;
}

bool Dispatcher::Impl::legacy_waits_on(const StreamState& s) const {
  return s.syncs_with_legacy.load(std::memory_order_relaxed) &&
         (s.queued.load(std::memory_order_relaxed) != 0 || sticky_errors.load(std::memory_order_relaxed) != 0);
}

int Dispatcher::Impl::drain_legacy_sync() {
  // The common case (nothing queued, no error waiting) touches no stream.
  if (holds_nothing()) return 0;
  return drain_streams([this](const StreamState& s) { return legacy_waits_on(s); }, /*with_orphans=*/false);
}

QueryState Dispatcher::Impl::query(StreamState& s, bool take_error) {
  // Under the stream's mutex: an op being submitted right now (already off the queue, its error
  // not yet recorded) is seen either as queued or with its error.
  std::lock_guard lock(s.mu);
  QueryState out;
  out.queued = !s.queue.empty();
  if (!take_error || s.deferred_errors.empty()) return out;
  out.error = s.deferred_errors.front().second;
  s.deferred_errors.pop_front();
  sticky_errors.fetch_sub(1, std::memory_order_acq_rel);
  return out;
}

QueryState Dispatcher::Impl::query_stream(StreamId id) {
  StreamState* s = find_stream(id);
  return s == nullptr ? QueryState{} : query(*s);
}

QueryState Dispatcher::Impl::query_event(EventId event) {
  EventRecordRef ref;
  {
    std::lock_guard lock(events_mu);
    auto it = events.find(event);
    if (it == events.end() || it->second.latest.stream == nullptr) return {};
    ref = it->second.latest;
  }
  QueryState out;
  out.queued = ref.stream->last_submitted_seq.load(std::memory_order_acquire) < ref.seq;
  if (sticky_errors.load(std::memory_order_acquire) != 0) out.error = take_error(*ref.stream, ref.seq);
  return out;
}

QueryState Dispatcher::Impl::query_legacy_sync() {
  QueryState out;
  if (holds_nothing()) return out;
  for (StreamState* s : all_streams()) {
    if (!legacy_waits_on(*s)) continue;
    // One error per call: the others stay with their streams for the next synchronising call
    // (taking them all and returning the first lost the rest).
    const QueryState one = query(*s, /*take_error=*/out.error == 0);
    out.queued |= one.queued;
    if (out.error == 0) out.error = one.error;
  }
  return out;
}

void Dispatcher::Impl::try_pump() {
  std::unique_lock lock(pump_mu, std::try_to_lock);
  if (lock.owns_lock()) pump_locked();
}

void Dispatcher::Impl::try_pump_inline() {
  if (opt.inline_poll_interval_ns > 0) {
    const int64_t now = device.now_ns();
    int64_t last = last_inline_poll_ns.load(std::memory_order_relaxed);
    if (now - last < opt.inline_poll_interval_ns) return;
    // One caller polls per interval; the others go on.
    if (!last_inline_poll_ns.compare_exchange_strong(last, now, std::memory_order_relaxed)) return;
  }
  try_pump();
}

void Dispatcher::Impl::pump() {
  std::lock_guard lock(pump_mu);
  pump_locked();
}

void Dispatcher::Impl::pump_locked() {
  apply_deferred_completions();  // first: what the poll reports comes after them
  device.poll();
  apply_deferred_completions();
  if (total_queued.load(std::memory_order_relaxed) == 0) return;
  {
    std::shared_lock lock(streams_mu);
    pump_scratch.assign(stream_list.begin(), stream_list.end());
  }
  const size_t n = pump_scratch.size();
  // Round-robin passes, one head per stream per pass, until a pass admits nothing.
  for (bool progress = true; progress && total_queued.load(std::memory_order_relaxed) > 0;) {
    progress = false;
    const size_t start = rr_next++ % n;
    for (size_t i = 0; i < n; ++i) {
      StreamState& s = *pump_scratch[(start + i) % n];
      if (s.queued.load(std::memory_order_relaxed) != 0 && admit_head(s)) progress = true;
    }
  }
}

// Offers s's queue head to the policy; forces it after be_max_wait_ns. True if it made progress.
// The pumping thread (the shim's helper thread, under pump_mu) must never wait on a driver call:
// a stream whose mutex is held is being submitted to by another thread, perhaps in a blocking
// call (a pageable copy, a full launch queue); it is skipped this pass. And an op whose caller
// waits is submitted by that caller (it drains its stream up to its op at once): a blocking call
// stays on the thread that made it, and the pump keeps admitting the rest (issue 24, finding 8:
// a cuStreamWaitValue32 whose producer is a later held op could hang while the pump was stuck).
bool Dispatcher::Impl::admit_head(StreamState& s) {
  std::unique_lock lock(s.mu, std::try_to_lock);
  if (!lock.owns_lock() || s.queue.empty()) return false;
  QueuedOp& head = s.queue.front();
  if (head.waiter != nullptr) return false;
  const bool starving = device.now_ns() - s.head_since_ns >= opt.be_max_wait_ns;
  if (const detail::Dep* dep = first_unmet(head)) {
    if (!starving) return false;
    const detail::Dep d = *dep;
    lock.unlock();
    drain_until(*d.stream, d.seq);
    return true;
  }
  head.deps.clear();
  const OpEstimate est = estimate(head.op);
  if (!reserve_best_effort(head.op, est, /*force=*/false)) {
    if (!starving) return false;
    reserve_best_effort(head.op, est, /*force=*/true);
    ++s.forced;
  }
  submit_head_locked(s, est);
  return true;
}

void Dispatcher::Impl::wake_background() {
  if (!opt.background_thread) return;
  {
    std::lock_guard lock(bg_mu);
    bg_wake = true;
  }
  bg_cv.notify_one();
}

void Dispatcher::Impl::background_loop() {
  // With nothing queued, completions only feed bookkeeping: poll at a relaxed pace.
  const auto busy = std::chrono::nanoseconds(opt.pump_interval_ns);
  const auto idle = std::max<std::chrono::nanoseconds>(busy, std::chrono::milliseconds(1));
  std::unique_lock lock(bg_mu);
  while (!stop) {
    lock.unlock();
    pump();
    lock.lock();
    const bool queued = total_queued.load(std::memory_order_relaxed) != 0;
    bg_cv.wait_for(lock, queued ? busy : idle, [&] { return stop || bg_wake; });
    bg_wake = false;
  }
}

void Dispatcher::Impl::apply_deferred_completions(bool wait) {
  if (!have_deferred.load(std::memory_order_acquire)) return;
  std::vector<Completion> ready;
  {
    std::lock_guard lock(deferred_mu);
    ready.swap(deferred_completions);
    have_deferred.store(false, std::memory_order_relaxed);
  }
  // One whose stream is still busy stays put off, and so do the later ones of that stream: the
  // policy hears of a stream's ops in completion order (the ready time of each is its
  // predecessor's end).
  std::vector<StreamId> busy;
  for (const Completion& done : ready) {
    StreamState* s = find_stream(done.stream);
    if (s != nullptr) s->completions_put_off.fetch_sub(1, std::memory_order_acq_rel);
    const bool behind = std::find(busy.begin(), busy.end(), done.stream) != busy.end();
    if (behind || !apply_completion(s, done, wait)) {
      busy.push_back(done.stream);
      defer_completion(s, done);
    }
  }
}

DispatcherStats Dispatcher::Impl::stats() {
  DispatcherStats out;
  const std::vector<StreamState*> streams_now = all_streams();
  out.streams = streams_now.size();
  for (StreamState* s : streams_now) {
    std::lock_guard lock(s->mu);
    out.submitted += s->submitted;
    out.submitted_inline += s->submitted_inline;
    out.deferred += s->deferred;
    out.forced_by_starvation += s->forced;
    out.caller_waits += s->caller_waits;
    out.backend_errors += s->errors;
    out.promoted += s->promoted;
    out.op_classed += s->op_classed;
  }
  out.queued_now = total_queued.load(std::memory_order_relaxed);
  return out;
}

}  // namespace sched

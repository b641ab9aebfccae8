// The dispatcher: per-stream FIFO queues in front of a Device, with a Policy deciding when
// best-effort work may go. This is where every intercepted launch lands (intercept/ calls
// submit() from the program's own thread).
//
// Rules it keeps:
//  - An op's class is its stream's, unless the op carries its own (Op::requested_class: the
//    shim's per-thread class). A communication stream keeps its class.
//  - Per-stream FIFO order always holds; a stream-wait-event op is not submitted before the
//    event's latest record was submitted (cross-stream order through events).
//  - High-priority, communication and unmanaged ops are never deferred: submitted inline in the
//    caller's thread. Best-effort work still queued on the op's own stream is submitted first
//    (promoted: it ignores the policy), since the op cannot pass it. If such an op depends on a queued best-effort event record, that producer
//    stream is drained first (so high priority never waits behind another stream's queued work
//    except what it explicitly depends on).
//  - Best-effort ops are admitted by the policy, from the caller's thread or the background thread.
//  - Starvation bound: a best-effort op at the head of its queue is admitted at most
//    `be_max_wait_ns` after it became the head (plus one pump interval), whatever the policy says.
//  - drain_*() return only once everything they depend on was submitted, and return the first
//    backend error of those ops (a deferred op's error reaches the caller at the next drain, as
//    CUDA reports asynchronous errors); each deferred error is returned once, the others stay
//    for later drains.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "scheduler/device.h"
#include "scheduler/op.h"
#include "scheduler/policy.h"

namespace sched {

class ProfileStore;
class TraceWriter;

struct DispatcherOptions {
  int64_t be_max_wait_ns = 2'000'000;  // starvation bound for best-effort heads
  bool background_thread = true;       // admit BE work from a helper thread too (off for the simulator)
  int64_t pump_interval_ns = 20'000;   // background thread period
  // A caller's thread polls the device (and admits queued work) from submit() at most once per
  // this interval; 0: at every best-effort submit. With a helper thread pumping, polling from
  // every launch costs a driver query per busy stream per launch for little news.
  int64_t inline_poll_interval_ns = 0;
  StreamClass default_class = StreamClass::kUnmanaged;
  ProfileStore* profiles = nullptr;    // kernel estimates, learned online from completions (null: a private store)
  TraceWriter* trace = nullptr;        // optional: one trace event per submitted op
};

struct DispatcherStats {
  uint64_t submitted = 0;          // ops handed to the backend
  uint64_t submitted_inline = 0;   // of those, in the caller's thread at submit()
  uint64_t deferred = 0;           // ops that were queued
  uint64_t forced_by_starvation = 0;
  uint64_t caller_waits = 0;       // ops whose payload could not be cloned
  uint64_t queued_now = 0;
  uint64_t backend_errors = 0;
  uint64_t promoted = 0;       // queued best-effort ops submitted early: a non-deferred op arrived behind them
  uint64_t op_classed = 0;     // ops scheduled with their own class (Op::requested_class), not their stream's
  uint64_t streams = 0;        // stream states kept (never freed: threads cache them; see forget_stream)
};

// What a query (cuStreamQuery, cuEventQuery) must say about the work the dispatcher still holds:
// whether some of it is queued (so not done), and the first deferred error it returns (taken, as
// a drain takes it). A query never forces work out.
struct QueryState {
  bool queued = false;
  int error = 0;
};

class Dispatcher {
 public:
  Dispatcher(Device& device, std::unique_ptr<Policy> policy, DispatcherOptions options = {});
  ~Dispatcher();  // drains everything, stops the background thread
  Dispatcher(const Dispatcher&) = delete;
  Dispatcher& operator=(const Dispatcher&) = delete;

  // Sets a stream's class (drains the stream first if it had queued work).
  void set_stream_class(StreamId stream, StreamClass cls);
  StreamClass stream_class(StreamId stream) const;

  // Submits or queues `op`. Returns the backend's status for an op submitted now, or 0 when it
  // was queued. An op with a borrowed payload is cloned before queueing; if it cannot be
  // cloned the call blocks until the op is submitted.
  // `may_defer` false: submitted now whatever the stream's class, behind the work already queued
  // on its stream (a stream capture is active: a deferred op would drop out of the graph).
  int submit(Op&& op, bool may_defer = true);

  int drain_stream(StreamId stream);  // everything queued on `stream`
  int drain_event(EventId event);     // everything up to the event's latest record
  int drain_all();                    // every stream
  // Like the drains, but without taking deferred errors: they stay for the call that
  // synchronises with their op (a caller that only needs the work in the driver before its own
  // op must not get, and swallow, another op's error). Cheap when nothing is queued.
  void release_all();
  void release_stream(StreamId stream);
  void release_event(EventId event);  // up to the event's latest record
  void release_legacy_sync();
  // Whether work on the legacy NULL stream waits for `stream` (CUDA: blocking streams do,
  // non-blocking ones never do). Streams not told otherwise are blocking.
  void set_syncs_with_legacy(StreamId stream, bool syncs);
  // `legacy` is the legacy NULL stream and its ops may be held (a whole best-effort process):
  // while held, a legacy op waits for what blocking streams queued before it, and a blocking
  // stream's op for what the legacy stream queued before it (CUDA's legacy-stream order, kept
  // without forcing anything out). A non-deferred op of a blocking stream first drains the
  // legacy stream's queue.
  void order_legacy_stream(StreamId legacy);
  // Whether the policy would admit `op` as a best-effort op now (nothing reserved, nothing
  // submitted): for work that cannot be deferred to another thread (a per-thread default stream
  // names the caller's own), whose caller waits instead.
  bool policy_admits(const Op& op);
  // Everything queued on streams that synchronise with the legacy stream (what a legacy-stream op
  // depends on); streams with nothing queued cost nothing.
  int drain_legacy_sync();
  QueryState query_stream(StreamId stream);
  QueryState query_event(EventId event);      // up to the event's latest record
  QueryState query_legacy_sync();             // the streams the legacy stream waits for
  // Stream or event destroyed: drop bookkeeping (the stream is drained first).
  void forget_stream(StreamId stream);
  void forget_event(EventId event);

  // Polls the device for completions and admits what the policy allows. The background thread
  // calls this; the simulator's replay loop calls it after each event.
  void pump();

  DispatcherStats stats() const;
  // Ops queued now (cheap: one atomic load; stats() locks every stream).
  uint64_t queued_now() const;
  // When the starvation bound (be_max_wait_ns) next forces a queued best-effort head out, on the
  // device's clock; -1 when nothing is queued or the policy has no bound. A simulated clock must
  // stop there and pump (with a real device, the pump thread runs every pump_interval_ns).
  int64_t next_forced_admission_ns() const;
  const Policy& policy() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sched

// The dispatcher's per-stream state. Internal to the scheduler library.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <mutex>
#include <vector>

#include "fifo_ring.h"
#include "scheduler/op.h"
#include "scheduler/policy.h"

namespace sched::detail {

// A submitted op the dispatcher still counts as running (HP and BE ops only).
struct InFlightOp {
  uint64_t seq = 0;
  StreamClass cls = StreamClass::kUnmanaged;
  int sms = 0;
  double est_ns = 0;
  // For Policy::observe (filled only when the policy wants observations):
  bool kernel = false;          // a kernel launch
  bool be_busy = false;         // best-effort ops were in flight at its submission
  KernelId kernel_id = 0;
  KernelProfile profile = KernelProfile::kUnknown;
  int64_t submitted_ns = 0;
  uint64_t be_mark = 0;         // best-effort submissions so far, at its submission
  uint64_t hp_ticket = 0;       // an HP kernel's entry in Dispatcher::Impl::hp_kernels (0: none)
};

// A caller blocked until its op (whose payload could not be cloned) is submitted.
struct CallerWait {
  bool done = false;  // guarded by the dispatcher's wait mutex
  int status = 0;
};

struct StreamState;

// An op of another stream that must reach the device first: `stream`'s op number `seq`.
struct Dep {
  StreamState* stream = nullptr;
  uint64_t seq = 0;
};

struct QueuedOp {
  Op op;
  // Ops of other streams that must be submitted first, each with a smaller seq: for a
  // stream-wait-event, the event's latest record at arrival; for an event record, the event's
  // previous record and the waits queued on it (they must bind to the earlier record).
  std::vector<Dep> deps;
  CallerWait* waiter = nullptr;
};

struct StreamState {
  StreamState(StreamId id_, StreamClass cls_) : id(id_), cls(cls_) {}
  const StreamId id;
  // Serializes everything that happens on this stream: arrival (seq), queueing and submission
  // to the device, so per-stream FIFO order holds whichever thread submits.
  std::mutex mu;
  std::atomic<StreamClass> cls;
  std::atomic<bool> syncs_with_legacy{true};  // a blocking stream (legacy-stream semantics)
  std::atomic<uint64_t> last_submitted_seq{0};  // ops submit in seq order per stream
  // queue.size() plus the op being submitted from it (readable without mu).
  std::atomic<size_t> queued{0};

  // Guarded by mu.
  std::deque<QueuedOp> queue;
  int64_t head_since_ns = 0;  // when the current queue head became the head
  FifoRing<InFlightOp> in_flight;
  // Backend errors of deferred ops, oldest first, as (op seq, error): each is returned once, by
  // the first drain (or query) that synchronises with its op; a drain up to an earlier op takes
  // none. A list, not one slot: a second failure before the first was taken must not vanish.
  std::deque<std::pair<uint64_t, int>> deferred_errors;
  // Completions of this stream put off (Dispatcher::Impl::defer_completion) and not applied yet:
  // a newer one waits behind them, so the policy hears of its ops in completion order.
  std::atomic<int> completions_put_off{0};
  uint64_t submitted = 0, submitted_inline = 0, deferred = 0, forced = 0, caller_waits = 0,
           errors = 0, promoted = 0, op_classed = 0;
  uint64_t timing_tick = 0;  // tracked kernels submitted, for Op::wants_timing's re-samples
  int64_t last_done_ns = 0;  // end of the latest completion reported on this stream
};

}  // namespace sched::detail

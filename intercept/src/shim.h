// The shim's state when scheduling is on: settings, the real-driver backend, the dispatcher, and
// the helpers the wrappers share. In pass-through mode there is no Shim (active_shim() returns
// nullptr) and every wrapper calls the real driver directly.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <unordered_set>

#include "cuda_api.h"
#include "driver_device.h"
#include "green_partitions.h"
#include "scheduler/dispatcher.h"
#include "scheduler/profile_store.h"
#include "scheduler/trace.h"
#include "settings.h"

namespace orion {

class Shim {
 public:
  explicit Shim(Settings settings);
  ~Shim() = delete;  // lives until the process ends (calls may arrive from atexit handlers)

  sched::Dispatcher& dispatcher() { return *dispatcher_; }
  const Settings& settings() const { return settings_; }

  // Scheduler stream identity of a handle: NULL and CU_STREAM_LEGACY are the legacy stream (0);
  // NULL through a _ptsz entry point, and CU_STREAM_PER_THREAD, are the calling thread's own
  // per-thread default stream: each thread's is a stream of its own (issue 24, finding 1).
  static sched::StreamId stream_id(CUstream s, bool per_thread) {
    auto v = reinterpret_cast<uintptr_t>(s);
    if (v == 0) return per_thread ? per_thread_stream() : kLegacyStream;
    if (v == 1) return kLegacyStream;
    if (v == 2) return per_thread_stream();
    return v;
  }
  static constexpr sched::StreamId kLegacyStream = 0;
  // Per-thread default streams: this bit and a number per thread (no handle has it).
  static constexpr sched::StreamId kPerThreadStream = sched::StreamId{1} << 62;
  // The calling thread's; its number goes to a later thread once this one exits.
  static sched::StreamId per_thread_stream();
  // Work on a per-thread default stream is never held: only its own thread can name that stream,
  // so no other thread (the helper thread, a drain) could submit it later.
  static bool is_per_thread(sched::StreamId id) { return (id & kPerThreadStream) != 0; }

  // While any stream capture is active nothing is deferred (a deferred launch would silently
  // drop out of the graph); ops still go through the dispatcher, behind their stream's queue.
  bool capturing() const { return captures_.load(std::memory_order_acquire) > 0; }
  // Counts the capture (nothing is deferred from now on), hands everything queued to the driver,
  // then calls `begin` (the driver's begin-capture); a failed begin is not counted. Deferred
  // errors are not taken: each stays for the call that synchronises with its op (another
  // stream's launch error refused PyTorch's capture, and was lost for its own stream). A sticky
  // error (a context that faulted) the driver returns from `begin` itself.
  template <typename Begin>
  CUresult begin_capture(Begin begin) {
    // Under the device's record lock: a tail record of the helper thread is either done before
    // the capture begins or sees the count raised and stays out of it.
    device_.with_records_blocked([this] { captures_.fetch_add(1, std::memory_order_acq_rel); });
    dispatcher_->release_all();
    const CUresult rc = begin();
    if (rc != CUDA_SUCCESS) end_capture();
    return rc;
  }
  void end_capture() { captures_.fetch_sub(1, std::memory_order_acq_rel); }

  // For good, from now on: nothing is held back, and what is held reaches the driver now. For a
  // program that was handed a driver entry point the shim could not wrap (a newer ABI than this
  // build's cuda.h, proc_address.cpp): calls through it bypass the shim, so held work could run
  // after work the program submitted after it. Ops still go through the dispatcher (counted,
  // traced, released in stream order). `why` is logged once.
  void stop_holding_work(const std::string& why);
  bool holds_work() const { return !stopped_holding_.load(std::memory_order_seq_cst); }

  // Work on the legacy stream waits for all blocking streams: release their queued best-effort
  // work (non-blocking streams never synchronise with it); their errors stay pending.
  void release_for_legacy_stream(sched::StreamId id);

  // Stream creation with a priority: CUDA's lower number = more urgent.
  sched::StreamClass class_for_priority(int priority) const;
  void set_stream_class(sched::StreamId id, sched::StreamClass cls);
  // The calling thread's class (orion_set_thread_class), applied to each op it submits except on
  // the legacy stream; nullopt: each stream's own class.
  void set_thread_class(std::optional<sched::StreamClass> cls);
  static std::optional<sched::StreamClass> thread_class(sched::StreamId stream);
  // Events made with CU_EVENT_INTERPROCESS: another process may wait on any of their records (it
  // binds to whatever record the driver has when it waits), so a record is never held back.
  void event_created(CUevent e, unsigned flags);
  void event_destroyed(CUevent e);
  bool interprocess_event(CUevent e) const;
  // A stream created by the program: its class and its flags (CU_STREAM_NON_BLOCKING).
  void stream_created(CUstream s, unsigned flags, sched::StreamClass cls);
  // A stream ended (destroyed; a per-thread stream's thread exited): what the dispatcher and the
  // device kept of it (class, queued work, drained first; completion bookkeeping, a partition's
  // shadow streams) is not what a later stream of that identity starts with.
  void stream_ended(sched::StreamId id);

  // Submits an op through the dispatcher. `call` is the borrowed payload; `clone` may be null
  // (the caller then waits until the op reached the driver). The caller fills
  // op.requested_class from thread_class() (submit_call, launch).
  CUresult submit(sched::Op&& op);
  // A kernel launch: kernel facts for the policy, communication detection, then submit(). A
  // launch that may be deferred records its caller's context (a borrowed one whose arguments
  // cannot be copied may be submitted by another thread while its caller waits).
  CUresult launch(class KernelLaunch& call, bool per_thread);

  // A module or library was unloaded: function handles may be reused for other kernels, so the
  // kernel catalogue and the occupancy answers start afresh.
  void forget_functions();
  // cuCtxDestroy(ctx) succeeded: the streams and events of ctx are gone without a destroy call
  // of their own. The shim forgets the streams it tracked there (their completion events went
  // too: never queried, pooled or destroyed again, since their handle values may already name
  // a new event of the program) and the dispatcher's state of those streams.
  void context_destroyed(CUcontext ctx, const DriverDevice::PollsBlocked& polls_blocked);
  // Primary contexts (cuDevicePrimaryCtxRetain's answers): a device's, while active. A reset, or
  // a release that was the last (the program's, or a green context's destroy), ends one; its
  // streams and events go like a destroyed context's, and the driver hands its handle out again
  // (a new stream of the new context may get an old stream's handle value).
  // A device's primary context keeps its handle (the entry stays after it ends: a retain the
  // shim does not see, such as a green context's, may make it active again).
  void primary_context_retained(CUdevice dev, CUcontext ctx);
  CUcontext primary_context(CUdevice dev) const;  // null: no retain seen
  bool have_primary_contexts() const;
  // After a call that may have been a last release: each primary context the driver reports
  // inactive now ended (primary_context_ended).
  void primary_contexts_maybe_ended(const DriverDevice::PollsBlocked& polls_blocked);
  // `reset`: cuDevicePrimaryCtxReset, which "destroys and cleans up all resources associated
  // with the device": the partition policy's green contexts there are taken as gone too.
  void primary_context_ended(CUdevice dev, CUcontext ctx, bool reset, const DriverDevice::PollsBlocked& polls_blocked);
  // Held around every call that may end a context (from before the driver call until the shim
  // has dropped what it had there) and every call that may make a primary context active
  // (cuDevicePrimaryCtxRetain, cuGreenCtxCreate): a primary context cannot come back, with new
  // streams under its old handle, between a last release and the shim's look at its state.
  std::unique_lock<std::mutex> lock_context_lifecycle() { return std::unique_lock(context_lifecycle_mu_); }

  // Drains everything and writes the trace (ORION_TRACE). Returns the first deferred error.
  int flush();
  // Stops the helper thread, flushes, exports profiles; afterwards every call passes through.
  void shutdown();

  // A call reached the driver outside the dispatcher (synchronous copies and sets, the
  // release_all class): the partition policy's shadow streams must wait for it (finding 4).
  void work_outside_dispatcher() {
    if (partitions_ != nullptr) partitions_->forget_tails();
  }

  uint64_t communication_streams() const { return comm_streams_.load(std::memory_order_relaxed); }
  // The partition policy's green contexts (null under other policies).
  const GreenPartitions* partitions() const { return partitions_.get(); }
  DriverDevice& device() { return device_; }

  // Graph executables with event-record or event-wait nodes (child graphs walked; a node the shim
  // cannot look into, such as a conditional's body, counts as one) or communication kernels, read
  // when the executable is instantiated or updated. A launch of one with communication kernels
  // makes its stream a communication stream. The shim's event bookkeeping never sees those records and waits, so
  // a launch of such an executable is never deferred: everything queued reaches the driver before
  // it (queued waits of the events it records, records of those it waits on), then it does.
  void graph_instantiated(CUgraphExec exec, CUgraph graph);
  // The dispatcher orders the launches of one executable like the records of one event (CUDA
  // runs each launch behind the executable's earlier ones, whatever their streams): this id,
  // which no CUevent handle can equal (user-space pointers are below 2^63), is that event.
  static sched::EventId graph_order_id(CUgraphExec exec) {
    return reinterpret_cast<uintptr_t>(exec) | (uint64_t{1} << 63);
  }
  void graph_exec_destroyed(CUgraphExec exec);
  // A launch of `exec` (op.kind kGraphLaunch): deferred like any op unless it has event nodes.
  CUresult launch_graph(CUgraphExec exec, sched::Op&& op);

 private:
  void pump_loop();
  CUresult submit_op(sched::Op&& op, bool may_defer);
  // Everything queued reaches the driver first, then `op`, not deferred (an op whose events the
  // bookkeeping cannot follow); returns op's own result.
  CUresult submit_after_everything(sched::Op&& op);
  // Wakes the helper thread from an idle sleep (something was queued or is tracked now).
  void wake_pump();

  Settings settings_;
  mutable std::mutex ipc_events_mu_;
  std::unordered_set<CUevent> ipc_events_;
  std::atomic<bool> have_ipc_events_{false};
  std::mutex context_lifecycle_mu_;
  mutable std::mutex primaries_mu_;
  std::map<CUdevice, CUcontext> primaries_;  // under primaries_mu_
  mutable std::mutex graphs_mu_;
  std::unordered_set<CUgraphExec> graphs_with_event_nodes_;
  std::unordered_set<CUgraphExec> communication_graphs_;  // run NCCL kernels
  DriverDevice device_;
  sched::ProfileStore profiles_;
  std::unique_ptr<sched::TraceWriter> trace_;
  std::unique_ptr<sched::Dispatcher> dispatcher_;
  std::unique_ptr<GreenPartitions> partitions_;  // reads the policy the dispatcher owns
  std::atomic<int> captures_{0};
  std::atomic<bool> stopped_holding_{false};
  void wait_for_admission(const sched::Op& op);
  std::atomic<bool> have_best_effort_{false};
  // The policy gates the whole process (gpud): every stream best effort, the legacy one included
  // (held in order with blocking streams), thread classes ignored. Set once at construction.
  bool whole_process_ = false;
  std::atomic<uint64_t> comm_streams_{0};
  std::atomic<bool> stop_{false};
  // The helper thread sleeps a pump interval while work is queued or tracked in flight, and an
  // idle period (woken by the next submit) when there is none.
  std::mutex pump_mu_;
  std::condition_variable pump_cv_;
  bool pump_wake_ = false;  // guarded by pump_mu_
  std::atomic<bool> pump_idle_{false};
  std::thread pump_thread_;
};

// 0 = not initialised, 1 = pass-through (or shut down), otherwise a Shim*.
extern std::atomic<uintptr_t> g_shim_state;
Shim* init_shim_slow();

// The active shim, or nullptr when calls should go straight to the driver. First call reads the
// settings (a bad setting ends the process with status 2, see settings.h).
inline Shim* active_shim() {
  uintptr_t v = g_shim_state.load(std::memory_order_acquire);
  if (v > 1) return reinterpret_cast<Shim*>(v);
  if (v == 1) return nullptr;
  return init_shim_slow();
}

}  // namespace orion

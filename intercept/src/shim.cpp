#include "shim.h"

#include <pthread.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "log.h"

#include "driver_calls.h"
#include "driver_functions.h"
#include "kernel_catalog.h"
#include "real_driver.h"

namespace orion {

std::atomic<uintptr_t> g_shim_state{0};

namespace {

std::mutex g_init_mutex;
// The shim lives until the process ends (calls may still arrive from atexit handlers and other
// threads after shutdown): this reference keeps it reachable for leak checkers too.
Shim* volatile g_shim_forever = nullptr;  // volatile: the store must not be optimised away

void shutdown_at_exit() {
  uintptr_t v = g_shim_state.exchange(1, std::memory_order_acq_rel);
  if (v > 1) reinterpret_cast<Shim*>(v)->shutdown();
}

void configure_logging(const Settings& s) { set_log_level(s.log_level); }

// A child of fork() has only the forking thread: the shim's helper thread, and any lock another
// thread held at the fork, are not there. The child passes every call straight through and its
// exit neither flushes nor joins anything (the parent owns the queues and the trace).
void child_after_fork() { g_shim_state.store(1, std::memory_order_release); }

}  // namespace

Shim* init_shim_slow() {
  std::lock_guard lock(g_init_mutex);
  uintptr_t v = g_shim_state.load(std::memory_order_acquire);
  if (v > 1) return reinterpret_cast<Shim*>(v);
  if (v == 1) return nullptr;

  std::string error;
  std::optional<Settings> settings = settings_from_env(&error);
  if (!settings) {
    std::fprintf(stderr, "libgpu_scheduler: %s\n", error.c_str());
    std::exit(2);
  }
  if (!settings->enabled) {
    g_shim_state.store(1, std::memory_order_release);
    return nullptr;
  }
  configure_logging(*settings);
  if (!load_real_driver()) {
    g_shim_state.store(1, std::memory_order_release);
    return nullptr;
  }
  Shim* shim = nullptr;
  try {
    shim = new Shim(*settings);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "libgpu_scheduler: %s\n", e.what());
    std::exit(2);
  }
  g_shim_forever = shim;
  shim_log().info("{}", settings->describe());
  g_shim_state.store(reinterpret_cast<uintptr_t>(shim), std::memory_order_release);
  std::atexit(shutdown_at_exit);
  pthread_atfork(nullptr, nullptr, child_after_fork);
  return shim;
}

Shim::Shim(Settings settings) : settings_(std::move(settings)) {
  // make_policy throws std::invalid_argument naming the bad policy or parameter; the message then
  // also names the variable it came from (intercept/README.md's error format).
  std::unique_ptr<sched::Policy> policy;
  try {
    policy = sched::make_policy(settings_.policy, settings_.policy_params);
  } catch (const std::invalid_argument& e) {
    std::string params;
    for (const auto& [key, value] : settings_.policy_params) params += (params.empty() ? "" : ",") + key + "=" + value;
    throw std::invalid_argument(params.empty() ? fmt::format("ORION_POLICY='{}': {}", settings_.policy, e.what())
                                               : fmt::format("ORION_POLICY='{}' ORION_POLICY_PARAMS='{}': {}",
                                                             settings_.policy, params, e.what()));
  }
  sched::DispatcherOptions options;
  options.be_max_wait_ns = settings_.be_max_wait_us * 1000;
  options.pump_interval_ns = settings_.pump_interval_us * 1000;
  // Our own helper thread pumps, so that shutdown can stop it while the dispatcher stays alive
  // for calls that still arrive during process exit.
  options.background_thread = false;
  // The helper thread polls every pump interval: a launch polls inline at most that often, so its
  // cost does not grow with the number of busy streams.
  options.inline_poll_interval_ns = options.pump_interval_ns;
  options.default_class = sched::StreamClass::kUnmanaged;
  if (!settings_.profile_import.empty()) {
    // Throws std::invalid_argument naming the file, line and field.
    size_t rows = 0;
    try {
      rows = profiles_.load_orion_csv(settings_.profile_import);
    } catch (const std::exception& e) {
      throw std::invalid_argument(fmt::format("ORION_PROFILE_IMPORT='{}': {}", settings_.profile_import, e.what()));
    }
    shim_log().info("imported {} kernel profiles from {}", rows,
                 settings_.profile_import);
  }
  options.profiles = &profiles_;
  if (!settings_.trace_path.empty()) {
    trace_ = std::make_unique<sched::TraceWriter>();
    options.trace = trace_.get();
  }
  device_.set_capture_counter(&captures_);
  device_.set_completion_batch_ns(settings_.completion_batch_us * 1000);
  if (policy->sm_partition()) {
    // Best-effort kernels to green contexts; high priority stays on the program's streams, on
    // every SM (hp_rest is the simulator's alone: moving high-priority work would cost it latency).
    if (policy->sm_partition()->high_priority_on_rest) {
      shim_log().warn("partition: hp_rest=1 is simulated only; on a GPU high-priority kernels stay on every SM");
    }
    partitions_ = std::make_unique<GreenPartitions>(*policy);
    device_.set_partitions(partitions_.get());
  }
  whole_process_ = policy->gates_whole_process();
  dispatcher_ = std::make_unique<sched::Dispatcher>(device_, std::move(policy), options);
  if (whole_process_) {
    // A best-effort process (XSched gates processes, not streams: holding one stream while its
    // neighbours run deadlocks on cross-stream waits and lets the rest into the pipeline's time).
    // PyTorch launches on the legacy stream unless told otherwise: it is held too, in order.
    dispatcher_->order_legacy_stream(kLegacyStream);
    set_stream_class(kLegacyStream, sched::StreamClass::kBestEffort);
    shim_log().info("policy {}: the whole process is best effort (every stream, whatever its priority)",
                    settings_.policy);
  }
  pump_thread_ = std::thread([this] { pump_loop(); });
}

void Shim::pump_loop() {
  // Relaxed capture mode: the helper thread's event queries never invalidate a program's capture.
  DriverDevice::mark_shim_thread();
  const auto period = std::chrono::microseconds(settings_.pump_interval_us);
  const auto idle_period = std::max<std::chrono::microseconds>(period, std::chrono::milliseconds(5));
  // Passes with nothing to do before sleeping the idle period (about 1 ms at the default
  // interval): between the launches of a burst the thread stays awake, so submits need not wake it.
  const int idle_passes_before_sleep =
      static_cast<int>(std::max<int64_t>(1, 1000 / std::max<int64_t>(settings_.pump_interval_us, 1)));
  int idle_passes = 0;
  while (!stop_.load(std::memory_order_acquire)) {
    dispatcher_->pump();
    std::unique_lock lock(pump_mu_);
    // Nothing queued and nothing tracked in flight (for a while): nothing to admit or retire until
    // a submit changes that (Shim::submit wakes us); the idle period only bounds how stale a
    // missed wake can leave us.
    const bool nothing = dispatcher_->queued_now() == 0 && device_.tracked_in_flight() == 0;
    idle_passes = nothing ? idle_passes + 1 : 0;
    const bool idle = idle_passes >= idle_passes_before_sleep;
    pump_idle_.store(idle, std::memory_order_seq_cst);
    if (idle && (dispatcher_->queued_now() != 0 || device_.tracked_in_flight() != 0)) {
      pump_idle_.store(false, std::memory_order_seq_cst);  // raced with a submit: go on
      continue;
    }
    pump_cv_.wait_for(lock, idle ? idle_period : period,
                      [&] { return pump_wake_ || stop_.load(std::memory_order_acquire); });
    pump_wake_ = false;
    pump_idle_.store(false, std::memory_order_relaxed);
  }
}

void Shim::wake_pump() {
  {
    std::lock_guard lock(pump_mu_);
    pump_wake_ = true;
  }
  pump_cv_.notify_one();
}

int Shim::flush() {
  int rc = dispatcher_->drain_all();
  if (trace_) {
    // Completions still outstanding are picked up by later flushes.
    dispatcher_->pump();
    std::string err = trace_->flush(settings_.trace_path);
    if (!err.empty()) shim_log().error("ORION_TRACE: {}", err);
  }
  return rc;
}

void Shim::shutdown() {
  stop_.store(true, std::memory_order_release);
  wake_pump();
  if (pump_thread_.joinable()) pump_thread_.join();
  int rc = flush();
  if (rc != 0) shim_log().error("deferred work failed at exit with CUresult {}", rc);
  if (!settings_.profile_export.empty()) {
    std::string err = profiles_.save_orion_csv(settings_.profile_export);
    if (!err.empty()) shim_log().error("ORION_PROFILE_EXPORT: {}", err);
  }
  sched::DispatcherStats s = dispatcher_->stats();
  shim_log().info("{} ops submitted ({} inline), {} deferred, "
               "{} forced by starvation, {} promoted, {} classed by their thread, {} caller waits, {} driver errors",
               s.submitted, s.submitted_inline, s.deferred,
               s.forced_by_starvation, s.promoted, s.op_classed, s.caller_waits, s.backend_errors);
  if (partitions_ != nullptr) shim_log().info("partition: {}", partitions_->stats().summary());
  if (std::string releases = release_call_summary(); !releases.empty()) shim_log().info("{}", releases);
}

void Shim::release_for_legacy_stream(sched::StreamId id) {
  // A whole best-effort process holds legacy work too, ordered by the dispatcher instead.
  if (id != kLegacyStream || whole_process_ || !have_best_effort_.load(std::memory_order_acquire)) return;
  dispatcher_->release_legacy_sync();
}

sched::StreamClass Shim::class_for_priority(int priority) const {
  if (priority <= settings_.hp_priority_max) return sched::StreamClass::kHighPriority;
  if (priority >= settings_.be_priority_min) return sched::StreamClass::kBestEffort;
  return sched::StreamClass::kUnmanaged;
}

void Shim::set_stream_class(sched::StreamId id, sched::StreamClass cls) {
  if (cls == sched::StreamClass::kBestEffort) have_best_effort_.store(true, std::memory_order_release);
  dispatcher_->set_stream_class(id, cls);
}

namespace {
// The calling thread's class: -1 none, otherwise a sched::StreamClass value. Plain TLS (no
// constructor), so reading it costs a TLS load on every launch.
thread_local int8_t t_thread_class = -1;
}  // namespace

void Shim::set_thread_class(std::optional<sched::StreamClass> cls) {
  // A whole best-effort process: a thread cannot class itself out of it.
  if (whole_process_) cls.reset();
  if (cls == sched::StreamClass::kBestEffort) have_best_effort_.store(true, std::memory_order_release);
  t_thread_class = cls ? static_cast<int8_t>(*cls) : int8_t{-1};
}

std::optional<sched::StreamClass> Shim::thread_class(sched::StreamId stream) {
  // Every blocking stream orders with the legacy stream: deferring its work by thread would let
  // their later work pass it. A per-thread default stream's held work could only be submitted by
  // its own thread (CU_STREAM_PER_THREAD names the caller's): it keeps its unmanaged class.
  if (t_thread_class < 0 || stream == kLegacyStream || is_per_thread(stream)) return std::nullopt;
  return static_cast<sched::StreamClass>(t_thread_class);
}

void Shim::forget_functions() {
  forget_all_functions();
  device_.forget_occupancy();
}

void Shim::context_destroyed(CUcontext ctx, const DriverDevice::PollsBlocked& polls_blocked) {
  for (const sched::StreamId id : device_.context_destroyed(ctx, polls_blocked)) dispatcher_->forget_stream(id);
}

void Shim::primary_context_retained(CUdevice dev, CUcontext ctx) {
  std::lock_guard lock(primaries_mu_);
  primaries_[dev] = ctx;
}

CUcontext Shim::primary_context(CUdevice dev) const {
  std::lock_guard lock(primaries_mu_);
  auto it = primaries_.find(dev);
  return it == primaries_.end() ? nullptr : it->second;
}

bool Shim::have_primary_contexts() const {
  std::lock_guard lock(primaries_mu_);
  return !primaries_.empty();
}

void Shim::primary_contexts_maybe_ended(const DriverDevice::PollsBlocked& polls_blocked) {
  if (real::cuDevicePrimaryCtxGetState == nullptr) return;  // left to stream_created's check
  std::map<CUdevice, CUcontext> known;
  {
    std::lock_guard lock(primaries_mu_);
    known = primaries_;
  }
  for (const auto& [dev, ctx] : known) {
    unsigned flags = 0;
    int active = 1;
    // A query that fails tells nothing: the context is kept (a reused stream handle still shows
    // its end, Shim::stream_created).
    // (Dropping a context that ended at an earlier call again finds nothing tracked there.)
    if (real::cuDevicePrimaryCtxGetState(dev, &flags, &active) == CUDA_SUCCESS && active == 0) {
      primary_context_ended(dev, ctx, /*reset=*/false, polls_blocked);
    }
  }
}

void Shim::primary_context_ended(CUdevice dev, CUcontext ctx, bool reset,
                                 const DriverDevice::PollsBlocked& polls_blocked) {
  // First, so that the dropped streams' shadows (of green contexts that may be gone) are only
  // forgotten, never destroyed. A last release cannot take the policy's green contexts: they
  // hold retains of their own.
  if (reset && partitions_ != nullptr) partitions_->device_reset(dev);
  context_destroyed(ctx, polls_blocked);
}

void Shim::stream_ended(sched::StreamId id) {
  dispatcher_->forget_stream(id);
  device_.stream_destroying(id);
}

void Shim::event_created(CUevent e, unsigned flags) {
  // A reused handle value (the old event destroyed, or gone with its context): what the
  // dispatcher knew of the old event's records must not order the new one's waits.
  dispatcher_->forget_event(reinterpret_cast<sched::EventId>(e));
  std::lock_guard lock(ipc_events_mu_);
  if ((flags & CU_EVENT_INTERPROCESS) != 0) {
    ipc_events_.insert(e);
    have_ipc_events_.store(true, std::memory_order_release);
  } else {
    ipc_events_.erase(e);  // a reused handle value
  }
}

void Shim::event_destroyed(CUevent e) {
  if (!have_ipc_events_.load(std::memory_order_acquire)) return;
  std::lock_guard lock(ipc_events_mu_);
  ipc_events_.erase(e);
}

bool Shim::interprocess_event(CUevent e) const {
  if (!have_ipc_events_.load(std::memory_order_acquire)) return false;  // the common case
  std::lock_guard lock(ipc_events_mu_);
  return ipc_events_.count(e) != 0;
}

void Shim::stream_created(CUstream s, unsigned flags, sched::StreamClass cls) {
  const sched::StreamId id = stream_id(s, false);
  if (whole_process_ && cls != sched::StreamClass::kCommunication) cls = sched::StreamClass::kBestEffort;
  // A handle value the shim still tracks: the old stream went without a destroy call (with a
  // context the shim could not tell had ended: a primary context's last release or reset, a green
  // context): what it tracked of that context goes, as for a destroyed context.
  for (const sched::StreamId gone : device_.stream_handle_reused(id)) {
    if (gone != id) dispatcher_->forget_stream(gone);  // id's own state goes just below
  }
  // The dispatcher's state of an earlier stream of this handle value (its class, a deferred error
  // no synchronisation collected) is not the new stream's, whether or not completions were tracked.
  dispatcher_->forget_stream(id);
  // A handle value can be reused after a destroy: class and flags are set again each time.
  dispatcher_->set_syncs_with_legacy(id, (flags & CU_STREAM_NON_BLOCKING) == 0);
  set_stream_class(id, cls);
}

void Shim::wait_for_admission(const sched::Op& op) {
  // A per-thread default stream's work cannot be held for another thread to submit (its handle
  // names the caller's own stream): in a whole best-effort process its caller waits, launch by
  // launch, until the policy would admit it (a window opens, the pipeline leaves, or the lease
  // runs out with fallback=pass). Polled with a backoff (20 us to 1 ms); bounded at 1 s, after
  // which it goes anyway (as a synchronisation releases held work), said once in the log.
  static std::atomic<bool> told{false}, told_bound{false};
  if (!told.exchange(true)) {
    shim_log().info("policy {}: launches on per-thread default streams wait in their calling thread for admission",
                    settings_.policy);
  }
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(1);
  auto pause = std::chrono::microseconds(20);
  while (!dispatcher_->policy_admits(op)) {
    if (!holds_work()) return;  // scheduling is off for good: nothing waits any more
    if (stop_.load(std::memory_order_acquire) || std::chrono::steady_clock::now() >= give_up) {
      if (!told_bound.exchange(true)) {
        shim_log().warn("policy {}: a per-thread default stream's launch waited 1 s for admission and went anyway",
                        settings_.policy);
      }
      return;
    }
    std::this_thread::sleep_for(pause);
    pause = std::min(pause * 2, std::chrono::microseconds(1000));
  }
}

void Shim::stop_holding_work(const std::string& why) {
  if (stopped_holding_.exchange(true, std::memory_order_seq_cst)) return;
  shim_log().warn("{}: from now on the shim holds no work back (scheduling off; ops are still counted)", why);
  dispatcher_->release_all();
  work_outside_dispatcher();
}

CUresult Shim::submit(sched::Op&& op) { return submit_op(std::move(op), /*may_defer=*/true); }

CUresult Shim::submit_op(sched::Op&& op, bool may_defer) {
  if (whole_process_ && may_defer && is_per_thread(op.stream) && !capturing() && holds_work() &&
      dispatcher_->stream_class(op.stream) != sched::StreamClass::kCommunication) {
    wait_for_admission(op);
    // Goes now, from this thread, counted in flight as best effort (so the budget sees it).
    op.requested_class = sched::StreamClass::kBestEffort;
    may_defer = false;
  }
  // Another stream's deferred error is not this op's: it stays for the call that synchronises
  // with its op, and this op is submitted (issue 24, finding 7).
  release_for_legacy_stream(op.stream);
  const bool defer = may_defer && !capturing() && holds_work();
  const auto rc = static_cast<CUresult>(dispatcher_->submit(std::move(op), defer));
  // stop_holding_work() may have released everything between the look and the queueing: this
  // op must not stay held behind calls that now bypass the shim.
  if (defer && !holds_work()) dispatcher_->release_all();
  if (pump_idle_.load(std::memory_order_seq_cst) &&
      (dispatcher_->queued_now() != 0 || device_.tracked_in_flight() != 0)) {
    wake_pump();
  }
  return rc;
}

CUresult Shim::launch(KernelLaunch& call, bool per_thread) {
  const CUlaunchConfig& c = call.config();
  const FunctionInfo& info = function_info(call.function());
  sched::Op op;
  op.kind = sched::OpKind::kKernel;
  op.stream = stream_id(c.hStream, per_thread);
  op.kernel.id = reinterpret_cast<sched::KernelId>(call.function());
  const char* name = info.registered_name.load(std::memory_order_acquire);
  if (name == nullptr && !info.name.empty()) {
    name = profiles_.register_kernel(op.kernel.id, info.name);
    info.registered_name.store(name, std::memory_order_release);
  }
  op.kernel.name = name;
  op.kernel.grid = {c.gridDimX, c.gridDimY, c.gridDimZ};
  op.kernel.block = {c.blockDimX, c.blockDimY, c.blockDimZ};
  op.kernel.shared_mem_bytes = c.sharedMemBytes;
  // A launch that records an event is ordered with the event's other records and waits.
  op.event = reinterpret_cast<sched::EventId>(call.recorded_event());
  op.borrowed = &call;
  op.clone = &KernelLaunch::clone;
  const sched::StreamClass cls = dispatcher_->stream_class(op.stream);
  if (cls != sched::StreamClass::kCommunication &&
      (info.communication || call.remote_sync_domain())) {
    // NCCL kernels spin until their peers arrive: the stream is a communication stream from now
    // on (set_stream_class drains what it had queued first, keeping its order).
    dispatcher_->set_stream_class(op.stream, sched::StreamClass::kCommunication);
    comm_streams_.fetch_add(1, std::memory_order_relaxed);
    shim_log().debug("stream {:#x} carries {} -> communication", op.stream, info.name);
  } else {
    op.requested_class = thread_class(op.stream);
    if (op.requested_class.value_or(cls) == sched::StreamClass::kBestEffort) call.capture_context();
  }
  // The event bookkeeping follows one event per op: a launch recording two goes in program order.
  if (call.recorded_event_count() > 1) return submit_after_everything(std::move(op));
  return submit(std::move(op));
}

namespace {
// What the shim must know about a graph before its launches are scheduled: whether it records or
// waits on events, and whether it runs a communication kernel (NCCL, whose kernels spin until
// their peers arrive). Child graphs are walked; anything the shim cannot inspect (a failed query,
// a conditional's bodies) counts as having event nodes.
struct GraphFacts {
  bool event_nodes = false;
  bool communication = false;
};
void walk_graph(CUgraph graph, int depth, GraphFacts& out) {
  size_t n = 0;
  if (depth > 16 || !real::cuGraphGetNodes || !real::cuGraphNodeGetType ||
      real::cuGraphGetNodes(graph, nullptr, &n) != CUDA_SUCCESS) {
    out.event_nodes = true;
    return;
  }
  std::vector<CUgraphNode> nodes(n);
  if (n != 0 && real::cuGraphGetNodes(graph, nodes.data(), &n) != CUDA_SUCCESS) {
    out.event_nodes = true;
    return;
  }
  for (size_t i = 0; i < n && i < nodes.size(); ++i) {
    CUgraphNodeType type{};
    if (real::cuGraphNodeGetType(nodes[i], &type) != CUDA_SUCCESS) {
      out.event_nodes = true;
      continue;
    }
    CUgraph child = nullptr;
    CUDA_KERNEL_NODE_PARAMS kernel{};
    switch (type) {
      case CU_GRAPH_NODE_TYPE_EVENT_RECORD:
      case CU_GRAPH_NODE_TYPE_WAIT_EVENT:
      case CU_GRAPH_NODE_TYPE_CONDITIONAL: out.event_nodes = true; break;  // bodies not walked
      // Signals and waits another party sees (external semaphores: Vulkan, another process;
      // stream memory operations: a flag a host or peer polls): never held, as the direct calls
      // (cuSignalExternalSemaphoresAsync, cuStreamWriteValue*) are not.
      case CU_GRAPH_NODE_TYPE_EXT_SEMAS_SIGNAL:
      case CU_GRAPH_NODE_TYPE_EXT_SEMAS_WAIT:
      case CU_GRAPH_NODE_TYPE_BATCH_MEM_OP: out.event_nodes = true; break;
      case CU_GRAPH_NODE_TYPE_GRAPH:
        if (!real::cuGraphChildGraphNodeGetGraph || real::cuGraphChildGraphNodeGetGraph(nodes[i], &child) != CUDA_SUCCESS) {
          out.event_nodes = true;
        } else {
          walk_graph(child, depth + 1, out);
        }
        break;
      case CU_GRAPH_NODE_TYPE_KERNEL:
        if (real::cuGraphKernelNodeGetParams_v2 != nullptr &&
            real::cuGraphKernelNodeGetParams_v2(nodes[i], &kernel) == CUDA_SUCCESS) {
          CUfunction f = kernel.func != nullptr ? kernel.func : reinterpret_cast<CUfunction>(kernel.kern);
          if (f != nullptr && function_info(f).communication) out.communication = true;
        }
        break;
      default: break;
    }
  }
}
}  // namespace

void Shim::graph_instantiated(CUgraphExec exec, CUgraph graph) {
  GraphFacts facts;
  walk_graph(graph, 0, facts);
  std::lock_guard lock(graphs_mu_);
  // Erased first: a handle value reused by a new executable.
  graphs_with_event_nodes_.erase(exec);
  communication_graphs_.erase(exec);
  if (facts.event_nodes) graphs_with_event_nodes_.insert(exec);
  if (facts.communication) communication_graphs_.insert(exec);
}

void Shim::graph_exec_destroyed(CUgraphExec exec) {
  dispatcher_->forget_event(graph_order_id(exec));
  std::lock_guard lock(graphs_mu_);
  graphs_with_event_nodes_.erase(exec);
  communication_graphs_.erase(exec);
}

CUresult Shim::launch_graph(CUgraphExec exec, sched::Op&& op) {
  bool has_events = false, communication = false;
  {
    std::lock_guard lock(graphs_mu_);
    has_events = graphs_with_event_nodes_.count(exec) != 0;
    communication = communication_graphs_.count(exec) != 0;
  }
  if (communication && dispatcher_->stream_class(op.stream) != sched::StreamClass::kCommunication &&
      op.stream != kLegacyStream) {
    // A replay of NCCL kernels spins until its peers arrive, like the launch it was captured from:
    // its stream becomes a communication stream (never deferred; queued work drained first).
    dispatcher_->set_stream_class(op.stream, sched::StreamClass::kCommunication);
    comm_streams_.fetch_add(1, std::memory_order_relaxed);
    shim_log().debug("stream {:#x} replays a graph with communication kernels -> communication", op.stream);
  }
  // Its records and waits are invisible to the event bookkeeping: everything queued goes first
  // (the waits of the events it re-records, the records of those it waits on), and it goes now.
  return has_events ? submit_after_everything(std::move(op)) : submit(std::move(op));
}

CUresult Shim::submit_after_everything(sched::Op&& op) {
  dispatcher_->release_all();  // errors of the released work stay for their synchronising call
  return submit_op(std::move(op), /*may_defer=*/false);
}

}  // namespace orion


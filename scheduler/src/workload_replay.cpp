// Replays workloads through Dispatchers on a SimulatedGpu in virtual time (one process, or several
// sharing the GPU, each with its own dispatcher and policy), and the latency / throughput summaries
// the orion-sim study prints.
//
// Completions are matched to workload ops per stream: the dispatcher keeps per-stream FIFO order
// and so does the device, so the k-th completion on a stream is the k-th op submitted on it.
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <optional>
#include <queue>
#include <stdexcept>

#include "scheduler/dispatcher.h"
#include "scheduler/profile_store.h"
#include "scheduler/trace.h"
#include "scheduler/workload.h"

namespace sched {
namespace {

// Each process's ids live in their own range of the GPU's: its index in the top bits.
constexpr int kProcessShift = 40;
constexpr uint64_t kLocalMask = (uint64_t{1} << kProcessShift) - 1;

// A process's view of the shared GPU: its own stream and event ids, its own listener.
class ProcessDevice final : public Device {
 public:
  ProcessDevice(SimulatedGpu& gpu, size_t index) : gpu_(gpu), offset_(static_cast<uint64_t>(index) << kProcessShift) {}
  int submit(const Op& op) override {
    Op global;  // what the simulated GPU reads of an op (replayed ops carry no payload)
    global.kind = op.kind;
    global.stream = op.stream + offset_;
    global.kernel = op.kernel;
    global.event = op.event == 0 ? 0 : op.event + offset_;
    global.bytes = op.bytes;
    global.seq = op.seq;
    global.cls = op.cls;
    return gpu_.submit(global);
  }
  void poll() override { gpu_.poll(); }  // the GPU's listener routes to every process
  void set_listener(CompletionListener* listener) override { listener_ = listener; }
  int sm_count() const override { return gpu_.sm_count(); }
  int max_active_blocks_per_sm(const KernelInfo& kernel) override { return gpu_.max_active_blocks_per_sm(kernel); }
  int64_t now_ns() const override { return gpu_.now_ns(); }

  StreamId global(StreamId local) const { return local + offset_; }
  void deliver(Completion c) const {
    if (listener_ == nullptr) return;
    c.stream &= kLocalMask;
    listener_->on_complete(c);
  }

 private:
  SimulatedGpu& gpu_;
  uint64_t offset_;
  CompletionListener* listener_ = nullptr;
};

class CompletionRouter final : public CompletionListener {
 public:
  std::vector<ProcessDevice*> devices;
  void on_complete(const Completion& done) override {
    const size_t i = static_cast<size_t>(done.stream >> kProcessShift);
    if (i < devices.size()) devices[i]->deliver(done);
  }
};

bool hardware_priority(HwPriority mode, const Policy& policy, StreamClass cls) {
  switch (mode) {
    case HwPriority::kByPolicy:
      return (policy.defers_best_effort() || policy.sm_partition().has_value()) && cls == StreamClass::kHighPriority;
    case HwPriority::kHighPriorityStreams:
      return cls == StreamClass::kHighPriority;
    case HwPriority::kNone:
      return false;
    case HwPriority::kAllStreams:
      return true;
  }
  return false;
}

// The earlier of two times, -1 meaning none.
int64_t earliest(int64_t a, int64_t b) { return a < 0 ? b : (b < 0 ? a : std::min(a, b)); }

// One process of a replay: its workload's requests, arrivals and in-flight ops, its dispatcher.
class ProcessRun {
 public:
  ProcessRun(const ProcessSpec& spec, size_t index, SimulatedGpu& gpu, int context)
      : spec_(spec), w_(*spec.workload), gpu_(gpu), device_(gpu, index) {
    std::unique_ptr<Policy> policy =
        spec.make_custom_policy ? spec.make_custom_policy(device_) : make_policy(spec.policy, spec.policy_params);
    partition_ = policy->sm_partition();
    pol_ = policy.get();
    DispatcherOptions dopt;
    if (!spec.trace_path.empty()) dopt.trace = &trace_;
    dopt.background_thread = false;
    dopt.be_max_wait_ns = spec.be_max_wait_ns;
    dopt.profiles = &profiles_;
    if (spec.seed_profiles) spec.seed_profiles(profiles_);
    dispatcher_ = std::make_unique<Dispatcher>(device_, std::move(policy), dopt);

    sms_ = gpu.sm_count();
    applied_be_ = partition_ ? partition_->best_effort_sms(sms_) : 0;
    for (const WorkloadOp& op : w_.ops) {
      // Checked up front: a kernel the GPU refuses while the dispatcher holds it would only leave
      // a deferred error, and the replay would end "stuck" instead of naming the line.
      if (op.kind == OpKind::kKernel && gpu.max_active_blocks_per_sm(w_.kernel_info(op, gpu)) <= 0) {
        throw std::runtime_error(where(op) + ": the simulated GPU rejects " + (op.name.empty() ? "this kernel" : op.name) +
                                 " (its block does not fit an SM: threads, shared memory or registers)");
      }
      if (stream_cls_.count(op.stream_id)) continue;
      stream_cls_[op.stream_id] = op.cls;
      dispatcher_->set_stream_class(op.stream_id, op.cls);
      gpu.set_stream_priority(device_.global(op.stream_id), hardware_priority(spec.hw_priority, *pol_, op.cls));
      gpu.set_stream_context(device_.global(op.stream_id), context);
      if (partition_) confine(op.stream_id, op.cls, *partition_, applied_be_);
    }
    RequestGraph graph = request_graph(w_);
    op_request_ = std::move(graph.op_request);
    for (WorkloadRequest& r : graph.requests) {
      RequestState state;
      static_cast<WorkloadRequest&>(state) = std::move(r);
      state.remaining = state.ops.size();
      requests_.push_back(std::move(state));
    }
    for (size_t i = 0; i < w_.ops.size(); ++i) {
      if (!requests_[op_request_[i]].closed_loop) arrivals_.push({w_.ops[i].arrival_ns, i});
    }
    result_.name = spec.name;
    result_.replay.policy = spec.make_custom_policy ? pol_->name() : spec.policy;
    result_.replay.start_be_sms = applied_be_;
  }

  // Hands every op that has arrived by now to the dispatcher.
  void submit_arrivals(int64_t now) {
    while (!arrivals_.empty() && arrivals_.top().t <= now) {
      size_t i = arrivals_.top().op;
      arrivals_.pop();
      const WorkloadOp& wop = w_.ops[i];
      Op op;
      op.kind = wop.kind;
      op.stream = wop.stream_id;
      op.kernel = w_.kernel_info(wop, gpu_);
      op.event = wop.event;
      op.bytes = wop.bytes;
      in_flight_[wop.stream_id].push(i);
      RequestState& req = requests_[op_request_[i]];
      if (!req.started) {
        req.started = true;
        req.result.arrival_ns = now;
        if (spec_.on_request) spec_.on_request(req.result, false);
      }
      int rc = dispatcher_->submit(std::move(op));
      if (rc != 0) {
        throw std::runtime_error(where(wop) + ": the simulated GPU rejected " +
                                 (wop.name.empty() ? to_string(wop.kind) : wop.name) + " with error " +
                                 std::to_string(rc) + " (launch shape does not fit an SM?)");
      }
    }
  }

  void pump() {
    dispatcher_->pump();
    follow_partition();
  }
  void drain_all() {
    if (const int rc = dispatcher_->drain_all(); rc != 0) {
      throw std::runtime_error(w_.source + ": the simulated GPU rejected an op the dispatcher held, with error " +
                               std::to_string(rc));
    }
  }

  // A completion of one of this process's ops (its own stream id); true when it released a
  // closed-loop follower.
  bool complete(Completion c) {
    c.stream &= kLocalMask;
    result_.completions.push_back(c);
    auto& fifo = in_flight_[c.stream];
    if (fifo.empty()) throw std::logic_error("replay: completion on a stream with nothing submitted");
    size_t i = fifo.front();
    fifo.pop();
    ++done_ops_;
    RequestState& req = requests_[op_request_[i]];
    req.result.done_ns = std::max(req.result.done_ns, c.end_ns);
    if (req.result.first_start_ns < 0 || c.start_ns < req.result.first_start_ns) req.result.first_start_ns = c.start_ns;
    ++req.result.ops;
    if (--req.remaining != 0) return false;
    result_.replay.requests.push_back(req.result);
    if (spec_.on_request) spec_.on_request(req.result, true);
    for (size_t f : req.followers) {
      for (size_t oi : requests_[f].ops) arrivals_.push({c.end_ns + w_.ops[oi].after_ns, oi});
    }
    return !req.followers.empty();
  }

  int64_t next_arrival() const { return arrivals_.empty() ? -1 : arrivals_.top().t; }
  // The policy's next wake-up (gpud), or the starvation bound's next forced admission: either
  // changes what the dispatcher does with no device event or arrival to wake it.
  int64_t next_wakeup(int64_t now) const {
    int64_t t = spec_.next_wakeup_ns ? spec_.next_wakeup_ns(now) : -1;
    if (t <= now) t = -1;
    const int64_t forced = dispatcher_->next_forced_admission_ns();
    return earliest(t, forced < 0 ? -1 : std::max(forced, now + 1));
  }
  bool done() const { return done_ops_ == w_.ops.size(); }
  size_t left() const { return w_.ops.size() - done_ops_; }
  std::string where(const WorkloadOp& op) const {
    return (spec_.name.empty() ? "" : "process " + spec_.name + ": ") + w_.source + ":" + std::to_string(op.line);
  }
  const std::string& source() const { return w_.source; }
  ProcessDevice& device() { return device_; }

  ProcessResult finish(const SimulatedGpu& gpu) {
    ReplayResult& r = result_.replay;
    for (const RequestResult& q : r.requests) r.makespan_ns = std::max(r.makespan_ns, q.done_ns);
    r.ops_completed = done_ops_;
    r.final_be_sms = applied_be_;
    if (r.makespan_ns > applied_since_) {
      be_sms_ns_ += static_cast<double>(applied_be_) * static_cast<double>(r.makespan_ns - applied_since_);
    }
    r.mean_be_sms = r.makespan_ns > 0 ? be_sms_ns_ / static_cast<double>(r.makespan_ns) : applied_be_;
    if (r.makespan_ns > 0) {
      r.sm_utilisation = gpu.busy_sm_ns() / (static_cast<double>(gpu.sm_count()) * static_cast<double>(r.makespan_ns));
    }
    r.forced_by_starvation = dispatcher_->stats().forced_by_starvation;
    dispatcher_.reset();  // drained: nothing is left queued
    if (!spec_.trace_path.empty()) {
      std::string err = trace_.flush(spec_.trace_path);
      if (!err.empty()) throw std::runtime_error(err);
    }
    return std::move(result_);
  }

 private:
  struct RequestState : WorkloadRequest {
    size_t remaining = 0;
    bool started = false;
  };
  struct Arrival {
    int64_t t;
    size_t op;  // index into workload.ops: ties keep file order
    bool operator>(const Arrival& o) const { return t != o.t ? t > o.t : op > o.op; }
  };

  void confine(StreamId id, StreamClass cls, const SmPartition& part, int be) {
    if (be > 0 && cls == StreamClass::kBestEffort) gpu_.set_stream_sms(device_.global(id), 0, be);
    if (be > 0 && cls == StreamClass::kHighPriority && part.high_priority_on_rest) {
      gpu_.set_stream_sms(device_.global(id), be, sms_ - be);
    }
  }
  // Re-applies the partition when the policy resized it: new blocks go to the new range, running
  // blocks keep theirs (as launches into a new green context would).
  void follow_partition() {
    if (!partition_) return;
    const std::optional<SmPartition> now_part = pol_->sm_partition();
    const int be = now_part ? now_part->best_effort_sms(sms_) : 0;
    if (be == applied_be_ || be <= 0) return;
    const int64_t t = gpu_.now_ns();
    be_sms_ns_ += static_cast<double>(applied_be_) * static_cast<double>(t - applied_since_);
    applied_since_ = t;
    applied_be_ = be;
    ++result_.replay.partition_resizes;
    for (const auto& [id, cls] : stream_cls_) confine(id, cls, *now_part, be);
  }

  const ProcessSpec& spec_;
  const Workload& w_;
  SimulatedGpu& gpu_;
  ProcessDevice device_;
  ProfileStore profiles_;
  TraceWriter trace_;
  const Policy* pol_ = nullptr;
  std::optional<SmPartition> partition_;
  std::unique_ptr<Dispatcher> dispatcher_;
  std::map<StreamId, StreamClass> stream_cls_;
  std::vector<size_t> op_request_;
  std::vector<RequestState> requests_;
  std::priority_queue<Arrival, std::vector<Arrival>, std::greater<>> arrivals_;
  std::map<StreamId, std::queue<size_t>> in_flight_;  // per stream, submitted op indices in order
  ProcessResult result_;
  int sms_ = 0;
  int applied_be_ = 0;    // the partition's size as last applied
  double be_sms_ns_ = 0;  // integral of the partition size over time
  int64_t applied_since_ = 0;
  size_t done_ops_ = 0;
};

}  // namespace

ColocatedResult replay_processes(const std::vector<ProcessSpec>& specs, const SimGpuConfig& gpu_config) {
  if (specs.empty()) throw std::invalid_argument("replay_processes: no process to replay");
  SimulatedGpu gpu(gpu_config);
  CompletionRouter router;
  std::vector<std::unique_ptr<ProcessRun>> procs;
  for (size_t i = 0; i < specs.size(); ++i) {
    if (specs[i].workload == nullptr) throw std::invalid_argument("replay_processes: process " + specs[i].name + " has no workload");
    procs.push_back(std::make_unique<ProcessRun>(specs[i], i, gpu, static_cast<int>(i)));
    router.devices.push_back(&procs.back()->device());
  }
  gpu.set_listener(&router);
  // Unhooked before the processes go (their dispatchers drain and poll as they are destroyed).
  struct Unhook {
    SimulatedGpu& gpu;
    ~Unhook() { gpu.set_listener(nullptr); }
  } unhook{gpu};

  size_t seen = 0;
  for (;;) {
    const int64_t now = gpu.now_ns();
    for (auto& p : procs) p->submit_arrivals(now);
    for (auto& p : procs) p->pump();

    bool released = false;
    for (const Completion& c : gpu.completions(seen)) {
      ++seen;
      const size_t i = static_cast<size_t>(c.stream >> kProcessShift);
      if (i >= procs.size()) throw std::logic_error("replay: a completion of no process");
      released = procs[i]->complete(c) || released;
    }
    if (released) continue;

    int64_t t_other = -1;  // arrivals and wake-ups
    for (auto& p : procs) t_other = earliest(t_other, earliest(p->next_arrival(), p->next_wakeup(now)));
    const int64_t t_dev = gpu.next_event_ns();
    if (t_dev < 0 && t_other < 0) {
      bool all_done = true;
      for (auto& p : procs) all_done = all_done && p->done();
      if (all_done) break;
      // Nothing can happen on its own: the dispatchers still hold queued work.
      for (auto& p : procs) p->drain_all();
      if (gpu.next_event_ns() < 0 && gpu.completed_count() == seen) {
        std::string what;
        for (auto& p : procs) {
          if (!p->done()) what += (what.empty() ? "" : ", ") + p->source() + ": " + std::to_string(p->left()) + " ops";
        }
        throw std::runtime_error("replay stuck with ops not completed (" + what +
                                 "; a stream waits for an event recorded after it?)");
      }
      continue;
    }
    gpu.advance_to(earliest(t_dev, t_other));
  }

  ColocatedResult result;
  for (auto& p : procs) result.processes.push_back(p->finish(gpu));
  result.context_switches = gpu.context_switches();
  return result;
}

ReplayResult replay_workload(const Workload& w, const ReplayOptions& options) {
  ProcessSpec spec;
  spec.workload = &w;
  spec.policy = options.policy;
  spec.policy_params = options.policy_params;
  spec.hw_priority = options.force_hw_priority_on    ? HwPriority::kHighPriorityStreams
                     : options.force_hw_priority_off ? HwPriority::kNone
                                                     : HwPriority::kByPolicy;
  spec.be_max_wait_ns = options.be_max_wait_ns;
  spec.trace_path = options.trace_path;
  return replay_processes({spec}, options.gpu).processes.front().replay;
}

double percentile(std::vector<int64_t> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  // Nearest rank: the smallest value with at least p% of the samples at or below it.
  double rank = std::ceil(std::clamp(p, 0.0, 100.0) / 100.0 * static_cast<double>(values.size()));
  size_t index = rank < 1 ? 0 : static_cast<size_t>(rank) - 1;
  return static_cast<double>(values[std::min(index, values.size() - 1)]);
}

double latency_percentile_ns(const ReplayResult& result, StreamClass cls, double p) {
  std::vector<int64_t> values;
  for (const RequestResult& r : result.requests) {
    if (r.cls == cls) values.push_back(r.latency_ns());
  }
  return percentile(std::move(values), p);
}

double execution_percentile_ns(const ReplayResult& result, StreamClass cls, double p) {
  std::vector<int64_t> values;
  for (const RequestResult& r : result.requests) {
    if (r.cls == cls) values.push_back(r.execution_ns());
  }
  return percentile(std::move(values), p);
}

double requests_per_second(const ReplayResult& result, StreamClass cls) {
  struct Span {
    int64_t first = INT64_MAX, last = 0;
    size_t count = 0;
  };
  std::map<std::string, Span> per_client;
  for (const RequestResult& r : result.requests) {
    if (r.cls != cls) continue;
    Span& s = per_client[r.client];
    s.first = std::min(s.first, r.arrival_ns);
    s.last = std::max(s.last, r.done_ns);
    ++s.count;
  }
  double total = 0;
  for (const auto& [client, s] : per_client) {
    if (s.last > s.first) total += static_cast<double>(s.count) * 1e9 / static_cast<double>(s.last - s.first);
  }
  return total;
}

}  // namespace sched

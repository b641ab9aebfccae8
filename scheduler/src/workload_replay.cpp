// Replays a workload through a Dispatcher on a SimulatedGpu in virtual time, and the latency /
// throughput summaries the orion-sim study prints.
//
// Completions are matched to workload ops per stream: the dispatcher keeps per-stream FIFO order
// and so does the device, so the k-th completion on a stream is the k-th op submitted on it.
#include <algorithm>
#include <cmath>
#include <map>
#include <queue>
#include <stdexcept>

#include "scheduler/dispatcher.h"
#include "scheduler/profile_store.h"
#include "scheduler/trace.h"
#include "scheduler/workload.h"

namespace sched {
namespace {

struct RequestState : WorkloadRequest {
  size_t remaining = 0;
  bool started = false;
};

struct Arrival {
  int64_t t;
  size_t op;  // index into workload.ops: ties keep file order
  bool operator>(const Arrival& o) const { return t != o.t ? t > o.t : op > o.op; }
};

}  // namespace

ReplayResult replay_workload(const Workload& w, const ReplayOptions& options) {
  SimulatedGpu gpu(options.gpu);
  std::unique_ptr<Policy> policy = make_policy(options.policy, options.policy_params);
  const std::optional<SmPartition> partition = policy->sm_partition();
  // A partition confines best effort in space; high priority keeps its hardware priority.
  bool hw_priority = policy->defers_best_effort() || partition.has_value();
  if (options.force_hw_priority_on) hw_priority = true;
  if (options.force_hw_priority_off) hw_priority = false;

  ProfileStore profiles;
  TraceWriter trace;
  DispatcherOptions dopt;
  if (!options.trace_path.empty()) dopt.trace = &trace;
  dopt.background_thread = false;
  dopt.be_max_wait_ns = options.be_max_wait_ns;
  dopt.profiles = &profiles;
  const Policy& pol = *policy;
  Dispatcher dispatcher(gpu, std::move(policy), dopt);

  // Streams, requests and the closed-loop graph.
  std::map<StreamId, bool> streams_seen;
  std::map<StreamId, StreamClass> stream_cls;
  // The partition's size as last applied; an adaptive policy changes it while the replay runs.
  const int sms = gpu.sm_count();
  int applied_be = partition ? partition->best_effort_sms(sms) : 0;
  auto confine = [&](StreamId id, StreamClass cls, const SmPartition& part, int be) {
    if (be > 0 && cls == StreamClass::kBestEffort) gpu.set_stream_sms(id, 0, be);
    if (be > 0 && cls == StreamClass::kHighPriority && part.high_priority_on_rest) gpu.set_stream_sms(id, be, sms - be);
  };
  for (const WorkloadOp& op : w.ops) {
    if (!streams_seen.count(op.stream_id)) {
      streams_seen[op.stream_id] = true;
      stream_cls[op.stream_id] = op.cls;
      dispatcher.set_stream_class(op.stream_id, op.cls);
      gpu.set_stream_priority(op.stream_id, hw_priority && op.cls == StreamClass::kHighPriority);
      if (partition) confine(op.stream_id, op.cls, *partition, applied_be);
    }
  }
  RequestGraph graph = request_graph(w);
  const std::vector<size_t>& op_request = graph.op_request;
  std::vector<RequestState> requests;
  for (WorkloadRequest& r : graph.requests) {
    RequestState state;
    static_cast<WorkloadRequest&>(state) = std::move(r);
    state.remaining = state.ops.size();
    requests.push_back(std::move(state));
  }

  std::priority_queue<Arrival, std::vector<Arrival>, std::greater<>> arrivals;
  for (size_t i = 0; i < w.ops.size(); ++i) {
    if (!requests[op_request[i]].closed_loop) arrivals.push({w.ops[i].arrival_ns, i});
  }

  std::map<StreamId, std::queue<size_t>> in_flight;  // per stream, submitted op indices in order
  ReplayResult result;
  result.policy = options.policy;
  result.start_be_sms = applied_be;
  double be_sms_ns = 0;   // integral of the partition size over time
  int64_t applied_since = 0;
  // Re-applies the partition when the policy resized it: new blocks go to the new range, running
  // blocks keep theirs (as launches into a new green context would).
  auto follow_partition = [&] {
    if (!partition) return;
    const std::optional<SmPartition> now_part = pol.sm_partition();
    const int be = now_part ? now_part->best_effort_sms(sms) : 0;
    if (be == applied_be || be <= 0) return;
    const int64_t t = gpu.now_ns();
    be_sms_ns += static_cast<double>(applied_be) * static_cast<double>(t - applied_since);
    applied_since = t;
    applied_be = be;
    ++result.partition_resizes;
    for (const auto& [id, cls] : stream_cls) confine(id, cls, *now_part, be);
  };
  size_t seen = 0;
  size_t done_ops = 0;

  for (;;) {
    int64_t now = gpu.now_ns();
    while (!arrivals.empty() && arrivals.top().t <= now) {
      size_t i = arrivals.top().op;
      arrivals.pop();
      const WorkloadOp& wop = w.ops[i];
      Op op;
      op.kind = wop.kind;
      op.stream = wop.stream_id;
      op.kernel = w.kernel_info(wop, gpu);
      op.event = wop.event;
      op.bytes = wop.bytes;
      in_flight[wop.stream_id].push(i);
      RequestState& req = requests[op_request[i]];
      if (!req.started) {
        req.started = true;
        req.result.arrival_ns = now;
      }
      int rc = dispatcher.submit(std::move(op));
      if (rc != 0) {
        throw std::runtime_error(w.source + ":" + std::to_string(wop.line) + ": the simulated GPU rejected " +
                                 (wop.name.empty() ? to_string(wop.kind) : wop.name) + " with error " +
                                 std::to_string(rc) + " (launch shape does not fit an SM?)");
      }
    }
    dispatcher.pump();
    follow_partition();

    bool released = false;
    for (const Completion& c : gpu.completions(seen)) {
      ++seen;
      auto& fifo = in_flight[c.stream];
      if (fifo.empty()) throw std::logic_error("replay: completion on a stream with nothing submitted");
      size_t i = fifo.front();
      fifo.pop();
      ++done_ops;
      RequestState& req = requests[op_request[i]];
      req.result.done_ns = std::max(req.result.done_ns, c.end_ns);
      if (req.result.first_start_ns < 0 || c.start_ns < req.result.first_start_ns) req.result.first_start_ns = c.start_ns;
      ++req.result.ops;
      if (--req.remaining == 0) {
        result.requests.push_back(req.result);
        for (size_t f : req.followers) {
          for (size_t oi : requests[f].ops) {
            arrivals.push({c.end_ns + w.ops[oi].after_ns, oi});
          }
          released = true;
        }
      }
    }
    if (released) continue;

    int64_t t_dev = gpu.next_event_ns();
    int64_t t_arr = arrivals.empty() ? -1 : arrivals.top().t;
    if (t_dev < 0 && t_arr < 0) {
      if (done_ops == w.ops.size()) break;
      // Nothing can happen on its own: the dispatcher still holds queued work.
      dispatcher.drain_all();
      if (gpu.next_event_ns() < 0 && gpu.completed_count() == seen) {
        throw std::runtime_error(w.source + ": replay stuck with " + std::to_string(w.ops.size() - done_ops) +
                                 " ops not completed (a stream waits for an event recorded after it?)");
      }
      continue;
    }
    int64_t t = t_dev < 0 ? t_arr : (t_arr < 0 ? t_dev : std::min(t_dev, t_arr));
    gpu.advance_to(t);
  }

  for (const RequestResult& r : result.requests) result.makespan_ns = std::max(result.makespan_ns, r.done_ns);
  result.ops_completed = done_ops;
  result.final_be_sms = applied_be;
  if (result.makespan_ns > applied_since) {
    be_sms_ns += static_cast<double>(applied_be) * static_cast<double>(result.makespan_ns - applied_since);
  }
  result.mean_be_sms = result.makespan_ns > 0 ? be_sms_ns / static_cast<double>(result.makespan_ns) : applied_be;
  if (result.makespan_ns > 0) {
    result.sm_utilisation =
        gpu.busy_sm_ns() / (static_cast<double>(gpu.sm_count()) * static_cast<double>(result.makespan_ns));
  }
  result.forced_by_starvation = dispatcher.stats().forced_by_starvation;
  if (!options.trace_path.empty()) {
    std::string err = trace.flush(options.trace_path);
    if (!err.empty()) throw std::runtime_error(err);
  }
  return result;
}

namespace {

double percentile(std::vector<int64_t> values, double p) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  // Nearest rank: the smallest value with at least p% of the samples at or below it.
  double rank = std::ceil(std::clamp(p, 0.0, 100.0) / 100.0 * static_cast<double>(values.size()));
  size_t index = rank < 1 ? 0 : static_cast<size_t>(rank) - 1;
  return static_cast<double>(values[std::min(index, values.size() - 1)]);
}

}  // namespace

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

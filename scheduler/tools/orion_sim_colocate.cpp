// orion-sim colocate (issue 25): a pipeline stage and a best-effort job, each in its own process,
// on one simulated GPU. Rows: time slicing (no MPS) or MPS, and the job unmanaged, behind MPS
// client priority, or gated by the gpud policy (the shim's ORION_POLICY=gpud, the same
// gpud::admit) into the windows the pipeline publishes, per in-flight budget.
//
// The pipeline publishes as gpipe_runner's BubblePublisher does: step k's windows are the gaps
// between step k-1's compute spans (its forward / backward requests), shifted to step k's start;
// step 0 publishes nothing. While the pipeline runs its heartbeat is fresh and the grant, a live
// lease, is gated; once it is done the grant is free and the job runs freely, as the daemon frees
// it (a job that sees the heartbeat gone under a gated grant holds until then).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <sstream>
#include <stdexcept>

#include "orion_sim.h"
#include "scheduler/gpud_policy.h"
#include "scheduler/profile_store.h"

namespace orion_sim {
namespace {

using sched::Completion;
using sched::StreamClass;

struct Interval {
  int64_t begin = 0, end = 0;
};

// Sorted, merged union of intervals.
std::vector<Interval> merged(std::vector<Interval> spans) {
  std::sort(spans.begin(), spans.end(), [](const Interval& a, const Interval& b) { return a.begin < b.begin; });
  std::vector<Interval> out;
  for (const Interval& s : spans) {
    if (s.end <= s.begin) continue;
    if (!out.empty() && s.begin <= out.back().end) {
      out.back().end = std::max(out.back().end, s.end);
    } else {
      out.push_back(s);
    }
  }
  return out;
}

int64_t covered(const std::vector<Interval>& u, int64_t lo, int64_t hi) {
  int64_t total = 0;
  for (const Interval& s : u) total += std::max<int64_t>(0, std::min(s.end, hi) - std::max(s.begin, lo));
  return total;
}

// |a \ b| within [lo, hi): both sorted and merged.
int64_t covered_outside(const std::vector<Interval>& a, const std::vector<Interval>& b, int64_t lo, int64_t hi) {
  int64_t total = 0;
  for (const Interval& s : a) {
    const int64_t x0 = std::max(s.begin, lo), x1 = std::min(s.end, hi);
    if (x1 <= x0) continue;
    total += (x1 - x0) - covered(b, x0, x1);
  }
  return total;
}

std::vector<Interval> kernel_spans(const sched::ProcessResult& p) {
  std::vector<Interval> spans;
  for (const Completion& c : p.completions) {
    if (c.kind == sched::OpKind::kKernel) spans.push_back({c.start_ns, c.end_ns});
  }
  return merged(std::move(spans));
}

int step_of(const std::string& request) {
  const auto at = request.rfind('@');
  return at == std::string::npos ? 0 : std::stoi(request.substr(at + 1));
}

bool is_compute(StreamClass cls) { return cls == StreamClass::kHighPriority || cls == StreamClass::kBestEffort; }

// The pipeline process's side: learns step starts and compute spans from its requests, and
// publishes each step's windows from the step before (gpipe_runner's BubblePublisher).
class BubblePublisherModel {
 public:
  BubblePublisherModel(std::string last_request, int64_t step_gap_ns, int64_t min_window_ns, size_t requests)
      : last_(std::move(last_request)), gap_(step_gap_ns), min_window_(min_window_ns), requests_left_(requests) {
    starts_.push_back(0);
  }

  void on_request(const sched::RequestResult& r, bool done) {
    if (!done) {
      // An action starts: a window open now closes now (BubblePublisher::demand()).
      if (!is_compute(r.cls)) return;
      for (Interval& w : current_) {
        if (w.begin <= r.arrival_ns && r.arrival_ns < w.end) {
          w.end = r.arrival_ns;
          ++cut_;
        }
      }
      return;
    }
    --requests_left_;
    const int k = step_of(r.request);
    if (is_compute(r.cls)) spans_[k].push_back({r.first_start_ns < 0 ? r.arrival_ns : r.first_start_ns, r.done_ns});
    const auto at = r.request.rfind('@');
    if (r.request.substr(0, at) == last_ && k + 1 == static_cast<int>(starts_.size())) {
      starts_.push_back(r.done_ns + gap_);  // step k+1 begins
      publish(k + 1);
    }
  }

  // The page as a best-effort process reads it at `now`: the current or next window of the
  // latest published step.
  gpud::WindowView window(int64_t now) const {
    gpud::WindowView v;
    v.heartbeat_ns = requests_left_ > 0 ? now + 1 : 0;  // 0 means "no pipeline"
    v.windows_published = published_;
    for (const Interval& w : current_) {
      if (w.end > now) {
        v.open_ns = w.begin;
        v.close_ns = w.end;
        break;
      }
    }
    return v;
  }
  int64_t next_open(int64_t now) const {
    for (const Interval& w : current_) {
      if (w.begin > now) return w.begin;
    }
    return -1;
  }
  uint64_t windows_cut() const { return cut_; }
  uint64_t windows_published() const { return published_; }
  int64_t step_start(int k) const { return k < static_cast<int>(starts_.size()) ? starts_[static_cast<size_t>(k)] : -1; }

 private:
  void publish(int k) {
    const int64_t prev = starts_[static_cast<size_t>(k - 1)], start = starts_[static_cast<size_t>(k)];
    std::vector<Interval> busy = merged(spans_[k - 1]);
    current_.clear();
    int64_t t = prev;
    for (const Interval& b : busy) {
      if (b.begin - t >= min_window_) current_.push_back({start + (t - prev), start + (b.begin - prev)});
      t = std::max(t, b.end);
    }
    if (start - t >= min_window_) current_.push_back({start + (t - prev), start + (start - prev)});
    published_ += current_.size();
  }

  std::string last_;
  int64_t gap_, min_window_;
  size_t requests_left_;
  std::vector<int64_t> starts_;
  std::map<int, std::vector<Interval>> spans_;
  std::vector<Interval> current_;
  uint64_t published_ = 0;
  uint64_t cut_ = 0;
};

struct Measured {
  double span_ns = 0, idle_ns = 0, job_only_ns = 0, job_kernels_per_s = 0, pipeline_p99_ns = 0;
  uint64_t switches = 0;
};

double compute_p99(const sched::ReplayResult& r) {
  std::vector<int64_t> v;
  for (const sched::RequestResult& q : r.requests) {
    if (is_compute(q.cls)) v.push_back(q.execution_ns());
  }
  return sched::percentile(std::move(v), 99);
}

// Steps 1.. of the pipeline (from step 1's start to its last completion).
Measured measure(const sched::ColocatedResult& run, int64_t step1_start, const sched::ProcessResult* job) {
  const sched::ProcessResult& pipe = run.processes.front();
  Measured m;
  const int64_t end = pipe.replay.makespan_ns;
  m.span_ns = static_cast<double>(end - step1_start);
  const std::vector<Interval> busy = kernel_spans(pipe);
  m.idle_ns = m.span_ns - static_cast<double>(covered(busy, step1_start, end));
  m.pipeline_p99_ns = compute_p99(pipe.replay);
  m.switches = run.context_switches;
  if (job != nullptr) {
    m.job_only_ns = static_cast<double>(covered_outside(kernel_spans(*job), busy, step1_start, end));
    uint64_t kernels = 0;
    for (const Completion& c : job->completions) {
      if (c.kind == sched::OpKind::kKernel && c.end_ns > step1_start && c.end_ns <= end) ++kernels;
    }
    m.job_kernels_per_s = static_cast<double>(kernels) * 1e9 / m.span_ns;
  }
  return m;
}

std::string last_request_of(const sched::Workload& pipeline, const sched::SimGpuConfig& gpu) {
  sched::ReplayOptions o;
  o.gpu = gpu;
  const sched::ReplayResult alone = sched::replay_workload(pipeline, o);
  if (alone.requests.empty()) throw std::invalid_argument(pipeline.source + ": the pipeline workload has no requests");
  return std::max_element(alone.requests.begin(), alone.requests.end(),
                          [](const auto& a, const auto& b) { return a.done_ns < b.done_ns; })
      ->request;
}

}  // namespace

sched::Workload repeat_steps(const sched::Workload& w, int steps, int64_t step_gap_ns, const std::string& last_request) {
  if (steps < 1) throw std::invalid_argument("repeat_steps: steps must be >= 1");
  sched::Workload out;
  out.source = w.source;
  for (int k = 0; k < steps; ++k) {
    const std::string suffix = "@" + std::to_string(k);
    for (const sched::WorkloadOp& op : w.ops) {
      sched::WorkloadOp o = op;
      o.request = op.request + suffix;
      if (!op.after_request.empty()) {
        o.after_request = op.after_request + suffix;
      } else if (k > 0) {
        o.after_request = last_request + "@" + std::to_string(k - 1);
        o.after_ns = op.arrival_ns + step_gap_ns;
      }
      out.ops.push_back(std::move(o));
    }
  }
  return out;
}

ColocateStudy run_colocation(const sched::Workload& pipeline_step, const sched::Workload& job,
                             const ColocateOptions& options) {
  if (options.steps < 2) throw std::invalid_argument("colocate: --steps must be >= 2 (step 0 publishes no window)");
  for (const sched::WorkloadOp& op : job.ops) {
    if (op.cls != StreamClass::kBestEffort) {
      throw std::invalid_argument(job.source + ":" + std::to_string(op.line) +
                                  ": the job's streams must be best_effort (the gpud policy gates best-effort work)");
    }
  }
  const std::string last = last_request_of(pipeline_step, options.gpu);
  const int64_t gap_ns = static_cast<int64_t>(options.step_gap_us * 1e3);
  const sched::Workload pipeline = repeat_steps(pipeline_step, options.steps, gap_ns, last);
  size_t pipeline_requests = sched::request_graph(pipeline).requests.size();

  ColocateStudy study;
  study.pipeline_source = pipeline_step.source;
  study.job_source = job.source;
  // The job alone: its throughput, and its kernels' durations (the offline profile its gated runs
  // start from: a kernel of unknown length is admitted only into a long window).
  sched::ProcessSpec job_spec;
  job_spec.name = "job";
  job_spec.workload = &job;
  job_spec.hw_priority = sched::HwPriority::kNone;
  const sched::ColocatedResult job_alone = sched::replay_processes({job_spec}, options.gpu);
  {
    uint64_t kernels = 0;
    for (const Completion& c : job_alone.processes[0].completions) kernels += c.kind == sched::OpKind::kKernel;
    const int64_t makespan = job_alone.processes[0].replay.makespan_ns;
    study.job_alone_kernels_per_s = makespan > 0 ? static_cast<double>(kernels) * 1e9 / static_cast<double>(makespan) : 0;
  }
  const std::vector<Completion>& profiled = job_alone.processes[0].completions;
  auto seed = [&profiled](sched::ProfileStore& store) {
    for (const Completion& c : profiled) {
      if (c.kind == sched::OpKind::kKernel) store.record_completion(c.kernel, c.start_ns, c.end_ns);
    }
  };

  // One co-located (or alone) run: the pipeline first, the job second when given.
  auto run = [&](sched::ContextSharing sharing, sched::HwPriority pipe_priority, double budget_us,
                 bool with_job, bool gated, int64_t* step1_start, uint64_t* windows = nullptr,
                 uint64_t* windows_cut = nullptr) {
    sched::SimGpuConfig gpu = options.gpu;
    gpu.context_sharing = sharing;
    auto publisher = std::make_shared<BubblePublisherModel>(last, gap_ns,
                                                            static_cast<int64_t>(options.min_window_us * 1e3),
                                                            pipeline_requests);
    std::vector<sched::ProcessSpec> specs(with_job ? 2 : 1);
    specs[0].name = "pipeline";
    specs[0].workload = &pipeline;
    specs[0].hw_priority = pipe_priority;
    specs[0].on_request = [publisher](const sched::RequestResult& r, bool done) { publisher->on_request(r, done); };
    if (with_job) {
      specs[1].name = "job";
      specs[1].workload = &job;
      specs[1].hw_priority = sched::HwPriority::kNone;
      specs[1].seed_profiles = seed;
      if (gated) {
        gpud::AdmissionConfig config;
        config.guard_ns = static_cast<int64_t>(options.guard_us * 1e3);
        const int64_t budget_ns = static_cast<int64_t>(budget_us * 1e3);
        specs[1].make_custom_policy = [publisher, config, budget_ns](sched::Device& device) {
          sched::GpudSource source;
          source.now_ns = [&device] { return device.now_ns(); };
          source.window = [publisher](int64_t now) { return publisher->window(now); };
          source.grant = [publisher, budget_ns](int64_t now) {
            gpud::GrantView g;
            g.mode = publisher->window(now).heartbeat_ns > 0 ? gpud::GrantMode::kGated : gpud::GrantMode::kFree;
            g.epoch = 1;
            g.lease_expiry_ns = std::numeric_limits<int64_t>::max();
            g.inflight_budget_ns = budget_ns;
            return g;
          };
          return sched::make_gpud_policy(std::move(source), config);
        };
        specs[1].next_wakeup_ns = [publisher](int64_t now) { return publisher->next_open(now); };
      }
    }
    sched::ColocatedResult result = sched::replay_processes(specs, gpu);
    *step1_start = publisher->step_start(1);
    if (windows != nullptr) *windows = publisher->windows_published();
    if (windows_cut != nullptr) *windows_cut = publisher->windows_cut();
    return result;
  };

  int64_t s1 = 0;
  const sched::ColocatedResult alone = run(sched::ContextSharing::kMps, sched::HwPriority::kNone, 0, false, false, &s1);
  const Measured base = measure(alone, s1, nullptr);
  study.pipeline_span_us = base.span_ns / 1e3;
  study.pipeline_idle_us = base.idle_ns / 1e3;

  auto add_row = [&](const char* sharing_name, sched::ContextSharing sharing, const char* management,
                     sched::HwPriority pipe_priority, bool gated, double budget_us) {
    int64_t start = 0;
    uint64_t windows = 0, cut = 0;
    const sched::ColocatedResult r = run(sharing, pipe_priority, budget_us, true, gated, &start, &windows, &cut);
    if (start < 0) throw std::logic_error("colocate: the pipeline never reached step 1");
    const Measured m = measure(r, start, &r.processes[1]);
    ColocateRow row;
    row.sharing = sharing_name;
    row.management = management;
    row.budget_us = budget_us;
    row.step_ratio = m.span_ns / base.span_ns;
    row.bubble_used = base.idle_ns > 0 ? m.job_only_ns / base.idle_ns : 0;
    row.job_ratio = study.job_alone_kernels_per_s > 0 ? m.job_kernels_per_s / study.job_alone_kernels_per_s : 0;
    row.pipeline_p99_ratio = base.pipeline_p99_ns > 0 ? m.pipeline_p99_ns / base.pipeline_p99_ns : 0;
    row.context_switches = m.switches;
    row.windows = gated ? windows : 0;
    row.windows_cut = gated ? cut : 0;
    row.meets_goals = row.step_ratio <= 1.02 && row.bubble_used >= 0.50;
    study.rows.push_back(row);
  };
  using sched::ContextSharing;
  using sched::HwPriority;
  add_row("time-slice", ContextSharing::kTimeSlice, "unmanaged", HwPriority::kNone, false, 0);
  for (double b : options.budgets_us) add_row("time-slice", ContextSharing::kTimeSlice, "gpud", HwPriority::kNone, true, b);
  add_row("mps", ContextSharing::kMps, "unmanaged", HwPriority::kNone, false, 0);
  add_row("mps", ContextSharing::kMps, "client priority", HwPriority::kAllStreams, false, 0);
  for (double b : options.budgets_us) add_row("mps", ContextSharing::kMps, "gpud", HwPriority::kAllStreams, true, b);
  return study;
}

int job_iterations_to_outlast(const sched::Workload& pipeline_step, const TrainingJobSpec& spec,
                              const ColocateOptions& options) {
  sched::ReplayOptions o;
  o.gpu = options.gpu;
  const double step_ns = static_cast<double>(sched::replay_workload(pipeline_step, o).makespan_ns) + options.step_gap_us * 1e3;
  TrainingJobSpec one = spec;
  one.iterations = 2;
  std::stringstream text;
  write_training_job(text, one, "sizing");
  const double two_ns = static_cast<double>(sched::replay_workload(sched::parse_workload(text, "sizing"), o).makespan_ns);
  const double iteration_ns = std::max(1.0, two_ns / 2);
  return std::max(2, static_cast<int>(std::ceil(1.1 * step_ns * options.steps / iteration_ns)));
}

std::string format_colocation(const ColocateStudy& s) {
  std::ostringstream out;
  char line[512];
  std::snprintf(line, sizeof line,
                "pipeline %s, steps 1.. alone: %.0f us, of which %.0f us (%.1f%%) with no pipeline kernel running\n"
                "job %s alone: %.0f kernels/s\n\n",
                s.pipeline_source.c_str(), s.pipeline_span_us, s.pipeline_idle_us,
                s.pipeline_span_us > 0 ? 100.0 * s.pipeline_idle_us / s.pipeline_span_us : 0.0, s.job_source.c_str(),
                s.job_alone_kernels_per_s);
  out << line;
  out << "| GPU sharing | job | in-flight budget | pipeline time / alone | bubble used by the job | job throughput / alone "
         "| pipeline p99 / alone | context switches | windows (cut by demand) | goals |\n"
         "|---|---|---:|---:|---:|---:|---:|---:|---:|---|\n";
  for (const ColocateRow& r : s.rows) {
    std::string budget = r.management == "gpud" ? std::to_string(static_cast<int>(r.budget_us)) + " us" : "-";
    const std::string windows = r.management == "gpud" ? std::to_string(r.windows) + " (" + std::to_string(r.windows_cut) + ")" : "-";
    std::snprintf(line, sizeof line, "| %s | %s | %s | %.3fx | %.1f%% | %.3fx | %.2fx | %llu | %s | %s |\n",
                  r.sharing.c_str(), r.management.c_str(), budget.c_str(), r.step_ratio, 100.0 * r.bubble_used,
                  r.job_ratio, r.pipeline_p99_ratio, static_cast<unsigned long long>(r.context_switches),
                  windows.c_str(), r.meets_goals ? "met" : "-");
    out << line;
  }
  out << "\nGoals (issue 25): pipeline time <= 1.02x alone and >= 50% of its idle time used by the job. "
         "'bubble used' over 100% means the job also took time the pipeline needed (it ran slower).\n";
  return out.str();
}

std::string colocation_csv(const ColocateStudy& s) {
  std::ostringstream out;
  out << "sharing,management,budget_us,step_ratio,bubble_used,job_ratio,pipeline_p99_ratio,context_switches,meets_goals\n";
  for (const ColocateRow& r : s.rows) {
    out << r.sharing << "," << r.management << "," << r.budget_us << "," << r.step_ratio << "," << r.bubble_used << ","
        << r.job_ratio << "," << r.pipeline_p99_ratio << "," << r.context_switches << "," << (r.meets_goals ? 1 : 0)
        << "\n";
  }
  return out.str();
}

}  // namespace orion_sim

// The study: each client alone for reference, then the whole workload under each policy.
#include <cstdio>
#include <sstream>

#include "orion_sim.h"

namespace orion_sim {

using sched::ReplayOptions;
using sched::ReplayResult;
using sched::StreamClass;

namespace {

StudyRow summarise(const ReplayResult& r) {
  StudyRow row;
  row.policy = r.policy;
  row.hp_p50_ns = sched::latency_percentile_ns(r, StreamClass::kHighPriority, 50);
  row.hp_p99_ns = sched::latency_percentile_ns(r, StreamClass::kHighPriority, 99);
  row.hp_exec_p99_ns = sched::execution_percentile_ns(r, StreamClass::kHighPriority, 99);
  row.be_per_s = sched::requests_per_second(r, StreamClass::kBestEffort);
  row.makespan_ns = r.makespan_ns;
  row.sm_utilisation = r.sm_utilisation;
  row.forced_by_starvation = r.forced_by_starvation;
  return row;
}

std::string ratio(double value, double reference) {
  char buf[64];
  if (reference <= 0) {
    std::snprintf(buf, sizeof buf, "%.3f", value);
  } else {
    std::snprintf(buf, sizeof buf, "%.3f (%.2fx)", value, value / reference);
  }
  return buf;
}

}  // namespace

sched::PolicyParams params_for(const std::string& policy, const sched::PolicyParams& params) {
  sched::PolicyParams out;
  for (const auto& [key, value] : params) {
    const size_t dot = key.find('.');
    if (dot == std::string::npos) {
      if (policy == "orion") out[key] = value;  // unqualified: orion's (the first policy with any)
    } else if (key.substr(0, dot) == policy) {
      out[key.substr(dot + 1)] = value;
    }
  }
  return out;
}

StudyRow run_alone(const sched::Workload& workload, const StudyOptions& options) {
  ReplayOptions base;
  base.gpu = options.gpu;
  base.be_max_wait_ns = options.be_max_wait_ns;
  // Every client on its own GPU, nothing to schedule around (passthrough, no parameters).
  ReplayResult alone;
  StudyRow row;
  for (const std::string& client : workload.clients()) {
    ReplayOptions o = base;
    o.policy = "passthrough";
    ReplayResult r = sched::replay_workload(workload.only_client(client), o);
    alone.requests.insert(alone.requests.end(), r.requests.begin(), r.requests.end());
    row.be_per_s += sched::requests_per_second(r, StreamClass::kBestEffort);
  }
  row.policy = "alone";
  row.hp_p50_ns = sched::latency_percentile_ns(alone, StreamClass::kHighPriority, 50);
  row.hp_p99_ns = sched::latency_percentile_ns(alone, StreamClass::kHighPriority, 99);
  row.hp_exec_p99_ns = sched::execution_percentile_ns(alone, StreamClass::kHighPriority, 99);
  return row;
}

StudyRow run_point(const sched::Workload& workload, const StudyOptions& options, const std::string& policy,
                   const sched::PolicyParams& params, const std::string& trace_path) {
  ReplayOptions o;
  o.gpu = options.gpu;
  o.be_max_wait_ns = options.be_max_wait_ns;
  o.policy = policy;
  o.policy_params = params;
  o.force_hw_priority_on = options.hw_priority == "on";
  o.force_hw_priority_off = options.hw_priority == "off";
  o.trace_path = trace_path;
  return summarise(sched::replay_workload(workload, o));
}

Study run_study(const sched::Workload& workload, const StudyOptions& options) {
  Study study;
  study.alone = run_alone(workload, options);
  std::vector<std::string> policies = options.policies.empty() ? sched::policy_names() : options.policies;
  for (const std::string& policy : policies) {
    const std::string trace = options.trace_dir.empty() ? "" : options.trace_dir + "/" + policy + ".trace.json";
    study.rows.push_back(run_point(workload, options, policy, params_for(policy, options.params), trace));
  }
  return study;
}

std::string format_study(const Study& s) {
  std::ostringstream out;
  char buf[128];
  std::snprintf(buf, sizeof buf, "alone: HP p50 %.3f ms, HP p99 %.3f ms, BE %.2f requests/s\n\n",
                s.alone.hp_p50_ns / 1e6, s.alone.hp_p99_ns / 1e6, s.alone.be_per_s);
  out << buf;
  out << "| policy | HP p50 ms (/ alone) | HP p99 ms (/ alone) | HP exec p99 ms (/ alone) | BE req/s (/ alone) |"
         " makespan ms | SM util | BE forced |\n";
  out << "|---|---|---|---|---|---|---|---|\n";
  for (const StudyRow& r : s.rows) {
    std::snprintf(buf, sizeof buf, "%.2f | %.1f%% | %llu |", static_cast<double>(r.makespan_ns) / 1e6,
                  r.sm_utilisation * 100.0, static_cast<unsigned long long>(r.forced_by_starvation));
    out << "| " << r.policy << " | " << ratio(r.hp_p50_ns / 1e6, s.alone.hp_p50_ns / 1e6) << " | "
        << ratio(r.hp_p99_ns / 1e6, s.alone.hp_p99_ns / 1e6) << " | "
        << ratio(r.hp_exec_p99_ns / 1e6, s.alone.hp_exec_p99_ns / 1e6) << " | " << ratio(r.be_per_s, s.alone.be_per_s)
        << " | " << buf << "\n";
  }
  return out.str();
}

}  // namespace orion_sim

// The study's rows, the simulated runs behind them, and the tables (shared by orion-sim and
// orion-replay-gpu).
#include "study.h"

#include <cmath>
#include <cstdio>
#include <sstream>

namespace orion_sim {

using sched::ReplayOptions;
using sched::ReplayResult;
using sched::StreamClass;

namespace {

std::string ratio(double value, double reference) {
  char buf[64];
  if (reference <= 0) {
    std::snprintf(buf, sizeof buf, "%.3f", value);
  } else {
    std::snprintf(buf, sizeof buf, "%.3f (%.2fx)", value, value / reference);
  }
  return buf;
}

// "measured / predicted (+12.3%)"; the error is n/a when the prediction is 0.
std::string versus(double measured, double predicted, const char* unit_format) {
  char m[48], p[48], buf[160];
  std::snprintf(m, sizeof m, unit_format, measured);
  std::snprintf(p, sizeof p, unit_format, predicted);
  if (predicted == 0) {
    std::snprintf(buf, sizeof buf, "%s / %s (n/a)", m, p);
  } else {
    std::snprintf(buf, sizeof buf, "%s / %s (%+.1f%%)", m, p, (measured - predicted) / predicted * 100.0);
  }
  return buf;
}

}  // namespace

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
  row.start_be_sms = r.start_be_sms;
  row.final_be_sms = r.final_be_sms;
  row.partition_resizes = r.partition_resizes;
  row.mean_be_sms = r.mean_be_sms;
  return row;
}

StudyRow alone_row(const std::vector<ReplayResult>& per_client) {
  ReplayResult alone;
  StudyRow row;
  for (const ReplayResult& r : per_client) {
    alone.requests.insert(alone.requests.end(), r.requests.begin(), r.requests.end());
    row.be_per_s += sched::requests_per_second(r, StreamClass::kBestEffort);
  }
  row.policy = "alone";
  row.hp_p50_ns = sched::latency_percentile_ns(alone, StreamClass::kHighPriority, 50);
  row.hp_p99_ns = sched::latency_percentile_ns(alone, StreamClass::kHighPriority, 99);
  row.hp_exec_p99_ns = sched::execution_percentile_ns(alone, StreamClass::kHighPriority, 99);
  return row;
}

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
  std::vector<ReplayResult> per_client;
  for (const std::string& client : workload.clients()) {
    ReplayOptions o = base;
    o.policy = "passthrough";
    per_client.push_back(sched::replay_workload(workload.only_client(client), o));
  }
  return alone_row(per_client);
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
    char util[32];
    if (r.sm_utilisation < 0) {
      std::snprintf(util, sizeof util, "n/a");
    } else {
      std::snprintf(util, sizeof util, "%.1f%%", r.sm_utilisation * 100.0);
    }
    std::snprintf(buf, sizeof buf, "%.2f | %s | %llu |", static_cast<double>(r.makespan_ns) / 1e6, util,
                  static_cast<unsigned long long>(r.forced_by_starvation));
    out << "| " << r.policy << " | " << ratio(r.hp_p50_ns / 1e6, s.alone.hp_p50_ns / 1e6) << " | "
        << ratio(r.hp_p99_ns / 1e6, s.alone.hp_p99_ns / 1e6) << " | "
        << ratio(r.hp_exec_p99_ns / 1e6, s.alone.hp_exec_p99_ns / 1e6) << " | " << ratio(r.be_per_s, s.alone.be_per_s)
        << " | " << buf << "\n";
  }
  for (const StudyRow& r : s.rows) {
    if (r.start_be_sms <= 0) continue;
    std::snprintf(buf, sizeof buf, "%s: best-effort partition %d -> %d SMs, time-weighted mean %.1f, %llu resizes\n",
                  r.policy.c_str(), r.start_be_sms, r.final_be_sms, r.mean_be_sms,
                  static_cast<unsigned long long>(r.partition_resizes));
    out << buf;
  }
  return out.str();
}

std::string format_prediction(const Study& measured, const Study& predicted) {
  std::ostringstream out;
  out << "| run | HP p50 ms measured / simulated (error) | HP p99 ms | HP exec p99 ms | BE req/s | makespan ms |\n";
  out << "|---|---|---|---|---|---|\n";
  auto line = [&](const StudyRow& m, const StudyRow& p) {
    out << "| " << m.policy << " | " << versus(m.hp_p50_ns / 1e6, p.hp_p50_ns / 1e6, "%.3f") << " | "
        << versus(m.hp_p99_ns / 1e6, p.hp_p99_ns / 1e6, "%.3f") << " | "
        << versus(m.hp_exec_p99_ns / 1e6, p.hp_exec_p99_ns / 1e6, "%.3f") << " | "
        << versus(m.be_per_s, p.be_per_s, "%.2f") << " | ";
    if (m.policy == "alone") {
      out << "- |\n";  // the alone runs have no common makespan
    } else {
      out << versus(static_cast<double>(m.makespan_ns) / 1e6, static_cast<double>(p.makespan_ns) / 1e6, "%.2f")
          << " |\n";
    }
  };
  line(measured.alone, predicted.alone);
  for (size_t i = 0; i < measured.rows.size() && i < predicted.rows.size(); ++i) line(measured.rows[i], predicted.rows[i]);
  return out.str();
}

}  // namespace orion_sim

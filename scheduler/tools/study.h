// The study both orion-sim (simulated GPU) and orion-replay-gpu (a real GPU) print: each client run
// alone for reference, then one row per policy (HP latency percentiles and BE throughput relative
// to alone). Rows are made from sched::ReplayResult, whoever produced it, so the two tools print
// the same table from the same results.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "scheduler/workload.h"

namespace orion_sim {

struct StudyOptions {
  std::vector<std::string> policies;  // empty: all
  sched::PolicyParams params;
  sched::SimGpuConfig gpu;
  std::string trace_dir;              // empty: no traces
  int64_t be_max_wait_ns = 2'000'000;
  std::string hw_priority = "auto";   // auto (per policy) | on | off: HP streams' hardware priority
};

struct StudyRow {
  std::string policy;
  double hp_p50_ns = 0, hp_p99_ns = 0, be_per_s = 0;
  double hp_exec_p99_ns = 0;  // HP requests' time on the device (first start to done)
  int64_t makespan_ns = 0;
  double sm_utilisation = 0;  // negative: not measured (printed n/a)
  uint64_t forced_by_starvation = 0;
  // Best-effort SM partition (partition policies; 0 otherwise): size at start and end, how often
  // it was resized, time-weighted mean (sched::ReplayResult).
  int start_be_sms = 0, final_be_sms = 0;
  uint64_t partition_resizes = 0;
  double mean_be_sms = 0;
};

struct Study {
  StudyRow alone;  // HP latencies / BE throughput of each client run alone (policy passthrough)
  std::vector<StudyRow> rows;
};

// One run's row (named after result.policy).
StudyRow summarise(const sched::ReplayResult& result);
// The reference row from each client's own run: HP percentiles over all their requests, BE
// throughput summed over clients.
StudyRow alone_row(const std::vector<sched::ReplayResult>& per_client);

// Simulated: each client alone (passthrough on its own GPU), the reference of every ratio.
StudyRow run_alone(const sched::Workload& workload, const StudyOptions& options);
// Simulated: the whole workload under one policy with these parameters.
StudyRow run_point(const sched::Workload& workload, const StudyOptions& options, const std::string& policy,
                   const sched::PolicyParams& params, const std::string& trace_path = "");
// --param KEY=VALUE: "policy.key" goes to that policy, an unqualified key to orion.
sched::PolicyParams params_for(const std::string& policy, const sched::PolicyParams& params);

// Markdown table: policy | HP p50 / alone | HP p99 / alone | HP exec p99 / alone |
// BE throughput / alone | makespan | SM util | BE ops forced by the starvation bound.
std::string format_study(const Study& study);
// Measured against predicted, row by row (rows matched by position, alone first): each metric as
// "measured / predicted (error)" with error = (measured - predicted) / predicted.
std::string format_prediction(const Study& measured, const Study& predicted);

}  // namespace orion_sim

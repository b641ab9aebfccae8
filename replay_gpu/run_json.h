// What one replay process measured (a child of `orion-replay-gpu --policies ...`), as JSON: the
// child writes it to the file the parent names, the parent reads it back. Pure C++ (no CUDA).
#pragma once

#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "scheduler/workload.h"

namespace replay_gpu {

struct GpuDescription {
  std::string name;
  int sm_count = 0;
  int cc_major = 0, cc_minor = 0;
  int clock_khz = 0;
  int driver_version = 0;
};

struct ChildResult {
  std::string label;                     // run name: "no-shim" or the policy
  std::string policy;                    // the shim's policy ("" without the shim)
  bool shim_loaded = false;              // libgpu_scheduler.so was in the process
  bool shim_active = false;              // and scheduling (USE_ORION_SCHEDULER=1)
  GpuDescription gpu;
  double h2d_gbps = 0;                   // measured host-to-device copy rate (0: not measured)
  double copy_scale = 1;                 // copy bytes launched per byte in the file
  std::string timer;                     // globaltimer | clock64
  std::vector<sched::ReplayResult> alone;  // one per client, when asked
  sched::ReplayResult together;          // the whole workload
  double issue_lag_p99_us = 0, issue_lag_max_us = 0;  // together: issue time minus due time
};

nlohmann::json to_json(const sched::ReplayResult& result);
sched::ReplayResult replay_result_from_json(const nlohmann::json& j);
nlohmann::json to_json(const ChildResult& result);
// Throws std::runtime_error naming the missing or mistyped field.
ChildResult child_result_from_json(const nlohmann::json& j);

void write_child_result(const std::string& path, const ChildResult& result);  // throws on I/O errors
ChildResult read_child_result(const std::string& path);                      // throws, naming the file

}  // namespace replay_gpu

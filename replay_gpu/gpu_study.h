// The parent side of `orion-replay-gpu --policies ...`: one child process per run (no shim, then
// each policy under the shim), their results put together into the study orion-sim prints, the
// simulator's prediction for the same runs, and the JSON of it all. No CUDA here.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "run_json.h"
#include "scheduler/workload.h"
#include "study.h"

namespace replay_gpu {

inline constexpr const char* kNoShimLabel = "no-shim";

struct RunSpec {
  std::string label;   // row name
  std::string policy;  // shim policy; for the no-shim run, the simulator's stand-in (passthrough)
  bool shim = false;
  bool alone = false;  // also measure every client alone (the reference of the ratios)
};
// The no-shim run (which measures the clients alone too), then one run per policy under the shim.
std::vector<RunSpec> run_specs(const std::vector<std::string>& policies);

struct StudyConfig {
  std::string workload_path;
  std::string shim_path;             // required when a spec has shim
  sched::PolicyParams params;        // --param: "policy.key" or an unqualified (orion) key
  int64_t be_max_wait_ns = 2'000'000;
  std::vector<std::string> child_args;  // replay options forwarded to every child
  std::string result_dir;            // where children write their JSON
};

// The environment changes for one run: the shim preloaded and configured, or all of it removed.
std::map<std::string, std::optional<std::string>> child_environment(const RunSpec& spec, const StudyConfig& config);
// The child's command line.
std::vector<std::string> child_command(const RunSpec& spec, const StudyConfig& config, const std::string& output);

// Exit status of a child that found no GPU (NoGpuError): the parent reports it as such.
inline constexpr int kExitNoGpu = 3;

// Runs every spec in its own process, in order. Throws std::runtime_error naming the run that
// failed (its own message is on stderr above).
std::vector<ChildResult> run_children(const std::vector<RunSpec>& specs, const StudyConfig& config);

// The measured study: alone from the run that measured it, a row per run (named by its label).
orion_sim::Study measured_study(const std::vector<ChildResult>& runs);
// What the simulator predicts for the same runs on `gpu` (SM count of the measured GPU): the
// replayer gives high-priority streams the greatest hardware priority in every run, so the
// simulation does too; the no-shim run is simulated as passthrough.
orion_sim::Study predicted_study(const sched::Workload& workload, const std::vector<RunSpec>& specs,
                                 const sched::PolicyParams& params, const sched::SimGpuConfig& gpu,
                                 int64_t be_max_wait_ns);

nlohmann::json study_json(const std::string& workload_path, const std::vector<ChildResult>& runs,
                          const orion_sim::Study& measured, const orion_sim::Study* predicted);

}  // namespace replay_gpu

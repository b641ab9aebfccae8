// `gpipe_runner --plan`: measures the model on this device (DeviceProfile), runs the planner
// (trainer/planner/planner.h), prints its table, writes the pick as YAML, and with --verify K runs
// the top K candidates as real gpipe_runner processes and prints predicted against measured.
#pragma once

#include <iosfwd>
#include <string>
#include <vector>

#include "trainer/cli/cli.h"
#include "trainer/planner/planner.h"
#include "trainer/training/trainer.h"

namespace gpipe {

struct ProfileOptions {
  std::vector<int64_t> microbatch_sizes;  // 1 to 4 distinct sizes to measure at (ascending)
  int warmup_runs = 2;
  int timed_runs = 5;
  double link_gbps = 0;          // > 0: given, not measured
  double link_latency_us = -1;   // >= 0: given
  double memory_budget_gib = 0;  // > 0: per device, instead of the device's memory
};

// Measures every layer of `components.model` (configured, vocab resolved) on the config's device:
// forward, input-gradient and weight-gradient time (medians), activation, deferred-weight-gradient,
// output and workspace bytes (allocation statistics: CUDA's allocator, or the CPU allocation
// counter, which this installs), the optimizer's time per parameter, the in-process transfer
// cost, and how much an overlapped forward and backward pair slows each other. One layer is built
// at a time, so the profile needs one layer's memory, not the model's.
DeviceProfile measure_device_profile(const PipelineConfig& config, const PipelineComponents& components,
                                     const ProfileOptions& options, std::ostream& log);

struct VerifyResult {
  PlanCandidate candidate;
  double predicted_ms = 0, measured_ms = 0;
  double predicted_peak_bytes = 0, measured_peak_bytes = -1;  // measured -1: no allocation statistics
  int exit_code = 0;
  std::string output_dir;
};

// The whole --plan command. Returns the exit code (0 ok, 1 when a --verify run failed; the
// planner's ConfigError is thrown: exit 2). `self_exe` is gpipe_runner's own path, for the
// calibration and --verify runs.
int run_plan_command(PipelineConfig config, const PlanRequest& request, const std::string& self_exe,
                     std::ostream& out);

}  // namespace gpipe

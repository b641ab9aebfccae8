// gpipe_runner's command line (CLI11): the seed's flags plus --set overrides and direct flags for
// the common fields. The library never exits: parse_cli() returns a struct or throws, and
// report_error() maps what it threw to a message and an exit code for main().
#pragma once

#include <iosfwd>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "trainer/config/config.h"
#include "trainer/launch/launcher.h"

namespace gpipe {

// --plan: choose the pipeline configuration from measured costs (trainer/planner/planner.h).
struct PlanRequest {
  bool enabled = false;        // --plan
  std::string output;          // --plan-output FILE; empty: <training.output_dir>/plan.yaml
  int rows = 10;               // --plan-rows N: candidates shown
  int verify = 0;              // --verify K: run the top K for a few steps each, predicted vs measured
  int verify_steps = 6;        // --verify-steps N (the first two are warm-up, not compared)
  int world_size = 0;          // --world-size N: ranks the real run will have; 0: the config's
  double memory_budget_gib = 0;  // --memory-budget-gib X per device; 0: the device's memory
  double link_gbps = 0;          // --link-gbps X between processes / nodes; 0: measured or assumed
  double link_latency_us = -1;   // --link-latency-us X; < 0: measured or assumed
  std::vector<std::string> schedules;  // --plan-schedules a,b: only these; empty: all
  int max_microbatches = 64;           // --plan-max-microbatches N
  // --plan-calibrate 0|1: first run the configuration as given, with the most virtual stages and
  // as 2 replicas (5 steps each), and fit DeviceProfile::sharing_efficiency, handoff_ms and
  // replica_step_ms to them.
  bool calibrate = true;
};

struct RunOptions {
  std::string config_path;             // --config; empty: the built-in defaults (config.h)
  std::vector<std::string> overrides;  // "section.field=value" in the order applied after the file
  // What the user wrote for each override ("--schedule foo"; "" for a --set), which an error names.
  std::vector<std::string> override_flags;
  PipelineConfig config;               // the effective configuration, validated
  bool print_config = false;           // --print-config: print the effective YAML and stop
  bool print_schedule = false;         // --print-schedule: print the step x rank grid and stop
  // --format with --print-schedule: grid (the step x rank grid and metrics), csv (torch's
  // compute_comms CSV: the programs with communication, as executors run them) or
  // csv_compute_only (torch's compute_only CSV).
  std::string print_format = "grid";
  bool validate_only = false;          // --validate-only: check config and schedule, then stop
  bool resume = false;                 // --resume / --resume-from: continue from a checkpoint
  std::string resume_from;             // --resume-from FOLDER; empty: the newest under the checkpoint dir
  PlanRequest plan;
  // --nproc-per-node N (> 0): be the launcher (launcher.h) of N workers instead of training.
  std::optional<LaunchOptions> launch;
};

// The command line is wrong: unknown flag, missing value, malformed --set. Exit code 2.
struct CliError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// --help: not an error; what() is the help text. Exit code 0.
struct CliHelp : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Flags (applied in this order: the file, each --set in order, then the direct flags):
//   --config PATH  --scheduler naive|async_threaded  --set section.field=value (repeatable)
//   --schedule NAME  --microbatches N  --stages N (parallel.model_parallel_size)
//   --virtual-stages N  --steps N (training.max_steps)  --device auto|cpu|cuda  --output-dir DIR
//   --seed N  --dtype auto|fp32|bf16  --partition NAME|"[12,13,13,11]"  --lr X
//   --schedule-file FILE (parallel.schedule_file: a torch-format schedule CSV instead of --schedule)
//   --print-config  --print-schedule [--format grid|csv|csv_compute_only]  --validate-only
//   --resume  --resume-from DIR  --checkpoint-interval N  --checkpoint-dir DIR
//   --transport auto|inprocess|gloo|nccl  --placement "[0,0,1,1]"  --peer-timeout SECONDS
//   --plan [--plan-output FILE --plan-rows N --verify K --verify-steps N --world-size N
//          --memory-budget-gib X --link-gbps X --link-latency-us X --plan-schedules a,b
//          --plan-max-microbatches N]
//   --nproc-per-node N  --nnodes N  --node-rank K  --master-addr HOST  --master-port PORT
// Throws CliHelp, CliError, or ConfigError (bad file, value or combination; exit code 2).
RunOptions parse_cli(int argc, const char* const* argv);
inline RunOptions parse_cli(int argc, char** argv) { return parse_cli(argc, const_cast<const char* const*>(argv)); }

// 0 for CliHelp; 2 for what the user can fix (CliError, ConfigError, std::invalid_argument such
// as an unknown registry name or an impossible schedule shape); 1 for anything else (runtime).
int exit_code_for(const std::exception& e);
// Prints help text to `out`, or one line "gpipe_runner: error: <message>" to `err`; returns
// exit_code_for(e).
int report_error(const std::exception& e, std::ostream& out, std::ostream& err);

// Runs --print-config / --print-schedule / --validate-only when asked, writing to `out`, and
// returns the exit code (0, or 1 when the schedule does not validate); std::nullopt: train.
std::optional<int> run_info_actions(const RunOptions& options, std::ostream& out);

// The --print-schedule text: the validated schedule's step x rank grid, then its simulated
// bubble (next to the (p-1)/(m+p-1) formula) and peak activations per rank. The schedule is
// parallel.schedule_file's when set (ScheduleCsvError if it is not usable), else generated.
std::string schedule_report(const PipelineConfig& config);

}  // namespace gpipe

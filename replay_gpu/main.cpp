// orion-replay-gpu: replays a JSONL workload (the one orion-sim reads, scheduler/workload.h) as
// real CUDA work and prints orion-sim's study table from what it measured.
//
//   orion-replay-gpu WORKLOAD --dry-run [--sms N]          the plan, no CUDA (works without a GPU)
//   orion-replay-gpu WORKLOAD [--policies P,...] [--shim PATH/libgpu_scheduler.so] [--simulate]
//                    [--json PATH] [--param KEY=VALUE]... [--device N] [--timer globaltimer|clock64]
//                    [--copy-rate-gbps X] [--be-max-wait-us US] [--seed N] [--jitter X] [--block-spread X]
//
// A real run starts one child process per run (this executable again): no shim (which also
// measures every client alone), then each policy with LD_PRELOAD=the shim, USE_ORION_SCHEDULER=1,
// ORION_POLICY=policy. Each child writes its measurements as JSON; this process prints the table.
// Exit status: 0 done, 1 error, 2 bad command line (CLI11), 3 no CUDA device.
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <iostream>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "driver.h"
#include "gpu_replayer.h"
#include "gpu_study.h"
#include "plan.h"
#include "scheduler/policy.h"

namespace {

using namespace replay_gpu;

struct Cli {
  std::string workload;
  bool dry_run = false;
  int sms = 132;
  std::vector<std::string> policies;
  std::string shim;
  bool simulate = false;
  std::string json_path;
  std::vector<std::string> params;
  int device = 0;
  std::string timer = "globaltimer";
  double copy_rate_gbps = 25;
  int64_t be_max_wait_us = 2000;  // whole microseconds: the shim's ORION_BE_MAX_WAIT_US is an integer
  sched::SimGpuConfig sim;
  // Child mode (set by the parent).
  std::string child_label, child_output, child_policy;
  bool child_alone = false;
};

int child_main(const Cli& cli, const sched::Workload& workload) {
  const ShimState shim = shim_state();
  if (!cli.child_policy.empty() && !(shim.loaded && shim.active)) {
    std::cerr << "orion-replay-gpu: run " << cli.child_label << ": the shim is " << (shim.loaded ? "loaded but not scheduling" : "not loaded")
              << " (LD_PRELOAD=" << (std::getenv("LD_PRELOAD") ? std::getenv("LD_PRELOAD") : "")
              << "): check the --shim path and that it is libgpu_scheduler.so\n";
    return 1;
  }
  ReplayerOptions options;
  options.device = cli.device;
  options.use_clock64 = cli.timer == "clock64";
  options.copy_rate_gbps = cli.copy_rate_gbps;
  GpuReplayer replayer(workload, options);
  ChildResult c;
  c.label = cli.child_label;
  c.policy = cli.child_policy;
  c.shim_loaded = shim.loaded;
  c.shim_active = shim.active;
  c.gpu = replayer.gpu();
  c.h2d_gbps = replayer.h2d_gbps();
  c.copy_scale = replayer.copy_scale();
  c.timer = cli.timer;
  if (cli.child_alone) {
    for (const std::string& client : workload.clients()) {
      c.alone.push_back(replayer.run(workload.only_client(client), "alone " + client));
    }
  }
  c.together = replayer.run(workload, cli.child_label);
  c.issue_lag_p99_us = replayer.last_issue_lag_p99_us();
  c.issue_lag_max_us = replayer.last_issue_lag_max_us();
  write_child_result(cli.child_output, c);
  return 0;
}

std::string temp_dir() {
  const char* base = std::getenv("TMPDIR");
  std::string pattern = std::string(base && *base ? base : "/tmp") + "/orion-replay-gpu.XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) throw std::runtime_error("cannot create a temporary folder in " + pattern);
  return pattern;
}

int parent_main(const Cli& cli, const sched::Workload& workload) {
  // Fail here, once, rather than in every child: driver, device, launch shapes.
  const DeviceInfo device = probe_device(cli.device);
  make_plan(workload, device.sm_count);

  StudyConfig config;
  config.workload_path = std::filesystem::absolute(cli.workload).string();
  if (!cli.shim.empty()) config.shim_path = std::filesystem::absolute(cli.shim).string();
  for (const std::string& p : cli.params) config.params[p.substr(0, p.find('='))] = p.substr(p.find('=') + 1);
  config.be_max_wait_ns = cli.be_max_wait_us * 1000;
  config.child_args = {"--device", std::to_string(cli.device), "--timer", cli.timer, "--copy-rate-gbps",
                       std::to_string(cli.copy_rate_gbps)};
  config.result_dir = temp_dir();
  const std::vector<RunSpec> specs = run_specs(cli.policies);
  std::vector<ChildResult> runs;
  try {
    runs = run_children(specs, config);
  } catch (...) {
    std::filesystem::remove_all(config.result_dir);
    throw;
  }
  std::filesystem::remove_all(config.result_dir);

  const ChildResult& first = runs.front();
  std::cout << "workload " << cli.workload << ": " << workload.ops.size() << " ops; GPU " << first.gpu.name << " ("
            << first.gpu.sm_count << " SMs, sm_" << first.gpu.cc_major << first.gpu.cc_minor << ", driver "
            << first.gpu.driver_version << "); runs:";
  for (const RunSpec& s : specs) std::cout << " " << s.label;
  if (!config.shim_path.empty()) std::cout << " (shim " << config.shim_path << ")";
  std::cout << "; spin timer " << cli.timer;
  if (first.h2d_gbps > 0) {
    std::printf("; copies: host-to-device %.1f GB/s measured, bytes x %.3f to take bytes / %.1f GB/s", first.h2d_gbps,
                first.copy_scale, cli.copy_rate_gbps);
  }
  std::cout << "\n";
  std::cout.flush();
  const orion_sim::Study measured = measured_study(runs);
  std::cout << orion_sim::format_study(measured);
  std::cout << "issue lag (issue - due) p99 / max us:";
  for (const ChildResult& r : runs) std::printf(" %s %.1f / %.1f;", r.label.c_str(), r.issue_lag_p99_us, r.issue_lag_max_us);
  std::printf("\n");
  std::fflush(stdout);

  orion_sim::Study predicted;
  if (cli.simulate) {
    sched::SimGpuConfig gpu = cli.sim;
    gpu.sm_count = first.gpu.sm_count;
    predicted = predicted_study(workload, specs, config.params, gpu, config.be_max_wait_ns);
    std::printf("\nsimulator prediction (SimulatedGpu: %d SMs, seed %llu, jitter %g, block spread %g; HP streams at high "
                "hardware priority in every run, as the replayer creates them; no-shim simulated as passthrough):\n\n",
                gpu.sm_count, static_cast<unsigned long long>(gpu.seed), gpu.jitter, gpu.block_spread);
    std::fflush(stdout);
    std::cout << orion_sim::format_prediction(measured, predicted);
  }
  if (!cli.json_path.empty()) {
    std::ofstream out(cli.json_path);
    const nlohmann::json j = study_json(cli.workload, runs, measured, cli.simulate ? &predicted : nullptr);
    if (!out || !(out << j.dump(2) << "\n")) {
      std::cerr << "orion-replay-gpu: cannot write " << cli.json_path << " (does its directory exist?)\n";
      return 1;
    }
    std::cout << "json: " << cli.json_path << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"orion-replay-gpu: replay a JSONL workload on a real GPU, measured like orion-sim's study"};
  Cli cli;
  app.add_option("workload", cli.workload, "JSONL workload (format: scheduler/include/scheduler/workload.h)")
      ->required()
      ->check(CLI::ExistingFile);
  app.add_flag("--dry-run", cli.dry_run, "Print the plan (streams, classes, kernels, expected busy time); no CUDA");
  app.add_option("--sms", cli.sms, "--dry-run: SMs to plan for (a real run uses the GPU's)")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--policies", cli.policies, "Shim policies to run, comma-separated (each in its own process)")
      ->delimiter(',')
      ->check(CLI::IsMember(sched::policy_names()));
  app.add_option("--shim", cli.shim, "libgpu_scheduler.so to preload for the policies")->check(CLI::ExistingFile);
  app.add_flag("--simulate", cli.simulate, "Also print the simulator's prediction for every run and its error");
  app.add_option("--json", cli.json_path, "Write every run's measurements (and predictions) as JSON here");
  app.add_option("--param", cli.params, "Policy parameter KEY=VALUE (orion) or POLICY.KEY=VALUE; repeatable");
  app.add_option("--device", cli.device, "CUDA device ordinal")->check(CLI::NonNegativeNumber)->capture_default_str();
  app.add_option("--timer", cli.timer, "Spin on %globaltimer (ns) or clock64 x the SM clock")
      ->check(CLI::IsMember({"globaltimer", "clock64"}))
      ->capture_default_str();
  app.add_option("--copy-rate-gbps", cli.copy_rate_gbps,
                 "Copies take bytes / this many GB/s (scaled by the measured host-to-device rate; the simulator's "
                 "is 25); 0: copy the file's bytes as they are")
      ->check(CLI::Range(0.0, 10000.0))
      ->capture_default_str();
  app.add_option("--be-max-wait-us", cli.be_max_wait_us,
                 "Starvation bound of best-effort heads, whole microseconds (shim and simulator alike)")
      ->check(CLI::Range(int64_t{1}, int64_t{3'600'000'000}))
      ->capture_default_str();
  cli.sim.jitter = 0.05;
  cli.sim.block_spread = 0.2;
  app.add_option("--seed", cli.sim.seed, "--simulate: seed of the simulated GPU's jitter")->capture_default_str();
  app.add_option("--jitter", cli.sim.jitter, "--simulate: relative std-dev of each launch's block time")
      ->check(CLI::Range(0.0, 0.5))
      ->capture_default_str();
  app.add_option("--block-spread", cli.sim.block_spread, "--simulate: block times vary in [1-x, 1+x]")
      ->check(CLI::Range(0.0, 0.9))
      ->capture_default_str();
  const std::string internal = "";  // hidden: the parent's instructions to a child
  app.add_option("--child", cli.child_label, "Run as one child: this run's label")->group(internal);
  app.add_option("--child-output", cli.child_output, "Child: result JSON file")->group(internal);
  app.add_option("--child-policy", cli.child_policy, "Child: the shim policy it must be running under")->group(internal);
  app.add_flag("--child-alone", cli.child_alone, "Child: also measure every client alone")->group(internal);
  CLI11_PARSE(app, argc, argv);

  try {
    for (const std::string& p : cli.params) {
      if (p.find('=') == std::string::npos || p.front() == '=') {
        std::cerr << "orion-replay-gpu: --param '" << p << "' is not KEY=VALUE (see orion-sim --list-params)\n";
        return 2;
      }
    }
    // Every policy's parameters are checked here, as orion-sim checks them, before any GPU work
    // (gpud's need a running daemon to check: its child reports them).
    sched::PolicyParams params;
    for (const std::string& p : cli.params) params[p.substr(0, p.find('='))] = p.substr(p.find('=') + 1);
    for (const std::string& policy : cli.policies) {
      if (policy == "gpud") continue;
      try {
        (void)sched::make_policy(policy, orion_sim::params_for(policy, params));
      } catch (const std::invalid_argument& e) {
        std::cerr << "orion-replay-gpu: --policies " << policy << ": " << e.what() << "\n";
        return 2;
      }
    }
    if (!cli.policies.empty() && cli.shim.empty() && cli.child_label.empty() && !cli.dry_run) {
      std::cerr << "orion-replay-gpu: --policies runs each policy under the shim: pass --shim "
                   "PATH/libgpu_scheduler.so (built under build*/intercept/)\n";
      return 2;
    }
    const sched::Workload workload = sched::load_workload(cli.workload);
    if (cli.dry_run) {
      std::cout << format_plan(make_plan(workload, cli.sms));
      return 0;
    }
    if (!cli.child_label.empty()) {
      if (cli.child_output.empty()) {
        std::cerr << "orion-replay-gpu: --child needs --child-output\n";
        return 2;
      }
      return child_main(cli, workload);
    }
    return parent_main(cli, workload);
  } catch (const NoGpuError& e) {
    std::cerr << "orion-replay-gpu: " << e.what() << "\n";
    return kExitNoGpu;
  } catch (const std::exception& e) {
    std::cerr << "orion-replay-gpu: " << e.what() << "\n";
    return 1;
  }
}

// orion-sim: replays a JSONL workload (scheduler/workload.h) on the simulated GPU under each
// scheduling policy and prints one table of HP latency and BE throughput relative to each client
// run alone; `generate` writes the shipped workloads.
//
//   orion-sim run WORKLOAD [--policy NAME]... [--param KEY=VALUE]... [--seed N] [--sms N]
//                 [--jitter X] [--block-spread X] [--hw-priority auto|on|off] [--trace-dir DIR]
//                 [--be-max-wait-us US]
//   orion-sim generate inference-training|pipeline-stage [-o FILE] [generator options]
#include <exception>
#include <fstream>
#include <iostream>
#include <sstream>

#include <CLI/CLI.hpp>

#include "orion_sim.h"

namespace {

std::string command_line(int argc, char** argv) {
  std::string cmd = "orion-sim";
  for (int i = 1; i < argc; ++i) cmd += std::string(" ") + argv[i];
  return cmd;
}

int write_output(const std::string& path, const std::string& text) {
  if (path.empty() || path == "-") {
    std::cout << text;
    return 0;
  }
  std::ofstream out(path);
  if (!out || !(out << text)) {
    std::cerr << "orion-sim: cannot write " << path << " (does its directory exist?)\n";
    return 1;
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"orion-sim: scheduling-policy study on a simulated GPU"};
  app.require_subcommand(1);

  // ---- run ----
  CLI::App* run = app.add_subcommand("run", "Replay a workload under each policy and print the study table");
  std::string workload_path;
  std::vector<std::string> policies;
  std::vector<std::string> params;
  orion_sim::StudyOptions study;
  double be_max_wait_us = 2000;
  run->add_option("workload", workload_path, "JSONL workload (format: scheduler/workload.h)")
      ->required()
      ->check(CLI::ExistingFile);
  run->add_option("--policy", policies, "Policy to run (repeatable; default: all)")
      ->check(CLI::IsMember(sched::policy_names()));
  run->add_option("--param", params,
                  "Policy parameter KEY=VALUE for orion, or POLICY.KEY=VALUE (e.g. partition.be_sm_frac=0.6); "
                  "repeatable; see --list-params");
  run->add_option("--seed", study.gpu.seed, "Seed of the simulated GPU's per-launch jitter")->capture_default_str();
  run->add_option("--sms", study.gpu.sm_count, "SMs of the simulated GPU")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  study.gpu.jitter = 0.05;
  run->add_option("--jitter", study.gpu.jitter, "Relative std-dev of each launch's block time (0: none)")
      ->check(CLI::Range(0.0, 0.5))
      ->capture_default_str();
  study.gpu.block_spread = 0.2;
  run->add_option("--block-spread", study.gpu.block_spread,
                  "Block times within a launch vary in [1-x, 1+x] (0: waves end in lock-step)")
      ->check(CLI::Range(0.0, 0.9))
      ->capture_default_str();
  run->add_option("--trace-dir", study.trace_dir, "Write <policy>.trace.json (Perfetto) per policy here")
      ->check(CLI::ExistingDirectory);
  run->add_option("--be-max-wait-us", be_max_wait_us, "Dispatcher starvation bound for best-effort heads")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  run->add_option("--hw-priority", study.hw_priority,
                  "Hardware priority of HP streams: auto (high unless the policy is passthrough), on, off")
      ->check(CLI::IsMember({"auto", "on", "off"}))
      ->capture_default_str();
  // ---- sweep ----
  CLI::App* sweep = app.add_subcommand(
      "sweep", "Each policy over a grid of its parameters: HP p99 / alone against BE throughput / alone, the "
               "Pareto front, and which points meet the goal (HP p99 <= 1.10x, BE >= 0.60x)");
  std::string sweep_workload, sweep_csv_path;
  sweep->add_option("workload", sweep_workload, "JSONL workload (format: scheduler/workload.h)")
      ->required()
      ->check(CLI::ExistingFile);
  sweep->add_option("--csv", sweep_csv_path, "Also write the points as CSV (scripts/plot_sweep.py draws it)");
  sweep->add_option("--seed", study.gpu.seed, "Seed of the simulated GPU's per-launch jitter")->capture_default_str();
  sweep->add_option("--sms", study.gpu.sm_count, "SMs of the simulated GPU")->check(CLI::Range(16, 100000));
  bool list_params = false;
  app.add_flag("--list-params", list_params, "Print every policy parameter with its default and exit");

  // ---- generate ----
  CLI::App* gen = app.add_subcommand("generate", "Write one of the shipped workloads");
  std::string kind, out_path;
  orion_sim::InferenceTrainingSpec it;
  orion_sim::PipelineStageSpec ps;
  gen->add_option("kind", kind, "inference-training | pipeline-stage")
      ->required()
      ->check(CLI::IsMember({"inference-training", "pipeline-stage"}));
  gen->add_option("-o,--output", out_path, "Output file (default: stdout)");
  gen->add_option("--seed", it.seed, "inference-training: seed of the kernel mix")->capture_default_str();
  gen->add_option("--requests", it.requests, "inference-training: inference requests")->capture_default_str();
  gen->add_option("--iterations", it.iterations, "inference-training: training iterations")->capture_default_str();
  gen->add_option("--think-us", it.think_us, "inference-training: think time between requests")->capture_default_str();
  gen->add_option("--stages", ps.stages, "pipeline-stage: pipeline stages")->capture_default_str();
  gen->add_option("--stage", ps.stage, "pipeline-stage: which stage (0-based)")->capture_default_str();
  gen->add_option("--micro-batches", ps.micro_batches, "pipeline-stage: micro-batches per step")->capture_default_str();
  gen->add_option("--layers", ps.layers, "pipeline-stage: transformer blocks on the stage")->capture_default_str();
  gen->add_option("--other-layers", ps.other_layers, "pipeline-stage: transformer blocks on every other stage")
      ->capture_default_str();
  gen->add_option("--batch", ps.batch, "pipeline-stage: micro-batch size")->capture_default_str();
  gen->add_option("--seq", ps.seq, "pipeline-stage: sequence length")->capture_default_str();
  gen->add_option("--hidden", ps.hidden, "pipeline-stage: hidden size")->capture_default_str();
  gen->add_option("--heads", ps.heads, "pipeline-stage: attention heads")->capture_default_str();
  gen->add_option("--pacing", ps.pacing,
                  "pipeline-stage: forward j is issued when backward j-(p-s) is issued (async: the product's "
                  "async_threaded executor) or finished (sync: Megatron's blocking 1F1B)")
      ->check(CLI::IsMember({"async", "sync"}))
      ->capture_default_str();

  if (argc > 1 && std::string(argv[1]) == "--list-params") {
    std::cout << sched::policy_param_docs();
    return 0;
  }
  CLI11_PARSE(app, argc, argv);

  try {
    if (*gen) {
      std::ostringstream text;
      if (kind == "inference-training") {
        orion_sim::write_inference_training(text, it, command_line(argc, argv));
      } else {
        orion_sim::write_pipeline_stage(text, ps, command_line(argc, argv));
      }
      return write_output(out_path, text.str());
    }
    if (*sweep) {
      sched::Workload workload = sched::load_workload(sweep_workload);
      std::cout << "workload " << sweep_workload << ": " << workload.ops.size() << " ops; simulated GPU "
                << study.gpu.sm_count << " SMs, seed " << study.gpu.seed << ", jitter " << study.gpu.jitter
                << ", block spread " << study.gpu.block_spread << "\n";
      const orion_sim::Sweep result = orion_sim::run_sweep(workload, study);
      std::cout << orion_sim::format_sweep(result);
      if (!sweep_csv_path.empty()) {
        if (int rc = write_output(sweep_csv_path, orion_sim::sweep_csv(result)); rc != 0) return rc;
        std::cout << "csv: " << sweep_csv_path << " (plot: scripts/plot_sweep.py " << sweep_csv_path << " -o sweep.png)\n";
      }
      return 0;
    }
    for (const std::string& p : params) {
      auto eq = p.find('=');
      if (eq == std::string::npos || eq == 0) {
        std::cerr << "orion-sim: --param '" << p << "' is not KEY=VALUE (see orion-sim --list-params)\n";
        return 2;
      }
      study.params[p.substr(0, eq)] = p.substr(eq + 1);
    }
    study.policies = policies;
    study.be_max_wait_ns = static_cast<int64_t>(be_max_wait_us * 1000.0);
    sched::Workload workload = sched::load_workload(workload_path);
    std::cout << "workload " << workload_path << ": " << workload.ops.size() << " ops; simulated GPU "
              << study.gpu.sm_count << " SMs, seed " << study.gpu.seed << ", jitter " << study.gpu.jitter
              << ", block spread " << study.gpu.block_spread << ", hw priority " << study.hw_priority << "\n";
    orion_sim::Study result = orion_sim::run_study(workload, study);
    std::cout << orion_sim::format_study(result);
    if (!study.trace_dir.empty()) std::cout << "traces: " << study.trace_dir << "/<policy>.trace.json\n";
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "orion-sim: " << e.what() << "\n";
    return 1;
  }
}

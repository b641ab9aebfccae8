// orion-sim: replays a JSONL workload (scheduler/workload.h) on the simulated GPU under each
// scheduling policy and prints one table of HP latency and BE throughput relative to each client
// run alone; `generate` writes the shipped workloads.
//
//   orion-sim run WORKLOAD [--policy NAME]... [--param KEY=VALUE]... [--seed N] [--sms N]
//                 [--jitter X] [--block-spread X] [--hw-priority auto|on|off] [--trace-dir DIR]
//                 [--be-max-wait-us US]
//   orion-sim colocate [--pipeline FILE] [--job FILE] [--steps N] [--budget-us US]... [--csv FILE]
//                      [--time-slice-us US] [--switch-us US]   (issue 25: two processes, one GPU)
//   orion-sim generate inference-training|pipeline-stage|training-job [-o FILE] [generator options]
#include <exception>
#include <fstream>
#include <filesystem>
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
  run->add_option("--trace-dir", study.trace_dir, "Write <policy>.trace.json (Perfetto) per policy here (made if missing)");
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

  // ---- colocate ----
  CLI::App* colo = app.add_subcommand(
      "colocate", "A pipeline stage and a best-effort job in two processes on one GPU: time slicing or MPS, the job "
                  "unmanaged or gated into the pipeline's published bubbles (the gpud policy)");
  orion_sim::ColocateOptions co;
  co.gpu.block_spread = 0.2;
  std::string colo_pipeline, colo_job, colo_csv;
  std::vector<double> colo_budgets;
  double slice_us = 2000, switch_us = 25;
  colo->add_option("--pipeline", colo_pipeline,
                   "One step of the pipeline process (JSONL; default: orion-sim generate pipeline-stage)");
  colo->add_option("--job", colo_job,
                   "The best-effort process, best_effort streams only (default: orion-sim generate training-job, "
                   "sized to outlast the pipeline)");
  colo->add_option("--steps", co.steps, "Pipeline steps (windows are published from step 1)")
      ->capture_default_str()
      ->check(CLI::Range(2, 1000));
  colo->add_option("--step-gap-us", co.step_gap_us, "GPU idle between steps (optimizer, data)")->capture_default_str();
  colo->add_option("--min-window-us", co.min_window_us, "Shorter gaps are not published")->capture_default_str();
  colo->add_option("--guard-us", co.guard_us, "Kept free before a window closes")->capture_default_str();
  colo->add_option("--budget-us", colo_budgets, "gpud in-flight budgets to sweep (repeatable; default 250 500 1000 2000 4000)");
  colo->add_option("--time-slice-us", slice_us, "Time slice between processes without MPS")->capture_default_str();
  colo->add_option("--switch-us", switch_us, "Cost of one context switch without MPS")->capture_default_str();
  colo->add_option("--sms", co.gpu.sm_count, "SMs of the simulated GPU")->check(CLI::Range(16, 100000));
  colo->add_option("--seed", co.gpu.seed, "Seed of the simulated GPU")->capture_default_str();
  colo->add_option("--jitter", co.gpu.jitter,
                   "Relative std-dev of each launch's block time: steps differ, so windows predicted from the step "
                   "before are wrong by that much")
      ->capture_default_str();
  colo->add_option("--csv", colo_csv, "Also write the rows as CSV (scripts/plot_colocation.py draws it)");

  // ---- generate ----
  CLI::App* gen = app.add_subcommand("generate", "Write one of the shipped workloads");
  std::string kind, out_path;
  orion_sim::InferenceTrainingSpec it;
  orion_sim::PipelineStageSpec ps;
  orion_sim::TrainingJobSpec tj;
  gen->add_option("kind", kind, "inference-training | pipeline-stage | training-job")
      ->required()
      ->check(CLI::IsMember({"inference-training", "pipeline-stage", "training-job"}));
  gen->add_option("--job-iterations", tj.iterations, "training-job: iterations")->capture_default_str();
  gen->add_option("--job-layers", tj.layers, "training-job: transformer blocks")->capture_default_str();
  gen->add_option("--job-hidden", tj.hidden, "training-job: hidden size")->capture_default_str();
  gen->add_option("--job-seq", tj.seq, "training-job: sequence length")->capture_default_str();
  gen->add_option("--job-heads", tj.heads, "training-job: attention heads")->capture_default_str();
  gen->add_option("--job-batch", tj.batch, "training-job: batch size")->capture_default_str();
  gen->add_option("-o,--output", out_path, "Output file (default: stdout)");
  gen->add_option("--seed", it.seed, "inference-training: seed of the kernel mix")->capture_default_str();
  gen->add_option("--requests", it.requests, "inference-training: inference requests")->capture_default_str();
  gen->add_option("--iterations", it.iterations, "inference-training: training iterations")->capture_default_str();
  gen->add_option("--think-us", it.think_us, "inference-training: think time between requests")->capture_default_str();
  gen->add_option("--stages", ps.stages, "pipeline-stage: pipeline stages")->capture_default_str();
  gen->add_option("--stage", ps.stage, "pipeline-stage: which stage (0-based)")->capture_default_str();
  gen->add_option("--micro-batches", ps.micro_batches, "pipeline-stage: micro-batches per step")->capture_default_str();
  gen->add_option("--layers", ps.layers, "pipeline-stage: transformer blocks on the stage")->capture_default_str();
  gen->add_option("--other-layers", ps.other_layers,
                  "pipeline-stage: accepted for old command lines, changes nothing (every stage runs as long as this one)")
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
      } else if (kind == "training-job") {
        orion_sim::write_training_job(text, tj, command_line(argc, argv));
      } else {
        orion_sim::write_pipeline_stage(text, ps, command_line(argc, argv));
      }
      return write_output(out_path, text.str());
    }
    if (*colo) {
      co.gpu.time_slice_ns = static_cast<int64_t>(slice_us * 1e3);
      co.gpu.context_switch_ns = static_cast<int64_t>(switch_us * 1e3);
      if (!colo_budgets.empty()) co.budgets_us = colo_budgets;
      sched::Workload pipeline, job;
      if (colo_pipeline.empty()) {
        std::stringstream text;
        orion_sim::write_pipeline_stage(text, orion_sim::PipelineStageSpec{}, "orion-sim generate pipeline-stage");
        pipeline = sched::parse_workload(text, "pipeline-stage (generated)");
      } else {
        pipeline = sched::load_workload(colo_pipeline);
      }
      if (colo_job.empty()) {
        std::stringstream text;
        orion_sim::TrainingJobSpec spec;
        spec.iterations = orion_sim::job_iterations_to_outlast(pipeline, spec, co);
        orion_sim::write_training_job(text, spec, "orion-sim generate training-job");
        job = sched::parse_workload(text, "training-job (generated, " + std::to_string(spec.iterations) + " iterations)");
      } else {
        job = sched::load_workload(colo_job);
      }
      std::cout << "simulated GPU " << co.gpu.sm_count << " SMs, seed " << co.gpu.seed << ", block spread "
                << co.gpu.block_spread << "; without MPS: time slice " << slice_us << " us, switch " << switch_us
                << " us; " << co.steps << " pipeline steps\n";
      const orion_sim::ColocateStudy result = orion_sim::run_colocation(pipeline, job, co);
      std::cout << orion_sim::format_colocation(result);
      if (!colo_csv.empty()) {
        if (int rc = write_output(colo_csv, orion_sim::colocation_csv(result)); rc != 0) return rc;
        std::cout << "csv: " << colo_csv << " (plot: .venv/bin/python scripts/plot_colocation.py " << colo_csv << " -o colocation.png)\n";
      }
      return 0;
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
        std::cout << "csv: " << sweep_csv_path << " (plot: .venv/bin/python scripts/plot_sweep.py " << sweep_csv_path << " -o sweep.png)\n";
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
    if (!study.trace_dir.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(study.trace_dir, ec);
      if (ec || !std::filesystem::is_directory(study.trace_dir)) {
        std::cerr << "orion-sim: --trace-dir '" << study.trace_dir << "' is not a folder that can be made ("
                  << (ec ? ec.message() : "a file is in the way") << "): give a writable folder\n";
        return 2;
      }
    }
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

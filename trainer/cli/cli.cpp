// parse_cli() with CLI11, the error-to-exit-code mapping, and the informational actions.
#include "trainer/cli/cli.h"

#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdio>
#include <limits>
#include <ostream>
#include <sstream>

#include "trainer/schedule/schedule.h"
#include "trainer/schedule/schedule_csv.h"
#include "trainer/launch/world.h"

namespace gpipe {

namespace {
// CLI11's PositiveNumber and NonNegativeNumber print their range as doubles ("Value 0 not in
// range 0.000000 to 179769...0000.000000"): these name the bound plainly.
CLI::Validator count_from(int least) {
  return CLI::Range(least, std::numeric_limits<int>::max()).description("INT >= " + std::to_string(least));
}
// A finite number above 0 (`strict`) or at least 0.
CLI::Validator number_above_zero(bool strict) {
  const std::string bound = strict ? "> 0" : ">= 0";
  return CLI::Validator(
      [strict, bound](std::string& in) -> std::string {
        double v = 0;
        const bool ok = CLI::detail::lexical_cast(in, v) && std::isfinite(v) && (strict ? v > 0 : v >= 0);
        return ok ? std::string() : "'" + in + "' is not a number " + bound;
      },
      "NUMBER " + bound);
}
const CLI::Validator kCount = count_from(1);
const CLI::Validator kIndex = count_from(0);
const CLI::Validator kPositive = number_above_zero(true);
const CLI::Validator kNonNegative = number_above_zero(false);
}  // namespace

RunOptions parse_cli(int argc, const char* const* argv) {
  CLI::App app{"gpipe_runner: pipeline-parallel GPT training (GPipe / 1F1B / interleaved 1F1B / ZB-H1)",
               "gpipe_runner"};
  RunOptions opts;
  std::vector<std::string> sets;
  std::string scheduler, schedule, microbatches, stages, virtual_stages, steps, device, output_dir, seed, dtype,
      partition, lr, checkpoint_interval, checkpoint_dir, transport, placement, peer_timeout, schedule_file,
      overlap_f_b, sync_mode, data_parallel;
  int nproc_per_node = 0, nnodes = 1, node_rank = 0, master_port = 29500;
  std::string master_addr = "127.0.0.1";
  app.add_option("--config", opts.config_path, "YAML config (sections model, dataset, training, parallel)");
  app.add_option("--set", sets, "Override any field: section.field=value (repeatable), e.g. training.learning_rate=3e-4");
  app.add_option("--scheduler", scheduler, "Executor: naive | async_threaded (parallel.scheduler)");
  app.add_option("--schedule", schedule,
                 "gpipe | 1f1b | interleaved_1f1b | zb_h1 | looped_bfs | interleaved_zb | zbv | dualpipev (parallel.schedule)");
  app.add_option("--schedule-file", schedule_file,
                 "Run this schedule CSV (torch.distributed.pipelining's format, with or without communication) "
                 "instead of generating --schedule (parallel.schedule_file)");
  app.add_option("--overlap-f-b", overlap_f_b,
                 "auto | true | false: run a rank's forward / backward pairs at the same time (parallel.overlap_f_b; "
                 "auto: the schedule's own pairs, dualpipev's)");
  app.add_option("--sync-mode", sync_mode,
                 "bsp | asp: one update per step, or each stage's update after every backward with weight stashing "
                 "(parallel.sync_mode; parallel.weight_stashing=false turns stashing off)");
  app.add_option("--microbatches", microbatches, "Micro-batches per step (training.num_microbatches)");
  app.add_option("--stages", stages, "Pipeline ranks (parallel.model_parallel_size)");
  app.add_option("--virtual-stages", virtual_stages, "Model chunks per rank (parallel.virtual_stages)");
  app.add_option("--steps", steps, "Stop after N optimizer steps (training.max_steps; -1: run the epochs)");
  app.add_option("--device", device, "auto | cpu | cuda (parallel.device)");
  app.add_option("--output-dir", output_dir, "Where metrics and timelines go (training.output_dir)");
  app.add_option("--seed", seed, "Random seed (training.seed)");
  app.add_option("--dtype", dtype, "auto | fp32 | bf16 (training.dtype)");
  app.add_option("--lr", lr, "Peak learning rate (training.learning_rate)");
  app.add_option("--partition", partition,
                 "uniform | parameters | time, or explicit block counts per stage, e.g. \"[12,13,13,11]\"");
  app.add_flag("--resume", opts.resume, "Continue from the newest complete checkpoint under the checkpoint folder");
  auto* resume_from = app.add_option("--resume-from", opts.resume_from, "Continue from this checkpoint folder (<checkpoint_dir>/step_00000042: N zero-padded to 8 digits)");
  app.add_option("--checkpoint-interval", checkpoint_interval, "Checkpoint every N steps (training.checkpoint_interval)");
  app.add_option("--checkpoint-dir", checkpoint_dir, "Checkpoint folder (training.checkpoint_dir)");
  app.add_option("--transport", transport, "auto | inprocess | gloo | nccl (parallel.transport)");
  app.add_option("--data-parallel-size", data_parallel,
                 "Replicas of the whole pipeline, each with WORLD_SIZE / N processes, averaging their gradients "
                 "(parallel.data_parallel_size)");
  app.add_option("--placement", placement, "Process of each pipeline rank, e.g. \"[0,0,1,1]\" (parallel.placement)");
  app.add_option("--peer-timeout", peer_timeout, "Seconds to wait for a peer rank (parallel.peer_timeout_s)");
  auto* nproc = app.add_option("--nproc-per-node", nproc_per_node,
                               "Launch N worker processes on this node (like torchrun --nproc_per_node)");
  nproc->check(kCount);
  // Without --nproc-per-node these were ignored and the process trained every rank by itself.
  app.add_option("--nnodes", nnodes, "Nodes of a --nproc-per-node launch")->check(kCount)->needs(nproc);
  app.add_option("--node-rank", node_rank, "This node's index in a --nproc-per-node launch")
      ->check(kIndex)
      ->needs(nproc);
  app.add_option("--master-addr", master_addr, "Rendezvous host of a --nproc-per-node launch (rank 0's node)")
      ->needs(nproc);
  app.add_option("--master-port", master_port, "Rendezvous port of a --nproc-per-node launch")
      ->check(CLI::Range(1, 65535))
      ->needs(nproc);
  auto* plan_flag = app.add_flag("--plan", opts.plan.enabled,
                                 "Measure each layer on this device, simulate every legal pipeline configuration, print "
                                 "the best and write it as YAML (see --plan-output), then exit");
  app.add_option("--plan-output", opts.plan.output, "Where --plan writes the chosen config (default <output_dir>/plan.yaml)")
      ->needs(plan_flag);
  app.add_option("--plan-rows", opts.plan.rows, "Candidates --plan prints")->check(kCount)->needs(plan_flag);
  app.add_option("--verify", opts.plan.verify, "With --plan: run the top K candidates a few steps each and print "
                 "predicted against measured step time and peak memory")->check(kIndex)->needs(plan_flag);
  app.add_option("--verify-steps", opts.plan.verify_steps, "Steps per verified candidate (the first two are warm-up)")
      ->check(CLI::Range(3, 1000))->needs(plan_flag);
  app.add_option("--world-size", opts.plan.world_size, "With --plan: ranks of the real run (pipeline ranks x replicas)")
      ->check(kCount)->needs(plan_flag);
  app.add_option("--memory-budget-gib", opts.plan.memory_budget_gib, "With --plan: memory per device (default: a GPU's free memory and what the run's allocator holds, less 5%; "
                 "the machine's memory on CPU)")
      ->check(kPositive)->needs(plan_flag);
  app.add_option("--link-gbps", opts.plan.link_gbps, "With --plan: GB/s between processes or nodes (default: measured "
                 "in-process for pipeline transfers, assumed for replicas)")->check(kPositive)->needs(plan_flag);
  app.add_option("--link-latency-us", opts.plan.link_latency_us, "With --plan: latency of one transfer in microseconds")
      ->check(kNonNegative)->needs(plan_flag);
  app.add_option("--plan-schedules", opts.plan.schedules, "With --plan: only these schedules (comma separated)")
      ->delimiter(',')->needs(plan_flag);
  app.add_option("--plan-calibrate", opts.plan.calibrate, "With --plan: first run the configuration as given, with "
                 "the most virtual stages and as 2 replicas, 5 steps each, and fit how well ranks share a device, the "
                 "hand-off time and the replicas' step cost (1, the default; 0: skip)")->needs(plan_flag);
  app.add_option("--plan-max-microbatches", opts.plan.max_microbatches, "With --plan: the most micro-batches tried")
      ->check(kCount)->needs(plan_flag);
  app.add_flag("--print-config", opts.print_config, "Print the effective config as YAML and exit");
  auto* print_schedule = app.add_flag("--print-schedule", opts.print_schedule, "Print the schedule's step x rank grid and exit");
  app.add_option("--format", opts.print_format,
                 "With --print-schedule: grid (default), csv (torch's compute_comms CSV) or csv_compute_only")
      ->check(CLI::IsMember({"grid", "csv", "csv_compute_only"}))
      ->needs(print_schedule);
  app.add_flag("--validate-only", opts.validate_only, "Check the config and the schedule, then exit");
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    throw CliHelp(app.help());
  } catch (const CLI::CallForAllHelp&) {
    throw CliHelp(app.help("", CLI::AppFormatMode::All));
  } catch (const CLI::ParseError& e) {
    throw CliError(std::string(e.what()) + " (run with --help for the flags)");
  }
  // An empty value (--steps "$STEPS" with STEPS unset) used to be dropped, and the config's value
  // used in its place.
  for (const CLI::Option* o : app.get_options()) {
    if (o->count() == 0 || o->get_type_size() == 0) continue;  // not given, or a flag without a value
    for (const std::string& r : o->results()) {
      if (r.empty()) throw CliError(o->get_name() + " was given an empty value (an unset shell variable?); give one");
    }
  }

  for (const std::string& s : sets) {
    if (s.find('=') == std::string::npos)
      throw CliError("--set '" + s + "': expected section.field=value, e.g. --set training.learning_rate=3e-4");
    opts.overrides.push_back(s);
    opts.override_flags.emplace_back();
  }
  auto add = [&](const std::string& assignment, const std::string& flag) {
    opts.overrides.push_back(assignment);
    opts.override_flags.push_back(flag);
  };
  auto direct = [&](const std::string& value, const char* flag, const char* path) {
    if (!value.empty()) add(std::string(path) + "=" + value, std::string(flag) + " " + value);
  };
  direct(scheduler, "--scheduler", "parallel.scheduler");
  direct(schedule, "--schedule", "parallel.schedule");
  direct(schedule_file, "--schedule-file", "parallel.schedule_file");
  direct(overlap_f_b, "--overlap-f-b", "parallel.overlap_f_b");
  direct(sync_mode, "--sync-mode", "parallel.sync_mode");
  direct(microbatches, "--microbatches", "training.num_microbatches");
  direct(stages, "--stages", "parallel.model_parallel_size");
  direct(virtual_stages, "--virtual-stages", "parallel.virtual_stages");
  direct(steps, "--steps", "training.max_steps");
  direct(device, "--device", "parallel.device");
  direct(output_dir, "--output-dir", "training.output_dir");
  direct(seed, "--seed", "training.seed");
  direct(dtype, "--dtype", "training.dtype");
  direct(lr, "--lr", "training.learning_rate");
  direct(checkpoint_interval, "--checkpoint-interval", "training.checkpoint_interval");
  direct(checkpoint_dir, "--checkpoint-dir", "training.checkpoint_dir");
  direct(transport, "--transport", "parallel.transport");
  direct(placement, "--placement", "parallel.placement");
  direct(data_parallel, "--data-parallel-size", "parallel.data_parallel_size");
  direct(peer_timeout, "--peer-timeout", "parallel.peer_timeout_s");
  if (resume_from->count() > 0) opts.resume = true;
  if (nproc->count() > 0) {
    LaunchOptions launch;
    launch.nproc_per_node = nproc_per_node;
    launch.nnodes = nnodes;
    launch.node_rank = node_rank;
    launch.master_addr = master_addr;
    launch.master_port = master_port;
    if (node_rank >= nnodes) {
      throw CliError("--node-rank " + std::to_string(node_rank) + " is not below --nnodes " + std::to_string(nnodes));
    }
    opts.launch = launch;
  }
  if (!partition.empty()) {
    const std::string flag = "--partition " + partition;
    if (partition.front() == '[') {
      add("parallel.partition=explicit", flag);
      add("parallel.partition_layers=" + partition, flag);
    } else {
      add("parallel.partition=" + partition, flag);
      if (partition != "explicit") add("parallel.partition_layers=[]", flag);
    }
  }

  opts.config = opts.config_path.empty() ? PipelineConfig{} : PipelineConfig::from_yaml_file(opts.config_path);
  for (size_t i = 0; i < opts.overrides.size(); ++i) {
    try {
      opts.config.apply_override(opts.overrides[i]);
    } catch (const ConfigError& e) {
      // A flag's error names the flag as typed ("--schedule foo: parallel.schedule: got 'foo'"),
      // not the override it became.
      const std::string as_override = "override '" + opts.overrides[i] + "'";
      const std::string message = e.what();
      if (opts.override_flags[i].empty() || message.rfind(as_override, 0) != 0) throw;
      throw ConfigError(opts.override_flags[i] + message.substr(as_override.size()));
    }
  }
  opts.config.load_partition_file();
  opts.config.validate();
  return opts;
}

int exit_code_for(const std::exception& e) {
  if (dynamic_cast<const CliHelp*>(&e)) return 0;
  // Everything the user can fix in the command line or the config is 2: a bad flag, a bad
  // field or combination, a missing file, an unknown registry name or impossible schedule shape.
  if (dynamic_cast<const CliError*>(&e) || dynamic_cast<const ConfigError*>(&e) ||
      dynamic_cast<const WorldError*>(&e) || dynamic_cast<const std::invalid_argument*>(&e))
    return 2;
  return 1;
}

int report_error(const std::exception& e, std::ostream& out, std::ostream& err) {
  const int code = exit_code_for(e);
  if (code == 0) {
    out << e.what();
  } else {
    std::string line = e.what();
    for (char& c : line)
      if (c == '\n') c = ' ';  // one line, so logs and SLURM output stay greppable
    err << "gpipe_runner: error: " << line << "\n";
  }
  return code;
}

namespace {

// What the executors would run: the schedule file's (read and validated) or the generated one,
// of one replica's pipeline as the run schedules it (replica_config).
Schedule schedule_to_run(const PipelineConfig& global) {
  const PipelineConfig config = replica_config(global);
  if (!config.parallel.schedule_file.empty()) return schedule_from_file(config.parallel, config.training);
  return with_communication(make_schedule(config));
}

}  // namespace

std::string schedule_report(const PipelineConfig& config) {
  const Schedule schedule = schedule_to_run(config);
  const ValidationResult result = validate(schedule);
  std::ostringstream out;
  const int p = schedule.num_ranks, m = schedule.num_microbatches, v = schedule.stages_per_rank;
  out << "schedule " << (schedule.kind == ScheduleKind::kFromFile ? "file " + config.parallel.schedule_file
                                                                  : std::string(to_string(schedule.kind)))
      << ": " << p << " rank(s) x " << v << " stage(s) per rank, " << m
      << " micro-batch(es)\n";
  out << render_grid(schedule, result);
  if (result.ok) {
    // Chunk costs scale with 1/v so that interleaved schedules do the same total work.
    const double bubble = simulated_bubble_fraction(schedule, 1.0 / v, 2.0 / v);
    char line[160];
    std::snprintf(line, sizeof line, "simulated bubble %.1f%% (F=1, B=2 per micro-batch and rank, free communication; "
                  "GPipe/1F1B formula (p-1)/(m+p-1) = %.1f%%)\n", 100 * bubble, 100.0 * (p - 1) / (m + p - 1));
    out << line;
    out << "peak activations per rank (micro-batch x stage held between F and B/I):";
    for (int a : peak_activations(schedule)) out << " " << a;
    out << "\n";
    if (schedule.sync_mode == SyncMode::kAsp) {
      out << "asp: each stage updates after every backward (F/B cells show the weight version); "
          << (schedule.weight_stashing ? "weight versions stashed per stage:" : "no weight stashing");
      if (schedule.weight_stashing) {
        for (int n : stashed_versions(schedule)) out << " " << n;
      }
      out << "\n";
    }
  }
  return out.str();
}

std::optional<int> run_info_actions(const RunOptions& options, std::ostream& out) {
  if (options.print_config) {
    out << options.config.to_yaml();
    return 0;
  }
  if (options.print_schedule || options.validate_only) {
    const Schedule schedule = schedule_to_run(options.config);
    const ValidationResult result = validate(schedule);
    if (options.print_schedule && options.print_format != "grid") {
      if (!result.ok) {
        out << render_grid(schedule, result);  // no CSV of a schedule that cannot run
      } else {
        out << schedule_to_csv(schedule, options.print_format == "csv" ? ScheduleCsvFormat::kComputeComms
                                                                       : ScheduleCsvFormat::kComputeOnly);
      }
    } else if (options.print_schedule) {
      out << schedule_report(options.config);
    } else if (result.ok) {
      check_stream_layout(options.config.parallel, schedule);  // the run's own refusal, here too
      out << "config ok; schedule " << to_string(schedule.kind) << " ok: " << result.num_steps
          << " lock-step steps, no deadlock, every forward and backward exactly once\n";
      if (const int replicas = options.config.parallel.data_parallel_size; replicas > 1) {
        out << "parallel.data_parallel_size=" << replicas << ": launch a multiple of " << replicas
            << " processes (--nproc-per-node, torchrun, srun); one process refuses it\n";
      }
      if (options.config.parallel.device == "cuda") {
        out << "parallel.device=cuda: not checked here (--validate-only does not start CUDA); the run refuses it "
               "when no GPU is visible\n";
      }
      if (options.config.model.attention != "auto") {
        out << "model.attention=" << options.config.model.attention
            << ": not checked here (the run asks ATen before the first step whether that kernel can run the model "
               "on its device and dtype, and refuses it if not)\n";
      }
    } else {
      out << render_grid(schedule, result);
    }
    return result.ok ? 0 : 1;
  }
  return std::nullopt;
}

}  // namespace gpipe

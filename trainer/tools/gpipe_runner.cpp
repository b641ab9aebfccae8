// gpipe_runner: the pipeline-parallel GPT trainer (C++ successor of the seed's gpipe_runner.py).
//
// One process runs every pipeline rank (one thread each) unless it is one of several processes:
// under torchrun (--no-python), srun, or this program's own launcher (--nproc-per-node N), the
// env:// or SLURM variables say which rank it is (trainer/world.h), stages are placed on the
// processes (parallel.placement) and tensors cross processes over Gloo (CPU) or NCCL (CUDA).
//
// Exit codes: 0 ok (also --help, --print-config, --print-schedule, --validate-only on a valid
// schedule), 2 bad usage, configuration, launch environment or checkpoint (the message names
// the flag, field, variable or file), 1 runtime failure (a lost peer rank included).
#include <sys/prctl.h>

#include <csignal>
#include <cstdio>
#include <exception>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>

#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>  // PipelineTrainer::train() returns the summary as JSON

#include "trainer/checkpoint/checkpoint.h"
#include "trainer/cli/cli.h"
#include "trainer/config/config.h"
#include "trainer/distributed/distributed.h"
#include "trainer/log/engine_log.h"
#include "trainer/launch/launcher.h"
#include "trainer/launch/orion_preload.h"
#include "trainer/device/device.h"
#include "trainer/training/plan_command.h"
#include "trainer/training/trainer.h"
#include "trainer/launch/world.h"

namespace {

std::unique_ptr<gpipe::Distributed> g_dist;  // set once this process joined a multi-process run
std::string g_rank_prefix;                   // "[rank R/W] " in a multi-process run

int exit_code(const std::exception& e) {
  if (dynamic_cast<const gpipe::CheckpointError*>(&e)) return 2;  // refused: the user picks another
  return gpipe::exit_code_for(e);
}

int fail(const std::exception& e) {
  std::ostringstream err;
  int code;
  if (const auto* c10_error = dynamic_cast<const c10::Error*>(&e)) {
    // LibTorch's errors carry a C++ backtrace: keep the message, one line.
    code = gpipe::report_error(std::runtime_error(c10_error->what_without_backtrace()), std::cout, err);
  } else {
    code = gpipe::report_error(e, std::cout, err);
  }
  const int final_code = code == 1 ? exit_code(e) : code;
  std::cerr << g_rank_prefix << err.str();
  if (final_code == 2) std::cerr << g_rank_prefix << "gpipe_runner: see --help; --print-config shows the effective configuration\n";
  if (g_dist) {
    // Tell the other ranks (they stop within a heartbeat instead of waiting for a timeout), then
    // leave without running destructors that could wait on peers that are gone.
    g_dist->announce_failure(e.what());
    std::cout.flush();
    std::cerr.flush();
    std::fflush(nullptr);
    std::_Exit(final_code);
  }
  return final_code;
}

int run(int argc, char** argv) {
  const gpipe::RunOptions options = gpipe::parse_cli(argc, argv);
  if (auto code = gpipe::run_info_actions(options, std::cout)) {
    return *code == 0 ? 0 : 2;  // a schedule that does not validate is a config problem
  }
  // CPU runs count their allocations (metrics' peak_allocated_bytes; --plan's memory figures).
  gpipe::install_cpu_allocation_counter();
  if (options.plan.enabled) {
    if (options.launch) throw gpipe::CliError("--plan runs in one process: drop --nproc-per-node (give --world-size)");
    return gpipe::run_plan_command(options.config, options.plan, gpipe::self_executable_path(), std::cout);
  }
  // The scheduler library must be preloaded before the CUDA runtime loads the driver: restart
  // with it (before launching workers, so they inherit it) unless it is there already.
  if (options.config.parallel.use_orion_scheduler) gpipe::ensure_orion_scheduler_loaded(argv, std::cerr);
  if (options.launch) {
    if (std::getenv("RANK") != nullptr) {
      throw gpipe::CliError("--nproc-per-node inside a launched worker (RANK is set): launch with torchrun or "
                            "with --nproc-per-node, not both");
    }
    gpipe::check_launch_under_slurm(*options.launch);
    std::vector<std::string> args(argv, argv + argc);
    args = gpipe::strip_launcher_flags(args);
    args.front() = gpipe::self_executable_path();
    return gpipe::launch_workers(*options.launch, args);
  }
  const gpipe::WorldInfo world = gpipe::world_from_environment();
  gpipe::PipelineConfig config = options.config;
  if (world.distributed()) {
    // A worker whose launcher (torchrun's agent, slurmstepd, --nproc-per-node) died must not
    // train on alone: it gets SIGTERM when its parent goes.
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    gpipe::engine_log_set_rank(world.rank, world.world_size);
    g_rank_prefix = "[rank " + std::to_string(world.rank) + "/" + std::to_string(world.world_size) + "] ";
    gpipe::engine_log_info("joining: " + world.describe());
    gpipe::DistributedOptions dist_options;
    dist_options.timeout = std::chrono::milliseconds(static_cast<int64_t>(config.parallel.peer_timeout_s * 1000));
    g_dist = gpipe::Distributed::connect(world, gpipe::config_hash(gpipe::run_fingerprint_text(config)), dist_options);
    gpipe::engine_log_info("all " + std::to_string(world.world_size) + " ranks joined; config hashes agree");
  }
  gpipe::engine_log_info("config: " + (options.config_path.empty() ? std::string("(built-in defaults)") : options.config_path));
  gpipe::PipelineComponents components = gpipe::create_components(config);
  gpipe::engine_log_info("vocab_size " + std::to_string(config.model.vocab_size) + " (from the tokenizer: " +
                         config.dataset.tokenizer + ")");
  {
    gpipe::PipelineTrainer trainer(config, std::move(components), g_dist.get());
    if (options.resume) trainer.resume_from(options.resume_from);
    try {
      trainer.train();
    } catch (const std::exception& e) {
      // Report (and, in a multi-process run, announce and leave) before the trainer unwinds:
      // tearing down its communicators could wait on peers that do not know yet.
      return fail(e);
    }
  }
  if (g_dist) {
    g_dist->finish();
    g_dist.reset();
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    return fail(e);
  }
}

// The built-in multi-process launcher behind `gpipe_runner --nproc-per-node N`: a small torchrun
// that starts one worker per local rank with the env:// variables set and supervises them.
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include "trainer/launch/world.h"

namespace gpipe {

struct LaunchOptions {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::chrono::milliseconds grace{30000};  // after a child fails, how long the others get to exit on their own
};

// Runs nproc_per_node copies of `argv` (argv[0] is the executable path) with RANK = node_rank*nproc+i,
// WORLD_SIZE = nnodes*nproc, LOCAL_RANK = i, LOCAL_WORLD_SIZE = nproc, GROUP_RANK = node_rank,
// MASTER_ADDR, MASTER_PORT set in their environment (the rest inherited). Forwards SIGINT, SIGTERM, SIGHUP,
// SIGQUIT, SIGUSR1, SIGUSR2 received by this process to every live child. When a child exits non-zero or by
// a signal, logs it, gives the others `grace` to exit by themselves, then SIGTERM, then after 5 more seconds
// SIGKILL. Returns 0 if every child exited 0; otherwise the first failing child's exit code (128+signal
// number when it was killed by a signal). Returns only once every child is reaped. Throws WorldError for
// bad options (nproc < 1, node_rank >= nnodes, ...) or when the workers cannot be started.
int launch_workers(const LaunchOptions& options, const std::vector<std::string>& argv);

// Refuses a launch that srun started as several tasks of one step (SLURM_STEP_NUM_TASKS > 1) unless
// each task is one node of it (--nnodes = the step's tasks, --node-rank = SLURM_PROCID): otherwise
// every task would start its own whole job on the same port and output folder. Throws WorldError
// saying how to run it (srun starting every rank itself, or one task per node). `getenv` as in world.h.
void check_launch_under_slurm(const LaunchOptions& options,
                              const GetEnv& getenv = [](const char* n) { return std::getenv(n); });

// Removes the launcher's own flags from a gpipe_runner command line so the children do not launch again:
// --nproc-per-node, --nnodes, --node-rank, --master-addr, --master-port ("--flag value" and "--flag=value").
// Arguments after a bare "--" are kept as they are.
std::vector<std::string> strip_launcher_flags(const std::vector<std::string>& argv);

// The path of the running executable (/proc/self/exe), for argv[0] of the children.
std::string self_executable_path();

}  // namespace gpipe

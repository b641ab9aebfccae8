// Where this process sits in a multi-process run: rank, world size and rendezvous address, read
// from torchrun's / the built-in launcher's environment (env://) or from SLURM's.
#pragma once

#include <cstdlib>
#include <functional>
#include <stdexcept>
#include <string>

namespace gpipe {

// A bad launch environment (missing or malformed variable); the runner exits with code 2.
struct WorldError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct WorldInfo {
  int rank = 0, world_size = 1, local_rank = 0, local_world_size = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string source = "single";  // "single" | "env" (torchrun or gpipe_runner --nproc-per-node) | "slurm"
  // torchrun's elastic agent already hosts the TCPStore on MASTER_PORT (TORCHELASTIC_USE_AGENT_STORE=True):
  // every worker, rank 0 included, must connect as a client under the prefix below instead of binding the port.
  bool agent_store = false;
  std::string store_prefix;  // "/worker/attempt_<TORCHELASTIC_RESTART_COUNT>" when agent_store, else ""
  bool distributed() const { return world_size > 1; }
  // One line, e.g. "rank 1/4 (local 1/4) master 10.0.0.1:29500 via slurm".
  std::string describe() const;
};

// Returns the variable's value or nullptr when unset; tests pass a fake.
using GetEnv = std::function<const char*(const char*)>;

// torchrun's variables win when both are set. Under SLURM (SLURM_PROCID and SLURM_NTASKS): the local
// size from the step's SLURM_STEP_TASKS_PER_NODE, else SLURM_NTASKS_PER_NODE / SLURM_TASKS_PER_NODE;
// MASTER_ADDR, else the first host of SLURM_STEP_NODELIST, SLURM_JOB_NODELIST or SLURM_NODELIST;
// MASTER_PORT, else 15000 + (job id + 7919 x step id) mod 15000, the same on every rank of a step
// and different for two jobs or steps sharing a node.
// Throws WorldError naming the variable (and its value) when the environment is incomplete or invalid.
WorldInfo world_from_environment(const GetEnv& getenv = [](const char* n) { return std::getenv(n); });

// This machine's host name (gethostname), "localhost" if it has none: what names this process's
// files next to its pid (PyTorch's profiler traces, TensorBoard's event files).
std::string this_host_name();

// First host of a SLURM node list: "node[01-04,07],gpu2" -> "node01"; "a,b" -> "a"; "gpu-[3,5]" -> "gpu-3".
std::string first_host_of_nodelist(const std::string& nodelist);

}  // namespace gpipe

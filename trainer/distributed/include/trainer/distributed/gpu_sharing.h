// Whether processes of a multi-process run share a GPU. A process runs on cuda:(LOCAL_RANK %
// visible devices), as torchrun's one-process-per-GPU convention has it; more processes on a node
// than GPUs they see then puts two on one GPU. NCCL refuses that for two ranks of one communicator
// ("Duplicate GPU detected", ncclInvalidUsage) once the first collective or send is already under
// way; the check here names it at start-up, on every rank, with what to do.
#pragma once

#include <string>
#include <vector>

namespace gpipe {

class Distributed;

// What a process says about itself: its GPU's UUID ("GPU-8f3c...", as nvidia-smi -L prints it),
// its host and its LOCAL_RANK.
struct ProcessGpu {
  std::string uuid, host;
  int local_rank = 0;
};

// The world ranks of each GPU that more than one process runs on, by first rank.
struct SharedGpu {
  std::string uuid, host;
  std::vector<int> ranks;
  std::vector<int> local_ranks;
};
std::vector<SharedGpu> shared_gpus(const std::vector<ProcessGpu>& by_rank);

// Every process calls it (collective, through the store). With nccl_between_processes (the nccl
// transport, or data-parallel gradient all-reduces on CUDA) a shared GPU throws ConfigError on
// every rank, naming the processes, the GPU and the fix; without, returns one line describing the
// sharing for the log ("" when no GPU is shared).
std::string check_gpu_sharing(Distributed& dist, const ProcessGpu& mine, bool nccl_between_processes);

}  // namespace gpipe

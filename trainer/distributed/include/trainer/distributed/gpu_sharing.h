// Whether processes of a multi-process run share a GPU where NCCL cannot have it. A process runs
// on cuda:(LOCAL_RANK % visible GPUs), as torchrun's one-process-per-GPU convention has it, so more
// processes on a node than GPUs they see puts two on one GPU. NCCL refuses two ranks of one
// communicator on one GPU ("Duplicate GPU detected", ncclInvalidUsage), and only when that
// communicator is first used, after the model is built. The check here finds it at start-up, on
// every rank, naming the processes, the GPU and the fix. (Gloo carries CPU tensors only: a CUDA
// run crosses processes over NCCL, so there is no "share on purpose" over another transport;
// pipeline ranks meant to share a GPU belong in one process, where tensors stay in memory.)
#pragma once

#include <set>
#include <string>
#include <utility>
#include <vector>

#include "trainer/partition/placement.h"
#include "trainer/schedule/schedule.h"

namespace gpipe {

class Distributed;

// Pipeline ranks (from, to) whose actions send tensors from one to the other: the directed pairs
// the nccl transport makes a two-rank communicator for when they are in different processes.
std::set<std::pair<int, int>> sending_rank_pairs(const Schedule& schedule);

// The world ranks of every NCCL communicator a CUDA run makes, in every replica: with
// nccl_transport, a pair per directed pair of pipeline ranks in different processes that send to
// each other; with data_parallel_size > 1, per stage its replicas' processes (the gradient
// all-reduce groups). Each sorted; the list sorted and without repeats.
std::vector<std::vector<int>> nccl_communicators(const Placement& placement, const Schedule& schedule,
                                                 bool nccl_transport);

// What a process says about itself: its GPU's UUID ("GPU-8f3c...", as nvidia-smi -L prints it;
// "" on the CPU), its host and its LOCAL_RANK.
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

// Every process calls it (collective, through the store) with the same `communicators`. Throws
// ConfigError on every rank when two members of one communicator share a GPU, or when some
// processes run on CUDA and others on the CPU; else returns one line naming GPUs shared by
// processes that never meet in a communicator ("" when none is shared).
std::string check_gpu_sharing(Distributed& dist, const ProcessGpu& mine,
                              const std::vector<std::vector<int>>& communicators);

}  // namespace gpipe

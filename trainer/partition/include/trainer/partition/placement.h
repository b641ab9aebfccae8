// Which process runs which pipeline rank. One process per GPU is the usual launch (torchrun,
// srun), but a process may also run several pipeline ranks co-located on its device (one thread
// each, exchanging tensors in memory), mixed with several processes (tensors over Gloo or NCCL).
#pragma once

#include <string>
#include <vector>

#include "trainer/config/config.h"
#include "trainer/schedule/schedule.h"

namespace gpipe {

struct Placement {
  int num_processes = 1;
  std::vector<int> process_of_rank;  // indexed by pipeline rank

  int num_ranks() const { return static_cast<int>(process_of_rank.size()); }
  int process_of(int rank) const { return process_of_rank.at(static_cast<size_t>(rank)); }
  bool is_local(int rank, int process) const { return process_of(rank) == process; }
  // Pipeline ranks of `process`, ascending.
  std::vector<int> ranks_of(int process) const;
  // e.g. "process 0: ranks 0 1 | process 1: ranks 2 3"
  std::string describe() const;
};

// parallel.placement when given (checked: one entry per rank, each in [0, world_size), every
// process gets a rank), else contiguous blocks of model_parallel_size / world_size ranks.
// Throws ConfigError naming the field, WORLD_SIZE and what to change.
Placement make_placement(const ParallelConfig& parallel, int world_size);

// For transports that match messages by order rather than by tag (NCCL point-to-point): true
// when, for every pair of pipeline ranks in different processes, the receiver's program
// receives the sender's messages in the order the sender's program sends them. Otherwise
// `why` names the first pair and message that differ.
bool sends_and_receives_in_same_order(const Schedule& schedule, const Placement& placement, std::string* why = nullptr);

}  // namespace gpipe

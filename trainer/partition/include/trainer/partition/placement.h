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
  std::vector<int> process_of_rank;  // indexed by pipeline rank: this replica's processes (world ranks)
  // parallel.data_parallel_size copies of the pipeline, replica r on world ranks
  // [r x processes_per_replica, (r + 1) x processes_per_replica); this process is in `replica`.
  int data_parallel_size = 1;
  int processes_per_replica = 1;
  int replica = 0;

  int num_ranks() const { return static_cast<int>(process_of_rank.size()); }
  int process_of(int rank) const { return process_of_rank.at(static_cast<size_t>(rank)); }
  bool is_local(int rank, int process) const { return process_of(rank) == process; }
  // Pipeline ranks of `process`, ascending.
  std::vector<int> ranks_of(int process) const;
  // The process that runs pipeline rank `rank` in replica `replica_index` (the same position in
  // that replica as process_of(rank) in this one).
  int process_in_replica(int rank, int replica_index) const;
  // This replica's processes, e.g. "process 0: ranks 0 1 | process 1: ranks 2 3", then
  // " (replica 1 of 2)" when the pipeline is replicated.
  std::string describe() const;
};

// The placement of the replica that process `world_rank` belongs to: parallel.placement when
// given (checked: one entry per rank, each in [0, processes per replica), every process gets a
// rank), else contiguous blocks of model_parallel_size / (processes per replica) ranks, offset to
// that replica's world ranks. Throws ConfigError naming the field, WORLD_SIZE and what to change.
Placement make_placement(const ParallelConfig& parallel, int world_size, int world_rank = 0);

// For transports that match messages by order rather than by tag (NCCL point-to-point): true
// when, for every pair of pipeline ranks in different processes, the receiver's program
// receives the sender's messages in the order the sender's program sends them. Otherwise
// `why` names the first pair and message that differ.
bool sends_and_receives_in_same_order(const Schedule& schedule, const Placement& placement, std::string* why = nullptr);

}  // namespace gpipe

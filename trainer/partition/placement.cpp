// Placement of pipeline ranks on processes, and the in-order check order-matched transports need.
#include "trainer/partition/placement.h"

#include <algorithm>
#include <map>
#include <tuple>
#include <utility>

namespace gpipe {

std::vector<int> Placement::ranks_of(int process) const {
  std::vector<int> ranks;
  for (int r = 0; r < num_ranks(); ++r) {
    if (process_of(r) == process) ranks.push_back(r);
  }
  return ranks;
}

std::string Placement::describe() const {
  std::string text;
  const int first = replica * processes_per_replica;
  for (int p = first; p < first + processes_per_replica; ++p) {
    text += (p == first ? "" : " | ") + std::string("process ") + std::to_string(p) + ": rank";
    const auto ranks = ranks_of(p);
    if (ranks.size() > 1) text += "s";
    for (int r : ranks) text += " " + std::to_string(r);
  }
  if (data_parallel_size > 1) {
    text += " (replica " + std::to_string(replica) + " of " + std::to_string(data_parallel_size) + ")";
  }
  return text;
}

namespace {

// One replica's placement over `processes` processes numbered 0..processes-1.
std::vector<int> replica_layout(const ParallelConfig& parallel, int processes, int data_parallel) {
  const int ranks = parallel.model_parallel_size;
  // Names the processes one replica has, and how they came about, in the messages below.
  const std::string world =
      data_parallel == 1 ? "WORLD_SIZE=" + std::to_string(processes)
                         : std::to_string(processes) + " processes per replica (WORLD_SIZE " +
                               std::to_string(processes * data_parallel) + " / parallel.data_parallel_size " +
                               std::to_string(data_parallel) + ")";
  if (processes > ranks) {
    throw ConfigError(world + " but parallel.model_parallel_size is " + std::to_string(ranks) +
                      ": every process runs at least one pipeline rank; start at most " + std::to_string(ranks) +
                      " processes per replica, raise model_parallel_size, or replicate the pipeline "
                      "(parallel.data_parallel_size = WORLD_SIZE / processes per pipeline)");
  }
  std::vector<int> layout;
  if (parallel.placement.empty()) {
    if (ranks % processes != 0) {
      throw ConfigError("parallel.model_parallel_size " + std::to_string(ranks) + " is not a multiple of " + world +
                        "; give parallel.placement (the process of each rank) or start a number of processes that "
                        "divides it");
    }
    const int per_process = ranks / processes;
    for (int r = 0; r < ranks; ++r) layout.push_back(r / per_process);
    return layout;
  }
  if (static_cast<int>(parallel.placement.size()) != ranks) {
    throw ConfigError("parallel.placement has " + std::to_string(parallel.placement.size()) +
                      " entries for " + std::to_string(ranks) + " pipeline ranks; give one process per rank");
  }
  std::vector<int> count(static_cast<size_t>(processes), 0);
  for (int r = 0; r < ranks; ++r) {
    const int64_t p = parallel.placement[static_cast<size_t>(r)];
    if (p < 0 || p >= processes) {
      throw ConfigError("parallel.placement[" + std::to_string(r) + "] = " + std::to_string(p) +
                        " is not a process of this run (" + world + ": 0.." + std::to_string(processes - 1) + ")");
    }
    layout.push_back(static_cast<int>(p));
    ++count[static_cast<size_t>(p)];
  }
  for (int p = 0; p < processes; ++p) {
    if (count[static_cast<size_t>(p)] == 0) {
      throw ConfigError("parallel.placement gives no pipeline rank to process " + std::to_string(p) + " of " + world +
                        "; every process must run at least one rank");
    }
  }
  return layout;
}

}  // namespace

Placement make_placement(const ParallelConfig& parallel, int world_size, int world_rank) {
  if (world_size < 1) throw ConfigError("WORLD_SIZE must be >= 1");
  const int replicas = std::max(1, parallel.data_parallel_size);
  if (world_size % replicas != 0) {
    throw ConfigError("WORLD_SIZE=" + std::to_string(world_size) + " processes do not split into parallel."
                      "data_parallel_size=" + std::to_string(replicas) + " replicas of the pipeline: start a multiple "
                      "of " + std::to_string(replicas) + " processes (--nproc-per-node, torchrun, srun -n)");
  }
  if (world_rank < 0 || world_rank >= world_size) {
    throw ConfigError("RANK=" + std::to_string(world_rank) + " is not in 0..WORLD_SIZE-1=" + std::to_string(world_size - 1));
  }
  Placement placement;
  placement.data_parallel_size = replicas;
  placement.processes_per_replica = world_size / replicas;
  placement.replica = world_rank / placement.processes_per_replica;
  const int first = placement.replica * placement.processes_per_replica;
  for (int p : replica_layout(parallel, placement.processes_per_replica, replicas)) {
    placement.process_of_rank.push_back(first + p);
  }
  return placement;
}

int Placement::process_in_replica(int rank, int replica_index) const {
  return process_of(rank) - replica * processes_per_replica + replica_index * processes_per_replica;
}

bool sends_and_receives_in_same_order(const Schedule& schedule, const Placement& placement, std::string* why) {
  // (sender rank, receiver rank) -> the messages in program order, as (kind, receiving stage, mb).
  using Message = std::tuple<int, int, int>;
  std::map<std::pair<int, int>, std::vector<Message>> sent, received;
  for (int r = 0; r < schedule.num_ranks; ++r) {
    for (const Action& a : schedule.per_rank[static_cast<size_t>(r)]) {
      switch (a.type) {
        case ActionType::kSendForward:
          sent[{r, schedule.rank_of_stage(a.stage + 1)}].emplace_back(0, a.stage + 1, a.microbatch);
          break;
        case ActionType::kSendBackward:
          sent[{r, schedule.rank_of_stage(a.stage - 1)}].emplace_back(1, a.stage - 1, a.microbatch);
          break;
        case ActionType::kRecvForward:
          received[{schedule.rank_of_stage(a.stage - 1), r}].emplace_back(0, a.stage, a.microbatch);
          break;
        case ActionType::kRecvBackward:
          received[{schedule.rank_of_stage(a.stage + 1), r}].emplace_back(1, a.stage, a.microbatch);
          break;
        default:
          break;
      }
    }
  }
  for (const auto& [pair, messages] : sent) {
    if (placement.process_of(pair.first) == placement.process_of(pair.second)) continue;
    const auto& got = received[pair];
    for (size_t i = 0; i < messages.size() || i < got.size(); ++i) {
      if (i < messages.size() && i < got.size() && messages[i] == got[i]) continue;
      if (why != nullptr) {
        auto name = [](const std::vector<Message>& v, size_t k) {
          if (k >= v.size()) return std::string("nothing");
          const auto& [kind, stage, mb] = v[k];
          return std::string(kind == 0 ? "activation" : "gradient") + " for stage " + std::to_string(stage) +
                 ", micro-batch " + std::to_string(mb);
        };
        *why = "rank " + std::to_string(pair.first) + " sends its message #" + std::to_string(i) + " to rank " +
               std::to_string(pair.second) + " as the " + name(messages, i) + " but rank " +
               std::to_string(pair.second) + " receives " + name(got, i) + " there";
      }
      return false;
    }
  }
  return true;
}

}  // namespace gpipe

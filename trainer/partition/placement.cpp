// Placement of pipeline ranks on processes, and the in-order check order-matched transports need.
#include "trainer/partition/placement.h"

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
  for (int p = 0; p < num_processes; ++p) {
    text += (p == 0 ? "" : " | ") + std::string("process ") + std::to_string(p) + ": rank";
    const auto ranks = ranks_of(p);
    if (ranks.size() > 1) text += "s";
    for (int r : ranks) text += " " + std::to_string(r);
  }
  return text;
}

Placement make_placement(const ParallelConfig& parallel, int world_size) {
  const int ranks = parallel.model_parallel_size;
  if (world_size < 1) throw ConfigError("WORLD_SIZE must be >= 1");
  if (world_size > ranks) {
    throw ConfigError("WORLD_SIZE=" + std::to_string(world_size) + " processes but parallel.model_parallel_size is " +
                      std::to_string(ranks) + ": every process runs at least one pipeline rank (there is no data "
                      "parallelism); start at most " + std::to_string(ranks) + " processes or raise model_parallel_size");
  }
  Placement placement;
  placement.num_processes = world_size;
  if (parallel.placement.empty()) {
    if (ranks % world_size != 0) {
      throw ConfigError("parallel.model_parallel_size " + std::to_string(ranks) + " is not a multiple of WORLD_SIZE=" +
                        std::to_string(world_size) + "; give parallel.placement (the process of each rank) or start a "
                        "number of processes that divides it");
    }
    const int per_process = ranks / world_size;
    for (int r = 0; r < ranks; ++r) placement.process_of_rank.push_back(r / per_process);
    return placement;
  }
  if (static_cast<int>(parallel.placement.size()) != ranks) {
    throw ConfigError("parallel.placement has " + std::to_string(parallel.placement.size()) +
                      " entries for " + std::to_string(ranks) + " pipeline ranks; give one process per rank");
  }
  std::vector<int> count(static_cast<size_t>(world_size), 0);
  for (int r = 0; r < ranks; ++r) {
    const int64_t p = parallel.placement[static_cast<size_t>(r)];
    if (p < 0 || p >= world_size) {
      throw ConfigError("parallel.placement[" + std::to_string(r) + "] = " + std::to_string(p) +
                        " is not a process of this run (WORLD_SIZE=" + std::to_string(world_size) + ": 0.." +
                        std::to_string(world_size - 1) + ")");
    }
    placement.process_of_rank.push_back(static_cast<int>(p));
    ++count[static_cast<size_t>(p)];
  }
  for (int p = 0; p < world_size; ++p) {
    if (count[static_cast<size_t>(p)] == 0) {
      throw ConfigError("parallel.placement gives no pipeline rank to process " + std::to_string(p) + " of WORLD_SIZE=" +
                        std::to_string(world_size) + "; every process must run at least one rank");
    }
  }
  return placement;
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

// Processes sharing a GPU (gpu_sharing.h): rank 0 gathers every process's GPU and says what it
// found; all ranks act on the same verdict, so none is left waiting for a peer that gave up.
#include "trainer/distributed/gpu_sharing.h"

#include <algorithm>
#include <map>
#include <stdexcept>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "trainer/config/config.h"
#include "trainer/distributed/distributed.h"

namespace gpipe {
namespace {

// "uuid\nhost\nlocal_rank": UUIDs and host names hold no newline.
std::string encode(const ProcessGpu& p) { return fmt::format("{}\n{}\n{}", p.uuid, p.host, p.local_rank); }

ProcessGpu decode(const std::string& text, int rank) {
  const size_t a = text.find('\n');
  const size_t b = a == std::string::npos ? a : text.find('\n', a + 1);
  if (b == std::string::npos) throw std::runtime_error(fmt::format("rank {} sent a malformed GPU identity", rank));
  ProcessGpu p{text.substr(0, a), text.substr(a + 1, b - a - 1), 0};
  try {
    p.local_rank = std::stoi(text.substr(b + 1));
  } catch (const std::exception&) {
    throw std::runtime_error(fmt::format("rank {} sent a malformed GPU identity", rank));
  }
  return p;
}

std::string describe(const SharedGpu& g) {
  return fmt::format("ranks {} (LOCAL_RANK {} on {}) share {}", fmt::join(g.ranks, ", "), fmt::join(g.local_ranks, ", "),
                     g.host, g.uuid);
}

// The verdict for `by_rank` (rank 0's): "error:<text>", "shared:<text>" or "".
std::string verdict_for(const std::vector<ProcessGpu>& by_rank, const std::vector<std::vector<int>>& communicators) {
  std::vector<int> cpu, gpu;
  for (size_t r = 0; r < by_rank.size(); ++r) (by_rank[r].uuid.empty() ? cpu : gpu).push_back(static_cast<int>(r));
  if (!cpu.empty() && !gpu.empty()) {
    return fmt::format(
        "error:ranks {} run on the CPU and ranks {} on CUDA GPUs: every process must see a GPU (check "
        "CUDA_VISIBLE_DEVICES and the driver on each node) or all run on the CPU (parallel.device: cpu)",
        fmt::join(cpu, ", "), fmt::join(gpu, ", "));
  }
  std::string conflicts, apart;
  for (const SharedGpu& g : shared_gpus(by_rank)) {
    const std::set<int> sharing(g.ranks.begin(), g.ranks.end());
    const std::vector<int>* met = nullptr;
    for (const std::vector<int>& c : communicators) {
      if (std::count_if(c.begin(), c.end(), [&](int r) { return sharing.count(r) != 0; }) > 1) {
        met = &c;
        break;
      }
    }
    std::string& out = met != nullptr ? conflicts : apart;
    out += (out.empty() ? "" : "; ") + describe(g) +
           (met != nullptr ? fmt::format(", and ranks {} form one NCCL communicator", fmt::join(*met, ", ")) : "");
  }
  if (!conflicts.empty()) {
    return fmt::format(
        "error:{}: NCCL cannot run two ranks of one communicator on one GPU. Each process runs on cuda:(LOCAL_RANK % "
        "visible GPUs): start at most one process per GPU (torchrun --nproc-per-node, srun --ntasks-per-node / "
        "--gpus-per-task) or make each see its own (CUDA_VISIBLE_DEVICES); pipeline ranks meant to share a GPU "
        "belong in one process (parallel.placement), where their tensors stay in memory",
        conflicts);
  }
  return apart.empty() ? "" : "shared:" + apart;
}

}  // namespace

std::set<std::pair<int, int>> sending_rank_pairs(const Schedule& schedule) {
  std::set<std::pair<int, int>> pairs;
  for (int r = 0; r < schedule.num_ranks; ++r) {
    for (const Action& a : schedule.per_rank[static_cast<size_t>(r)]) {
      if (a.type == ActionType::kSendForward) pairs.insert({r, schedule.rank_of_stage(a.stage + 1)});
      if (a.type == ActionType::kSendBackward) pairs.insert({r, schedule.rank_of_stage(a.stage - 1)});
    }
  }
  return pairs;
}

std::vector<std::vector<int>> nccl_communicators(const Placement& placement, const Schedule& schedule,
                                                 bool nccl_transport) {
  std::set<std::vector<int>> out;
  for (int replica = 0; replica < placement.data_parallel_size; ++replica) {
    if (!nccl_transport) break;
    for (const auto& [from, to] : sending_rank_pairs(schedule)) {
      const int a = placement.process_in_replica(from, replica), b = placement.process_in_replica(to, replica);
      if (a != b) out.insert({std::min(a, b), std::max(a, b)});
    }
  }
  if (placement.data_parallel_size > 1) {
    for (int stage = 0; stage < schedule.num_stages(); ++stage) {
      std::vector<int> group;
      for (int replica = 0; replica < placement.data_parallel_size; ++replica) {
        group.push_back(placement.process_in_replica(schedule.rank_of_stage(stage), replica));
      }
      std::sort(group.begin(), group.end());
      out.insert(group);
    }
  }
  return {out.begin(), out.end()};
}

std::vector<SharedGpu> shared_gpus(const std::vector<ProcessGpu>& by_rank) {
  std::map<std::string, SharedGpu> by_uuid;  // a UUID names one GPU on every host
  std::vector<std::string> order;
  for (size_t r = 0; r < by_rank.size(); ++r) {
    const ProcessGpu& p = by_rank[r];
    if (p.uuid.empty()) continue;  // the CPU is no GPU to share
    auto [it, fresh] = by_uuid.try_emplace(p.uuid, SharedGpu{p.uuid, p.host, {}, {}});
    if (fresh) order.push_back(p.uuid);
    it->second.ranks.push_back(static_cast<int>(r));
    it->second.local_ranks.push_back(p.local_rank);
  }
  std::vector<SharedGpu> out;
  for (const std::string& uuid : order) {
    if (by_uuid[uuid].ranks.size() > 1) out.push_back(std::move(by_uuid[uuid]));
  }
  return out;
}

std::string check_gpu_sharing(Distributed& dist, const ProcessGpu& mine,
                              const std::vector<std::vector<int>>& communicators) {
  const std::vector<std::string> all = dist.gather_to_rank0("gpu_identity", encode(mine));
  std::string verdict;
  if (dist.rank() == 0) {
    std::vector<ProcessGpu> by_rank;
    for (size_t r = 0; r < all.size(); ++r) by_rank.push_back(decode(all[r], static_cast<int>(r)));
    verdict = verdict_for(by_rank, communicators);
  }
  verdict = dist.broadcast_from_rank0("gpu_sharing", verdict);
  if (verdict.rfind("error:", 0) == 0) throw ConfigError(verdict.substr(6));
  return verdict.rfind("shared:", 0) == 0 ? verdict.substr(7) : "";
}

}  // namespace gpipe

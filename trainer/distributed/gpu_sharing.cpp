// Processes sharing a GPU (gpu_sharing.h): rank 0 gathers every process's GPU and says what it
// found; all ranks act on the same verdict, so none is left waiting for a peer that gave up.
#include "trainer/distributed/gpu_sharing.h"

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

std::string describe(const std::vector<SharedGpu>& shared) {
  std::string out;
  for (const SharedGpu& g : shared) {
    out += fmt::format("{}ranks {} (LOCAL_RANK {} on {}) share {}", out.empty() ? "" : "; ",
                       fmt::join(g.ranks, ", "), fmt::join(g.local_ranks, ", "), g.host, g.uuid);
  }
  return out;
}

}  // namespace

std::vector<SharedGpu> shared_gpus(const std::vector<ProcessGpu>& by_rank) {
  std::map<std::string, SharedGpu> by_uuid;  // a UUID names one GPU on every host
  std::vector<std::string> order;
  for (size_t r = 0; r < by_rank.size(); ++r) {
    const ProcessGpu& p = by_rank[r];
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

std::string check_gpu_sharing(Distributed& dist, const ProcessGpu& mine, bool nccl_between_processes) {
  const std::vector<std::string> all = dist.gather_to_rank0("gpu_identity", encode(mine));
  std::string verdict;  // "error:<text>" | "shared:<text>" | ""
  if (dist.rank() == 0) {
    std::vector<ProcessGpu> by_rank;
    for (size_t r = 0; r < all.size(); ++r) by_rank.push_back(decode(all[r], static_cast<int>(r)));
    const std::vector<SharedGpu> shared = shared_gpus(by_rank);
    if (!shared.empty()) verdict = (nccl_between_processes ? "error:" : "shared:") + describe(shared);
  }
  verdict = dist.broadcast_from_rank0("gpu_sharing", verdict);
  if (verdict.rfind("error:", 0) == 0) {
    throw ConfigError(fmt::format(
        "{}: NCCL cannot run two ranks of one communicator on one GPU (the nccl transport between processes, or "
        "the data-parallel gradient all-reduce on CUDA). Each process runs on cuda:(LOCAL_RANK % visible GPUs): "
        "start at most one process per GPU (torchrun --nproc-per-node, srun --ntasks-per-node / --gpus-per-task) "
        "or make each see its own (CUDA_VISIBLE_DEVICES); to share a GPU on purpose, use parallel.transport: gloo "
        "with parallel.data_parallel_size: 1",
        verdict.substr(6)));
  }
  return verdict.rfind("shared:", 0) == 0 ? verdict.substr(7) : "";
}

}  // namespace gpipe

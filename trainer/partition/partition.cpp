// partition_blocks(): uniform, explicit and cost-balanced splits of transformer blocks.
#include "trainer/partition/partition.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <stdexcept>

#include "trainer/config/config.h"

namespace gpipe {
namespace {

std::vector<int64_t> uniform_split(int64_t blocks, int stages) {
  std::vector<int64_t> out(stages, blocks / stages);
  int64_t extra = blocks % stages;
  // Middle stages take the remainder first; then stage 0 (an embedding lookup is cheap), then the
  // last stage (the LM head is the heaviest single layer).
  for (int s = 1; s < stages - 1 && extra > 0; ++s, --extra) ++out[s];
  if (extra > 0) ++out[0], --extra;
  if (extra > 0) ++out[stages - 1], --extra;
  return out;
}

void check_explicit(const std::vector<int64_t>& layers, int64_t blocks, int stages) {
  const std::string given = "parallel.partition_layers";
  if (static_cast<int>(layers.size()) != stages)
    throw ConfigError(given + " has " + std::to_string(layers.size()) + " entries for " + std::to_string(stages) +
                      " stages; give one block count per stage");
  for (size_t s = 0; s < layers.size(); ++s)
    if (layers[s] < 1)
      throw ConfigError(given + "[" + std::to_string(s) + "] is " + std::to_string(layers[s]) +
                        "; every stage needs at least one block");
  const int64_t sum = std::accumulate(layers.begin(), layers.end(), int64_t{0});
  if (sum != blocks)
    throw ConfigError(given + " sums to " + std::to_string(sum) + " but the model has " + std::to_string(blocks) +
                      " transformer blocks; the counts must add up to model.num_layers");
}

// Contiguous split of blocks 1..L (costs[1..L]) into `stages` non-empty parts minimising the
// largest part cost, where part 0 also pays costs[0] and the last part costs[L+1].
std::vector<int64_t> balanced_split(const std::vector<double>& costs, int stages) {
  const int64_t L = static_cast<int64_t>(costs.size()) - 2;
  std::vector<double> prefix(L + 1, 0.0);  // prefix[i] = cost of blocks 1..i
  for (int64_t i = 1; i <= L; ++i) prefix[i] = prefix[i - 1] + costs[i];
  auto part = [&](int stage, int64_t from, int64_t to) {  // blocks (from, to]
    double c = prefix[to] - prefix[from];
    if (stage == 0) c += costs[0];
    if (stage == stages - 1) c += costs[L + 1];
    return c;
  };
  constexpr double kInf = std::numeric_limits<double>::infinity();
  // best[s][i]: the smallest achievable max cost putting blocks 1..i on stages 0..s.
  std::vector<std::vector<double>> best(stages, std::vector<double>(L + 1, kInf));
  std::vector<std::vector<int64_t>> cut(stages, std::vector<int64_t>(L + 1, -1));
  for (int64_t i = 1; i <= L; ++i) best[0][i] = part(0, 0, i);
  for (int s = 1; s < stages; ++s) {
    for (int64_t i = s + 1; i <= L; ++i) {
      for (int64_t j = s; j < i; ++j) {  // stage s holds blocks (j, i]
        const double candidate = std::max(best[s - 1][j], part(s, j, i));
        if (candidate < best[s][i]) best[s][i] = candidate, cut[s][i] = j;
      }
    }
  }
  std::vector<int64_t> out(stages);
  int64_t end = L;
  for (int s = stages - 1; s > 0; --s) {
    out[s] = end - cut[s][end];
    end = cut[s][end];
  }
  out[0] = end;
  return out;
}

}  // namespace

std::vector<int64_t> partition_blocks(const std::string& method, const std::vector<double>& layer_costs,
                                      int num_stages, const std::vector<int64_t>& explicit_layers) {
  if (layer_costs.size() < 3)
    throw std::invalid_argument("partition_blocks: layer_costs has " + std::to_string(layer_costs.size()) +
                                " entries; it needs embedding, at least one block and the head");
  for (size_t i = 0; i < layer_costs.size(); ++i)
    if (!std::isfinite(layer_costs[i]) || layer_costs[i] < 0)
      throw std::invalid_argument("partition_blocks: layer_costs[" + std::to_string(i) + "] is " +
                                  std::to_string(layer_costs[i]) + "; costs must be finite and >= 0");
  const int64_t blocks = static_cast<int64_t>(layer_costs.size()) - 2;
  if (num_stages < 1) throw std::invalid_argument("partition_blocks: num_stages must be >= 1");
  if (num_stages > blocks)
    throw ConfigError(std::to_string(num_stages) + " stages but only " + std::to_string(blocks) +
                      " transformer blocks; every stage needs at least one block");
  if (method == "uniform") return uniform_split(blocks, num_stages);
  if (method == "explicit") {
    check_explicit(explicit_layers, blocks, num_stages);
    return explicit_layers;
  }
  if (method == "parameters" || method == "time") return balanced_split(layer_costs, num_stages);
  throw ConfigError("parallel.partition: unknown method '" + method + "'; allowed: uniform, explicit, parameters, time");
}

std::vector<double> stage_costs(const std::vector<double>& layer_costs, const std::vector<int64_t>& blocks_per_stage) {
  const int64_t total = std::accumulate(blocks_per_stage.begin(), blocks_per_stage.end(), int64_t{0});
  if (layer_costs.size() < 2 || total != static_cast<int64_t>(layer_costs.size()) - 2)
    throw std::invalid_argument("stage_costs: the partition covers " + std::to_string(total) + " blocks but layer_costs has " +
                                std::to_string(layer_costs.size()) + " entries (blocks + 2 expected)");
  std::vector<double> out(blocks_per_stage.size(), 0.0);
  size_t layer = 1;
  for (size_t s = 0; s < blocks_per_stage.size(); ++s)
    for (int64_t b = 0; b < blocks_per_stage[s]; ++b) out[s] += layer_costs[layer++];
  if (!out.empty()) {
    out.front() += layer_costs.front();
    out.back() += layer_costs.back();
  }
  return out;
}

}  // namespace gpipe

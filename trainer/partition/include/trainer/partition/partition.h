// Splitting a model's transformer blocks over pipeline stages (parallel.partition).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gpipe {

// Returns the number of transformer blocks of each of `num_stages` stages (they sum to the block
// count L). `layer_costs` has L + 2 entries, one per layer of ModelInterface::layer_costs(): the
// embedding (index 0, always on stage 0), the L blocks, and the final norm + LM head (last index,
// always on the last stage). Methods:
//   "uniform"     L / S each; the remainder goes to the middle stages first, then stage 0, then
//                 the last stage, since the first and last already carry embedding and head.
//                 Costs are only used for their count.
//   "explicit"    `explicit_layers` as given (VPipe's [12, 13, 13, 11]), checked: one entry per
//                 stage, each >= 1, summing to L.
//   "parameters", "time"   contiguous split minimising the largest stage cost (embedding and head
//                 included), by dynamic programming; pass parameter counts or measured times.
// Every stage gets at least one block. Bad user input (method name, explicit list) throws
// ConfigError; a cost vector that cannot be right (too short, negative, NaN) throws
// std::invalid_argument.
std::vector<int64_t> partition_blocks(const std::string& method, const std::vector<double>& layer_costs,
                                      int num_stages, const std::vector<int64_t>& explicit_layers = {});

// The cost of each stage under a partition, embedding and head included (for logs and tests).
std::vector<double> stage_costs(const std::vector<double>& layer_costs, const std::vector<int64_t>& blocks_per_stage);

}  // namespace gpipe

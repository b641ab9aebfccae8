// Shared by the schedule sources only (not a public header): the per-family generators that
// make_schedule() dispatches to, and small helpers about action types.
#pragma once

#include <vector>

#include "trainer/schedule/schedule.h"

namespace gpipe::detail {

using RankProgram = std::vector<Action>;

// Per-rank compute programs. Shapes are already checked by make_schedule().
std::vector<RankProgram> gpipe_programs(int num_ranks, int num_microbatches);
std::vector<RankProgram> one_f_one_b_programs(int num_ranks, int num_microbatches);
std::vector<RankProgram> interleaved_programs(int num_ranks, int num_microbatches, int stages_per_rank);
std::vector<RankProgram> zero_bubble_h1_programs(int num_ranks, int num_microbatches);

// Forwards rank `rank` runs before its first backward in interleaved 1F1B (torch/Megatron).
inline int interleaved_warmup(int num_ranks, int num_microbatches, int stages_per_rank, int rank) {
  const int warmup = (stages_per_rank - 1) * num_ranks + 2 * (num_ranks - 1 - rank);
  return warmup < stages_per_rank * num_microbatches ? warmup : stages_per_rank * num_microbatches;
}

inline bool is_backward_compute(ActionType t) {
  return t == ActionType::kBackward || t == ActionType::kBackwardInput;
}

}  // namespace gpipe::detail

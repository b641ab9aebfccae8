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
std::vector<RankProgram> zero_bubble_h1_programs(int num_ranks, int num_microbatches);
// Round-robin placement, stage s on rank s % p (schedule_interleaved.cpp).
std::vector<RankProgram> interleaved_programs(int num_ranks, int num_microbatches, int stages_per_rank);
std::vector<RankProgram> interleaved_zero_bubble_programs(int num_ranks, int num_microbatches, int stages_per_rank);
std::vector<RankProgram> looped_bfs_programs(int num_ranks, int num_microbatches, int stages_per_rank);
// V placement, rank r holding stages r and 2p-1-r (schedule_v.cpp; see v_stage_to_rank()).
std::vector<RankProgram> zero_bubble_v_programs(int num_ranks, int num_microbatches);
std::vector<RankProgram> dualpipe_v_programs(int num_ranks, int num_microbatches);

// torch's "flex" interleaving (ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble): the
// micro-batches go through the chunks in rounds of m / max(1, m / p) micro-batches, which is p
// when m is a multiple of p and m itself when m < 2p. make_schedule() requires
// m % max(1, m / p) == 0, as torch does, so rounds are whole.
inline int interleaved_microbatches_per_round(int num_ranks, int num_microbatches) {
  const int rounds = num_microbatches / num_ranks > 1 ? num_microbatches / num_ranks : 1;
  return num_microbatches / rounds;
}

// Forwards rank `rank` runs before its first backward in interleaved 1F1B (hops_factor 2: a
// forward and a backward per hop to the last rank and back) and interleaved zero bubble
// (hops_factor 1): torch's _get_warmup_ops, capped at the rank's v * m forwards.
inline int interleaved_warmup(int num_ranks, int num_microbatches, int stages_per_rank, int rank,
                              int hops_factor = 2) {
  const int warmup = (stages_per_rank - 1) * interleaved_microbatches_per_round(num_ranks, num_microbatches) +
                     hops_factor * (num_ranks - 1 - rank);
  return warmup < stages_per_rank * num_microbatches ? warmup : stages_per_rank * num_microbatches;
}

// The V placement of ZBV and DualPipeV: stages 0..p-1 go down the ranks, p..2p-1 come back up.
std::vector<int> v_stage_to_rank(int num_ranks);

inline bool is_backward_compute(ActionType t) {
  return t == ActionType::kBackward || t == ActionType::kBackwardInput;
}

// An asynchronous schedule's weight versions against the rule (schedule_async.cpp); a bsp
// schedule must carry none. Called by validate().
std::vector<ValidationIssue> check_weight_versions(const Schedule& schedule);

}  // namespace gpipe::detail

// GPipe and 1F1B per-rank orders, as torch.distributed.pipelining's ScheduleGPipe and
// Schedule1F1B run them (one stage per rank, stage == rank).
#include <algorithm>

#include "schedule_internal.h"

namespace gpipe::detail {

std::vector<RankProgram> gpipe_programs(int num_ranks, int num_microbatches) {
  // Fill, then drain: all forwards, then all backwards. The backward wave travels the stages in
  // reverse (last stage first); within a rank, micro-batches go in order 0..m-1 as in torch.
  std::vector<RankProgram> programs(num_ranks);
  for (int rank = 0; rank < num_ranks; ++rank) {
    for (int mb = 0; mb < num_microbatches; ++mb) programs[rank].push_back({ActionType::kForward, rank, mb});
    for (int mb = 0; mb < num_microbatches; ++mb) programs[rank].push_back({ActionType::kBackward, rank, mb});
  }
  return programs;
}

std::vector<RankProgram> one_f_one_b_programs(int num_ranks, int num_microbatches) {
  // Stage s: p-s-1 warm-up forwards, then alternate one forward and one backward, then drain.
  // This caps in-flight activations at p-s micro-batches (GPipe holds all m).
  std::vector<RankProgram> programs(num_ranks);
  for (int rank = 0; rank < num_ranks; ++rank) {
    const int warmup = std::min(num_ranks - rank - 1, num_microbatches);
    RankProgram& prog = programs[rank];
    int next_forward = 0;
    int next_backward = 0;
    for (; next_forward < warmup; ++next_forward) prog.push_back({ActionType::kForward, rank, next_forward});
    while (next_forward < num_microbatches) {
      prog.push_back({ActionType::kForward, rank, next_forward++});
      prog.push_back({ActionType::kBackward, rank, next_backward++});
    }
    while (next_backward < num_microbatches) prog.push_back({ActionType::kBackward, rank, next_backward++});
  }
  return programs;
}

}  // namespace gpipe::detail

// Interleaved 1F1B (Megatron-LM; torch.distributed.pipelining's ScheduleInterleaved1F1B): each
// rank holds v model chunks (virtual stages r, r+p, ..., r+(v-1)p). Forwards go round-robin over
// the chunks in rounds of p micro-batches, backwards over the chunks in reverse; the warm-up is
// (v-1)p + 2(p-1-r) forwards so the first backward arrives just as the warm-up ends.
#include <algorithm>

#include "schedule_internal.h"

namespace gpipe::detail {

std::vector<RankProgram> interleaved_programs(int num_ranks, int num_microbatches, int stages_per_rank) {
  const int p = num_ranks;
  const int v = stages_per_rank;
  const int per_round = p;  // micro-batches per round; make_schedule() requires m % p == 0
  const int chunk_ops = v * num_microbatches;
  std::vector<RankProgram> programs(p);
  for (int rank = 0; rank < p; ++rank) {
    const int warmup = interleaved_warmup(p, num_microbatches, v, rank);
    auto forward_stage = [&](int op) { return ((op / per_round) % v) * p + rank; };
    auto backward_stage = [&](int op) { return (v - 1 - ((op - warmup) / per_round) % v) * p + rank; };
    std::vector<int> next_forward_mb(static_cast<size_t>(v * p), 0);
    std::vector<int> next_backward_mb(static_cast<size_t>(v * p), 0);
    RankProgram& prog = programs[rank];
    auto forward = [&](int op) {
      const int stage = forward_stage(op);
      prog.push_back({ActionType::kForward, stage, next_forward_mb[stage]++});
    };
    auto backward = [&](int op) {
      const int stage = backward_stage(op);
      prog.push_back({ActionType::kBackward, stage, next_backward_mb[stage]++});
    };
    for (int op = 0; op < warmup; ++op) forward(op);
    for (int op = warmup; op < chunk_ops; ++op) {
      forward(op);
      backward(op);
    }
    for (int op = chunk_ops; op < chunk_ops + warmup; ++op) backward(op);
  }
  return programs;
}

}  // namespace gpipe::detail

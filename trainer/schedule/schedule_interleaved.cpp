// Schedules with several model chunks per rank in the round-robin placement (rank r holds
// virtual stages r, r+p, ..., r+(v-1)p), as torch.distributed.pipelining 2.11 orders them:
//  * interleaved 1F1B (Megatron-LM; ScheduleInterleaved1F1B): forwards go round-robin over the
//    chunks in rounds of micro-batches, backwards over the chunks in reverse, one forward and one
//    backward alternating in the steady state;
//  * interleaved zero bubble (ZB1P of Qi et al. 2023; ScheduleInterleavedZeroBubble): the same
//    walk with the backward split into I and W, a shorter warm-up, and each W deferred until the
//    rank has done `rank` steady-state pairs, so the W passes fill what would be bubbles;
//  * looped BFS (Lamy-Poirier 2022, "Breadth-First Pipeline Parallelism"; ScheduleLoopedBFS): all
//    micro-batches through one chunk before the next, backwards in reverse order.
// The orders equal torch's pipeline_order less its empty slots (tests/trainer/
// torch_schedule_csv_test.py compares them for every shape torch accepts, p = 2..4).
#include "schedule_internal.h"

namespace gpipe::detail {
namespace {

// torch's _get_1f1b_rank_ops for one rank, without the None padding (the dry run finds the
// waits). Ops are numbered 0..v*m+warmup-1: op k < warmup is a forward, warmup <= k < v*m a
// forward then a backward, the last `warmup` ops a backward. The chunk of op k is
// forward_chunk(k) = (k / per_round) % v for forwards, and for backwards counts down from the
// last chunk starting at the first backward op: v-1 - ((k - warmup) / per_round) % v. Each
// (stage, kind) takes micro-batches in order. With zero_bubble the backward is I, and the W of
// the oldest backward not yet weighted follows each backward once `weight_delay` steady-state
// backwards have run; the rest come at the end.
RankProgram flex_interleaved_rank(int p, int m, int v, int rank, int warmup, bool zero_bubble, int weight_delay) {
  const int per_round = interleaved_microbatches_per_round(p, m);
  const int microbatch_ops = v * m;
  auto forward_stage = [&](int op) { return ((op / per_round) % v) * p + rank; };
  auto backward_stage = [&](int op) { return (v - 1 - ((op - warmup) / per_round) % v) * p + rank; };
  // Next micro-batch per stage for F, for B/I and for W.
  std::vector<int> next_f(static_cast<size_t>(p * v), 0), next_b(next_f), next_w(next_f);
  std::vector<int> backward_ops;  // op numbers of the backwards so far, to place their W
  size_t weighted = 0;
  const ActionType backward_type = zero_bubble ? ActionType::kBackwardInput : ActionType::kBackward;
  RankProgram prog;
  auto forward = [&](int op) {
    const int stage = forward_stage(op);
    prog.push_back({ActionType::kForward, stage, next_f[static_cast<size_t>(stage)]++});
  };
  auto weight = [&] {
    const int stage = backward_stage(backward_ops[weighted++]);
    prog.push_back({ActionType::kBackwardWeight, stage, next_w[static_cast<size_t>(stage)]++});
  };
  auto backward = [&](int op) {
    const int stage = backward_stage(op);
    prog.push_back({backward_type, stage, next_b[static_cast<size_t>(stage)]++});
    backward_ops.push_back(op);
    if (zero_bubble && op - warmup >= weight_delay) weight();
  };
  for (int op = 0; op < microbatch_ops + warmup; ++op) {
    if (op < microbatch_ops) forward(op);
    if (op >= warmup) backward(op);
  }
  while (zero_bubble && weighted < backward_ops.size()) weight();
  return prog;
}

}  // namespace

std::vector<RankProgram> interleaved_programs(int num_ranks, int num_microbatches, int stages_per_rank) {
  // The warm-up, (v-1) rounds plus two ops per hop to the last rank, is what lets the first
  // backward arrive just as the warm-up ends.
  std::vector<RankProgram> programs(static_cast<size_t>(num_ranks));
  for (int rank = 0; rank < num_ranks; ++rank)
    programs[static_cast<size_t>(rank)] = flex_interleaved_rank(
        num_ranks, num_microbatches, stages_per_rank, rank,
        interleaved_warmup(num_ranks, num_microbatches, stages_per_rank, rank), /*zero_bubble=*/false, 0);
  return programs;
}

std::vector<RankProgram> interleaved_zero_bubble_programs(int num_ranks, int num_microbatches, int stages_per_rank) {
  // One op per hop in the warm-up (I is half a backward, so the gradient comes back sooner), and
  // rank r keeps r W passes outstanding through the steady state (torch's num_1f1b_microbatches
  // = rank): the ranks nearer the start wait longest for gradients and fill the wait with W.
  // torch then pads the order with bubbles (_add_bubbles_to_actions), which moves no action.
  std::vector<RankProgram> programs(static_cast<size_t>(num_ranks));
  for (int rank = 0; rank < num_ranks; ++rank)
    programs[static_cast<size_t>(rank)] = flex_interleaved_rank(
        num_ranks, num_microbatches, stages_per_rank, rank,
        interleaved_warmup(num_ranks, num_microbatches, stages_per_rank, rank, /*hops_factor=*/1),
        /*zero_bubble=*/true, /*weight_delay=*/rank);
  return programs;
}

std::vector<RankProgram> looped_bfs_programs(int num_ranks, int num_microbatches, int stages_per_rank) {
  // Breadth first: every micro-batch through chunk 0, then chunk 1, ...; then the backwards
  // chunk by chunk from the last, micro-batches last to first (the last forward's activation is
  // the freshest; torch's order).
  std::vector<RankProgram> programs(static_cast<size_t>(num_ranks));
  for (int rank = 0; rank < num_ranks; ++rank) {
    RankProgram& prog = programs[static_cast<size_t>(rank)];
    for (int chunk = 0; chunk < stages_per_rank; ++chunk)
      for (int mb = 0; mb < num_microbatches; ++mb) prog.push_back({ActionType::kForward, chunk * num_ranks + rank, mb});
    for (int chunk = stages_per_rank - 1; chunk >= 0; --chunk)
      for (int mb = num_microbatches - 1; mb >= 0; --mb)
        prog.push_back({ActionType::kBackward, chunk * num_ranks + rank, mb});
  }
  return programs;
}

}  // namespace gpipe::detail

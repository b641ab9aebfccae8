// Schedules over the V placement: rank r holds stage r (chunk 0, on the way down) and stage
// 2p-1-r (chunk 1, on the way back up), so the last rank holds the middle two stages and rank 0
// both the first and the last: the loss is computed where the input came in, and a micro-batch's
// forward on chunk 1 follows its chunk 0 forward on the last rank without communication.
//  * ZBV (Qi et al. 2023, "Zero Bubble Pipeline Parallelism", section 6; torch's
//    ScheduleZBVZeroBubble): backward split into I and W; with F = I = W in time it has no bubble.
//  * DualPipeV (DeepSeek-V3's DualPipe folded onto the V, github.com/deepseek-ai/DualPipe;
//    torch's ScheduleDualPipeV): in the steady state each forward of one chunk is paired with a
//    full backward of the other (an overlapped pair, Action::overlaps_next), so their computation
//    and communication can overlap.
// Both are ports of torch 2.11's _calculate_single_rank_operations for these classes, phase by
// phase, with the orders equal to torch's pipeline_order less its empty slots
// (tests/trainer/torch_schedule_csv_test.py compares them for every shape torch accepts, p = 2..4).
#include <algorithm>
#include <deque>
#include <map>
#include <utility>

#include "schedule_internal.h"

namespace gpipe::detail {

std::vector<int> v_stage_to_rank(int num_ranks) {
  std::vector<int> placement(static_cast<size_t>(2 * num_ranks));
  for (int rank = 0; rank < num_ranks; ++rank) {
    placement[static_cast<size_t>(rank)] = rank;
    placement[static_cast<size_t>(2 * num_ranks - 1 - rank)] = rank;
  }
  return placement;
}

std::vector<RankProgram> zero_bubble_v_programs(int num_ranks, int num_microbatches) {
  const int p = num_ranks;
  // The pattern needs at least 2p-1 micro-batches to fill the V; with fewer, torch builds it for
  // 2p-1 and drops the actions of the micro-batches that do not exist (its None slots), which
  // keeps the relative order of the rest. So do we.
  const int m_pattern = std::max(2 * p - 1, num_microbatches);
  std::vector<RankProgram> programs(static_cast<size_t>(p));
  for (int rank = 0; rank < p; ++rank) {
    const int chunk0 = rank, chunk1 = 2 * p - 1 - rank;
    int f0 = 0, f1 = 0, b0 = 0, b1 = 0;  // next forward / input-gradient micro-batch per chunk
    RankProgram prog;
    auto add = [&](ActionType t, int stage, int mb) {
      if (mb < num_microbatches) prog.push_back({t, stage, mb});
    };
    // Warm-up 1: chunk-0 forwards until the first chunk-1 forward can arrive from below
    // (2(p-r)-1 of them: down to the last rank and back up to this one).
    for (int i = 0; i < 2 * (p - rank) - 1; ++i) add(ActionType::kForward, chunk0, f0++);
    // Warm-up 2: alternate chunk-1 and chunk-0 forwards while the first backward travels up.
    for (int i = 0; i < rank; ++i) {
      add(ActionType::kForward, chunk1, f1++);
      add(ActionType::kForward, chunk0, f0++);
    }
    // Warm-up 3: chunk 1 runs F, I, W back to back: its gradient comes from the stage above on
    // this same side of the V, one hop away.
    for (int i = 0; i < p - rank; ++i) {
      add(ActionType::kForward, chunk1, f1);
      add(ActionType::kBackwardInput, chunk1, b1);
      add(ActionType::kBackwardWeight, chunk1, b1);
      ++f1;
      ++b1;
    }
    // Steady state: F I W on chunk 0, then F I W on chunk 1, until every forward has run.
    while (f1 < f0 || f0 < m_pattern) {
      if (f0 < m_pattern) add(ActionType::kForward, chunk0, f0++);
      add(ActionType::kBackwardInput, chunk0, b0);
      add(ActionType::kBackwardWeight, chunk0, b0);
      ++b0;
      add(ActionType::kForward, chunk1, f1++);
      add(ActionType::kBackwardInput, chunk1, b1);
      add(ActionType::kBackwardWeight, chunk1, b1);
      ++b1;
    }
    // Cool-down: the remaining input gradients first (they are on the critical path to rank 0),
    // their W passes after.
    int w0 = b0, w1 = b1;
    for (int i = 0; i < rank; ++i) {
      add(ActionType::kBackwardInput, chunk0, b0++);
      add(ActionType::kBackwardInput, chunk1, b1++);
    }
    for (int i = 0; i < p - rank; ++i) {
      add(ActionType::kBackwardInput, chunk0, b0++);
      add(ActionType::kBackwardWeight, chunk0, w0++);
    }
    while (w1 < b1) add(ActionType::kBackwardWeight, chunk1, w1++);
    while (w0 < b0) add(ActionType::kBackwardWeight, chunk0, w0++);
    programs[static_cast<size_t>(rank)] = std::move(prog);
  }
  return programs;
}

std::vector<RankProgram> dualpipe_v_programs(int num_ranks, int num_microbatches) {
  const int p = num_ranks;
  const int m = num_microbatches;  // make_schedule() requires m >= 2p
  std::vector<RankProgram> programs(static_cast<size_t>(p));
  for (int rank = 0; rank < p; ++rank) {
    const int chunk0 = rank, chunk1 = 2 * p - 1 - rank;
    RankProgram prog;
    // Next micro-batch per (stage, kind). A full backward B counts as both the I and the W of its
    // micro-batch: B and I share one counter, and W passes only come from the queue below.
    std::map<std::pair<int, ActionType>, int> next;
    std::deque<std::pair<int, int>> pending_weights;  // (stage, micro-batch) of I passes without W
    auto add = [&](int stage, ActionType t) {
      const ActionType counter = t == ActionType::kBackward ? ActionType::kBackwardInput : t;
      const int mb = next[{stage, counter}]++;
      prog.push_back({t, stage, mb});
      if (t == ActionType::kBackwardInput) pending_weights.emplace_back(stage, mb);
    };
    auto weight_if_pending = [&] {
      if (pending_weights.empty()) return;
      const auto [stage, mb] = pending_weights.front();
      pending_weights.pop_front();
      prog.push_back({ActionType::kBackwardWeight, stage, mb});
    };
    // torch's OVERLAP_F_B "(F;B)": the forward of one chunk and the full backward of the other,
    // run at the same time (Action::overlaps_next).
    auto overlapped_forward_backward = [&](int forward_stage, int backward_stage) {
      add(forward_stage, ActionType::kForward);
      prog.back().overlaps_next = true;
      add(backward_stage, ActionType::kBackward);
    };

    // 1. Chunk-0 forwards while the V fills below this rank.
    for (int i = 0; i < 2 * (p - rank - 1); ++i) add(chunk0, ActionType::kForward);
    // 2. Chunk-0 and chunk-1 forwards alternate.
    for (int i = 0; i < rank + 1; ++i) {
      add(chunk0, ActionType::kForward);
      add(chunk1, ActionType::kForward);
    }
    // 3. Chunk 1: I, a deferred W, F (zero-bubble style while the gradients start to flow).
    for (int i = 0; i < p - rank - 1; ++i) {
      add(chunk1, ActionType::kBackwardInput);
      weight_if_pending();
      add(chunk1, ActionType::kForward);
    }
    // 4. Steady state: F0 with B1, then F1 with B0, each pair overlapped. The last rank's first
    //    F0 and B1 run one after the other (torch: it shortens the bubble).
    for (int i = 0; i < m - 2 * p + rank + 1; ++i) {
      if (i == 0 && rank == p - 1) {
        add(chunk0, ActionType::kForward);
        add(chunk1, ActionType::kBackward);
      } else {
        overlapped_forward_backward(chunk0, chunk1);
      }
      overlapped_forward_backward(chunk1, chunk0);
    }
    // 5. B1 alone, then F1 with B0.
    for (int i = 0; i < p - rank - 1; ++i) {
      add(chunk1, ActionType::kBackward);
      overlapped_forward_backward(chunk1, chunk0);
    }
    // 6. B1 B0; from the middle on the backwards split (I now, W later) so W can fill the
    //    cool-down bubble. Odd ranks switch before B1 of the middle step, even ranks after it.
    bool split = false;
    const int step6 = rank + 1;
    for (int i = 0; i < step6; ++i) {
      if (i == step6 / 2 && rank % 2 == 1) split = true;
      add(chunk1, split ? ActionType::kBackwardInput : ActionType::kBackward);
      if (i == step6 / 2 && rank % 2 == 0) split = true;
      add(chunk0, split ? ActionType::kBackwardInput : ActionType::kBackward);
    }
    // 7. A deferred W, then the next chunk-0 backward.
    for (int i = 0; i < p - rank - 1; ++i) {
      weight_if_pending();
      add(chunk0, split ? ActionType::kBackwardInput : ActionType::kBackward);
    }
    // 8. The rank + 1 W passes still pending.
    for (int i = 0; i < rank + 1; ++i) weight_if_pending();
    programs[static_cast<size_t>(rank)] = std::move(prog);
  }
  return programs;
}

}  // namespace gpipe::detail

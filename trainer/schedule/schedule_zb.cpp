// ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", 2023): the backward is split into the
// input-gradient pass I (on the critical path between stages) and the weight-gradient pass W
// (local, can wait). The order is built by a unit-time list scheduler (F = I = W = 1, free
// communication), which reproduces the paper's handcrafted ZB-H1: each rank runs I as soon as
// the gradient arrives, else the next F if its input is there and the memory cap allows, else a
// deferred W. Caps: stage s holds at most p-s micro-batches between F and I (1F1B's activation
// memory; I frees the bulk of it, W keeps only the layer inputs it needs) and starts an I only
// with at most s W passes outstanding. With F = I = W the bubble is (p-1) units per rank against
// 1F1B's 3(p-1): a third.
#include <algorithm>
#include <limits>

#include "schedule_internal.h"

namespace gpipe::detail {

std::vector<RankProgram> zero_bubble_h1_programs(int num_ranks, int num_microbatches) {
  const int p = num_ranks;
  const int m = num_microbatches;
  constexpr int kNotYet = std::numeric_limits<int>::max();
  // finish[r][mb]: time at which F / I of micro-batch mb finished on rank r.
  std::vector<std::vector<int>> forward_done(p, std::vector<int>(m, kNotYet));
  std::vector<std::vector<int>> input_grad_done(p, std::vector<int>(m, kNotYet));
  std::vector<int> next_f(p, 0), next_i(p, 0), next_w(p, 0);
  std::vector<RankProgram> programs(p);
  int finished_ranks = 0;
  for (int t = 0; finished_ranks < p; ++t) {
    finished_ranks = 0;
    for (int r = 0; r < p; ++r) {
      const int f = next_f[r], i = next_i[r], w = next_w[r];
      if (w == m) {
        ++finished_ranks;
        continue;
      }
      const bool can_i = i < f && forward_done[r][i] <= t && (r == p - 1 || input_grad_done[r + 1][i] <= t) &&
                         i - w <= r;  // at most r deferred W passes on stage r
      const bool memory_ok = f - i < p - r;
      const bool can_f = f < m && memory_ok && (r == 0 || forward_done[r - 1][f] <= t);
      const bool can_w = w < i;
      if (can_i) {
        programs[r].push_back({ActionType::kBackwardInput, r, i});
        input_grad_done[r][i] = t + 1;
        ++next_i[r];
      } else if (can_f) {
        programs[r].push_back({ActionType::kForward, r, f});
        forward_done[r][f] = t + 1;
        ++next_f[r];
      } else if (can_w) {
        programs[r].push_back({ActionType::kBackwardWeight, r, w});
        ++next_w[r];
      }
    }
  }
  return programs;
}

}  // namespace gpipe::detail

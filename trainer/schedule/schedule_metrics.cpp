// Cost metrics of a schedule: the bubble share under a unit-cost event simulation and the
// activation-memory peak per rank.
#include <algorithm>
#include <limits>
#include <map>
#include <stdexcept>
#include <tuple>

#include "schedule_internal.h"

namespace gpipe {

double simulated_bubble_fraction(const Schedule& schedule, double forward_cost, double backward_cost) {
  if (!(forward_cost > 0) || !(backward_cost > 0))
    throw std::invalid_argument("simulated_bubble_fraction: costs must be > 0");
  const int P = schedule.num_ranks;
  const int S = schedule.num_stages();
  // Finish time of each (type, stage, mb) compute action; communication is free.
  std::map<std::tuple<ActionType, int, int>, double> finish;
  auto finished = [&](ActionType t, int stage, int mb, double* when) {
    auto it = finish.find({t, stage, mb});
    if (it == finish.end()) return false;
    *when = it->second;
    return true;
  };
  auto cost = [&](ActionType t) {
    if (t == ActionType::kForward) return forward_cost;
    if (t == ActionType::kBackward) return backward_cost;
    return backward_cost / 2;  // I and W each take half of a full backward
  };
  std::vector<size_t> pc(P, 0);
  std::vector<double> clock(P, 0.0), busy(P, 0.0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < P; ++r) {
      const auto& prog = schedule.per_rank[r];
      while (pc[r] < prog.size()) {
        const Action& a = prog[pc[r]];
        if (is_communication(a.type)) {
          ++pc[r];
          continue;
        }
        double ready = clock[r];
        double t = 0;
        bool ok = true;
        if (a.type == ActionType::kForward && a.stage > 0) {
          ok = finished(ActionType::kForward, a.stage - 1, a.microbatch, &t);
          ready = std::max(ready, t);
        } else if (detail::is_backward_compute(a.type)) {
          ok = finished(ActionType::kForward, a.stage, a.microbatch, &t);
          ready = std::max(ready, t);
          if (ok && a.stage < S - 1) {
            ok = finished(ActionType::kBackward, a.stage + 1, a.microbatch, &t) ||
                 finished(ActionType::kBackwardInput, a.stage + 1, a.microbatch, &t);
            ready = std::max(ready, t);
          }
        } else if (a.type == ActionType::kBackwardWeight) {
          ok = finished(ActionType::kBackwardInput, a.stage, a.microbatch, &t);
          ready = std::max(ready, t);
        }
        if (!ok) break;  // waits for another rank; come back on the next sweep
        clock[r] = ready + cost(a.type);
        busy[r] += cost(a.type);
        finish[{a.type, a.stage, a.microbatch}] = clock[r];
        ++pc[r];
        progress = true;
      }
    }
  }
  for (int r = 0; r < P; ++r)
    if (pc[r] < schedule.per_rank[r].size())
      throw std::invalid_argument("simulated_bubble_fraction: rank " + std::to_string(r) + " never gets past " +
                                  to_string(schedule.per_rank[r][pc[r]]) + "; run validate() for the reason");
  const double makespan = *std::max_element(clock.begin(), clock.end());
  double total_busy = 0;
  for (double b : busy) total_busy += b;
  if (makespan <= 0) return 0.0;
  return 1.0 - total_busy / (P * makespan);
}

std::vector<int> peak_activations(const Schedule& schedule) {
  std::vector<int> peak(schedule.num_ranks, 0);
  for (int r = 0; r < schedule.num_ranks; ++r) {
    int held = 0;
    const auto& program = schedule.per_rank[r];
    for (size_t k = 0; k < program.size(); ++k) {
      // Both halves of an overlapped pair are live at once: its forward's activation is counted
      // before its backward frees one, whichever half the program names first.
      const bool pair = program[k].overlaps_next && k + 1 < program.size();
      int forwards = 0, backwards = 0;
      for (size_t i = k; i <= k + (pair ? 1 : 0); ++i) {
        forwards += program[i].type == ActionType::kForward ? 1 : 0;
        backwards += detail::is_backward_compute(program[i].type) ? 1 : 0;
      }
      held += forwards;
      peak[r] = std::max(peak[r], held);
      held -= backwards;
      if (pair) ++k;
    }
  }
  return peak;
}

}  // namespace gpipe

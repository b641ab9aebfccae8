// Cost metrics of a schedule: its step time and bubble under an event simulation with per-stage
// costs, and the activation-memory peak per rank.
#include <algorithm>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "schedule_internal.h"

namespace gpipe {

SimulatedStep simulate_step(const Schedule& schedule, const std::vector<StageCosts>& stage_costs) {
  const int P = schedule.num_ranks;
  const int S = schedule.num_stages();
  if (stage_costs.size() != 1 && static_cast<int>(stage_costs.size()) != S) {
    throw std::invalid_argument("simulate_step: " + std::to_string(stage_costs.size()) + " stage costs for " +
                                std::to_string(S) + " stages (give one, or one per stage)");
  }
  for (const StageCosts& c : stage_costs) {
    if (!(c.forward >= 0) || !(c.backward_input >= 0) || !(c.backward_weight >= 0)) {
      throw std::invalid_argument("simulate_step: costs must be >= 0");
    }
  }
  // Finish time of each (type, stage, mb) compute action; communication is free.
  std::map<std::tuple<ActionType, int, int>, double> finish;
  auto finished = [&](ActionType t, int stage, int mb, double* when) {
    auto it = finish.find({t, stage, mb});
    if (it == finish.end()) return false;
    *when = it->second;
    return true;
  };
  auto cost = [&](const Action& a) {
    const StageCosts& c = stage_costs.size() == 1 ? stage_costs.front() : stage_costs[a.stage];
    if (a.type == ActionType::kForward) return c.forward;
    if (a.type == ActionType::kBackward) return c.backward_input + c.backward_weight;
    if (a.type == ActionType::kBackwardInput) return c.backward_input;
    return c.backward_weight;
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
        clock[r] = ready + cost(a);
        busy[r] += cost(a);
        finish[{a.type, a.stage, a.microbatch}] = clock[r];
        ++pc[r];
        progress = true;
      }
    }
  }
  for (int r = 0; r < P; ++r)
    if (pc[r] < schedule.per_rank[r].size())
      throw std::invalid_argument("simulate_step: rank " + std::to_string(r) + " never gets past " +
                                  to_string(schedule.per_rank[r][pc[r]]) + "; run validate() for the reason");
  SimulatedStep out;
  out.makespan = *std::max_element(clock.begin(), clock.end());
  out.busy = busy;
  double total_busy = 0;
  for (double b : busy) total_busy += b;
  out.bubble = out.makespan > 0 ? 1.0 - total_busy / (P * out.makespan) : 0.0;
  return out;
}

double simulated_bubble_fraction(const Schedule& schedule, double forward_cost, double backward_cost) {
  if (!(forward_cost > 0) || !(backward_cost > 0))
    throw std::invalid_argument("simulated_bubble_fraction: costs must be > 0");
  // I and W each take half of a full backward.
  return simulate_step(schedule, {StageCosts{forward_cost, backward_cost / 2, backward_cost / 2}}).bubble;
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

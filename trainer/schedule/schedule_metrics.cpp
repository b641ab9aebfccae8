// Cost metrics of a schedule: its step time and bubble under an event simulation with per-stage
// costs, and the activation-memory peak per rank.
#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>
#include <vector>

#include "schedule_internal.h"

namespace gpipe {

SimulatedStep simulate_step(const Schedule& schedule, const std::vector<StageCosts>& stage_costs,
                            const SimulateOptions& options) {
  const int P = schedule.num_ranks;
  const int S = schedule.num_stages();
  if (stage_costs.size() != 1 && static_cast<int>(stage_costs.size()) != S) {
    throw std::invalid_argument("simulate_step: " + std::to_string(stage_costs.size()) + " stage costs for " +
                                std::to_string(S) + " stages (give one, or one per stage)");
  }
  for (const StageCosts& c : stage_costs) {
    if (!(c.forward >= 0) || !(c.backward_input >= 0) || !(c.backward_weight >= 0) || !(c.send_activation >= 0) ||
        !(c.send_gradient >= 0)) {
      throw std::invalid_argument("simulate_step: costs must be >= 0");
    }
  }
  if (!(options.pair_serial_share >= 0 && options.pair_serial_share <= 1)) {
    throw std::invalid_argument("simulate_step: pair_serial_share must be in [0, 1]");
  }
  for (double c : options.rank_concurrency) {
    if (!(c > 0) || !std::isfinite(c)) throw std::invalid_argument("simulate_step: rank_concurrency entries must be > 0");
  }
  if (options.devices < 1 || options.replicas < 1) {
    throw std::invalid_argument("simulate_step: devices and replicas must be >= 1");
  }
  const auto costs_of = [&](int stage) -> const StageCosts& {
    return stage_costs.size() == 1 ? stage_costs.front() : stage_costs[static_cast<size_t>(stage)];
  };
  // Finish time of each (type, stage, mb) compute action.
  std::map<std::tuple<ActionType, int, int>, double> finish;
  auto finished = [&](ActionType t, int stage, int mb, double* when) {
    auto it = finish.find({t, stage, mb});
    if (it == finish.end()) return false;
    *when = it->second;
    return true;
  };
  auto cost = [&](const Action& a) {
    const StageCosts& c = costs_of(a.stage);
    if (a.type == ActionType::kForward) return c.forward;
    if (a.type == ActionType::kBackward) return c.backward_input + c.backward_weight;
    if (a.type == ActionType::kBackwardInput) return c.backward_input;
    return c.backward_weight;
  };
  // When `a`'s inputs are there (false: one is not produced yet). A tensor from another rank
  // arrives its transfer time after its producer ends.
  auto inputs_ready = [&](const Action& a, double* ready) {
    double t = 0;
    if (a.type == ActionType::kForward && a.stage > 0) {
      if (!finished(ActionType::kForward, a.stage - 1, a.microbatch, &t)) return false;
      if (schedule.rank_of_stage(a.stage - 1) != schedule.rank_of_stage(a.stage)) t += costs_of(a.stage - 1).send_activation;
      *ready = std::max(*ready, t);
    } else if (detail::is_backward_compute(a.type)) {
      if (!finished(ActionType::kForward, a.stage, a.microbatch, &t)) return false;
      *ready = std::max(*ready, t);
      if (a.stage < S - 1) {
        if (!finished(ActionType::kBackward, a.stage + 1, a.microbatch, &t) &&
            !finished(ActionType::kBackwardInput, a.stage + 1, a.microbatch, &t)) {
          return false;
        }
        if (schedule.rank_of_stage(a.stage + 1) != schedule.rank_of_stage(a.stage)) t += costs_of(a.stage + 1).send_gradient;
        *ready = std::max(*ready, t);
      }
    } else if (a.type == ActionType::kBackwardWeight) {
      if (!finished(ActionType::kBackwardInput, a.stage, a.microbatch, &t)) return false;
      *ready = std::max(*ready, t);
    }
    return true;
  };
  SimulatedStep out;
  out.timeline.resize(static_cast<size_t>(P));
  std::vector<size_t> pc(P, 0);
  std::vector<double> busy(P, 0.0);
  // What each rank runs now: one action, or an overlapped pair (second != npos), with the work
  // left in ms at full speed on each of its threads (a pair on a shared device runs as two
  // threads, each taking its share of the device; elsewhere as one of pair_serial_share's length).
  constexpr size_t kNone = static_cast<size_t>(-1);
  struct Running {
    bool active = false;
    size_t first = 0, second = kNone;
    double start = 0, work = 0;
    double remaining[2] = {0, 0};
    int threads() const { return (remaining[0] > 0 ? 1 : 0) + (remaining[1] > 0 ? 1 : 0); }
  };
  const bool shared_device = !options.rank_concurrency.empty();
  std::vector<Running> run(static_cast<size_t>(P));
  const int devices = options.rank_concurrency.empty() ? P : std::max(1, options.devices);
  const int replicas = std::max(1, options.replicas);
  auto rate_for = [&](int n) {
    if (options.rank_concurrency.empty() || n <= 1) return 1.0;
    const size_t k = std::min(static_cast<size_t>(n), options.rank_concurrency.size());
    return std::min(1.0, options.rank_concurrency[k - 1] / static_cast<double>(n));
  };
  auto record = [&](int r, const Action& a, double start, double end) {
    finish[{a.type, a.stage, a.microbatch}] = end;
    out.timeline[static_cast<size_t>(r)].push_back(SimulatedAction{a, start, end});
  };
  double now = 0;
  for (;;) {
    // Start whatever can start now; note the earliest time a blocked rank's inputs arrive.
    double next_arrival = std::numeric_limits<double>::infinity();
    for (int r = 0; r < P; ++r) {
      auto& slot = run[static_cast<size_t>(r)];
      const auto& prog = schedule.per_rank[r];
      // Communication costs a rank no time: sends never wait (buffered), and a receive only posts
      // (the executors take the tensor at the compute that needs it, Transport::recv_waits_on_host;
      // NCCL's consumer stream waits there): the compute waits for its input, inputs_ready.
      while (!slot.active && pc[r] < prog.size() && is_communication(prog[pc[r]].type)) ++pc[r];
      if (slot.active || pc[r] >= prog.size()) continue;
      const Action& a = prog[pc[r]];
      size_t second = pc[r] + 1;
      while (a.overlaps_next && second < prog.size() && is_communication(prog[second].type)) ++second;
      // Fully serial halves (share 1) run back to back, the first as soon as its own inputs are
      // there: what one saturated device does with a pair.
      const bool pair =
          a.overlaps_next && second < prog.size() && (options.pair_serial_share < 1 || shared_device);
      double ready = 0;
      if (!inputs_ready(a, &ready) || (pair && !inputs_ready(prog[second], &ready))) continue;  // produced later
      if (ready > now + 1e-12) {
        next_arrival = std::min(next_arrival, ready);
        continue;
      }
      slot = Running{};
      slot.active = true;
      slot.first = pc[r];
      slot.start = now;
      if (!pair) {
        slot.work = slot.remaining[0] = cost(a);
      } else {
        slot.second = second;
        const double ca = cost(a), cb = cost(prog[second]);
        if (shared_device) {
          slot.remaining[0] = ca;
          slot.remaining[1] = cb;
          slot.work = std::max(ca, cb);
        } else {
          slot.work = slot.remaining[0] = std::max(ca, cb) + options.pair_serial_share * std::min(ca, cb);
        }
      }
      // A zero-cost action still has to end: it takes no time, on one thread.
      if (slot.threads() == 0) slot.remaining[0] = 1e-300;
    }
    // Speeds: the running ranks of each device share it.
    std::vector<int> running_on(static_cast<size_t>(devices), 0);
    for (int r = 0; r < P; ++r)
      if (run[static_cast<size_t>(r)].active) running_on[static_cast<size_t>(r % devices)] += run[static_cast<size_t>(r)].threads();
    double next = next_arrival;
    for (int r = 0; r < P; ++r) {
      const auto& slot = run[static_cast<size_t>(r)];
      if (!slot.active) continue;
      const double rate = rate_for(running_on[static_cast<size_t>(r % devices)] * replicas);
      for (double left : slot.remaining)
        if (left > 0) next = std::min(next, now + left / rate);
    }
    if (!std::isfinite(next)) break;  // nothing runs and nothing will arrive: done, or stuck
    for (int r = 0; r < P; ++r) {
      auto& slot = run[static_cast<size_t>(r)];
      if (!slot.active) continue;
      const double rate = rate_for(running_on[static_cast<size_t>(r % devices)] * replicas);
      for (double& left : slot.remaining) {
        if (left <= 0) continue;
        // A thread whose own end is the next event ends there exactly (no rounding left over,
        // which at large clock values could stall the loop).
        if (now + left / rate <= next) {
          left = 0;
        } else {
          left -= rate * (next - now);
          if (left <= 1e-9 * std::max(1.0, slot.work)) left = 0;
        }
      }
      busy[r] += next - now;
    }
    now = next;
    for (int r = 0; r < P; ++r) {
      auto& slot = run[static_cast<size_t>(r)];
      if (!slot.active || slot.threads() > 0) continue;
      const auto& prog = schedule.per_rank[r];
      if (slot.second == kNone) {
        record(r, prog[slot.first], slot.start, now);
        pc[r] = slot.first + 1;
      } else {
        // Both halves' sends follow the pair (with_communication): their results leave together.
        record(r, prog[slot.first], slot.start, now);
        record(r, prog[slot.second], slot.start, now);
        pc[r] = slot.second + 1;
      }
      slot.active = false;
    }
  }
  std::vector<double> clock(P, 0.0);
  for (int r = 0; r < P; ++r)
    for (const auto& sa : out.timeline[static_cast<size_t>(r)]) clock[r] = std::max(clock[r], sa.end);
  for (int r = 0; r < P; ++r)
    if (pc[r] < schedule.per_rank[r].size())
      throw std::invalid_argument("simulate_step: rank " + std::to_string(r) + " never gets past " +
                                  to_string(schedule.per_rank[r][pc[r]]) + "; run validate() for the reason");
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

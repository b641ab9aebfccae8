// Lowering of a compute-only schedule to one with explicit point-to-point communication.
// Between two compute steps a rank posts ONE group: the sends of what it just computed and the
// receives of what it computes next (see the semantics in schedule.h); for GPipe, 1F1B and ZB-H1
// that is Megatron-LM's send_forward_recv_backward / send_backward_recv_forward pairing.
// Interleaved 1F1B needs Megatron's interleaved pairing instead: a forward immediately followed
// by a backward is one unit whose two receives are posted before the forward and whose two sends
// after the backward (send_forward_backward_recv_forward_backward), for the steady-state
// forwards only (not the warm-up ones: a rank whose warm-up covers all its forwards pairs
// nothing, or the first backward waits on a send the pairing holds back). Without it, two ranks each
// send a gradient to the other in separate groups and rendezvous sends deadlock. (The pairing
// is wrong for the others: GPipe's first backward depends on its last forward's send.)
// Neighbouring stages on the same rank exchange nothing.
// A schedule read from a file (kind kFromFile: any order, any placement), the kinds ported
// from torch's other multi-stage schedules, and any schedule with overlapped pairs, are lowered
// the way torch.distributed.pipelining lowers a compute_only file instead (see
// torch_order_lowering and uses_torch_lowering).
#include <set>
#include <stdexcept>
#include <tuple>

#include "schedule_internal.h"

namespace gpipe {
namespace {

// torch 2.11's _add_send_recv (schedules.py): sweep the ranks in order, each taking its next
// compute action once its input is there (the receive, or the producing action on the same
// rank); a taken action that feeds another rank appends its send to its own program and the
// matching receive to the receiving rank's program at once. So a receive is posted as early as
// the sender has produced the tensor, which is what lets schedules whose compute order the
// Megatron pairing above cannot serve (torch's interleaved 1F1B, ZBV, DualPipeV orders) run with
// rendezvous sends as well. Throws std::invalid_argument where torch says "Malformed compute
// schedule, can't schedule sends/recvs".
Schedule torch_order_lowering(const Schedule& compute_only) {
  Schedule out = compute_only;
  const int P = compute_only.num_ranks;
  const int last_stage = compute_only.num_stages() - 1;
  using Key = std::tuple<int, int, int>;  // (type, stage, micro-batch)
  auto key = [](ActionType t, int stage, int mb) { return Key{static_cast<int>(t), stage, mb}; };
  std::vector<std::set<Key>> seen(static_cast<size_t>(P));
  std::vector<std::vector<Action>> program(static_cast<size_t>(P));
  std::vector<size_t> next(static_cast<size_t>(P), 0);
  auto rank_of = [&](int stage) { return compute_only.rank_of_stage(stage); };
  auto ready = [&](const Action& a, const std::set<Key>& done) {
    if (a.type == ActionType::kForward && a.stage != 0)
      return done.count(key(ActionType::kRecvForward, a.stage, a.microbatch)) > 0 ||
             done.count(key(ActionType::kForward, a.stage - 1, a.microbatch)) > 0;
    if (detail::is_backward_compute(a.type) && a.stage != last_stage)
      return done.count(key(ActionType::kRecvBackward, a.stage, a.microbatch)) > 0 ||
             done.count(key(ActionType::kBackwardInput, a.stage + 1, a.microbatch)) > 0 ||
             done.count(key(ActionType::kBackward, a.stage + 1, a.microbatch)) > 0;
    return true;
  };
  auto take = [&](int rank, const Action& a) {
    program[static_cast<size_t>(rank)].push_back(a);
    seen[static_cast<size_t>(rank)].insert(key(a.type, a.stage, a.microbatch));
  };
  for (;;) {
    bool progress = false, left = false;
    for (int r = 0; r < P; ++r) {
      const auto& compute = compute_only.per_rank[static_cast<size_t>(r)];
      if (next[static_cast<size_t>(r)] >= compute.size()) continue;
      left = true;
      // An overlapped pair is taken as one unit once both halves' inputs are there (torch's
      // OVERLAP_F_B sub-actions), their sends after both.
      const size_t at = next[static_cast<size_t>(r)];
      const size_t unit = compute[at].overlaps_next && at + 1 < compute.size() ? 2 : 1;
      bool unit_ready = true;
      for (size_t k = at; k < at + unit; ++k) unit_ready = unit_ready && ready(compute[k], seen[static_cast<size_t>(r)]);
      if (!unit_ready) continue;
      for (size_t k = at; k < at + unit; ++k) take(r, compute[k]);
      for (size_t k = at; k < at + unit; ++k) {
        const Action& a = compute[k];
        if (a.type == ActionType::kForward && a.stage != last_stage && rank_of(a.stage + 1) != r) {
          take(r, {ActionType::kSendForward, a.stage, a.microbatch});
          take(rank_of(a.stage + 1), {ActionType::kRecvForward, a.stage + 1, a.microbatch});
        } else if (detail::is_backward_compute(a.type) && a.stage != 0 && rank_of(a.stage - 1) != r) {
          take(r, {ActionType::kSendBackward, a.stage, a.microbatch});
          take(rank_of(a.stage - 1), {ActionType::kRecvBackward, a.stage - 1, a.microbatch});
        }
      }
      next[static_cast<size_t>(r)] += unit;
      progress = true;
    }
    if (!left) break;
    if (!progress) {
      std::string stuck;
      for (int r = 0; r < P; ++r) {
        const auto& compute = compute_only.per_rank[static_cast<size_t>(r)];
        if (next[static_cast<size_t>(r)] < compute.size())
          stuck += " rank " + std::to_string(r) + " at " + to_string(compute[next[static_cast<size_t>(r)]]) + ";";
      }
      throw std::invalid_argument("with_communication: the compute order cannot run (each rank waits for an input "
                                  "no rank produces):" + stuck + " run validate() on the compute-only schedule");
    }
  }
  out.per_rank = std::move(program);
  return out;
}

// Which lowering a schedule gets. The Megatron pairing below is what GPipe, 1F1B, ZB-H1 and
// interleaved 1F1B in whole rounds of p micro-batches were built and tested with; torch's
// lowering serves everything else: files, the orders ported from torch's other multi-stage
// classes, and interleaved 1F1B with torch's flex rounds (m not a multiple of p). For those the
// pairing deadlocks under rendezvous sends in many shapes (over p 1..8, m 1..16, v 2..3: zbv 105
// of 128 legal shapes, dualpipev 49 of 64, interleaved_zb 124 of 212, looped_bfs 98 of 256,
// flex interleaved 1F1B 16, e.g. p=3 m=8), while torch's lowering validates them all
// (Communication.EveryKindValidatesOverAGridOfShapes).
bool uses_torch_lowering(const Schedule& s) {
  if (count_overlapped_pairs(s) > 0) return true;  // the Megatron pairing knows no OVERLAP_F_B
  switch (s.kind) {
    case ScheduleKind::kGPipe:
    case ScheduleKind::kOneFOneB:
    case ScheduleKind::kZeroBubbleH1: return false;
    case ScheduleKind::kInterleavedOneFOneB: return s.num_microbatches % s.num_ranks != 0;
    case ScheduleKind::kLoopedBFS:
    case ScheduleKind::kInterleavedZeroBubble:
    case ScheduleKind::kZeroBubbleV:
    case ScheduleKind::kDualPipeV:
    case ScheduleKind::kFromFile: return true;
  }
  return true;
}

}  // namespace

Schedule with_communication(const Schedule& compute_only) {
  if (static_cast<int>(compute_only.per_rank.size()) != compute_only.num_ranks)
    throw std::invalid_argument("with_communication: " + std::to_string(compute_only.per_rank.size()) +
                                " programs for " + std::to_string(compute_only.num_ranks) + " ranks");
  for (int rank = 0; rank < compute_only.num_ranks; ++rank)
    for (const Action& a : compute_only.per_rank[static_cast<size_t>(rank)])
      if (is_communication(a.type))
        throw std::invalid_argument("with_communication: rank " + std::to_string(rank) + " already has " +
                                    to_string(a) + "; pass a compute-only schedule");
  if (uses_torch_lowering(compute_only)) return torch_order_lowering(compute_only);
  Schedule out = compute_only;
  const int last_stage = compute_only.num_stages() - 1;
  auto crosses = [&](int from_stage, int to_stage) {
    return compute_only.rank_of_stage(from_stage) != compute_only.rank_of_stage(to_stage);
  };
  auto receive_for = [&](const Action& a, std::vector<Action>& into) {
    if (a.type == ActionType::kForward && a.stage > 0 && crosses(a.stage - 1, a.stage))
      into.push_back({ActionType::kRecvForward, a.stage, a.microbatch});
    if (detail::is_backward_compute(a.type) && a.stage < last_stage && crosses(a.stage + 1, a.stage))
      into.push_back({ActionType::kRecvBackward, a.stage, a.microbatch});
  };
  auto send_for = [&](const Action& a, std::vector<Action>& into) {
    if (a.type == ActionType::kForward && a.stage < last_stage && crosses(a.stage, a.stage + 1))
      into.push_back({ActionType::kSendForward, a.stage, a.microbatch});
    if (detail::is_backward_compute(a.type) && a.stage > 0 && crosses(a.stage, a.stage - 1))
      into.push_back({ActionType::kSendBackward, a.stage, a.microbatch});
  };

  for (int rank = 0; rank < compute_only.num_ranks; ++rank) {
    const std::vector<Action>& compute = compute_only.per_rank[rank];
    const bool interleaved = compute_only.kind == ScheduleKind::kInterleavedOneFOneB;
    const int warmup = interleaved ? detail::interleaved_warmup(compute_only.num_ranks, compute_only.num_microbatches,
                                                                compute_only.stages_per_rank, rank)
                                   : 0;
    std::vector<Action> program;
    std::vector<Action> pending_sends;
    int forwards_seen = 0;
    for (size_t i = 0; i < compute.size();) {
      const bool steady_forward = compute[i].type == ActionType::kForward && forwards_seen++ >= warmup;
      const bool pair = interleaved && steady_forward && i + 1 < compute.size() &&
                        detail::is_backward_compute(compute[i + 1].type);
      const size_t unit_end = i + (pair ? 2 : 1);
      program.insert(program.end(), pending_sends.begin(), pending_sends.end());
      pending_sends.clear();
      for (size_t k = i; k < unit_end; ++k) receive_for(compute[k], program);
      for (size_t k = i; k < unit_end; ++k) program.push_back(compute[k]);
      for (size_t k = i; k < unit_end; ++k) send_for(compute[k], pending_sends);
      i = unit_end;
    }
    program.insert(program.end(), pending_sends.begin(), pending_sends.end());
    out.per_rank[rank] = std::move(program);
  }
  return out;
}

}  // namespace gpipe

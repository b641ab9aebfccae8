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
// Neighbouring stages on the same rank (only possible with one rank) exchange nothing.
#include <stdexcept>

#include "schedule_internal.h"

namespace gpipe {

Schedule with_communication(const Schedule& compute_only) {
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
    for (const Action& a : compute)
      if (is_communication(a.type))
        throw std::invalid_argument("with_communication: rank " + std::to_string(rank) + " already has " +
                                    to_string(a) + "; pass a compute-only schedule");
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

// Schedule validator: checks the programs' structure (ranges, placement, duplicates,
// completeness), then dry-runs all ranks in lock-step steps with the point-to-point semantics
// documented in schedule.h (consecutive communication actions are one NCCL-style group whose
// sends are rendezvous), and reports deadlocks with each blocked rank's pending action.
#include <deque>
#include <map>
#include <string>
#include <utility>

#include "schedule_internal.h"

namespace gpipe {
namespace {

constexpr int kNever = -1;
constexpr size_t kActionTypes = 8;  // F, B, I, W, SF, RF, SB, RB

class DryRun {
 public:
  DryRun(const Schedule& s, ValidationResult& r) : s_(s), res_(r), S_(s.num_stages()), m_(s.num_microbatches) {
    res_.step_of_action.resize(s.per_rank.size());
    for (size_t r2 = 0; r2 < s.per_rank.size(); ++r2) res_.step_of_action[r2].assign(s.per_rank[r2].size(), kNever);
    done_.assign(kActionTypes * S_ * m_, kNever);
    split_.assign(static_cast<size_t>(S_) * m_, 0);
    for (const auto& prog : s.per_rank)
      for (const Action& a : prog) {
        has_comm_ = has_comm_ || is_communication(a.type);
        if (a.type == ActionType::kBackwardInput && in_range(a)) split_[static_cast<size_t>(a.stage) * m_ + a.microbatch] = 1;
      }
  }

  void run() {
    if (!check_structure()) return;  // out-of-range actions would make the dry run meaningless
    run_lock_step();
    check_completeness();
  }

 private:
  void issue(int rank, int index, std::string message) {
    res_.ok = false;
    res_.issues.push_back({rank, index, std::move(message)});
  }
  static std::string at(int rank, int index) {
    return "rank " + std::to_string(rank) + " action #" + std::to_string(index);
  }
  int& done(ActionType t, int stage, int mb) {
    return done_[(static_cast<size_t>(t) * S_ + stage) * m_ + mb];
  }
  bool in_range(const Action& a) const {
    return a.stage >= 0 && a.stage < S_ && a.microbatch >= 0 && a.microbatch < m_;
  }

  // The peer stage a communication action talks to, and the action the peer must post.
  static Action counterpart(const Action& a) {
    switch (a.type) {
      case ActionType::kSendForward: return {ActionType::kRecvForward, a.stage + 1, a.microbatch};
      case ActionType::kRecvForward: return {ActionType::kSendForward, a.stage - 1, a.microbatch};
      case ActionType::kSendBackward: return {ActionType::kRecvBackward, a.stage - 1, a.microbatch};
      default: return {ActionType::kSendBackward, a.stage + 1, a.microbatch};
    }
  }

  bool check_structure() {
    bool all_in_range = true;
    std::map<std::tuple<int, int, int>, std::pair<int, int>> first_seen;
    for (int r = 0; r < s_.num_ranks; ++r) {
      for (int k = 0; k < static_cast<int>(s_.per_rank[r].size()); ++k) {
        const Action& a = s_.per_rank[r][k];
        if (!in_range(a)) {
          issue(r, k, at(r, k) + ": " + to_string(a) + " is out of range (stages 0.." + std::to_string(S_ - 1) +
                          ", micro-batches 0.." + std::to_string(m_ - 1) + ")");
          all_in_range = false;
          continue;
        }
        if (s_.rank_of_stage(a.stage) != r)
          issue(r, k, at(r, k) + ": " + to_string(a) + " belongs to stage " + std::to_string(a.stage) +
                          ", which lives on rank " + std::to_string(s_.rank_of_stage(a.stage)));
        auto [it, fresh] = first_seen.try_emplace({static_cast<int>(a.type), a.stage, a.microbatch}, r, k);
        if (!fresh)
          issue(r, k, at(r, k) + ": duplicate " + to_string(a) + " (already at " + at(it->second.first, it->second.second) + ")");
        if (a.overlaps_next) check_pair(r, k);
        if (is_communication(a.type)) {
          const Action peer = counterpart(a);
          if (peer.stage < 0 || peer.stage >= S_ || s_.rank_of_stage(peer.stage) == r)
            issue(r, k, at(r, k) + ": " + to_string(a) + " has no peer rank (stage " + std::to_string(peer.stage) +
                            " is not on another rank); remove it");
        }
      }
    }
    return all_in_range;
  }

  // An overlapped pair (Action::overlaps_next on index k): a forward and a backward (B or I) of
  // another (stage, micro-batch), next to each other, not part of another pair.
  void check_pair(int r, int k) {
    const auto& prog = s_.per_rank[r];
    const Action& a = prog[k];
    if (k + 1 >= static_cast<int>(prog.size())) {
      issue(r, k, at(r, k) + ": " + to_string(a) + " starts an overlapped pair but is the rank's last action");
      return;
    }
    const Action& b = prog[k + 1];
    const std::string pair = to_string_pair(a, b);
    const int forwards = (a.type == ActionType::kForward) + (b.type == ActionType::kForward);
    const int backwards = detail::is_backward_compute(a.type) + detail::is_backward_compute(b.type);
    if (forwards != 1 || backwards != 1)
      issue(r, k, at(r, k) + ": overlapped pair " + pair + " must be one forward (F) and one backward (B or I)");
    else if (a.stage == b.stage && a.microbatch == b.microbatch)
      issue(r, k, at(r, k) + ": overlapped pair " + pair + " runs a micro-batch's backward at the same time as " +
                      "its own forward; pair it with another micro-batch's");
    if (b.overlaps_next)
      issue(r, k + 1, at(r, k + 1) + ": " + to_string(b) + " is already the second half of " + pair +
                          "; a pair has two actions");
  }

  // What compute action `a` needs before it runs, as (action, rank that produces it).
  std::vector<std::pair<Action, int>> dependencies(const Action& a, int rank) const {
    std::vector<std::pair<Action, int>> deps;
    const int last = S_ - 1;
    auto through = [&](ActionType local_recv, ActionType producer, int producer_stage) {
      const int producer_rank = s_.rank_of_stage(producer_stage);
      if (producer_rank != rank && has_comm_)
        deps.push_back({{local_recv, a.stage, a.microbatch}, rank});
      else
        deps.push_back({{producer, producer_stage, a.microbatch}, producer_rank});
    };
    switch (a.type) {
      case ActionType::kForward:
        if (a.stage > 0) through(ActionType::kRecvForward, ActionType::kForward, a.stage - 1);
        break;
      case ActionType::kBackward:
      case ActionType::kBackwardInput:
        deps.push_back({{ActionType::kForward, a.stage, a.microbatch}, rank});
        if (a.stage < last) {
          // The gradient comes from whichever backward form the next stage runs.
          const int next_rank = s_.rank_of_stage(a.stage + 1);
          if (next_rank != rank && has_comm_) {
            deps.push_back({{ActionType::kRecvBackward, a.stage, a.microbatch}, rank});
          } else {
            const bool split = is_split_backward(a.stage + 1, a.microbatch);
            deps.push_back({{split ? ActionType::kBackwardInput : ActionType::kBackward, a.stage + 1, a.microbatch},
                            next_rank});
          }
        }
        break;
      case ActionType::kBackwardWeight:
        deps.push_back({{ActionType::kBackwardInput, a.stage, a.microbatch}, rank});
        break;
      case ActionType::kSendForward:
        deps.push_back({{ActionType::kForward, a.stage, a.microbatch}, rank});
        break;
      case ActionType::kSendBackward: {
        const bool split = is_split_backward(a.stage, a.microbatch);
        deps.push_back({{split ? ActionType::kBackwardInput : ActionType::kBackward, a.stage, a.microbatch}, rank});
        break;
      }
      default: break;
    }
    return deps;
  }
  // Whether (stage, mb) runs a split backward (I + W) anywhere; decides which action sends its gradient.
  bool is_split_backward(int stage, int mb) const {
    return split_[static_cast<size_t>(stage) * m_ + mb];
  }

  // Local dependencies that are missing can never be met later (a rank runs its program in
  // order): report them as ordering errors and go on, so one run finds as much as it can.
  void check_local_deps(const Action& a, int rank, int index, int step) {
    for (const auto& [dep, dep_rank] : dependencies(a, rank)) {
      if (dep_rank != rank) continue;
      if (done(dep.type, dep.stage, dep.microbatch) == kNever || done(dep.type, dep.stage, dep.microbatch) > step)
        issue(rank, index, at(rank, index) + ": " + to_string(a) + " needs " + to_string(dep) +
                               ", which rank " + std::to_string(rank) + " has not run before it");
    }
  }
  bool remote_deps_met(const Action& a, int rank, int step, std::string* waiting_for) {
    for (const auto& [dep, dep_rank] : dependencies(a, rank)) {
      if (dep_rank == rank) continue;
      const int d = done(dep.type, dep.stage, dep.microbatch);
      if (d == kNever || d >= step) {
        if (waiting_for) *waiting_for = to_string(dep) + " on rank " + std::to_string(dep_rank);
        return false;
      }
    }
    return true;
  }

  struct Posted {
    int rank, index;
  };
  struct Group {
    int begin = -1, end = -1;  // [begin, end) in the rank's program; begin < 0: none posted
  };

  void run_lock_step();
  void report_deadlock(const std::vector<int>& pc, const std::vector<Group>& group);
  void check_completeness();

  const Schedule& s_;
  ValidationResult& res_;
  const int S_, m_;
  bool has_comm_ = false;
  std::vector<int> done_;
  std::vector<char> split_;  // per (stage, mb): backward is split into I + W
  std::vector<std::vector<char>> paired_;
  std::map<std::pair<int, int>, std::deque<Posted>> sends_, recvs_;  // keyed by (from rank, to rank)
};

void DryRun::run_lock_step() {
  const int P = s_.num_ranks;
  std::vector<int> pc(P, 0);
  std::vector<Group> group(P);
  paired_.resize(P);
  for (int r = 0; r < P; ++r) paired_[r].assign(s_.per_rank[r].size(), 0);
  size_t total = 0;
  for (const auto& prog : s_.per_rank) total += prog.size();

  for (int step = 0;; ++step) {
    bool progress = false;
    bool all_done = true;
    for (int r = 0; r < P; ++r) {
      const auto& prog = s_.per_rank[r];
      if (pc[r] >= static_cast<int>(prog.size())) continue;
      all_done = false;
      if (group[r].begin >= 0) continue;  // waiting for its posted group
      const Action& a = prog[pc[r]];
      if (is_communication(a.type)) {
        int end = pc[r];
        while (end < static_cast<int>(prog.size()) && is_communication(prog[end].type)) ++end;
        for (int k = pc[r]; k < end; ++k) {
          const Action& c = prog[k];
          check_local_deps(c, r, k, step);
          const int peer = s_.rank_of_stage(counterpart(c).stage);
          const bool send = c.type == ActionType::kSendForward || c.type == ActionType::kSendBackward;
          (send ? sends_[{r, peer}] : recvs_[{peer, r}]).push_back({r, k});
        }
        group[r] = {pc[r], end};
        progress = true;
      } else {
        // An overlapped pair runs in one step, once both halves' inputs are there.
        const int unit = a.overlaps_next && pc[r] + 1 < static_cast<int>(prog.size()) &&
                                 !is_communication(prog[pc[r] + 1].type)
                             ? 2
                             : 1;
        bool ready = true;
        for (int k = pc[r]; k < pc[r] + unit; ++k) ready = ready && remote_deps_met(prog[k], r, step, nullptr);
        if (ready) {
          for (int k = pc[r]; k < pc[r] + unit; ++k) {
            check_local_deps(prog[k], r, k, step);
            done(prog[k].type, prog[k].stage, prog[k].microbatch) = step;
            res_.step_of_action[r][k] = step;
          }
          pc[r] += unit;
          progress = true;
        }
      }
    }
    if (all_done) {
      res_.num_steps = step;
      return;
    }
    // Match posted sends and receives per ordered rank pair, in posting order.
    for (auto& [channel, send_queue] : sends_) {
      auto& recv_queue = recvs_[channel];
      while (!send_queue.empty() && !recv_queue.empty()) {
        const Posted snd = send_queue.front(), rcv = recv_queue.front();
        send_queue.pop_front();
        recv_queue.pop_front();
        paired_[snd.rank][snd.index] = paired_[rcv.rank][rcv.index] = 1;
        const Action& sa = s_.per_rank[snd.rank][snd.index];
        const Action& ra = s_.per_rank[rcv.rank][rcv.index];
        if (!(counterpart(sa) == ra)) {
          const std::string what = to_string(sa) + " sent by rank " + std::to_string(snd.rank) + " is matched by " +
                                   to_string(ra) + " on rank " + std::to_string(rcv.rank) + " (expected " +
                                   to_string(counterpart(sa)) + "): send/recv order mismatch";
          issue(snd.rank, snd.index, at(snd.rank, snd.index) + ": " + what);
          issue(rcv.rank, rcv.index, at(rcv.rank, rcv.index) + ": " + what);
        }
      }
    }
    for (int r = 0; r < P; ++r) {
      if (group[r].begin < 0) continue;
      bool complete = true;
      for (int k = group[r].begin; k < group[r].end; ++k) complete = complete && paired_[r][k];
      if (!complete) continue;
      for (int k = group[r].begin; k < group[r].end; ++k) {
        const Action& c = s_.per_rank[r][k];
        done(c.type, c.stage, c.microbatch) = step;
        res_.step_of_action[r][k] = step;
      }
      pc[r] = group[r].end;
      group[r] = {};
      progress = true;
    }
    if (!progress || static_cast<size_t>(step) > 4 * total + 16) {
      res_.num_steps = step;
      report_deadlock(pc, group);
      return;
    }
  }
}

void DryRun::report_deadlock(const std::vector<int>& pc, const std::vector<Group>& group) {
  for (int r = 0; r < s_.num_ranks; ++r) {
    const auto& prog = s_.per_rank[r];
    if (pc[r] >= static_cast<int>(prog.size())) continue;
    if (group[r].begin >= 0) {
      for (int k = group[r].begin; k < group[r].end; ++k) {
        if (paired_[r][k]) continue;
        const Action& c = prog[k];
        const Action peer = counterpart(c);
        issue(r, k, "deadlock: " + at(r, k) + " is blocked on " + to_string(c) + ", waiting for rank " +
                        std::to_string(s_.rank_of_stage(peer.stage)) + " to post " + to_string(peer));
        break;
      }
    } else {
      std::string waiting_for = "its peers";
      remote_deps_met(prog[pc[r]], r, res_.num_steps + 1, &waiting_for);
      issue(r, pc[r], "deadlock: " + at(r, pc[r]) + " is blocked on " + to_string(prog[pc[r]]) + ", waiting for " +
                          waiting_for);
    }
  }
}

void DryRun::check_completeness() {
  std::vector<int> count(kActionTypes * S_ * m_, 0);
  for (const auto& prog : s_.per_rank)
    for (const Action& a : prog) ++count[(static_cast<size_t>(a.type) * S_ + a.stage) * m_ + a.microbatch];
  auto n = [&](ActionType t, int stage, int mb) { return count[(static_cast<size_t>(t) * S_ + stage) * m_ + mb]; };
  for (int stage = 0; stage < S_; ++stage) {
    const int rank = s_.rank_of_stage(stage);
    for (int mb = 0; mb < m_; ++mb) {
      const std::string which = "stage " + std::to_string(stage) + " micro-batch " + std::to_string(mb);
      if (n(ActionType::kForward, stage, mb) == 0) issue(rank, -1, "missing forward F of " + which);
      const int full = n(ActionType::kBackward, stage, mb);
      const int input = n(ActionType::kBackwardInput, stage, mb);
      const int weight = n(ActionType::kBackwardWeight, stage, mb);
      if (full == 0 && input == 0) issue(rank, -1, "missing backward (B, or I + W) of " + which);
      if (full > 0 && (input > 0 || weight > 0)) issue(rank, -1, "both B and I/W for " + which + "; use one form");
      if (input > 0 && weight == 0) issue(rank, -1, "missing weight-gradient W of " + which);
      if (weight > 0 && input == 0) issue(rank, -1, "W without its input-gradient I for " + which);
    }
  }
}

}  // namespace

ValidationResult validate(const Schedule& schedule) {
  ValidationResult result;
  if (schedule.num_ranks < 1 || schedule.stages_per_rank < 1 || schedule.num_microbatches < 1 ||
      static_cast<int>(schedule.per_rank.size()) != schedule.num_ranks) {
    result.ok = false;
    result.issues.push_back({-1, -1,
                             "malformed schedule: " + std::to_string(schedule.num_ranks) + " ranks, " +
                                 std::to_string(schedule.per_rank.size()) + " programs, " +
                                 std::to_string(schedule.num_microbatches) + " micro-batches, " +
                                 std::to_string(schedule.stages_per_rank) + " stages per rank"});
    return result;
  }
  if (!schedule.stage_to_rank.empty()) {
    // An explicit placement: every stage on a real rank, the same number of stages on each.
    std::vector<int> held(static_cast<size_t>(schedule.num_ranks), 0);
    bool placed = static_cast<int>(schedule.stage_to_rank.size()) == schedule.num_ranks * schedule.stages_per_rank;
    for (int r : schedule.stage_to_rank) {
      if (r < 0 || r >= schedule.num_ranks) {
        placed = false;
        break;
      }
      ++held[static_cast<size_t>(r)];
    }
    for (int n : held) placed = placed && n == schedule.stages_per_rank;
    if (!placed) {
      std::string map;
      for (size_t s = 0; s < schedule.stage_to_rank.size(); ++s)
        map += (s == 0 ? "" : ", ") + std::to_string(s) + "->" + std::to_string(schedule.stage_to_rank[s]);
      result.ok = false;
      result.issues.push_back({-1, -1,
                               "malformed placement: stage -> rank {" + map + "} must put " +
                                   std::to_string(schedule.stages_per_rank) + " stage(s) on each of " +
                                   std::to_string(schedule.num_ranks) + " ranks"});
      return result;
    }
  }
  DryRun(schedule, result).run();
  for (ValidationIssue& issue : detail::check_weight_versions(schedule)) {
    result.ok = false;
    result.issues.push_back(std::move(issue));
  }
  return result;
}

}  // namespace gpipe

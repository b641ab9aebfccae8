// Overlapped forward+backward pairs (torch's OVERLAP_F_B): parallel.overlap_f_b's modes and the
// pairing of a compute-only schedule. What a pair means for the lowering, the validator and the
// executors is in schedule.h (Action::overlaps_next).
#include <fmt/format.h>

#include <stdexcept>
#include <string>

#include "schedule_internal.h"
#include "trainer/config/config.h"

namespace gpipe {

std::string to_string_pair(const Action& first, const Action& second) {
  return "(" + to_string(first) + ";" + to_string(second) + ")";
}

OverlapMode parse_overlap_mode(const std::string& name) {
  if (name == "auto") return OverlapMode::kAuto;
  if (name == "true") return OverlapMode::kOn;
  if (name == "false") return OverlapMode::kOff;
  throw std::invalid_argument("overlap_f_b '" + name +
                              "' is not one of auto (the schedule's own pairs: dualpipev's), true (also pair each "
                              "forward with the next backward), false (no pairs)");
}

const char* to_string(OverlapMode mode) {
  switch (mode) {
    case OverlapMode::kAuto: return "auto";
    case OverlapMode::kOn: return "true";
    case OverlapMode::kOff: return "false";
  }
  return "?";
}

int count_overlapped_pairs(const Schedule& schedule) {
  int pairs = 0;
  for (const auto& program : schedule.per_rank)
    for (const Action& a : program) pairs += a.overlaps_next ? 1 : 0;
  return pairs;
}

void check_stream_layout(const ParallelConfig& parallel, const Schedule& schedule) {
  if (parallel.streams != "per_rank" || parallel.scheduler != "async_threaded") return;
  const int pairs = count_overlapped_pairs(schedule);
  if (pairs == 0) return;
  throw ConfigError(fmt::format(
      "parallel.streams=per_rank puts a rank's forward and backward on one stream, so the {} overlapped (F;B) pair(s) "
      "of {} (parallel.overlap_f_b={}) could not run at once: set parallel.overlap_f_b=false, or "
      "parallel.streams=per_microbatch",
      pairs, parallel.schedule_file.empty() ? "parallel.schedule=" + parallel.schedule : "parallel.schedule_file=" + parallel.schedule_file,
      parallel.overlap_f_b));
}

namespace {

// Two compute actions of one rank that may run at the same time: a forward and a backward of
// another (stage, micro-batch). Anything else one half needs from the other (the gradient of
// stage s+1 for B(s), F(s)'s input from F(s-1)) makes the pair impossible to run in one step,
// which validate() reports.
bool can_pair(const Action& a, const Action& b) {
  const bool forward_backward = a.type == ActionType::kForward && detail::is_backward_compute(b.type);
  return forward_backward && !(a.stage == b.stage && a.microbatch == b.microbatch);
}

}  // namespace

Schedule with_overlap(const Schedule& compute_only, OverlapMode mode) {
  Schedule out = compute_only;
  if (mode == OverlapMode::kAuto) return out;
  if (mode == OverlapMode::kOff) {
    for (auto& program : out.per_rank)
      for (Action& a : program) a.overlaps_next = false;
    return out;
  }
  for (int rank = 0; rank < out.num_ranks && rank < static_cast<int>(out.per_rank.size()); ++rank) {
    auto& program = out.per_rank[static_cast<size_t>(rank)];
    for (size_t i = 0; i < program.size(); ++i) {
      if (is_communication(program[i].type))
        throw std::invalid_argument("overlap_f_b=true pairs a compute-only schedule, but rank " + std::to_string(rank) +
                                    " already has " + to_string(program[i]) +
                                    ": pair the compute order first, then lower it (with_communication)");
    }
    // Greedy, left to right: an action already in a pair (the schedule's own, or the backward
    // half of the previous one) is never paired again.
    for (size_t i = 0; i + 1 < program.size(); ++i) {
      const bool taken = program[i].overlaps_next || (i > 0 && program[i - 1].overlaps_next);
      if (taken || program[i + 1].overlaps_next) continue;
      if (can_pair(program[i], program[i + 1])) program[i].overlaps_next = true;
    }
  }
  // A pair starts only once both halves' inputs are there, so a forward paired with a backward
  // that waits (through other ranks) for that very forward's output can never start: e.g.
  // interleaved 1F1B with m = p, where the last warm-up forward feeds the first backward. Such
  // pairs deadlock the dry run; split each pair a rank is stuck at and dry-run again (each round
  // removes at least one pair, so this ends).
  for (;;) {
    const ValidationResult result = validate(out);
    bool split = false;
    for (const ValidationIssue& issue : result.issues) {
      if (issue.rank < 0 || issue.step < 0 || issue.message.rfind("deadlock", 0) != 0) continue;
      auto& program = out.per_rank[static_cast<size_t>(issue.rank)];
      const auto k = static_cast<size_t>(issue.step);
      if (program[k].overlaps_next) {
        program[k].overlaps_next = false;
        split = true;
      } else if (k > 0 && program[k - 1].overlaps_next) {
        program[k - 1].overlaps_next = false;
        split = true;
      }
    }
    if (!split) return out;
  }
}

}  // namespace gpipe

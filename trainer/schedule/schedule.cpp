// Names of actions and schedule kinds, and make_schedule(): shape checks, then dispatch to the
// family generators (schedule_gpipe_1f1b.cpp, schedule_interleaved.cpp, schedule_zb.cpp,
// schedule_v.cpp).
#include <algorithm>
#include <stdexcept>
#include <string>

#include "schedule_internal.h"
#include "trainer/config/config.h"
#include "trainer/schedule/schedule.h"

namespace gpipe {
namespace {
constexpr const char* kScheduleNames = "gpipe, 1f1b, interleaved_1f1b, zb_h1, looped_bfs, interleaved_zb, zbv, dualpipev";
}  // namespace

const char* short_name(ActionType t) {
  switch (t) {
    case ActionType::kForward: return "F";
    case ActionType::kBackward: return "B";
    case ActionType::kBackwardInput: return "I";
    case ActionType::kBackwardWeight: return "W";
    case ActionType::kSendForward: return "SF";
    case ActionType::kRecvForward: return "RF";
    case ActionType::kSendBackward: return "SB";
    case ActionType::kRecvBackward: return "RB";
  }
  return "?";
}

bool is_communication(ActionType t) {
  return t == ActionType::kSendForward || t == ActionType::kRecvForward || t == ActionType::kSendBackward ||
         t == ActionType::kRecvBackward;
}

std::string to_string(const Action& a) {
  return std::to_string(a.stage) + short_name(a.type) + std::to_string(a.microbatch);
}

ScheduleKind parse_schedule_kind(const std::string& name) {
  if (name == "gpipe") return ScheduleKind::kGPipe;
  if (name == "1f1b") return ScheduleKind::kOneFOneB;
  if (name == "interleaved_1f1b") return ScheduleKind::kInterleavedOneFOneB;
  if (name == "zb_h1") return ScheduleKind::kZeroBubbleH1;
  if (name == "looped_bfs") return ScheduleKind::kLoopedBFS;
  if (name == "interleaved_zb") return ScheduleKind::kInterleavedZeroBubble;
  if (name == "zbv") return ScheduleKind::kZeroBubbleV;
  if (name == "dualpipev") return ScheduleKind::kDualPipeV;
  throw std::invalid_argument("unknown schedule '" + name + "': use one of " + kScheduleNames);
}

const char* to_string(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::kGPipe: return "gpipe";
    case ScheduleKind::kOneFOneB: return "1f1b";
    case ScheduleKind::kInterleavedOneFOneB: return "interleaved_1f1b";
    case ScheduleKind::kZeroBubbleH1: return "zb_h1";
    case ScheduleKind::kLoopedBFS: return "looped_bfs";
    case ScheduleKind::kInterleavedZeroBubble: return "interleaved_zb";
    case ScheduleKind::kZeroBubbleV: return "zbv";
    case ScheduleKind::kDualPipeV: return "dualpipev";
    case ScheduleKind::kFromFile: return "file";
  }
  return "?";
}

namespace {

void check_schedule_shape(ScheduleKind kind, int num_ranks, int num_microbatches, int stages_per_rank) {
  const std::string what = std::string(to_string(kind)) + " with " + std::to_string(num_ranks) + " ranks, " +
                           std::to_string(num_microbatches) + " micro-batches, " + std::to_string(stages_per_rank) +
                           " stages per rank: ";
  if (num_ranks < 1) throw std::invalid_argument(what + "needs at least 1 rank");
  if (num_microbatches < 1) throw std::invalid_argument(what + "needs at least 1 micro-batch");
  if (stages_per_rank < 1) throw std::invalid_argument(what + "needs at least 1 stage per rank");
  if (kind == ScheduleKind::kFromFile)
    throw std::invalid_argument(what + "a schedule file is read (load_schedule_csv), not generated");
  const std::string name = to_string(kind);
  switch (kind) {
    case ScheduleKind::kInterleavedOneFOneB:
    case ScheduleKind::kInterleavedZeroBubble:
    case ScheduleKind::kLoopedBFS:
      // Any number of stages per rank, one included, as torch's classes take it.
      if (kind != ScheduleKind::kLoopedBFS) {
        // torch's rule (ScheduleInterleaved1F1B, ScheduleInterleavedZeroBubble): the micro-batches
        // go in max(1, m / p) rounds of equal size.
        auto whole_rounds = [num_ranks](int m) { return m % std::max(1, m / num_ranks) == 0; };
        if (!whole_rounds(num_microbatches)) {
          int below = num_microbatches - 1, above = num_microbatches + 1;
          while (!whole_rounds(below)) --below;  // stops at 2p-1 at the latest
          while (!whole_rounds(above)) ++above;
          throw std::invalid_argument(what + name + " needs the micro-batches to split into max(1, micro-batches / ranks) = " +
                                      std::to_string(std::max(1, num_microbatches / num_ranks)) +
                                      " equal rounds (torch's rule): use " + std::to_string(below) + " or " +
                                      std::to_string(above) + " micro-batches (any count up to " +
                                      std::to_string(2 * num_ranks - 1) + " works)");
        }
      }
      break;
    case ScheduleKind::kZeroBubbleV:
    case ScheduleKind::kDualPipeV:
      if (stages_per_rank != 2)
        throw std::invalid_argument(what + name + " needs virtual_stages = 2 (its V placement: rank r holds stages r and " +
                                    "2 x ranks - 1 - r)");
      if (kind == ScheduleKind::kDualPipeV && num_microbatches < 2 * num_ranks)
        throw std::invalid_argument(what + name + " needs at least as many micro-batches as stages (2 x ranks = " +
                                    std::to_string(2 * num_ranks) + ")");
      break;
    case ScheduleKind::kGPipe:
    case ScheduleKind::kOneFOneB:
    case ScheduleKind::kZeroBubbleH1:
      if (stages_per_rank != 1)
        throw std::invalid_argument(what + name +
                                    " runs one stage per rank: set virtual_stages to 1 or use interleaved_1f1b, "
                                    "looped_bfs, interleaved_zb, zbv or dualpipev");
      break;
    case ScheduleKind::kFromFile: break;  // refused above
  }
}

}  // namespace

Schedule make_schedule(ScheduleKind kind, int num_ranks, int num_microbatches, int stages_per_rank) {
  check_schedule_shape(kind, num_ranks, num_microbatches, stages_per_rank);
  Schedule s;
  s.kind = kind;
  s.num_ranks = num_ranks;
  s.stages_per_rank = stages_per_rank;
  s.num_microbatches = num_microbatches;
  switch (kind) {
    case ScheduleKind::kGPipe: s.per_rank = detail::gpipe_programs(num_ranks, num_microbatches); break;
    case ScheduleKind::kOneFOneB: s.per_rank = detail::one_f_one_b_programs(num_ranks, num_microbatches); break;
    case ScheduleKind::kInterleavedOneFOneB:
      s.per_rank = detail::interleaved_programs(num_ranks, num_microbatches, stages_per_rank);
      break;
    case ScheduleKind::kZeroBubbleH1: s.per_rank = detail::zero_bubble_h1_programs(num_ranks, num_microbatches); break;
    case ScheduleKind::kLoopedBFS:
      s.per_rank = detail::looped_bfs_programs(num_ranks, num_microbatches, stages_per_rank);
      break;
    case ScheduleKind::kInterleavedZeroBubble:
      s.per_rank = detail::interleaved_zero_bubble_programs(num_ranks, num_microbatches, stages_per_rank);
      break;
    case ScheduleKind::kZeroBubbleV:
      s.per_rank = detail::zero_bubble_v_programs(num_ranks, num_microbatches);
      s.stage_to_rank = detail::v_stage_to_rank(num_ranks);
      break;
    case ScheduleKind::kDualPipeV:
      s.per_rank = detail::dualpipe_v_programs(num_ranks, num_microbatches);
      s.stage_to_rank = detail::v_stage_to_rank(num_ranks);
      break;
    case ScheduleKind::kFromFile: break;  // refused by check_schedule_shape()
  }
  return s;
}

Schedule make_schedule(const PipelineConfig& config) {
  Schedule s = with_overlap(make_schedule(parse_schedule_kind(config.parallel.schedule), config.parallel.model_parallel_size,
                                          config.training.num_microbatches, config.parallel.virtual_stages),
                            parse_overlap_mode(config.parallel.overlap_f_b));
  if (parse_sync_mode(config.parallel.sync_mode) == SyncMode::kAsp) s = with_weight_versions(s, config.parallel.weight_stashing);
  return s;
}

}  // namespace gpipe

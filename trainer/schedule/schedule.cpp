// Names of actions and schedule kinds, and make_schedule(): shape checks, then dispatch to the
// family generators (schedule_gpipe_1f1b.cpp, schedule_interleaved.cpp, schedule_zb.cpp).
#include <stdexcept>
#include <string>

#include "schedule_internal.h"
#include "trainer/config/config.h"
#include "trainer/schedule/schedule.h"

namespace gpipe {

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
  throw std::invalid_argument("unknown schedule '" + name + "': use one of gpipe, 1f1b, interleaved_1f1b, zb_h1");
}

const char* to_string(ScheduleKind k) {
  switch (k) {
    case ScheduleKind::kGPipe: return "gpipe";
    case ScheduleKind::kOneFOneB: return "1f1b";
    case ScheduleKind::kInterleavedOneFOneB: return "interleaved_1f1b";
    case ScheduleKind::kZeroBubbleH1: return "zb_h1";
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
  if (kind == ScheduleKind::kInterleavedOneFOneB) {
    if (stages_per_rank < 2)
      throw std::invalid_argument(what + "interleaved_1f1b needs virtual_stages >= 2 (use 1f1b for one stage per rank)");
    if (num_microbatches % num_ranks != 0)
      throw std::invalid_argument(what + "interleaved_1f1b needs the micro-batch count to be a multiple of the rank count");
  } else if (stages_per_rank != 1) {
    throw std::invalid_argument(what + std::string(to_string(kind)) +
                                " runs one stage per rank: set virtual_stages to 1 or use interleaved_1f1b");
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
    case ScheduleKind::kFromFile: break;  // refused by check_schedule_shape()
  }
  return s;
}

Schedule make_schedule(const PipelineConfig& config) {
  return make_schedule(parse_schedule_kind(config.parallel.schedule), config.parallel.model_parallel_size,
                       config.training.num_microbatches, config.parallel.virtual_stages);
}

}  // namespace gpipe

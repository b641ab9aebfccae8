// Pipeline schedules as data: a small action IR (what torch.distributed.pipelining calls
// _Action), generators for the schedule families, a validator that dry-runs every rank's sends
// and receives, and a step x rank grid printer. Executors (executor.h) only run these lists.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gpipe {

enum class ActionType : uint8_t {
  kForward,         // F: forward of one micro-batch through one (virtual) stage
  kBackward,        // B: full backward (input and weight gradients together)
  kBackwardInput,   // I: input-gradient half of the backward (zero-bubble schedules)
  kBackwardWeight,  // W: weight-gradient half, deferred to fill bubbles
  kSendForward,     // send F's output activation to the next stage
  kRecvForward,     // receive the previous stage's activation
  kSendBackward,    // send the input gradient to the previous stage
  kRecvBackward,    // receive the output gradient from the next stage
};
const char* short_name(ActionType t);  // "F", "B", "I", "W", "SF", "RF", "SB", "RB"

struct Action {
  ActionType type;
  int stage;       // virtual stage index in [0, num_stages): the model chunk this acts on
  int microbatch;  // in [0, num_microbatches)
  bool operator==(const Action&) const = default;
};
std::string to_string(const Action& a);  // e.g. "2F5" = stage 2, forward, micro-batch 5

enum class ScheduleKind : uint8_t { kGPipe, kOneFOneB, kInterleavedOneFOneB, kZeroBubbleH1 };
// "gpipe", "1f1b", "interleaved_1f1b", "zb_h1"; throws std::invalid_argument listing the allowed names.
ScheduleKind parse_schedule_kind(const std::string& name);
const char* to_string(ScheduleKind k);

struct Schedule {
  ScheduleKind kind;
  int num_ranks = 0;         // pipeline ranks (physical stages)
  int stages_per_rank = 1;   // virtual stages (model chunks) per rank; >1 only for interleaved
  int num_microbatches = 0;
  // per_rank[r] is rank r's program, in order. Virtual stage s lives on rank s % num_ranks.
  std::vector<std::vector<Action>> per_rank;

  int num_stages() const { return num_ranks * stages_per_rank; }
  int rank_of_stage(int stage) const { return stage % num_ranks; }
};

// Compute-only programs (F/B/I/W) for each family. Throws std::invalid_argument for impossible
// shapes (e.g. interleaved 1F1B with micro-batches not a multiple of ranks), naming the rule.
Schedule make_schedule(ScheduleKind kind, int num_ranks, int num_microbatches, int stages_per_rank = 1);
// Inserts the SEND/RECV actions each compute action implies, in an order that cannot deadlock
// with blocking point-to-point transports (receives right before the compute that needs them,
// sends right after the compute that produces them).
Schedule with_communication(const Schedule& compute_only);

struct ValidationIssue {
  int rank = -1;
  int step = -1;  // index into per_rank[rank]
  std::string message;
};
struct ValidationResult {
  bool ok = true;
  std::vector<ValidationIssue> issues;
  // Steps (in dry-run time) at which each rank's action ran; used by the grid printer.
  std::vector<std::vector<int>> step_of_action;
  int num_steps = 0;
};
// Dry-runs every rank's program against blocking sends/receives and compute dependencies
// (F of stage s needs F of s-1; B/I needs F of the same stage and the gradient from s+1;
// W needs I), and checks completeness (every F and backward exactly once per stage and
// micro-batch). Reports deadlocks (with each blocked rank's action) and mismatches.
ValidationResult validate(const Schedule& schedule);
// Step x rank grid ("step | rank0 | rank1 ..."), marking the actions named in `result`'s issues.
std::string render_grid(const Schedule& schedule, const ValidationResult& result);

// Bubble share of wall time under unit costs (F=1, B=2 or I=1 + W=1): idle rank-time / (ranks x makespan).
double simulated_bubble_fraction(const Schedule& schedule, double forward_cost = 1.0,
                                 double backward_cost = 2.0);

}  // namespace gpipe

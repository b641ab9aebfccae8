// Pipeline schedules as data: a small action IR (what torch.distributed.pipelining calls
// _Action), generators for the schedule families, a validator that dry-runs every rank's sends
// and receives, and a step x rank grid printer. Executors (executor.h) only run these lists.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gpipe {

struct PipelineConfig;
struct ParallelConfig;

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
bool is_communication(ActionType t);   // SF, RF, SB, RB

struct Action {
  ActionType type;
  int stage;       // virtual stage index in [0, num_stages): the model chunk this acts on
  int microbatch;  // in [0, num_microbatches)
  // Set on the first of an overlapped pair (torch's OVERLAP_F_B, "(0F3;3B1)OVERLAP_F_B"): this
  // action and the rank's next one, a forward and a backward (B or I) of another (stage,
  // micro-batch), run at the same time. The async executor runs the forward on the rank's
  // forward lane (a second thread, best-effort class) while the backward runs on the rank's
  // thread (high-priority class), so a scheduler can fill the backward's idle SMs with the
  // forward; the naive executor runs them in order. Their receives come before the pair, their
  // sends after it (with_communication), and the validator runs the two in one step.
  bool overlaps_next = false;
  // Asynchronous schedules (Schedule::sync_mode kAsp) only: the version of its stage's weights
  // this F or B runs with, counting the stage's updates (0: the initial weights); -1 otherwise.
  int weight_version = -1;
  bool operator==(const Action&) const = default;
};
std::string to_string(const Action& a);  // e.g. "2F5" = stage 2, forward, micro-batch 5
// "(0F3;3B1)": an overlapped pair as the grid and torch's OVERLAP_F_B cell write it.
std::string to_string_pair(const Action& first, const Action& second);

// kFromFile: read from a schedule file (schedule_csv.h); it has no generator, so
// parse_schedule_kind() does not accept its name ("file") and make_schedule() refuses it.
// The generated kinds and what they need (make_schedule() checks it), each with torch 2.11's
// order (torch.distributed.pipelining; the class in brackets):
//   gpipe, 1f1b, zb_h1          one stage per rank [ScheduleGPipe, Schedule1F1B, -]
//   interleaved_1f1b            any stages per rank (torch's classes take 1 too), round-robin
//                               placement, m % max(1, m/p) == 0 [ScheduleInterleaved1F1B]
//   interleaved_zb              as interleaved_1f1b, backward split into I and W
//                               [ScheduleInterleavedZeroBubble]
//   looped_bfs                  any stages per rank, round-robin placement [ScheduleLoopedBFS]
//   zbv                         2 stages per rank, V placement (rank r: stages r and 2p-1-r)
//                               [ScheduleZBVZeroBubble]
//   dualpipev                   2 stages per rank, V placement, m >= 2p [ScheduleDualPipeV]
enum class ScheduleKind : uint8_t {
  kGPipe,
  kOneFOneB,
  kInterleavedOneFOneB,
  kZeroBubbleH1,
  kLoopedBFS,
  kInterleavedZeroBubble,
  kZeroBubbleV,
  kDualPipeV,
  kFromFile,
};
// "gpipe", "1f1b", "interleaved_1f1b", "zb_h1", "looped_bfs", "interleaved_zb", "zbv",
// "dualpipev"; throws std::invalid_argument listing the allowed names.
ScheduleKind parse_schedule_kind(const std::string& name);
const char* to_string(ScheduleKind k);  // also "file" for kFromFile

// parallel.sync_mode: when a stage's weights change.
enum class SyncMode : uint8_t {
  kBsp,  // bulk synchronous: every micro-batch's gradients, then one update (the default)
  kAsp,  // asynchronous (PipeDream 1F1B-async, VPipe's asp): each stage updates its weights right
         // after every backward, so the pipeline never waits for a flush; with weight stashing a
         // micro-batch's backward uses the weights its forward used (with_weight_versions)
};
// "bsp", "asp"; throws std::invalid_argument naming the allowed values.
SyncMode parse_sync_mode(const std::string& name);
const char* to_string(SyncMode mode);

struct Schedule {
  ScheduleKind kind;
  int num_ranks = 0;         // pipeline ranks (physical stages)
  int stages_per_rank = 1;   // virtual stages (model chunks) per rank (the multi-stage kinds: any; V kinds: 2)
  int num_microbatches = 0;
  // per_rank[r] is rank r's program, in order.
  std::vector<std::vector<Action>> per_rank;
  // Which rank holds each virtual stage. Empty (every generator but zbv and dualpipev): the
  // round-robin placement, stage s on rank s % num_ranks. Otherwise stage_to_rank[s] is the rank
  // of stage s, any placement (a schedule file's, or the V shape of zbv and dualpipev: 0 and 3 on
  // rank 0, 1 and 2 on rank 1), with num_ranks * stages_per_rank entries, stages_per_rank per rank.
  std::vector<int> stage_to_rank;
  // kAsp: every F and B carries its weight version (with_weight_versions); the validator checks
  // them. weight_stashing: a B uses its own F's version (PipeDream's weight stashing); false: the
  // stage's newest version (the inconsistent gradient stashing exists to avoid).
  SyncMode sync_mode = SyncMode::kBsp;
  bool weight_stashing = true;

  int num_stages() const {
    return stage_to_rank.empty() ? num_ranks * stages_per_rank : static_cast<int>(stage_to_rank.size());
  }
  // -1 for a stage outside [0, num_stages()) of an explicit placement.
  int rank_of_stage(int stage) const {
    if (stage_to_rank.empty()) return stage % num_ranks;
    return stage >= 0 && stage < static_cast<int>(stage_to_rank.size()) ? stage_to_rank[static_cast<size_t>(stage)] : -1;
  }
};

// Compute-only programs (F/B/I/W) for each family. Throws std::invalid_argument for impossible
// shapes (e.g. interleaved 1F1B with 9 micro-batches on 4 ranks: not 2 equal rounds), naming the
// rule. dualpipev carries torch's overlapped forward+backward pairs (Action::overlaps_next) where
// torch's order has an OVERLAP_F_B; no other kind has pairs until with_overlap() adds them.
Schedule make_schedule(ScheduleKind kind, int num_ranks, int num_microbatches, int stages_per_rank = 1);
// The compute-only schedule a config asks for: parallel.schedule over parallel.model_parallel_size
// ranks with parallel.virtual_stages chunks each and training.num_microbatches micro-batches,
// with parallel.overlap_f_b applied (with_overlap) and, for parallel.sync_mode asp, the weight
// versions (with_weight_versions, parallel.weight_stashing).
Schedule make_schedule(const PipelineConfig& config);

// parallel.overlap_f_b: which forward / backward pairs of a rank run at the same time.
enum class OverlapMode : uint8_t {
  kAuto,  // the schedule's own pairs (dualpipev's, a file's OVERLAP_F_B cells); none elsewhere
  kOn,    // also pair every forward with the rank's next compute action when that is a
          // backward (B or I) of another (stage, micro-batch) and neither is paired yet: 1F1B's,
          // ZB-H1's and ZBV's steady states, interleaved schedules; each rank's order is kept
  kOff,   // no pairs: every pair runs as its two halves in order, forward first (what torch's
          // runtime does with OVERLAP_F_B when no overlap function is registered)
};
// "auto", "true", "false"; throws std::invalid_argument naming the allowed values.
OverlapMode parse_overlap_mode(const std::string& name);
const char* to_string(OverlapMode mode);  // "auto", "true", "false"
// `compute_only` with the pairs `mode` asks for. Throws std::invalid_argument for kOn on a
// schedule that already communicates (pair the compute-only schedule, then lower it).
Schedule with_overlap(const Schedule& compute_only, OverlapMode mode);
// Overlapped pairs in the schedule (over all ranks).
int count_overlapped_pairs(const Schedule& schedule);
// parallel.streams=per_rank with the async_threaded executor puts a rank's forward and backward on
// one stream, so an overlapped pair's halves could not run at once: throws ConfigError naming
// both settings when `schedule` (generated or read from parallel.schedule_file) has pairs.
void check_stream_layout(const ParallelConfig& parallel, const Schedule& schedule);
// Inserts the SEND/RECV actions each compute action implies, in an order that cannot deadlock
// with blocking point-to-point transports (receives right before the compute that needs them,
// sends right after the compute that produces them; the sends after one compute and the
// receives before the next form one group, see below). Interleaved 1F1B uses Megatron's steady
// state pairing: both receives of a forward+backward pair before the forward, both sends after
// the backward. A schedule read from a file (kFromFile), and the kinds ported from torch's
// multi-stage classes (looped_bfs, interleaved_zb, zbv, dualpipev), are lowered as
// torch.distributed.pipelining lowers a compute_only file (its _add_send_recv: each receive
// posted on the receiving rank as soon as the sender has produced the tensor), which serves any
// placement and compute order that can run; so is interleaved_1f1b when the micro-batches are
// not a multiple of the ranks (torch's flex rounds), where the Megatron pairing can deadlock,
// and every schedule with overlapped pairs (torch's lowering of OVERLAP_F_B: the pair is taken
// once both halves' inputs are there, so both receives precede it and both sends follow it).
// Validated clean for every kind over p in 1..8, m in 1..16 wherever the shape is legal.
// Throws std::invalid_argument for a schedule that already communicates.
Schedule with_communication(const Schedule& compute_only);

// The asynchronous schedule (SyncMode::kAsp) of a compute-only one: the same order per rank,
// every F and B annotated with the weight version it runs with. A stage's version counts its
// updates, one after each of its backwards: a forward runs with the stage's newest version; a
// backward with its forward's version when `stashing` (the stage keeps that version until then),
// else with the newest. Needs full backwards (B, not I/W: an update needs the whole gradient) and
// no overlapped pairs; throws std::invalid_argument naming the rule and the fix otherwise.
// 1F1B is PipeDream's 1F1B-async: in steady state rank r holds p - r micro-batches in flight.
Schedule with_weight_versions(const Schedule& compute_only, bool stashing = true);
// Per virtual stage: the most weight versions it must hold at once besides its newest (the
// stashed ones: versions that in-flight micro-batches' backwards still need). 0 for bsp and
// without stashing. 1F1B-async: p - s - 1 on stage s once it reaches its steady state (m >= 2p;
// a shorter run updates fewer times while micro-batches are in flight).
std::vector<int> stashed_versions(const Schedule& schedule);

struct ValidationIssue {
  int rank = -1;
  int step = -1;  // index into per_rank[rank]; -1 when no single action is to blame (a missing one)
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
// micro-batch). An overlapped pair runs in one step once both halves' inputs are there; it must
// be a forward and a backward (B or I), adjacent, of different (stage, micro-batch). Reports deadlocks (with each blocked rank's action) and mismatches. An explicit
// stage_to_rank must name a rank in [0, num_ranks) for each of num_ranks * stages_per_rank
// stages, stages_per_rank on every rank.
// An asynchronous schedule's weight versions are checked too (each F: its stage's updates so
// far in the rank's order; each B: its F's version with stashing, the newest without).
ValidationResult validate(const Schedule& schedule);
// Step x rank grid ("step | rank 0 | rank 1 ...", cells like "F3", "RF3", "SF1+RB0" for a group,
// "(F3;B1)" for an overlapped pair, "2F3" unless every rank r holds just stage r; "F3@v1" when
// the schedule is asynchronous: the weight version), marking the actions named in `result`'s issues as
// "!B1!" with a trailing " <" on the row; actions a deadlock left unrun go in a last "stuck"
// row. The issue messages follow the grid.
std::string render_grid(const Schedule& schedule, const ValidationResult& result);

// What one (virtual) stage's compute costs per micro-batch, in any time unit: forward, input
// gradient (I) and weight gradient (W); a full backward (B) costs I + W. The two transfer times
// count only where the neighbouring stage is on another rank: send_activation from this stage's
// forward end to the next stage's forward, send_gradient from this stage's backward (B or I) end
// to the previous stage's backward.
struct StageCosts {
  double forward = 1.0;
  double backward_input = 1.0;
  double backward_weight = 1.0;
  double send_activation = 0.0;
  double send_gradient = 0.0;
};
// One compute action's place on the simulated timeline.
struct SimulatedAction {
  Action action;
  double start = 0;
  double end = 0;
};
struct SimulatedStep {
  double makespan = 0;        // the step: the last rank's last action ends
  double bubble = 0;          // idle rank-time / (ranks x makespan)
  std::vector<double> busy;   // time each rank spent computing (on a shared device: while sharing it)
  // Per rank, its compute actions in program order with their start and end (communication
  // actions are not listed: their time is in the receiving action's start).
  std::vector<std::vector<SimulatedAction>> timeline;
};
struct SimulateOptions {
  // An overlapped pair (Action::overlaps_next) takes max(a, b) + pair_serial_share x min(a, b),
  // starting once both halves' inputs are there, both results leaving at its end (the executor's
  // order: both receives before the pair, both sends after it). 1 (the default): the halves run
  // back to back, the first as soon as its own inputs are there (one saturated device); 0: fully
  // at once (halves that leave each other's resources idle). The planner measures it. On a shared
  // device (rank_concurrency below) a pair instead runs as two threads, each taking its share.
  double pair_serial_share = 1.0;
  // Ranks sharing a device: rank r runs on device r % devices, and while n of a device's ranks
  // run at once each progresses at min(1, rank_concurrency[n-1] / n) of its own speed (processor
  // sharing: a CPU's cores, or one GPU under several ranks). Empty: every rank has a device of
  // its own. replicas: this many copies of the whole program run on the same devices at once
  // (data-parallel replicas as processes of one CPU), so n counts their ranks too.
  std::vector<double> rank_concurrency;
  int devices = 1;
  int replicas = 1;
};
// Runs every rank's program against the compute dependencies (as simulated_bubble_fraction
// below) with these costs: one entry for every stage, or one per stage (virtual stages included,
// so a measured imbalance shows), with transfer times between ranks (StageCosts). A schedule with
// communication actions is run as the executors run it: sends never wait, a receive only posts,
// and the compute that needs the tensor waits for it (a receive placed early holds nothing). Throws
// std::invalid_argument for a wrong number of entries, a negative cost, options out of range
// (pair_serial_share outside [0, 1], a concurrency <= 0, devices or replicas < 1), or a schedule whose
// compute order deadlocks.
SimulatedStep simulate_step(const Schedule& schedule, const std::vector<StageCosts>& stage_costs,
                            const SimulateOptions& options = {});

// Bubble share of wall time under unit costs (F=1, B=2 or I=1 + W=1): idle rank-time / (ranks x makespan).
// Communication actions cost nothing (the zero-comm-cost limit). GPipe and 1F1B give exactly
// (p-1)/(m+p-1) with F=1, B=2. An overlapped pair costs its two halves back to back: what
// sharing one GPU costs when either half alone fills it; what the overlap gains on a real GPU
// (the idle SMs of one half) is measured there, not modelled here. Throws std::invalid_argument if the compute order deadlocks.
double simulated_bubble_fraction(const Schedule& schedule, double forward_cost = 1.0,
                                 double backward_cost = 2.0);

// Activation memory: the most (stage, micro-batch) activations each rank holds at once, walking
// its program: +1 at F, -1 at its B or I (the input-gradient pass frees the bulk; what W still
// needs, the layer inputs, is the zero-bubble paper's smaller M_W and is not counted).
// 1F1B: min(p-r, m) on rank r; GPipe: m; ZB-H1: the same as 1F1B.
std::vector<int> peak_activations(const Schedule& schedule);

// Communication semantics the validator checks (those of NCCL point-to-point inside a group):
//  * A maximal run of consecutive SF/RF/SB/RB actions on one rank is ONE group, posted at once
//    (ncclGroupStart/End, torch's batch_isend_irecv). The group completes only when every op in
//    it has been matched by the peer's posted counterpart: sends are rendezvous, not buffered,
//    which is what a large NCCL send does. A schedule that passes here also runs with buffered
//    or asynchronous sends.
//  * Between one ordered pair of ranks, sends and receives match in posting order whatever the
//    tensor (NCCL has no tags): the k-th send from rank a to b must be what b's k-th receive from
//    a expects, SF(s, mb) <-> RF(s+1, mb) and SB(s, mb) <-> RB(s-1, mb); anything else is a
//    mismatch (wrong tensor delivered, or a hang on a size mismatch).
//  * A schedule with no communication actions at all is checked as compute-only: a dependency
//    on another rank is met once that rank has run the producing action.
// Executors must post each group as one batch (batch_isend_irecv / ncclGroupStart..End); a
// transport with buffered sends (the in-process one) may post them one by one.

}  // namespace gpipe

// Schedules in torch.distributed.pipelining's CSV format (torch 2.11, schedules.py:
// _PipelineScheduleRuntime._dump_csv / _load_csv), both ways, so a schedule can move between
// gpipe_runner and torch: one row per rank (row r is rank r), no header, one action per cell as
// torch's _Action prints it ("0F3", "1B0", "2I1", "2W1", "0SEND_F3", "1RECV_F3", "0SEND_B1",
// "1RECV_B0", "2UNSHARD", "2RESHARD", "2REDUCE_GRAD", "(0F3;3B1)OVERLAP_F_B"), empty cells for
// bubbles. Torch's cells never hold commas or quotes, so a row is its cells split at commas.
//
// Reading (schedule_from_csv, load_schedule_csv):
//  * Which rank holds which stage comes from the file (every stage named in row r lives on rank
//    r), any placement, V-shaped included; each stage on one rank, every rank the same number.
//  * Files with and without communication are both read; the micro-batch count is the highest
//    micro-batch named plus one.
//  * UNSHARD / RESHARD (FSDP's parameter all-gather and free) are dropped: the trainer keeps each
//    stage's parameters whole. REDUCE_GRAD (torch's per-stage gradient reduction across
//    data-parallel replicas after the stage's last backward) is dropped too: the trainer has no
//    data-parallel replicas, and its optimizer step after the step's last action is where the
//    accumulated gradients are used, so the action IR has nothing to run for it. All three still
//    say which rank holds their stage.
//  * OVERLAP_F_B becomes an overlapped pair (Action::overlaps_next on its first sub-action): it
//    must hold two sub-actions, a forward and a backward (B or I). Written back the same way.
//  * The result is validate()d; a schedule that does not validate is an error with the issues
//    (each traced back to its row and column) and the step x rank grid.
// Errors name the file, the row (and its rank), the column (1-based) and the cell, and say what
// was expected.
//
// Writing (schedule_to_csv): kComputeOnly writes the F/B/I/W actions, each rank's k-th cell
// being dry-run step k (an empty cell where the rank waits), as torch dumps its pipeline_order.
// kComputeComms writes the whole program (lowering a compute-only schedule with
// with_communication() first) without empty cells (torch's compute_comms loader refuses them);
// within each group of consecutive communication actions the sends come before the receives:
// torch's runtime treats sends as non-blocking and receives as blocking, and its simulator
// (_simulate_comms_compute) would otherwise stall where two ranks each wait to receive before
// sending. This keeps the schedule's meaning here (a group is posted at once).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "trainer/schedule/schedule.h"

namespace gpipe {

struct ParallelConfig;
struct TrainingConfig;

// torch's format names: "compute_only" and "compute_comms".
enum class ScheduleCsvFormat : uint8_t { kComputeOnly, kComputeComms };

// A schedule file that cannot be read, or that is not a valid schedule. An invalid_argument, so
// the CLI reports it with exit code 2 (something the user can fix).
struct ScheduleCsvError : std::invalid_argument {
  using std::invalid_argument::invalid_argument;
};

// An action as torch prints it: "2F0", "1SEND_B3", "0RECV_F1" (to_string() gives "2F0", "1SB3").
std::string torch_action_name(const Action& a);
// A program's cells as torch writes them: one per action, an overlapped pair as one
// "(0F3;3B1)OVERLAP_F_B".
std::vector<std::string> torch_cells(const std::vector<Action>& program);

// The CSV text of `schedule`, rows ending in "\n" (torch's csv.writer writes "\r\n"; both read the same).
std::string schedule_to_csv(const Schedule& schedule, ScheduleCsvFormat format);

// Parses CSV text; `source` names it in errors (a file name). Returns a validated schedule of
// kind kFromFile with an explicit stage_to_rank; throws ScheduleCsvError.
Schedule schedule_from_csv(const std::string& text, const std::string& source);
// Reads the file at `path` (schedule_from_csv with the path as source).
Schedule load_schedule_csv(const std::string& path);

// The schedule the executors run for parallel.schedule_file: the file's, checked against the
// configured ranks (parallel.model_parallel_size), stages per rank (parallel.virtual_stages) and
// micro-batches (training.num_microbatches), lowered with with_communication() if it has no
// communication, and validated. Throws ScheduleCsvError.
Schedule schedule_from_file(const ParallelConfig& parallel, const TrainingConfig& training);

}  // namespace gpipe

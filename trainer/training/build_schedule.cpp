// build_schedule (trainer.h): the schedule a PipelineTrainer runs, from parallel.schedule_file or
// generated from parallel.schedule, lowered with its SEND/RECV actions and validated by a dry run;
// every way it can be wrong is a ConfigError naming the config fields (and, for a schedule that
// does not validate, the step x rank grid).
#include "trainer/training/trainer.h"

#include <stdexcept>
#include <string>

#include <fmt/format.h>

#include "trainer/config/config.h"
#include "trainer/schedule/schedule.h"
#include "trainer/schedule/schedule_csv.h"

namespace gpipe {

namespace {
Schedule generate_or_read_schedule(const ParallelConfig& parallel, const TrainingConfig& global_training) {
  const TrainingConfig training = replica_training(parallel, global_training);  // one replica's pipeline
  if (!parallel.schedule_file.empty()) {
    // Read, checked against the config's shape, lowered if compute-only, and validated.
    Schedule from_file;
    try {
      from_file = schedule_from_file(parallel, training);
    } catch (const ScheduleCsvError& e) {
      throw ConfigError(std::string("parallel.schedule_file: ") + e.what());
    }
    if (parse_sync_mode(parallel.sync_mode) == SyncMode::kAsp) {
      // As for a generated schedule: each B updates its stage, each F records the weight version
      // it used (the file said only the order; without this asp silently trained as bsp).
      try {
        from_file = with_weight_versions(from_file, parallel.weight_stashing);
      } catch (const std::invalid_argument& e) {
        throw ConfigError(fmt::format("parallel.sync_mode=asp with parallel.schedule_file {}: {}", parallel.schedule_file,
                                      e.what()));
      }
    }
    return from_file;
  }
  ScheduleKind kind;
  try {
    kind = parse_schedule_kind(parallel.schedule);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(std::string("parallel.schedule: ") + e.what());
  }
  Schedule compute;
  try {
    compute = with_overlap(make_schedule(kind, parallel.model_parallel_size, training.num_microbatches,
                                         parallel.virtual_stages),
                           parse_overlap_mode(parallel.overlap_f_b));
    if (parse_sync_mode(parallel.sync_mode) == SyncMode::kAsp) {
      compute = with_weight_versions(compute, parallel.weight_stashing);
    }
  } catch (const std::invalid_argument& e) {
    throw ConfigError(fmt::format("parallel.schedule={} with parallel.model_parallel_size={}, "
                                  "training.num_microbatches={}, parallel.virtual_stages={}: {}",
                                  parallel.schedule, parallel.model_parallel_size, training.num_microbatches,
                                  parallel.virtual_stages, e.what()));
  }
  Schedule schedule = with_communication(compute);
  const ValidationResult result = validate(schedule);
  if (!result.ok) {
    std::string issues;
    for (const auto& issue : result.issues) issues += fmt::format("\n  rank {} step {}: {}", issue.rank, issue.step, issue.message);
    throw ConfigError(fmt::format("parallel.schedule={} does not validate for {} ranks and {} micro-batches:{}\n{}",
                                  parallel.schedule, parallel.model_parallel_size, training.num_microbatches, issues,
                                  render_grid(schedule, result)));
  }
  return schedule;
}
}  // namespace

Schedule build_schedule(const ParallelConfig& parallel, const TrainingConfig& training) {
  Schedule schedule = generate_or_read_schedule(parallel, training);
  check_stream_layout(parallel, schedule);  // generated or read from parallel.schedule_file alike
  return schedule;
}

}  // namespace gpipe

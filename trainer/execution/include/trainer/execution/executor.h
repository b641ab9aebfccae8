// Executors run a Schedule (from make_schedule + with_communication) for one optimizer step's
// forward and backward passes. `naive`: one thread, one stream, actions in the validator's
// dry-run step order. `async_threaded`: one thread per rank running its own program, each
// micro-batch's forward and backward on their own prioritised CUDA streams (no streams on CPU).
#pragma once

#include <c10/core/Device.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "trainer/model/interfaces.h"
#include "trainer/schedule/schedule.h"

namespace gpipe {

class StageRuntime;
class Transport;
class ActionRecorder;

struct ExecutorOptions {
  // A receive that waits longer is an error; across processes a sender whose heartbeat advances
  // is waited for up to 10 x this (a dead one ends the wait after 1 x, through the monitor).
  std::chrono::milliseconds recv_timeout{120000};
  std::string priority = "backward_first";         // parallel.priority
  std::string streams = "per_microbatch";          // parallel.streams (async_threaded)
  bool bf16_autocast = false;                      // at::autocast bf16 on CUDA devices
};

// What one step needs. The executor does not own any of it.
struct StepContext {
  // The pipeline ranks this process runs (all when local_ranks is empty).
  std::vector<int> ranks_here() const;
  const Schedule* schedule = nullptr;      // with communication actions
  std::vector<StageRuntime*> stages;       // indexed by virtual stage; null for stages of other processes
  std::vector<c10::Device> rank_devices;   // indexed by rank
  std::vector<int> local_ranks;            // the ranks this process runs; empty: all of them
  std::vector<Batch> microbatches;         // indexed by micro-batch
  Transport* transport = nullptr;
  ActionRecorder* recorder = nullptr;      // optional: spans of every action
  // Asynchronous schedules (sync_mode asp): called on the rank's thread right after each B of
  // `stage` (of `microbatch`), to update that stage's weights (StageRuntime::apply_update).
  std::function<void(int stage, int microbatch)> update_after_backward;
  // Replicated stages (parallel.data_parallel_size > 1): called on the rank's thread right before
  // and right after the last action of the step that writes `stage`'s .grad (its last B, I or W),
  // so the replicas' gradient all-reduce can start bucket by bucket during it (GradientReducer).
  std::function<void(int stage)> before_last_gradient, after_last_gradient;
};

class Executor {
 public:
  virtual ~Executor() = default;
  virtual const char* name() const = 0;
  // Runs every rank's program once: all forwards and backwards of the step, gradients
  // accumulated in the stages' parameters. Throws std::runtime_error naming the rank and the
  // action that failed (the root cause, not the peers that then timed out or were aborted).
  virtual void run_step(const StepContext& ctx) = 0;
  // One line per rank about streams, for the log.
  virtual std::vector<std::string> describe_streams(const std::vector<c10::Device>& rank_devices) const = 0;
};

// "naive" | "async_threaded"; throws ConfigError naming parallel.scheduler and the allowed names.
std::unique_ptr<Executor> make_executor(const std::string& name, ExecutorOptions options = {});

}  // namespace gpipe

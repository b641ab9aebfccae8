// What each rank did during one step: an ActionRecorder the executors feed (one vector and one
// lock per rank, so rank threads never share a lock), and its Chrome-trace / Perfetto export (one
// track per rank, plus one for its forward lane when overlapped pairs ran, one event per action
// named like "F3 s1").
//
// Two clocks. On CPU a span is host time: the action's work is done when its method returns. On
// a GPU the method returns once its kernels are queued, so host spans would say little: there
// each span also carries GPU times (CUDA events on the action's stream), read at end_step() once
// the devices are synchronised, and busy time, bubble and the timeline use those.
#pragma once

#include <chrono>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "trainer/schedule/schedule.h"

namespace gpipe {

// Where a rank's action ran: its own thread, or its forward lane (the forward half of an
// overlapped pair, async executor; Action::overlaps_next).
enum class ActionLane : uint8_t { kRank, kForwardLane };

struct ActionSpan {
  Action action;
  int rank = 0;
  double start_us = 0;  // since the step began
  double end_us = 0;
  ActionLane lane = ActionLane::kRank;
};

// The GPU-clock ends of one action span, in microseconds since its device's step mark. Read only
// after the step's device work is complete.
class GpuSpanTimes {
 public:
  virtual ~GpuSpanTimes() = default;
  virtual std::pair<double, double> start_end_us() const = 0;
};

enum class SpanClock {
  kHost,        // steady_clock around each action's method (CPU)
  kCudaEvents,  // CUDA events on each action's stream (GPU)
};
const char* to_string(SpanClock clock);  // "host" | "cuda_events"

// Busy actions are the compute ones (F, B, I, W); sends and receives are communication/waiting.
bool is_compute(ActionType type);

class ActionRecorder {
 public:
  using Clock = std::chrono::steady_clock;
  explicit ActionRecorder(int num_ranks = 0);
  // Clears the spans and starts the step clock. Not thread-safe: call between steps.
  void begin_step(int num_ranks);
  // Rank `rank` only touches its own vector under its own lock (its thread and its forward lane
  // may record at once). `gpu` (GPU ranks): the span's GPU times, resolved by end_step().
  void record(int rank, const Action& action, Clock::time_point start, Clock::time_point end,
              std::shared_ptr<const GpuSpanTimes> gpu = nullptr, ActionLane lane = ActionLane::kRank);
  // Stops the step clock. When spans carry GPU times (call only after the devices were
  // synchronised), they replace the host times, and the wall time is the latest span end on
  // the GPU clock. Spans of one step use one clock: all of them have GPU times, or none.
  void end_step();
  // Told when a rank starts a compute action (F, B, I, W), before its work is issued, and when it
  // issued it all: the bubble publisher keeps windows closed in between (parallel.publish_bubbles_gpu).
  // `finished` (a GPU rank's action; empty on CPU, where issued is done) says without waiting
  // whether the device has run the action's work: on a GPU the host runs ahead, and a window must
  // stay closed until then. Set between steps; called from the ranks' threads.
  using ComputeFinished = std::function<bool()>;
  void set_compute_hooks(std::function<void(int rank)> starting,
                         std::function<void(int rank, ComputeFinished finished)> done) {
    compute_start_hook_ = std::move(starting);
    compute_done_hook_ = std::move(done);
  }
  void compute_starting(int rank) const {
    if (compute_start_hook_) compute_start_hook_(rank);
  }
  void compute_done(int rank, ComputeFinished finished = {}) const {
    if (compute_done_hook_) compute_done_hook_(rank, std::move(finished));
  }

  int num_ranks() const { return static_cast<int>(per_rank_.size()); }
  double wall_us() const { return wall_us_; }
  SpanClock clock() const { return clock_; }
  const std::vector<ActionSpan>& spans(int rank) const { return per_rank_.at(rank); }
  std::vector<ActionSpan> all_spans() const;
  // Time one rank computed: the union of its compute spans (an overlapped pair's two halves
  // count once where they ran at the same time).
  double busy_us(int rank) const;
  // Idle share of rank-time: 1 - sum(busy) / (ranks x wall) over the ranks that recorded spans
  // (a process of a multi-process run sees only its own). 0 when nothing was recorded.
  double bubble_fraction() const;

 private:
  std::function<void(int rank)> compute_start_hook_;
  std::function<void(int rank, ComputeFinished finished)> compute_done_hook_;
  Clock::time_point step_start_{};
  double wall_us_ = 0;
  SpanClock clock_ = SpanClock::kHost;
  std::vector<std::vector<ActionSpan>> per_rank_;
  // Parallel to per_rank_: each span's GPU times (null on CPU).
  std::vector<std::vector<std::shared_ptr<const GpuSpanTimes>>> gpu_per_rank_;
  std::vector<std::mutex> rank_mu_;  // one per rank, held by record()
};

// Event name used in the trace: "<type><microbatch> s<stage>", e.g. "F3 s1", "SB0 s2".
std::string span_name(const Action& action);
// {"traceEvents": [...], "displayTimeUnit": "ms", "metadata": {...}}: a thread-name event per
// rank ("rank r", tid r) and, for a rank whose forward lane ran, per lane ("rank r forward lane",
// tid ranks + r, sorted right below its rank), and one complete ("X") event per action, args
// {stage, microbatch, action};
// metadata says which clock the spans use ("clock": "host" | "cuda_events").
nlohmann::json to_chrome_trace(const ActionRecorder& recorder, int step);
// Writes to_chrome_trace to `path` (creating its folder); throws std::runtime_error naming it.
void write_chrome_trace(const ActionRecorder& recorder, int step, const std::string& path);

}  // namespace gpipe

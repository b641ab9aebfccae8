// What each rank did during one step: an ActionRecorder the executors feed (one vector per rank,
// so rank threads never share a lock), and its Chrome-trace / Perfetto export (one track per
// rank, one event per action named like "F3 s1").
#pragma once

#include <chrono>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "trainer/schedule/schedule.h"

namespace gpipe {

struct ActionSpan {
  Action action;
  int rank = 0;
  double start_us = 0;  // since the step began
  double end_us = 0;
};

// Busy actions are the compute ones (F, B, I, W); sends and receives are communication/waiting.
bool is_compute(ActionType type);

class ActionRecorder {
 public:
  using Clock = std::chrono::steady_clock;
  explicit ActionRecorder(int num_ranks = 0);
  // Clears the spans and starts the step clock. Not thread-safe: call between steps.
  void begin_step(int num_ranks);
  // Rank `rank` only touches its own vector, so concurrent ranks need no lock.
  void record(int rank, const Action& action, Clock::time_point start, Clock::time_point end);
  // Stops the step clock.
  void end_step();

  int num_ranks() const { return static_cast<int>(per_rank_.size()); }
  double wall_us() const { return wall_us_; }
  const std::vector<ActionSpan>& spans(int rank) const { return per_rank_.at(rank); }
  std::vector<ActionSpan> all_spans() const;
  // Sum of compute-span durations of one rank.
  double busy_us(int rank) const;
  // Idle share of rank-time: 1 - sum(busy) / (ranks x wall) over the ranks that recorded spans
  // (a process of a multi-process run sees only its own). 0 when nothing was recorded.
  double bubble_fraction() const;

 private:
  Clock::time_point step_start_{};
  double wall_us_ = 0;
  std::vector<std::vector<ActionSpan>> per_rank_;
};

// Event name used in the trace: "<type><microbatch> s<stage>", e.g. "F3 s1", "SB0 s2".
std::string span_name(const Action& action);
// {"traceEvents": [...], "displayTimeUnit": "ms", "metadata": {...}}: a thread-name event per
// rank ("rank r") and one complete ("X") event per action, args {stage, microbatch, action}.
nlohmann::json to_chrome_trace(const ActionRecorder& recorder, int step);
// Writes to_chrome_trace to `path` (creating its folder); throws std::runtime_error naming it.
void write_chrome_trace(const ActionRecorder& recorder, int step, const std::string& path);

}  // namespace gpipe

// ActionRecorder and the Chrome-trace export (chrome://tracing, ui.perfetto.dev).
#include "trainer/metrics/timeline.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <stdexcept>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

namespace gpipe {

bool is_compute(ActionType type) {
  switch (type) {
    case ActionType::kForward:
    case ActionType::kBackward:
    case ActionType::kBackwardInput:
    case ActionType::kBackwardWeight:
      return true;
    default:
      return false;
  }
}

const char* to_string(SpanClock clock) { return clock == SpanClock::kCudaEvents ? "cuda_events" : "host"; }

ActionRecorder::ActionRecorder(int num_ranks)
    : per_rank_(static_cast<size_t>(std::max(0, num_ranks))),
      gpu_per_rank_(static_cast<size_t>(std::max(0, num_ranks))),
      rank_mu_(static_cast<size_t>(std::max(0, num_ranks))) {}

void ActionRecorder::begin_step(int num_ranks) {
  per_rank_.assign(static_cast<size_t>(std::max(0, num_ranks)), {});
  gpu_per_rank_.assign(static_cast<size_t>(std::max(0, num_ranks)), {});
  if (rank_mu_.size() != per_rank_.size()) rank_mu_ = std::vector<std::mutex>(per_rank_.size());
  for (auto& spans : per_rank_) spans.reserve(64);
  wall_us_ = 0;
  clock_ = SpanClock::kHost;
  step_start_ = Clock::now();
}

void ActionRecorder::record(int rank, const Action& action, Clock::time_point start, Clock::time_point end,
                            std::shared_ptr<const GpuSpanTimes> gpu, ActionLane lane) {
  auto us = [&](Clock::time_point t) {
    return std::chrono::duration<double, std::micro>(t - step_start_).count();
  };
  std::lock_guard<std::mutex> lock(rank_mu_.at(static_cast<size_t>(rank)));
  per_rank_.at(static_cast<size_t>(rank)).push_back(ActionSpan{action, rank, us(start), us(end), lane});
  gpu_per_rank_.at(static_cast<size_t>(rank)).push_back(std::move(gpu));
}

void ActionRecorder::end_step() {
  wall_us_ = std::chrono::duration<double, std::micro>(Clock::now() - step_start_).count();
  size_t with_gpu = 0, total = 0;
  for (const auto& times : gpu_per_rank_) {
    total += times.size();
    with_gpu += static_cast<size_t>(std::count_if(times.begin(), times.end(), [](const auto& t) { return t != nullptr; }));
  }
  if (with_gpu == 0) return;
  if (with_gpu != total) {
    throw std::logic_error(fmt::format("{} of the step's {} action spans have GPU times: one step's timeline cannot "
                                       "mix the host and the GPU clock", with_gpu, total));
  }
  clock_ = SpanClock::kCudaEvents;
  double wall = 0;
  for (size_t r = 0; r < per_rank_.size(); ++r) {
    for (size_t i = 0; i < per_rank_[r].size(); ++i) {
      const auto [start, end] = gpu_per_rank_[r][i]->start_end_us();
      per_rank_[r][i].start_us = start;
      per_rank_[r][i].end_us = end;
      wall = std::max(wall, end);
    }
    gpu_per_rank_[r].clear();  // the events may go back to their pool now
  }
  wall_us_ = wall;
}

std::vector<ActionSpan> ActionRecorder::all_spans() const {
  std::vector<ActionSpan> out;
  for (const auto& spans : per_rank_) out.insert(out.end(), spans.begin(), spans.end());
  return out;
}

double ActionRecorder::busy_us(int rank) const {
  std::vector<std::pair<double, double>> compute;
  for (const auto& span : per_rank_.at(static_cast<size_t>(rank))) {
    if (is_compute(span.action.type)) compute.emplace_back(span.start_us, span.end_us);
  }
  std::sort(compute.begin(), compute.end());
  double busy = 0, covered_to = -std::numeric_limits<double>::infinity();
  for (const auto& [start, end] : compute) {
    const double from = std::max(start, covered_to);
    if (end > from) busy += end - from;
    covered_to = std::max(covered_to, end);
  }
  return busy;
}

double ActionRecorder::bubble_fraction() const {
  if (per_rank_.empty() || wall_us_ <= 0) return 0.0;
  // Ranks run by other processes record nothing here and are left out.
  double busy = 0;
  int recorded = 0;
  for (int r = 0; r < num_ranks(); ++r) {
    if (per_rank_[static_cast<size_t>(r)].empty()) continue;
    busy += busy_us(r);
    ++recorded;
  }
  if (recorded == 0) return 0.0;
  return std::clamp(1.0 - busy / (static_cast<double>(recorded) * wall_us_), 0.0, 1.0);
}

std::string span_name(const Action& action) {
  return std::string(short_name(action.type)) + std::to_string(action.microbatch) + " s" +
         std::to_string(action.stage);
}

namespace {

// One (rank, lane) of the trace: its spans spread over as many tracks as overlap at once.
// Chrome-trace "X" events of one track must nest (Perfetto drops those that partly overlap), and
// on the GPU clock a rank's actions on different streams run at once (GPipe's forwards), so each
// span goes on the first of the lane's tracks that is free when it starts. Track k > 0 is tid
// base + k x 2 x ranks, named "... (overlap k)", sorted right after the lane's first track.
void add_lane(nlohmann::json& events, const std::vector<const ActionSpan*>& spans, int base_tid, int ranks,
              const std::string& name, int sort_base, bool always) {
  std::vector<const ActionSpan*> by_start = spans;
  std::stable_sort(by_start.begin(), by_start.end(),
                   [](const ActionSpan* a, const ActionSpan* b) { return a->start_us < b->start_us; });
  std::vector<double> track_end;  // per track of the lane: where its last span ends
  auto open_track = [&] {
    const int k = static_cast<int>(track_end.size());
    const int tid = base_tid + k * 2 * ranks;
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 0}, {"tid", tid},
                      {"args", {{"name", k == 0 ? name : name + " (overlap " + std::to_string(k) + ")"}}}});
    events.push_back({{"name", "thread_sort_index"}, {"ph", "M"}, {"pid", 0}, {"tid", tid},
                      {"args", {{"sort_index", sort_base + k}}}});
    track_end.push_back(-std::numeric_limits<double>::infinity());
  };
  if (always) open_track();
  for (const ActionSpan* span : by_start) {
    const double end = std::max(span->start_us, span->end_us);
    auto free = std::find_if(track_end.begin(), track_end.end(), [&](double e) { return e <= span->start_us; });
    if (free == track_end.end()) {
      open_track();
      free = track_end.end() - 1;
    }
    *free = end;
    const int k = static_cast<int>(free - track_end.begin());
    events.push_back({{"name", span_name(span->action)},
                      {"cat", is_compute(span->action.type) ? "compute" : "comm"},
                      {"ph", "X"},
                      {"pid", 0},
                      {"tid", base_tid + k * 2 * ranks},
                      {"ts", span->start_us},
                      {"dur", end - span->start_us},
                      {"args",
                       {{"stage", span->action.stage},
                        {"microbatch", span->action.microbatch},
                        {"action", short_name(span->action.type)}}}});
  }
}

}  // namespace

nlohmann::json to_chrome_trace(const ActionRecorder& recorder, int step) {
  nlohmann::json events = nlohmann::json::array();
  const int ranks = recorder.num_ranks();
  // Room in the sort order for each lane's overlap tracks.
  constexpr int kSortStride = 64;
  for (int r = 0; r < ranks; ++r) {
    std::vector<const ActionSpan*> on_rank, on_forward_lane;
    for (const auto& span : recorder.spans(r)) {
      (span.lane == ActionLane::kForwardLane ? on_forward_lane : on_rank).push_back(&span);
    }
    add_lane(events, on_rank, r, ranks, "rank " + std::to_string(r), kSortStride * 2 * r, /*always=*/true);
    add_lane(events, on_forward_lane, ranks + r, ranks, "rank " + std::to_string(r) + " forward lane",
             kSortStride * (2 * r + 1), /*always=*/false);
  }
  return {{"traceEvents", events},
          {"displayTimeUnit", "ms"},
          {"metadata",
           {{"step", step},
            {"ranks", recorder.num_ranks()},
            {"wall_us", recorder.wall_us()},
            {"clock", to_string(recorder.clock())},
            {"bubble_fraction", recorder.bubble_fraction()}}}};
}

void write_chrome_trace(const ActionRecorder& recorder, int step, const std::string& path) {
  const std::filesystem::path file(path);
  std::error_code ec;
  if (file.has_parent_path()) std::filesystem::create_directories(file.parent_path(), ec);
  std::ofstream out(file);
  if (!out) throw std::runtime_error("cannot write the timeline to '" + path + "': check that the folder is writable");
  out << to_chrome_trace(recorder, step).dump() << '\n';
  if (!out) throw std::runtime_error("writing the timeline to '" + path + "' failed (disk full?)");
}

}  // namespace gpipe

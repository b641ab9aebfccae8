// The Chrome-trace timeline: one track per rank and one event per action of the schedule.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <map>
#include <set>

#include <nlohmann/json.hpp>

#include "test_engine_helpers.h"
#include "temp_dir.h"
#include "trainer/metrics/timeline.h"

namespace gpipe::testing {
namespace {

void expect_every_action_on_its_track(const std::string& schedule, const std::string& executor, int virtual_stages) {
  TinySetup s;
  s.schedule = schedule;
  s.executor = executor;
  s.virtual_stages = virtual_stages;
  auto trainer = make_tiny_trainer(s);
  ActionRecorder recorder;
  trainer->forward_backward(tiny_batch(s.batch, s.seq, s.vocab, 5), &recorder);
  const nlohmann::json trace = to_chrome_trace(recorder, 0);

  std::set<int> named_tracks;
  std::multiset<std::pair<int, std::string>> events;  // (tid, name)
  for (const auto& e : trace.at("traceEvents")) {
    if (e.at("ph") == "M" && e.at("name") == "thread_name") named_tracks.insert(e.at("tid").get<int>());
    if (e.at("ph") == "X") {
      events.insert({e.at("tid").get<int>(), e.at("name").get<std::string>()});
      EXPECT_GE(e.at("dur").get<double>(), 0.0);
      EXPECT_TRUE(e.at("args").contains("stage") && e.at("args").contains("microbatch") && e.at("args").contains("action"));
    }
  }
  EXPECT_EQ(named_tracks, (std::set<int>{0, 1}));
  std::multiset<std::pair<int, std::string>> expected;
  for (int r = 0; r < trainer->schedule().num_ranks; ++r) {
    for (const Action& a : trainer->schedule().per_rank[static_cast<size_t>(r)]) expected.insert({r, span_name(a)});
  }
  EXPECT_EQ(events, expected);
  EXPECT_GT(trace.at("metadata").at("wall_us").get<double>(), 0.0);
}

TEST(TimelineTest, OneFOneBAsyncHasEveryActionOnItsRank) { expect_every_action_on_its_track("1f1b", "async_threaded", 1); }
TEST(TimelineTest, ZeroBubbleNaiveHasEveryActionOnItsRank) { expect_every_action_on_its_track("zb_h1", "naive", 1); }
TEST(TimelineTest, InterleavedHasEveryActionOnItsRank) {
  expect_every_action_on_its_track("interleaved_1f1b", "async_threaded", 2);
}

// With overlapped pairs the async executor runs each paired forward on the rank's forward lane:
// its event goes on the lane's own track (tid ranks + r, named and sorted below its rank).
TEST(TimelineTest, OverlappedForwardsGoOnTheRanksForwardLaneTrack) {
  TinySetup s;
  s.overlap_f_b = "true";
  auto trainer = make_tiny_trainer(s);
  ActionRecorder recorder;
  trainer->forward_backward(tiny_batch(s.batch, s.seq, s.vocab, 5), &recorder);
  const nlohmann::json trace = to_chrome_trace(recorder, 0);
  const int ranks = trainer->schedule().num_ranks;
  std::map<int, std::string> track_names;
  std::map<int, int> sort_index;
  std::multiset<std::pair<int, std::string>> events, expected;
  for (const auto& e : trace.at("traceEvents")) {
    if (e.at("ph") == "M" && e.at("name") == "thread_name") track_names[e.at("tid")] = e.at("args").at("name");
    if (e.at("ph") == "M" && e.at("name") == "thread_sort_index") sort_index[e.at("tid")] = e.at("args").at("sort_index");
    if (e.at("ph") == "X") events.insert({e.at("tid").get<int>(), e.at("name").get<std::string>()});
  }
  std::set<int> lanes;
  for (int r = 0; r < ranks; ++r) {
    const auto& prog = trainer->schedule().per_rank[static_cast<size_t>(r)];
    for (size_t k = 0; k < prog.size(); ++k) {
      const bool paired_forward = prog[k].type == ActionType::kForward &&
                                  (prog[k].overlaps_next || (k > 0 && prog[k - 1].overlaps_next));
      if (paired_forward) lanes.insert(r);
      expected.insert({paired_forward ? ranks + r : r, span_name(prog[k])});
    }
  }
  ASSERT_FALSE(lanes.empty()) << "1F1B with overlap_f_b=true has no pair";
  EXPECT_EQ(events, expected);
  for (int r : lanes) {
    EXPECT_EQ(track_names[ranks + r], "rank " + std::to_string(r) + " forward lane");
    EXPECT_GT(sort_index[ranks + r], sort_index[r]);  // right below its rank
    if (r + 1 < ranks) EXPECT_LT(sort_index[ranks + r], sort_index[r + 1]);
  }
  EXPECT_EQ(track_names.size(), static_cast<size_t>(ranks) + lanes.size()) << "a lane track for a rank without pairs";
}

// Busy time is the union of a rank's compute spans: an overlapped pair's stretch counts once,
// communication not at all.
TEST(TimelineTest, BusyTimeCountsOverlappingSpansOnce) {
  ActionRecorder recorder;
  recorder.begin_step(1);
  const auto t0 = ActionRecorder::Clock::now();
  auto at = [&](int us) { return t0 + std::chrono::microseconds(us); };
  recorder.record(0, {ActionType::kBackward, 0, 0}, at(0), at(100));
  recorder.record(0, {ActionType::kForward, 0, 1}, at(40), at(160), nullptr, ActionLane::kForwardLane);
  recorder.record(0, {ActionType::kSendBackward, 0, 0}, at(160), at(400));
  recorder.record(0, {ActionType::kForward, 0, 2}, at(500), at(600));
  EXPECT_NEAR(recorder.busy_us(0), 160.0 + 100.0, 1e-6);
  EXPECT_EQ(recorder.spans(0)[1].lane, ActionLane::kForwardLane);
  EXPECT_EQ(recorder.spans(0)[0].lane, ActionLane::kRank);
}

TEST(TimelineTest, SpanNamesSayActionMicrobatchAndStage) {
  EXPECT_EQ(span_name(Action{ActionType::kForward, 1, 3}), "F3 s1");
  EXPECT_EQ(span_name(Action{ActionType::kSendBackward, 2, 0}), "SB0 s2");
}

// GPU ranks time each action with CUDA events; the recorder takes those times at end_step (the
// CUDA side runs on the GPU check, this is the recorder's arithmetic with given GPU times).
class GivenGpuTimes final : public GpuSpanTimes {
 public:
  GivenGpuTimes(double start, double end) : start_(start), end_(end) {}
  std::pair<double, double> start_end_us() const override { return {start_, end_}; }

 private:
  double start_, end_;
};

// Records `action` on `rank` as a GPU rank does: ~0 on the host (kernels only queued), the GPU's
// [start_us, end_us] known at end_step.
void record_on_gpu(ActionRecorder& recorder, int rank, Action action, double start_us, double end_us) {
  const auto now = ActionRecorder::Clock::now();
  recorder.record(rank, action, now, now, std::make_shared<GivenGpuTimes>(start_us, end_us));
}

TEST(TimelineTest, GpuTimesReplaceHostTimesAndSetTheClockAndTheWall) {
  ActionRecorder recorder;
  recorder.begin_step(2);
  const auto now = ActionRecorder::Clock::now();
  // Host spans say every action took ~0 (kernels only queued); the GPU says otherwise.
  record_on_gpu(recorder, 0, Action{ActionType::kForward, 0, 0}, 0, 400);
  record_on_gpu(recorder, 0, Action{ActionType::kBackward, 0, 0}, 600, 1000);
  record_on_gpu(recorder, 1, Action{ActionType::kRecvForward, 1, 0}, 0, 400);
  record_on_gpu(recorder, 1, Action{ActionType::kForward, 1, 0}, 400, 600);
  EXPECT_EQ(recorder.clock(), SpanClock::kHost);
  recorder.end_step();
  EXPECT_EQ(recorder.clock(), SpanClock::kCudaEvents);
  EXPECT_DOUBLE_EQ(recorder.wall_us(), 1000.0);
  EXPECT_DOUBLE_EQ(recorder.spans(0).at(1).start_us, 600.0);
  EXPECT_DOUBLE_EQ(recorder.busy_us(0), 800.0);
  EXPECT_DOUBLE_EQ(recorder.busy_us(1), 200.0);  // the receive is not busy time
  EXPECT_DOUBLE_EQ(recorder.bubble_fraction(), 1.0 - 1000.0 / 2000.0);
  const nlohmann::json trace = to_chrome_trace(recorder, 3);
  EXPECT_EQ(trace.at("metadata").at("clock"), "cuda_events");
  // The next step starts on the host clock again.
  recorder.begin_step(1);
  recorder.record(0, Action{ActionType::kForward, 0, 0}, now, now);
  recorder.end_step();
  EXPECT_EQ(recorder.clock(), SpanClock::kHost);
  EXPECT_EQ(to_chrome_trace(recorder, 4).at("metadata").at("clock"), "host");
}

// On the GPU clock a rank's actions on different streams run at once (GPipe: F1 need not wait
// for F0). Chrome-trace "X" events of one track must nest, or Perfetto drops them: overlapping
// spans go on extra tracks of the rank ("rank 0 (overlap 1)"), each track's spans disjoint.
TEST(TimelineTest, OverlappingGpuSpansOfARankGetTracksOfTheirOwn) {
  ActionRecorder recorder;
  recorder.begin_step(1);
  record_on_gpu(recorder, 0, Action{ActionType::kForward, 0, 0}, 0, 400);
  record_on_gpu(recorder, 0, Action{ActionType::kForward, 0, 1}, 100, 500);
  record_on_gpu(recorder, 0, Action{ActionType::kForward, 0, 2}, 450, 700);
  recorder.end_step();
  const nlohmann::json trace = to_chrome_trace(recorder, 0);
  std::map<int, std::vector<std::pair<double, double>>> by_track;
  std::map<int, std::string> names;
  for (const auto& e : trace.at("traceEvents")) {
    if (e.at("ph") == "M" && e.at("name") == "thread_name") names[e.at("tid")] = e.at("args").at("name");
    if (e.at("ph") == "X") {
      const double ts = e.at("ts").get<double>();
      by_track[e.at("tid").get<int>()].push_back({ts, ts + e.at("dur").get<double>()});
    }
  }
  ASSERT_EQ(by_track.size(), 2u) << "three spans, at most two at once: two tracks";
  for (auto& [tid, spans] : by_track) {
    EXPECT_TRUE(names.count(tid)) << "track " << tid << " has no name";
    std::sort(spans.begin(), spans.end());
    for (size_t i = 1; i < spans.size(); ++i) {
      EXPECT_LE(spans[i - 1].second, spans[i].first) << "overlapping spans on track " << tid;
    }
  }
  EXPECT_EQ(by_track.at(0).size(), 2u);  // F0, then F2 once F0 ended
  EXPECT_EQ(names.at(0), "rank 0");
  const int overlap_tid = std::prev(by_track.end())->first;
  EXPECT_EQ(names.at(overlap_tid), "rank 0 (overlap 1)");
}

TEST(TimelineTest, OneStepCannotMixTheHostAndTheGpuClock) {
  ActionRecorder recorder;
  recorder.begin_step(1);
  const auto now = ActionRecorder::Clock::now();
  recorder.record(0, Action{ActionType::kForward, 0, 0}, now, now, std::make_shared<GivenGpuTimes>(0, 1));
  recorder.record(0, Action{ActionType::kBackward, 0, 0}, now, now);
  EXPECT_THROW(recorder.end_step(), std::logic_error);
}

TEST(TimelineTest, WritesAReadableFile) {
  ActionRecorder recorder;
  recorder.begin_step(2);
  const auto now = ActionRecorder::Clock::now();
  recorder.record(1, Action{ActionType::kBackward, 1, 0}, now, now + std::chrono::milliseconds(2));
  recorder.end_step();
  const std::string dir = fresh_temp_dir("timeline_test");
  const std::string path = dir + "/sub/timeline.json";
  write_chrome_trace(recorder, 4, path);
  std::ifstream in(path);
  const auto trace = nlohmann::json::parse(in);
  EXPECT_EQ(trace.at("metadata").at("step"), 4);
  int complete = 0;
  for (const auto& e : trace.at("traceEvents")) complete += e.at("ph") == "X";
  EXPECT_EQ(complete, 1);
  EXPECT_NEAR(recorder.busy_us(1), 2000.0, 1.0);
  EXPECT_EQ(recorder.busy_us(0), 0.0);
  remove_tree(dir);
}

}  // namespace
}  // namespace gpipe::testing

// TraceWriter: records per submitted op, completion times, Chrome-trace JSON with one track per
// stream, and flush errors.
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "fake_device.h"
#include "scheduler/dispatcher.h"
#include "scheduler/trace.h"

namespace sched {
namespace {

using testing::FakeDevice;
using testing::kernel_op;

TEST(Trace, OneTrackPerStreamWithClassAndArgs) {
  FakeDevice dev;
  TraceWriter trace;
  DispatcherOptions opt;
  opt.background_thread = false;
  opt.trace = &trace;
  Dispatcher d(dev, make_policy("priority"), opt);
  d.set_stream_class(10, StreamClass::kHighPriority);
  d.set_stream_class(20, StreamClass::kBestEffort);
  Op hp = kernel_op(10, 1, 64);
  hp.kernel.name = "hp_gemm";
  hp.kernel.block = {256, 1, 1};
  ASSERT_EQ(d.submit(std::move(hp)), 0);
  ASSERT_EQ(d.submit(kernel_op(20, 2, 8)), 0);  // queued: HP in flight
  dev.advance(5000);
  dev.complete_all();
  d.pump();  // HP completes, BE admitted
  dev.complete_all();
  d.pump();
  ASSERT_EQ(d.drain_all(), 0);
  ASSERT_EQ(trace.size(), 2u);

  const auto doc = nlohmann::json::parse(trace.to_json());
  std::map<int, std::string> track_names;
  std::vector<nlohmann::json> spans;
  for (const auto& ev : doc.at("traceEvents")) {
    if (ev.at("ph") == "M" && ev.at("name") == "thread_name") {
      track_names[ev.at("tid").get<int>()] = ev.at("args").at("name").get<std::string>();
    }
    if (ev.at("ph") == "X") spans.push_back(ev);
  }
  ASSERT_EQ(track_names.size(), 2u);
  ASSERT_EQ(spans.size(), 2u);
  std::set<int> tids;
  for (const auto& s : spans) {
    tids.insert(s.at("tid").get<int>());
    const std::string track = track_names.at(s.at("tid").get<int>());
    const std::string cls = s.at("args").at("class").get<std::string>();
    EXPECT_NE(track.find(cls), std::string::npos) << track;
    for (const char* key : {"queue_delay_us", "seq", "grid", "block"}) {
      EXPECT_TRUE(s.at("args").contains(key)) << key;
    }
    EXPECT_TRUE(s.at("args").at("completed").get<bool>());
  }
  EXPECT_EQ(tids.size(), 2u);
  const auto& hp_span = spans[0];
  EXPECT_EQ(hp_span.at("name"), "hp_gemm");
  EXPECT_EQ(hp_span.at("args").at("class"), "high_priority");
  EXPECT_EQ(hp_span.at("args").at("grid")[0], 64);
  EXPECT_EQ(hp_span.at("args").at("block")[0], 256);
  EXPECT_DOUBLE_EQ(hp_span.at("dur").get<double>(), 1.0);  // the fake's 1000 ns kernels
  EXPECT_DOUBLE_EQ(hp_span.at("args").at("queue_delay_us").get<double>(), 0.0);
  // The BE kernel waited 5 us for the HP kernel.
  EXPECT_EQ(spans[1].at("args").at("class"), "best_effort");
  EXPECT_DOUBLE_EQ(spans[1].at("args").at("queue_delay_us").get<double>(), 5.0);
}

TEST(Trace, RecordsWithoutCompletionAndLimit) {
  TraceWriter trace(/*max_records=*/2);
  for (int i = 1; i <= 3; ++i) {
    Op op = testing::event_op(OpKind::kEventRecord, 5, 1);
    op.seq = static_cast<uint64_t>(i);
    op.arrival_ns = 100;
    op.submitted_ns = 300;
    trace.on_submit(op);
  }
  EXPECT_EQ(trace.size(), 2u);
  EXPECT_EQ(trace.dropped(), 1u);
  const auto before = nlohmann::json::parse(trace.to_json());
  EXPECT_FALSE(before.at("traceEvents")[2].at("args").at("completed").get<bool>());
  trace.on_complete({/*seq=*/2, 5, OpKind::kEventRecord, 0, 400, 450});
  const auto recs = trace.records();
  EXPECT_EQ(recs[0].end_ns, -1);
  EXPECT_EQ(recs[1].end_ns, 450);
  EXPECT_EQ(recs[0].queue_delay_ns(), 200);
  const auto doc = nlohmann::json::parse(trace.to_json());
  EXPECT_EQ(doc.at("otherData").at("dropped_records"), 1);
  // Seq 1 was retired by seq 2's completion (same stream, in order): completed, not timed.
  const auto& retired = doc.at("traceEvents")[2].at("args");
  ASSERT_EQ(retired.at("seq"), 1);
  EXPECT_TRUE(retired.at("completed").get<bool>());
  EXPECT_FALSE(retired.at("timed").get<bool>());
  EXPECT_EQ(retired.at("retired_by_seq"), 2);
  EXPECT_DOUBLE_EQ(retired.at("done_by_us").get<double>(), 0.45);
  EXPECT_TRUE(doc.at("traceEvents")[3].at("args").at("timed").get<bool>());
}

TEST(Trace, ACompletionRetiresOnlyEarlierOpsOfItsStream) {
  TraceWriter trace;
  for (uint64_t seq = 1; seq <= 4; ++seq) {
    Op op = kernel_op(seq % 2 == 1 ? 7 : 8, 1);
    op.seq = seq;
    trace.on_submit(op);
  }
  trace.on_complete({/*seq=*/3, 7, OpKind::kKernel, 0, 100, 200});  // stream 7: retires 1, times 3
  const auto recs = trace.records();
  EXPECT_EQ(recs[0].retired_by_seq, 3u);
  EXPECT_EQ(recs[0].done_by_ns, 200);
  EXPECT_EQ(recs[2].start_ns, 100);
  EXPECT_EQ(recs[2].retired_by_seq, 0u);
  // Stream 8's ops (2, 4) stay open, however much older.
  EXPECT_EQ(recs[1].done_by_ns, -1);
  EXPECT_EQ(recs[3].done_by_ns, -1);
  trace.on_complete({/*seq=*/4, 8, OpKind::kKernel, 0, 300, 400});
  EXPECT_EQ(trace.records()[1].retired_by_seq, 4u);
}

TEST(Trace, FlushWritesFileOrNamesTheError) {
  TraceWriter trace;
  Op op = kernel_op(1, 1);
  op.seq = 1;
  trace.on_submit(op);
  const std::string path = ::testing::TempDir() + "trace_test.json";
  ASSERT_EQ(trace.flush(path), "");
  std::ifstream in(path);
  const auto doc = nlohmann::json::parse(in);
  EXPECT_TRUE(doc.contains("traceEvents"));
  std::remove(path.c_str());
  const std::string err = trace.flush("/nonexistent/dir/trace.json");
  EXPECT_NE(err.find("/nonexistent/dir/trace.json"), std::string::npos) << err;
}

}  // namespace
}  // namespace sched

// Workload JSONL reader: fields, defaults, and errors that name the line and field.
#include "scheduler/workload.h"

#include <gtest/gtest.h>

#include <sstream>
#include <string>

namespace sched {
namespace {

Workload parse(const std::string& text) {
  std::istringstream in(text);
  return parse_workload(in, "test.jsonl");
}

// The error message of parsing `text`, or "" when it parsed.
std::string error_of(const std::string& text) {
  try {
    parse(text);
  } catch (const WorkloadError& e) {
    return e.what();
  }
  return "";
}

TEST(WorkloadParser, ReadsAllFields) {
  Workload w = parse(
      "# comment line\n"
      "\n"
      R"({"arrival_us": 1.5, "stream": "inf", "class": "high_priority", "name": "gemm", "grid": [4,2,1], "block": 256, "smem": 1024, "block_us": 3, "profile": "compute", "client": "A", "request": 7})"
      "\n"
      R"({"arrival_us": 2, "stream": "train", "class": "be", "kind": "copy", "bytes": 4096})"
      "\n"
      R"({"stream": "train", "kind": "event_record", "event": "e1"})"
      "\n"
      R"({"stream": "inf", "kind": "stream_wait_event", "event": "e1", "client": "A", "request": 7})"
      "\n"
      R"({"stream": "inf", "name": "ln", "grid": 8, "block": [128], "duration_us": 10, "profile": "memory", "blocks_per_sm": 4, "client": "A", "request": 8, "after_request": 7})"
      "\n");
  ASSERT_EQ(w.ops.size(), 5u);
  const WorkloadOp& k = w.ops[0];
  EXPECT_EQ(k.line, 3);
  EXPECT_EQ(k.arrival_ns, 1500);
  EXPECT_EQ(k.stream_id, 1u);
  EXPECT_EQ(k.cls, StreamClass::kHighPriority);
  EXPECT_EQ(k.kind, OpKind::kKernel);
  EXPECT_EQ(k.grid.count(), 8u);
  EXPECT_EQ(k.block.x, 256u);
  EXPECT_EQ(k.smem, 1024u);
  EXPECT_DOUBLE_EQ(k.block_ns, 3000);
  EXPECT_EQ(k.profile, KernelProfile::kComputeBound);
  EXPECT_EQ(k.client, "A");
  EXPECT_EQ(k.request, "7");
  EXPECT_NE(k.kernel_id, 0u);

  EXPECT_EQ(w.ops[1].stream_id, 2u);
  EXPECT_EQ(w.ops[1].cls, StreamClass::kBestEffort);
  EXPECT_EQ(w.ops[1].kind, OpKind::kCopy);
  EXPECT_EQ(w.ops[1].bytes, 4096u);
  EXPECT_EQ(w.ops[1].client, "train");  // default client: the stream name
  EXPECT_EQ(w.ops[1].request, "#4");    // default request: the op alone

  EXPECT_EQ(w.ops[2].cls, StreamClass::kBestEffort);  // inherited from the stream's first line
  EXPECT_EQ(w.ops[2].event, w.ops[3].event);
  EXPECT_NE(w.ops[2].event, 0u);
  EXPECT_EQ(w.ops[4].after_request, "7");
  EXPECT_EQ(w.ops[4].blocks_per_sm, 4u);
  EXPECT_EQ(w.clients(), (std::vector<std::string>{"A", "train"}));
  EXPECT_EQ(w.only_client("A").ops.size(), 3u);
}

TEST(WorkloadParser, DurationBecomesBlockTimePerWave) {
  Workload w = parse(R"({"stream": "s", "class": "hp", "name": "k", "grid": 20, "block": 128, "blocks_per_sm": 2, "duration_us": 30})");
  SimGpuConfig cfg;
  cfg.sm_count = 4;  // 8 slots: 20 blocks are 3 waves
  SimulatedGpu gpu(cfg);
  KernelInfo k = w.kernel_info(w.ops[0], gpu);
  EXPECT_DOUBLE_EQ(k.sim_block_ns, 10'000);
  EXPECT_STREQ(k.name, "k");
}

struct BadLine {
  const char* text;
  const char* expected;  // substring of the error
};

class WorkloadParserErrors : public ::testing::TestWithParam<BadLine> {};

TEST_P(WorkloadParserErrors, NameLineAndField) {
  // The bad line is line 2, after a valid one.
  std::string text = std::string(R"({"stream": "s", "class": "hp", "name": "k", "grid": 1, "block": 32, "block_us": 1})") +
                     "\n" + GetParam().text + "\n";
  std::string err = error_of(text);
  ASSERT_FALSE(err.empty()) << "accepted: " << GetParam().text;
  EXPECT_NE(err.find("test.jsonl:2:"), std::string::npos) << err;
  EXPECT_NE(err.find(GetParam().expected), std::string::npos) << err;
}

INSTANTIATE_TEST_SUITE_P(
    BadInput, WorkloadParserErrors,
    ::testing::Values(
        BadLine{R"({"stream": "s", "name": "k", "grid": 1, "block": 32})", "field \"block_us\""},
        BadLine{R"({"stream": "s", "name": "k", "grid": 0, "block": 32, "block_us": 1})", "field \"grid\""},
        BadLine{R"({"stream": "s", "name": "k", "grid": [1,2,3,4], "block": 32, "block_us": 1})", "field \"grid\""},
        BadLine{R"({"stream": "s", "name": "k", "block": 32, "block_us": 1})", "field \"grid\": missing"},
        BadLine{R"({"stream": "s", "grid": 1, "block": 32, "block_us": 1})", "field \"name\""},
        BadLine{R"({"stream": "s", "name": "k", "grid": 1, "block": "x", "block_us": 1})", "field \"block\""},
        BadLine{R"({"stream": "s", "name": "k", "grid": 1, "block": 32, "block_us": -1})", "field \"block_us\""},
        BadLine{R"({"stream": "s", "name": "k", "grid": 1, "block": 32, "block_us": 1, "duration_us": 2})", "exactly one"},
        BadLine{R"({"stream": "s", "class": "be", "name": "k", "grid": 1, "block": 32, "block_us": 1})", "field \"class\": stream \"s\" was high_priority"},
        BadLine{R"({"stream": "t", "name": "k", "grid": 1, "block": 32, "block_us": 1})", "field \"class\": missing"},
        BadLine{R"({"stream": "t", "class": "urgent", "kind": "host_func"})", "field \"class\": \"urgent\""},
        BadLine{R"({"stream": "s", "kind": "launch"})", "field \"kind\""},
        BadLine{R"({"stream": "s", "kind": "copy"})", "field \"bytes\": missing"},
        BadLine{R"({"stream": "s", "kind": "event_record"})", "field \"event\""},
        BadLine{R"({"stream": "s", "name": "k", "grid": 1, "block": 32, "block_us": 1, "profile": "io"})", "field \"profile\""},
        BadLine{R"({"stream": "s", "name": "k", "grid": 1, "block": 32, "block_us": 1, "gird": 2})", "field \"gird\": unknown"},
        BadLine{R"({"stream": "s", "kind": "host_func", "arrival_us": "soon"})", "field \"arrival_us\""},
        BadLine{R"({"stream": "s", "kind": "host_func", "request": 2, "after_request": 1})", "field \"after_request\""},
        BadLine{R"({"kind": "host_func"})", "field \"stream\": missing"},
        BadLine{R"({"stream": "s", "kind": "host_func", "after_us": 3})", "field \"after_us\": only meaningful"},
        BadLine{R"({"stream": "s", "kind": "host_func", "request": "#1", "client": "other"})", "field \"request\": request \"#1\" belongs to client \"s\""},
        // Figures past CUDA's limits or the simulator's nanosecond clock: a grid of 2^16 x 2^24 x
        // 2^24 blocks counted 0 (uint64 wrap), 1e16 us of arrival overflowed int64 nanoseconds.
        BadLine{R"({"stream": "s", "name": "k", "grid": [65536, 16777216, 16777216], "block": 32, "block_us": 1})", "field \"grid\""},
        BadLine{R"({"stream": "s", "name": "k", "grid": 1, "block": [1024, 2], "block_us": 1})", "field \"block\""},
        BadLine{R"({"stream": "s", "kind": "host_func", "arrival_us": 1e16})", "field \"arrival_us\": must be at most"},
        BadLine{R"({"stream": "s", "name": "k", "grid": 1, "block": 32, "block_us": 1e300})", "field \"block_us\": must be at most"},
        BadLine{R"({"stream": "s", "kind": "host_func")", "not valid JSON"},
        BadLine{R"([1, 2])", "expected a JSON object"}));

TEST(WorkloadParser, AfterRequestMustAgreeWithinARequest) {
  std::string err = error_of(
      R"({"stream": "s", "class": "hp", "kind": "host_func", "request": 1})" "\n"
      R"({"stream": "s", "kind": "host_func", "request": 2, "after_request": 1})" "\n"
      R"({"stream": "s", "kind": "host_func", "request": 2})" "\n");
  EXPECT_NE(err.find("test.jsonl:3: field \"after_request\""), std::string::npos) << err;
}

TEST(WorkloadParser, EmptyAndMissingFilesAreErrors) {
  EXPECT_NE(error_of("# only a comment\n").find("no ops"), std::string::npos);
  try {
    load_workload("/nonexistent/workload.jsonl");
    FAIL() << "loaded a missing file";
  } catch (const WorkloadError& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/workload.jsonl"), std::string::npos);
  }
}

}  // namespace
}  // namespace sched

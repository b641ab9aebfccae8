// Names of classes/kinds, the SM-need formula, policy parameters and the three policies' rules.
#include <gtest/gtest.h>

#include <stdexcept>

#include "fake_device.h"
#include "scheduler/scheduler.h"

namespace sched {
namespace {

using testing::kernel_op;

TEST(OpNames, StreamClassRoundTripAndAliases) {
  for (StreamClass c : {StreamClass::kHighPriority, StreamClass::kBestEffort,
                        StreamClass::kCommunication, StreamClass::kUnmanaged}) {
    StreamClass parsed = StreamClass::kUnmanaged;
    ASSERT_TRUE(parse_stream_class(to_string(c), &parsed)) << to_string(c);
    EXPECT_EQ(parsed, c);
  }
  StreamClass c = StreamClass::kUnmanaged;
  EXPECT_TRUE(parse_stream_class("hp", &c));
  EXPECT_EQ(c, StreamClass::kHighPriority);
  EXPECT_TRUE(parse_stream_class("be", &c));
  EXPECT_EQ(c, StreamClass::kBestEffort);
  EXPECT_TRUE(parse_stream_class("comm", &c));
  EXPECT_EQ(c, StreamClass::kCommunication);
  EXPECT_FALSE(parse_stream_class("HP", &c));
  EXPECT_FALSE(parse_stream_class("", &c));
}

TEST(OpNames, OpKindRoundTrip) {
  for (OpKind k : {OpKind::kKernel, OpKind::kCopy, OpKind::kMemset, OpKind::kEventRecord,
                   OpKind::kStreamWaitEvent, OpKind::kHostFunc, OpKind::kGraphLaunch, OpKind::kMemPool}) {
    OpKind parsed = OpKind::kCopy;
    ASSERT_TRUE(parse_op_kind(to_string(k), &parsed)) << to_string(k);
    EXPECT_EQ(parsed, k);
  }
  OpKind k;
  EXPECT_FALSE(parse_op_kind("launch", &k));
  EXPECT_STREQ(to_string(OpKind::kStreamWaitEvent), "stream_wait_event");
}

TEST(SmsNeeded, CeilOfBlocksOverOccupancyCappedBySmCount) {
  KernelInfo k;
  k.grid = {10, 1, 1};
  EXPECT_EQ(sms_needed(k, 100, 4), 3);   // ceil(10 / 4)
  EXPECT_EQ(sms_needed(k, 100, 5), 2);
  EXPECT_EQ(sms_needed(k, 2, 1), 2);     // capped by the device
  k.grid = {8, 4, 2};                    // 64 blocks
  EXPECT_EQ(sms_needed(k, 132, 2), 32);
  EXPECT_EQ(sms_needed(k, 132, 0), 132); // does not fit: charged the whole device
  k.grid = {0, 1, 1};
  EXPECT_EQ(sms_needed(k, 132, 2), 0);
}

void expect_invalid(const std::string& policy, const PolicyParams& params, const std::string& needle) {
  try {
    make_policy(policy, params);
    ADD_FAILURE() << "no error for policy " << policy;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(PolicyParams, ErrorsNameTheProblem) {
  expect_invalid("fifo", {}, "unknown scheduling policy 'fifo'");
  expect_invalid("fifo", {}, "orion");  // lists the choices
  expect_invalid("priority", {{"sm_threshold", "4"}}, "unknown parameter 'sm_threshold'");
  expect_invalid("orion", {{"sm_treshold", "4"}}, "unknown parameter 'sm_treshold'");
  expect_invalid("orion", {{"sm_threshold", "abc"}}, "'sm_threshold'='abc': expected an integer");
  expect_invalid("orion", {{"sm_threshold", "0"}}, "'sm_threshold'");
  expect_invalid("orion", {{"sm_threshold", "4x"}}, "'sm_threshold'");
  expect_invalid("orion", {{"sm_threshold_frac", "1.5"}}, "'sm_threshold_frac'");
  expect_invalid("orion", {{"sm_threshold_frac", "0"}}, "'sm_threshold_frac'='0': must be in (0, 1]");
  expect_invalid("partition", {{"be_sm_frac", "1"}}, "must be in [0.01, 0.99]");
  expect_invalid("orion", {{"dur_threshold_us", "-1"}}, "'dur_threshold_us'");
  expect_invalid("orion", {{"dur_threshold_us", "fast"}}, "expected a number");
  expect_invalid("orion", {{"allow_unknown", "yes"}}, "'allow_unknown'");
  expect_invalid("orion", {{"sm_threshold", "4"}, {"sm_threshold_frac", "0.5"}}, "not both");
}

TEST(PolicyParams, DocsCoverEveryParameterAndPolicy) {
  const std::string docs = policy_param_docs();
  for (const char* word : {"passthrough", "priority", "sm_threshold=", "sm_threshold_frac=",
                           "dur_threshold_us=", "allow_unknown=", "default 100", "partition", "be_sm_frac=",
                           "granularity=", "hp_rest=", "gate="}) {
    EXPECT_NE(docs.find(word), std::string::npos) << word;
  }
  EXPECT_EQ(policy_names(), (std::vector<std::string>{"passthrough", "priority", "orion", "partition"}));
  for (const auto& name : policy_names()) EXPECT_EQ(make_policy(name)->name(), name);
}

TEST(Partition, ConfinesBestEffortToWholeStepsOfSms) {
  auto p = make_policy("partition", {{"be_sm_frac", "0.5"}});
  ASSERT_TRUE(p->sm_partition().has_value());
  EXPECT_EQ(p->sm_partition()->best_effort_sms(132), 64);  // 66 rounded down to a multiple of 8
  EXPECT_FALSE(p->sm_partition()->high_priority_on_rest);
  EXPECT_FALSE(p->defers_best_effort()) << "gate=0: space alone, nothing deferred";
  auto tiny = make_policy("partition", {{"be_sm_frac", "0.01"}, {"granularity", "8"}});
  EXPECT_EQ(tiny->sm_partition()->best_effort_sms(132), 8) << "at least one step";
  auto huge = make_policy("partition", {{"be_sm_frac", "0.99"}, {"hp_rest", "1"}});
  EXPECT_EQ(huge->sm_partition()->best_effort_sms(132), 120) << "at most 15 of the GPU's 16 whole steps";
  EXPECT_TRUE(huge->sm_partition()->high_priority_on_rest);
  EXPECT_EQ(make_policy("partition")->sm_partition()->best_effort_sms(12), 0) << "fewer than two steps: none";
  auto gated = make_policy("partition", {{"gate", "1"}});
  EXPECT_TRUE(gated->defers_best_effort());
  DeviceState busy;
  busy.hp_in_flight = 1;
  EXPECT_FALSE(gated->admit(kernel_op(1, 1), {}, busy)) << "gate=1 admits as priority does";
  EXPECT_TRUE(p->admit(kernel_op(1, 1), {}, busy)) << "gate=0 admits at once";
  EXPECT_FALSE(make_policy("orion")->sm_partition().has_value());
  EXPECT_THROW(make_policy("partition", {{"gate", "3"}}), std::invalid_argument);
  EXPECT_THROW(make_policy("partition", {{"sm_threshold", "3"}}), std::invalid_argument);
}

TEST(Passthrough, NeverDefers) {
  auto p = make_policy("passthrough");
  EXPECT_FALSE(p->defers_best_effort());
  DeviceState busy;
  busy.hp_in_flight = 5;
  EXPECT_TRUE(p->admit(kernel_op(1, 1), {}, busy));
}

TEST(Priority, AdmitsOnlyWithoutHighPriorityInFlight) {
  auto p = make_policy("priority");
  EXPECT_TRUE(p->defers_best_effort());
  DeviceState s;
  s.sm_count = 100;
  EXPECT_TRUE(p->admit(kernel_op(1, 1), {}, s));
  s.hp_in_flight = 1;
  EXPECT_FALSE(p->admit(kernel_op(1, 1), {}, s));
  EXPECT_FALSE(p->admit(testing::event_op(OpKind::kEventRecord, 1, 9), {}, s));
}

// A case Orion admits: HP compute-bound kernel running, BE memory-bound kernel that fits in SMs
// and duration. Each test below flips exactly one clause.
struct OrionCase {
  Op op = kernel_op(2, 7);
  OpEstimate est{/*duration_ns=*/20'000, /*sms_needed=*/10, KernelProfile::kMemoryBound};
  DeviceState state{/*sm_count=*/100, /*hp_in_flight=*/1, KernelProfile::kComputeBound,
                    /*be_in_flight=*/1, /*be_sms_in_flight=*/30, /*be_outstanding_ns=*/50'000};
};

TEST(Orion, BaseCaseIsAdmitted) {
  OrionCase c;
  EXPECT_TRUE(make_policy("orion")->admit(c.op, c.est, c.state));
}

TEST(Orion, NoHighPriorityInFlightAdmitsAnyKernelWhileUnderTheDurationThreshold) {
  OrionCase c;
  c.state.hp_in_flight = 0;
  c.est.sms_needed = 1000;
  c.est.profile = KernelProfile::kComputeBound;
  c.est.duration_ns = 1e9;
  auto orion = make_policy("orion");
  EXPECT_TRUE(orion->admit(c.op, c.est, c.state));  // 50 us outstanding of 100
  // Orion's duration gate holds with HP idle too: "idle" is a gap between two HP launches, and
  // the next HP kernel would wait behind everything admitted in it.
  c.state.be_outstanding_ns = 100'001;
  EXPECT_FALSE(orion->admit(c.op, c.est, c.state));
  EXPECT_FALSE(orion->admit(testing::graph_op(2, 5), c.est, c.state));
  EXPECT_TRUE(orion->admit(testing::event_op(OpKind::kEventRecord, 2, 9), {}, c.state)) << "holds no SMs";
  EXPECT_DOUBLE_EQ(orion->untimed_kernel_duration_ns(), 100'000);
  EXPECT_DOUBLE_EQ(orion->non_kernel_duration_ns(testing::graph_op(2, 5)), 100'000) << "a graph is untimed work";
  EXPECT_DOUBLE_EQ(orion->non_kernel_duration_ns(testing::event_op(OpKind::kEventRecord, 2, 9)), 0);
  EXPECT_DOUBLE_EQ(make_policy("orion", {{"dur_threshold_us", "0"}})->untimed_kernel_duration_ns(), 1)
      << "with a threshold of 0, one untimed kernel at a time";
  EXPECT_DOUBLE_EQ(make_policy("priority")->untimed_kernel_duration_ns(), 0);
  // partition gate=2 is orion inside the partition: its estimates too.
  EXPECT_DOUBLE_EQ(make_policy("partition", {{"gate", "2"}})->untimed_kernel_duration_ns(), 100'000);
  EXPECT_DOUBLE_EQ(make_policy("partition", {{"gate", "2"}})->non_kernel_duration_ns(testing::graph_op(2, 5)), 100'000);
}

TEST(Orion, SmThresholdClause) {
  OrionCase c;
  auto frac = make_policy("orion", {{"sm_threshold_frac", "0.4"}});  // 40 SMs of 100
  EXPECT_TRUE(frac->admit(c.op, c.est, c.state));                   // 30 + 10 <= 40
  c.est.sms_needed = 11;
  EXPECT_FALSE(frac->admit(c.op, c.est, c.state));                  // 41 > 40
  auto abs = make_policy("orion", {{"sm_threshold", "41"}});
  EXPECT_TRUE(abs->admit(c.op, c.est, c.state));
  c.est.sms_needed = 80;  // default threshold: all 100 SMs
  EXPECT_FALSE(make_policy("orion")->admit(c.op, c.est, c.state));
}

TEST(Orion, ProfileClause) {
  OrionCase c;
  auto strict = make_policy("orion", {{"allow_unknown", "0"}});
  c.est.profile = KernelProfile::kComputeBound;  // same as the running HP kernel
  EXPECT_FALSE(make_policy("orion")->admit(c.op, c.est, c.state));
  c.est.profile = KernelProfile::kUnknown;
  EXPECT_FALSE(strict->admit(c.op, c.est, c.state));
  EXPECT_TRUE(make_policy("orion", {{"allow_unknown", "1"}})->admit(c.op, c.est, c.state));
  c.est.profile = KernelProfile::kMemoryBound;
  c.state.hp_running_profile = KernelProfile::kUnknown;
  EXPECT_FALSE(strict->admit(c.op, c.est, c.state));
  EXPECT_TRUE(make_policy("orion", {{"allow_unknown", "true"}})->admit(c.op, c.est, c.state));
}

// Review regression: Orion (scheduler_eval.cpp) schedules a BE kernel whose profile or the HP
// kernel's is -1 (`op.profile == -1 || hp_profile == -1 || hp_profile != op.profile`). The
// default used to hold such kernels back, and the shim never learns profiles online.
TEST(Orion, UnknownProfileIsComplementaryByDefaultAsInOrion) {
  OrionCase c;
  auto p = make_policy("orion");
  c.est.profile = KernelProfile::kUnknown;
  EXPECT_TRUE(p->admit(c.op, c.est, c.state));
  c.est.profile = KernelProfile::kMemoryBound;
  c.state.hp_running_profile = KernelProfile::kUnknown;
  EXPECT_TRUE(p->admit(c.op, c.est, c.state));
}

// Orion's duration gate: a BE kernel goes while the BE work already outstanding is at or under
// the threshold (the kernel that crosses it still goes); its own length is not added first.
TEST(Orion, DurationClause) {
  OrionCase c;
  auto p = make_policy("orion");  // 100 us
  c.state.be_outstanding_ns = 100'000;  // at the threshold: still admitted
  EXPECT_TRUE(p->admit(c.op, c.est, c.state));
  c.state.be_outstanding_ns = 100'001;
  EXPECT_FALSE(p->admit(c.op, c.est, c.state));
  EXPECT_TRUE(make_policy("orion", {{"dur_threshold_us", "200"}})->admit(c.op, c.est, c.state));
}

// Review regression: a kernel longer than the threshold used to be refused even with no BE work
// outstanding, so long BE kernels were never packed next to HP (only forced by starvation).
TEST(Orion, KernelLongerThanTheThresholdGoesWhenNothingIsOutstanding) {
  OrionCase c;
  auto p = make_policy("orion");  // 100 us
  c.state.be_in_flight = 0;
  c.state.be_sms_in_flight = 0;
  c.state.be_outstanding_ns = 0;
  c.est.duration_ns = 500'000;
  EXPECT_TRUE(p->admit(c.op, c.est, c.state));
  c.state.be_in_flight = 1;
  c.state.be_outstanding_ns = 500'000;  // now it is outstanding: the next one waits
  EXPECT_FALSE(p->admit(c.op, c.est, c.state));
}

TEST(Orion, NonKernelOpsAndGraphs) {
  OrionCase c;
  auto p = make_policy("orion");
  c.est = {};  // copies carry no estimate
  c.state.be_sms_in_flight = 100;
  EXPECT_TRUE(p->admit(testing::event_op(OpKind::kEventRecord, 2, 3), c.est, c.state));
  Op copy;
  copy.kind = OpKind::kCopy;
  EXPECT_TRUE(p->admit(copy, c.est, c.state));
  Op graph;
  graph.kind = OpKind::kGraphLaunch;
  EXPECT_FALSE(p->admit(graph, c.est, c.state));
  c.state.hp_in_flight = 0;
  EXPECT_TRUE(p->admit(graph, c.est, c.state));
}

}  // namespace
}  // namespace sched

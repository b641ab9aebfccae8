// Dispatcher rules on hand-built cases with a manual-clock fake device and no background thread,
// so every step is deterministic: inline HP path, BE queueing per policy, starvation bound,
// drains, event order across streams, backend errors, payload cloning and the caller-wait path.
#include <gtest/gtest.h>

#include <atomic>
#include <thread>

#include "dispatcher_fixture.h"
#include "fake_device.h"
#include "scheduler/dispatcher.h"
#include "scheduler/profile_store.h"
#include "scheduler/trace.h"

namespace sched {
namespace {

using namespace dispatcher_fixture;

TEST_F(DispatcherTest, HighPriorityIsSubmittedInlineWhileBestEffortQueuesAreFull) {
  auto d = make("priority");
  ASSERT_EQ(d->submit(kernel_op(kHp, 1)), 0);  // HP in flight from now on
  for (KernelId k = 100; k < 150; ++k) ASSERT_EQ(d->submit(kernel_op(kBe, k)), 0);
  for (KernelId k = 200; k < 250; ++k) ASSERT_EQ(d->submit(kernel_op(kBe2, k)), 0);
  EXPECT_EQ(d->stats().queued_now, 100u);
  EXPECT_TRUE(kernels_on(kBe).empty());
  for (KernelId k = 2; k < 10; ++k) {
    const size_t before = dev.submitted_count();
    ASSERT_EQ(d->submit(kernel_op(kHp, k)), 0);
    EXPECT_EQ(dev.submitted_count(), before + 1);  // on the device before submit() returned
  }
  ASSERT_EQ(d->submit(kernel_op(kComm, 900)), 0);  // communication is never deferred either
  EXPECT_EQ(kernels_on(kComm), std::vector<KernelId>{900});
  EXPECT_EQ(kernels_on(kHp).size(), 9u);
  EXPECT_EQ(d->stats().queued_now, 100u);
  const auto st = d->stats();
  EXPECT_EQ(st.deferred, 100u);
  EXPECT_EQ(st.submitted_inline, 10u);
}

TEST_F(DispatcherTest, PassthroughDefersNothing) {
  auto d = make("passthrough");
  d->submit(kernel_op(kHp, 1));
  for (KernelId k = 10; k < 20; ++k) d->submit(kernel_op(kBe, k));
  EXPECT_EQ(kernels_on(kBe).size(), 10u);
  EXPECT_EQ(d->stats().deferred, 0u);
  EXPECT_FALSE(d->policy().defers_best_effort());
}

TEST_F(DispatcherTest, PriorityAdmitsBestEffortOnceHighPriorityCompletes) {
  auto d = make("priority");
  d->submit(kernel_op(kBe, 10));  // nothing HP in flight: inline
  EXPECT_EQ(kernels_on(kBe).size(), 1u);
  d->submit(kernel_op(kHp, 1));
  d->submit(kernel_op(kBe, 11));
  d->submit(kernel_op(kBe, 12));
  d->pump();
  EXPECT_EQ(kernels_on(kBe).size(), 1u);  // HP still in flight
  dev.complete_all();
  d->pump();
  EXPECT_EQ(kernels_on(kBe), (std::vector<KernelId>{10, 11, 12}));
  EXPECT_EQ(d->stats().queued_now, 0u);
}

TEST_F(DispatcherTest, OrionPacksComplementaryKernelsNextToHighPriority) {
  auto d = make("orion", {{"sm_threshold", "50"}});  // fake: 100 SMs, 2 blocks per SM
  d->submit(kernel_op(kHp, 1, 100, KernelProfile::kComputeBound));
  d->submit(kernel_op(kBe, 10, 40, KernelProfile::kMemoryBound));   // 20 SMs: fits, complements
  d->submit(kernel_op(kBe, 11, 40, KernelProfile::kMemoryBound));   // 40 SMs: fits
  d->submit(kernel_op(kBe, 12, 40, KernelProfile::kMemoryBound));   // 60 SMs: over the threshold
  EXPECT_EQ(kernels_on(kBe), (std::vector<KernelId>{10, 11}));
  d->submit(kernel_op(kBe2, 20, 2, KernelProfile::kComputeBound));  // same profile as HP: waits
  EXPECT_TRUE(kernels_on(kBe2).empty());
  dev.complete_all();  // HP and both BE kernels finish
  d->pump();
  EXPECT_EQ(kernels_on(kBe), (std::vector<KernelId>{10, 11, 12}));
  EXPECT_EQ(kernels_on(kBe2), std::vector<KernelId>{20});
}

TEST_F(DispatcherTest, OrionDurationThresholdUsesLearnedDurations) {
  auto d = make("orion");  // 100 us of outstanding BE work at most
  dev.kernel_duration_ns = 60'000;
  d->submit(kernel_op(kBe, 10, 2, KernelProfile::kMemoryBound));  // learn: 60 us
  dev.complete_all();
  d->pump();
  ASSERT_DOUBLE_EQ(profiles.find(10)->duration_ns, 60'000);
  d->submit(kernel_op(kHp, 1, 2, KernelProfile::kComputeBound));
  d->submit(kernel_op(kBe, 10, 2, KernelProfile::kMemoryBound));   // nothing outstanding: goes
  d->submit(kernel_op(kBe, 10, 2, KernelProfile::kMemoryBound));   // 60 us outstanding: goes
  d->submit(kernel_op(kBe2, 10, 2, KernelProfile::kMemoryBound));  // 120 us outstanding: waits
  EXPECT_EQ(kernels_on(kBe).size(), 3u);
  EXPECT_TRUE(kernels_on(kBe2).empty());
  dev.complete_all();  // the BE kernels finish (and HP too)
  d->pump();
  EXPECT_EQ(kernels_on(kBe2), std::vector<KernelId>{10});
}

// With no HP kernel in flight Orion still bounds what best effort puts on the GPU: the next HP
// kernel (a pipeline's next backward, an inference request's next layer) waits behind all of it.
TEST_F(DispatcherTest, OrionBoundsOutstandingBestEffortWorkWithHighPriorityIdle) {
  auto d = make("orion");  // 100 us of outstanding BE work at most
  dev.kernel_duration_ns = 60'000;
  d->submit(kernel_op(kBe, 10, 2));  // never timed: counts as the whole 100 us
  d->submit(kernel_op(kBe, 10, 2));  // 100 us outstanding: still at the threshold, goes
  d->submit(kernel_op(kBe, 10, 2));  // 200 us: waits
  EXPECT_EQ(kernels_on(kBe).size(), 2u);
  dev.complete_all();
  d->pump();  // learned: 60 us each
  ASSERT_DOUBLE_EQ(profiles.find(10)->duration_ns, 60'000);
  EXPECT_EQ(kernels_on(kBe).size(), 3u);
  dev.complete_all();
  d->pump();
  for (int i = 0; i < 20; ++i) d->submit(kernel_op(kBe2, 10, 2));
  EXPECT_EQ(kernels_on(kBe2).size(), 2u) << "0 and 60 us outstanding go, 120 us waits";
  d->submit(event_op(OpKind::kEventRecord, kBe, 5));  // holds no SMs: never held by the gate
  EXPECT_EQ(position([](const SubmittedOp& s) { return s.kind == OpKind::kEventRecord; }) >= 0, true);
  EXPECT_EQ(d->drain_all(), 0);
  EXPECT_EQ(kernels_on(kBe2).size(), 20u);
}

// Review regression: a deferred op's error used to be cleared by forget_stream() (the stream is
// drained there), so it never reached the program. It now comes back from the next drain_all().
TEST_F(DispatcherTest, ForgottenStreamsDeferredErrorReachesTheNextDrainAll) {
  auto d = make("priority");
  dev.fail_kernel(666, 700);
  d->submit(kernel_op(kHp, 1));
  EXPECT_EQ(d->submit(kernel_op(kBe, 666)), 0);  // deferred behind HP
  d->forget_stream(kBe);                          // drains it: it fails there
  EXPECT_EQ(d->stats().backend_errors, 1u);
  EXPECT_EQ(d->drain_stream(kBe), 0);  // a new stream reusing the handle does not inherit it
  EXPECT_EQ(d->drain_all(), 700);
  EXPECT_EQ(d->drain_all(), 0);
}

TEST_F(DispatcherTest, StarvationBoundForcesTheHeadUnderContinuousHighPriorityLoad) {
  auto d = make("priority");
  d->submit(kernel_op(kHp, 1));
  d->submit(kernel_op(kBe, 10));
  d->submit(kernel_op(kBe, 11));
  for (int step = 0; step < 9; ++step) {  // 0.9 ms of HP load, below the 1 ms bound
    dev.advance(100'000);
    d->submit(kernel_op(kHp, 2));
    d->pump();
  }
  EXPECT_TRUE(kernels_on(kBe).empty());
  dev.advance(100'000);  // the head has now waited 1 ms
  d->pump();
  EXPECT_EQ(kernels_on(kBe), std::vector<KernelId>{10});
  EXPECT_EQ(d->stats().forced_by_starvation, 1u);
  // The next op became the head when 10 went: its own wait starts now.
  dev.advance(999'999);
  d->pump();
  EXPECT_EQ(kernels_on(kBe).size(), 1u);
  dev.advance(1);
  d->pump();
  EXPECT_EQ(kernels_on(kBe), (std::vector<KernelId>{10, 11}));
  EXPECT_EQ(d->stats().forced_by_starvation, 2u);
}

TEST_F(DispatcherTest, DrainStreamReturnsOnlyWhenEverythingIsSubmitted) {
  auto d = make("priority");
  d->submit(kernel_op(kHp, 1));
  for (KernelId k = 10; k < 30; ++k) d->submit(kernel_op(kBe, k));
  d->submit(kernel_op(kBe2, 50));
  EXPECT_EQ(d->drain_stream(kBe), 0);
  std::vector<KernelId> expect;
  for (KernelId k = 10; k < 30; ++k) expect.push_back(k);
  EXPECT_EQ(kernels_on(kBe), expect);  // all of them, in order, despite HP in flight
  EXPECT_TRUE(kernels_on(kBe2).empty());  // other streams untouched
  EXPECT_EQ(d->drain_all(), 0);
  EXPECT_EQ(kernels_on(kBe2), std::vector<KernelId>{50});
}

TEST_F(DispatcherTest, DrainEventSubmitsUpToTheLatestRecordOnly) {
  auto d = make("priority");
  d->submit(kernel_op(kHp, 1));
  d->submit(kernel_op(kBe, 10));
  d->submit(event_op(OpKind::kEventRecord, kBe, 77));
  d->submit(kernel_op(kBe, 11));
  d->submit(event_op(OpKind::kEventRecord, kBe, 77));  // re-recorded: the drain covers this one
  d->submit(kernel_op(kBe, 12));
  EXPECT_EQ(d->drain_event(77), 0);
  EXPECT_EQ(kernels_on(kBe), (std::vector<KernelId>{10, 11}));
  EXPECT_EQ(d->stats().queued_now, 1u);
  EXPECT_EQ(d->drain_event(12345), 0);  // unknown event: nothing to wait for
}

TEST_F(DispatcherTest, HighPriorityWaitDrainsOnlyTheProducerOfItsEvent) {
  auto d = make("priority");
  d->submit(kernel_op(kHp, 1));
  d->submit(kernel_op(kBe, 10));
  d->submit(event_op(OpKind::kEventRecord, kBe, 5));
  d->submit(kernel_op(kBe, 11));  // after the record: stays queued
  d->submit(kernel_op(kBe2, 20));
  d->submit(event_op(OpKind::kStreamWaitEvent, kHp, 5));
  const int record = position([](const SubmittedOp& s) { return s.kind == OpKind::kEventRecord; });
  const int wait = position([](const SubmittedOp& s) { return s.kind == OpKind::kStreamWaitEvent; });
  ASSERT_GE(record, 0);
  ASSERT_GE(wait, 0);
  EXPECT_LT(record, wait);
  EXPECT_EQ(kernels_on(kBe), std::vector<KernelId>{10});
  EXPECT_TRUE(kernels_on(kBe2).empty());
}

TEST_F(DispatcherTest, QueuedWaitIsNotSubmittedBeforeItsRecord) {
  auto d = make("priority");
  d->submit(kernel_op(kHp, 1));
  d->submit(kernel_op(kBe, 10));
  d->submit(event_op(OpKind::kEventRecord, kBe, 5));
  d->submit(event_op(OpKind::kStreamWaitEvent, kBe2, 5));
  d->submit(kernel_op(kBe2, 20));
  // Draining the consumer must first drain the producer up to the record.
  EXPECT_EQ(d->drain_stream(kBe2), 0);
  const int record = position([](const SubmittedOp& s) { return s.kind == OpKind::kEventRecord; });
  const int wait = position([](const SubmittedOp& s) { return s.kind == OpKind::kStreamWaitEvent; });
  ASSERT_GE(record, 0);
  ASSERT_GE(wait, 0);
  EXPECT_LT(record, wait);

  // Through the pump: the consumer's wait is head but its record is not admitted yet.
  d->submit(kernel_op(kBe, 30));
  d->submit(event_op(OpKind::kEventRecord, kBe, 6));
  d->submit(event_op(OpKind::kStreamWaitEvent, kBe2, 6));
  dev.complete_all();
  d->pump();
  const auto log = dev.submitted();
  int rec6 = -1, wait6 = -1;
  for (size_t i = 0; i < log.size(); ++i) {
    if (log[i].event == 6 && log[i].kind == OpKind::kEventRecord) rec6 = static_cast<int>(i);
    if (log[i].event == 6 && log[i].kind == OpKind::kStreamWaitEvent) wait6 = static_cast<int>(i);
  }
  ASSERT_GE(rec6, 0);
  ASSERT_GE(wait6, 0);
  EXPECT_LT(rec6, wait6);
}

TEST_F(DispatcherTest, QueuedOpOwnsAClonedPayload) {
  auto d = make("priority");
  d->submit(kernel_op(kHp, 1));
  {
    testing::ValuePayload args(42);
    Op op = kernel_op(kBe, 10);
    op.borrowed = &args;
    op.clone = testing::clone_value_payload;
    EXPECT_EQ(d->submit(std::move(op)), 0);
    args.value = -7;  // the caller's frame moves on
  }
  EXPECT_EQ(d->stats().caller_waits, 0u);
  dev.complete_all();
  d->pump();
  const auto log = dev.submitted();
  ASSERT_EQ(log.size(), 2u);
  EXPECT_EQ(log[1].payload_value, 42);
}

// Issue 11, finding 10: a caller whose op cannot be copied does not wait for the policy (up to
// the starvation bound per op ahead of it): its stream is drained at once, in order.
TEST_F(DispatcherTest, UnclonablePayloadDrainsItsStreamAtOnce) {
  auto d = make("priority");
  d->submit(kernel_op(kHp, 1));
  EXPECT_EQ(d->submit(kernel_op(kBe, 9)), 0);  // queued behind high priority
  EXPECT_TRUE(kernels_on(kBe).empty());
  testing::ValuePayload args(5);
  Op op = kernel_op(kBe, 10);
  op.borrowed = &args;
  op.clone = testing::refuse_clone;  // argument sizes unknown
  EXPECT_EQ(d->submit(std::move(op)), 0);  // returns with high priority still in flight
  EXPECT_EQ(d->stats().caller_waits, 1u);
  const auto log = dev.submitted();
  ASSERT_EQ(log.size(), 3u);
  EXPECT_EQ(log[1].kernel, 9u) << "the op overtook older work of its stream";
  EXPECT_EQ(log[2].kernel, 10u);
  EXPECT_EQ(log[2].payload_value, 5);  // read while the caller's frame was alive
}

TEST_F(DispatcherTest, WaitingCallerGetsItsOwnError) {
  auto d = make("priority");
  dev.fail_kernel(10, 123);
  d->submit(kernel_op(kHp, 1));
  int status = -1;
  std::thread caller([&] {
    testing::ValuePayload args(5);
    Op op = kernel_op(kBe, 10);
    op.borrowed = &args;  // no cloner at all
    status = d->submit(std::move(op));
  });
  while (d->stats().caller_waits == 0) std::this_thread::yield();
  EXPECT_EQ(d->drain_stream(kBe), 0);  // the drain submits it; the error is the caller's
  caller.join();
  EXPECT_EQ(status, 123);
}

TEST_F(DispatcherTest, ClassChangeDrainsQueuedWork) {
  auto d = make("priority");
  d->submit(kernel_op(kHp, 1));
  d->submit(kernel_op(kBe, 10));
  EXPECT_EQ(d->stream_class(kBe), StreamClass::kBestEffort);
  d->set_stream_class(kBe, StreamClass::kHighPriority);
  EXPECT_EQ(kernels_on(kBe), std::vector<KernelId>{10});
  d->submit(kernel_op(kBe, 11));  // now HP: inline
  EXPECT_EQ(kernels_on(kBe), (std::vector<KernelId>{10, 11}));
  d->forget_stream(kBe);
  EXPECT_EQ(d->stream_class(kBe), StreamClass::kUnmanaged);
  EXPECT_EQ(d->stream_class(9999), StreamClass::kUnmanaged);
}

// The shim's per-thread class: an op carries its own class, whatever its stream's. Forward
// kernels (best effort) and backward kernels (high priority) of one micro-batch share a stream,
// because autograd runs backward on its forward's stream.
Op with_class(Op op, StreamClass cls) {
  op.requested_class = cls;
  return op;
}

TEST_F(DispatcherTest, AnOpsOwnClassOverridesItsStreamsClass) {
  auto d = make("priority");
  constexpr StreamId kPlain = 7;  // unmanaged (the default class)
  d->submit(kernel_op(kHp, 1));   // HP in flight: best effort waits
  ASSERT_EQ(d->submit(with_class(kernel_op(kPlain, 10), StreamClass::kBestEffort)), 0);
  ASSERT_EQ(d->submit(with_class(kernel_op(kHp, 11), StreamClass::kBestEffort)), 0);
  EXPECT_TRUE(kernels_on(kPlain).empty()) << "best-effort op on an unmanaged stream was not deferred";
  EXPECT_EQ(kernels_on(kHp), std::vector<KernelId>{1}) << "best-effort op on a high-priority stream was not deferred";
  // High priority asked on a best-effort stream: at once, while HP is in flight.
  ASSERT_EQ(d->submit(with_class(kernel_op(kBe, 20), StreamClass::kHighPriority)), 0);
  EXPECT_EQ(kernels_on(kBe), std::vector<KernelId>{20});
  // A communication stream keeps its class.
  ASSERT_EQ(d->submit(with_class(kernel_op(kComm, 30), StreamClass::kBestEffort)), 0);
  EXPECT_EQ(kernels_on(kComm), std::vector<KernelId>{30});
  EXPECT_EQ(d->stream_class(kPlain), StreamClass::kUnmanaged) << "an op's class must not change its stream's";
  const auto st = d->stats();
  EXPECT_EQ(st.deferred, 2u);
  EXPECT_EQ(st.op_classed, 3u);  // the communication op was scheduled with its stream's class
  dev.complete_all();
  d->pump();
  EXPECT_EQ(kernels_on(kPlain), std::vector<KernelId>{10});
}

TEST_F(DispatcherTest, HighPriorityOpPromotesTheBestEffortWorkQueuedAheadOfItOnItsStream) {
  auto d = make("priority");
  constexpr StreamId kShared = 7;
  d->submit(kernel_op(kHp, 1));
  d->submit(kernel_op(kBe, 5));  // another stream's queued forward work: not promoted
  for (KernelId k = 10; k < 13; ++k) d->submit(with_class(kernel_op(kShared, k), StreamClass::kBestEffort));
  EXPECT_TRUE(kernels_on(kShared).empty());
  const size_t before = dev.submitted_count();
  ASSERT_EQ(d->submit(with_class(kernel_op(kShared, 20), StreamClass::kHighPriority)), 0);
  // Stream order holds: the three queued ops, then the HP op, all before submit() returned.
  EXPECT_EQ(kernels_on(kShared), (std::vector<KernelId>{10, 11, 12, 20}));
  EXPECT_EQ(dev.submitted_count(), before + 4);
  EXPECT_TRUE(kernels_on(kBe).empty()) << "another stream's best-effort work was promoted";
  const auto st = d->stats();
  EXPECT_EQ(st.promoted, 3u);
  EXPECT_EQ(st.queued_now, 1u);
  // Best effort again after it: deferred again (HP in flight).
  ASSERT_EQ(d->submit(with_class(kernel_op(kShared, 21), StreamClass::kBestEffort)), 0);
  EXPECT_EQ(kernels_on(kShared).size(), 4u);
}

// A whole best-effort process (gpud): the legacy stream is held too, and CUDA's legacy-stream
// order holds among held ops: a legacy op waits for what blocking streams queued before it, a
// blocking stream's op for what the legacy stream queued before it; a non-blocking stream's op
// for neither. An op that goes at once (not deferrable) first releases what it must follow.
TEST_F(DispatcherTest, HeldLegacyWorkKeepsLegacyStreamOrder) {
  constexpr StreamId kLegacy = 0, kNonBlocking = 5;
  auto d = make("priority");
  d->order_legacy_stream(kLegacy);
  d->set_stream_class(kLegacy, StreamClass::kBestEffort);
  d->set_stream_class(kNonBlocking, StreamClass::kBestEffort);
  d->set_syncs_with_legacy(kNonBlocking, false);
  d->submit(kernel_op(kHp, 1));      // in flight: best effort is held
  d->submit(kernel_op(kBe, 20));     // blocking stream
  d->submit(kernel_op(kLegacy, 30)); // after 20 (legacy waits for blocking streams)
  d->submit(kernel_op(kBe2, 21));    // after 30 (blocking streams wait for the legacy stream)
  d->submit(kernel_op(kNonBlocking, 40));  // orders with nothing
  d->pump();
  EXPECT_TRUE(kernels_on(kLegacy).empty() && kernels_on(kBe).empty()) << "held while high priority runs";
  dev.complete_all();
  d->pump();
  auto at = [&](KernelId k) { return position([k](const SubmittedOp& o) { return o.kernel == k; }); };
  ASSERT_GE(at(20), 0);
  ASSERT_GE(at(30), 0);
  ASSERT_GE(at(21), 0);
  EXPECT_LT(at(20), at(30));
  EXPECT_LT(at(30), at(21));
  EXPECT_GE(at(40), 0);

  // Not deferrable (a capture, say): held blocking-stream work goes first, the policy aside.
  d->submit(kernel_op(kHp, 2));
  d->submit(kernel_op(kBe, 22));
  d->pump();
  EXPECT_LT(at(22), 0) << "held";
  d->submit(kernel_op(kLegacy, 31), /*may_defer=*/false);
  ASSERT_GE(at(22), 0);
  EXPECT_LT(at(22), at(31));
  dev.complete_all();
  EXPECT_EQ(d->drain_all(), 0);
}

// Orion's rule (2) pairs a best-effort kernel with the high-priority kernel running on the device.
// The dispatcher told the policy the profile of the latest HP kernel submitted, kept after it
// completed: with a long memory-bound kernel still running on one HP stream and a short
// compute-bound one submitted and done on another, a memory-bound BE kernel went beside the first.
TEST_F(DispatcherTest, OrionPairsBestEffortWithTheHighPriorityKernelStillRunning) {
  constexpr StreamId kHp2 = 5;
  auto d = make("orion");
  d->set_stream_class(kHp2, StreamClass::kHighPriority);
  ASSERT_EQ(d->submit(kernel_op(kHp, 1, 1, KernelProfile::kMemoryBound)), 0);
  ASSERT_EQ(d->submit(kernel_op(kHp2, 2, 1, KernelProfile::kComputeBound)), 0);
  dev.complete_stream(kHp2);
  d->pump();
  ASSERT_EQ(d->submit(kernel_op(kBe, 10, 1, KernelProfile::kMemoryBound)), 0);
  EXPECT_TRUE(kernels_on(kBe).empty()) << "a memory-bound BE kernel went beside the memory-bound HP kernel still running";
  ASSERT_EQ(d->submit(kernel_op(kBe2, 11, 1, KernelProfile::kComputeBound)), 0);
  EXPECT_EQ(kernels_on(kBe2), std::vector<KernelId>{11}) << "a compute-bound one complements it";
  // Only an HP copy in flight: no HP kernel runs, so no profile to clash with.
  dev.complete_all();
  d->pump();
  EXPECT_EQ(kernels_on(kBe), std::vector<KernelId>{10});
  Op copy;
  copy.kind = OpKind::kCopy;
  copy.stream = kHp;
  ASSERT_EQ(d->submit(std::move(copy)), 0);
  ASSERT_EQ(d->submit(kernel_op(kBe2, 12, 1, KernelProfile::kComputeBound)), 0);
  EXPECT_EQ(kernels_on(kBe2), (std::vector<KernelId>{11, 12})) << "paired with a finished compute-bound HP kernel";
  dev.complete_all();
  EXPECT_EQ(d->drain_all(), 0);
}

TEST_F(DispatcherTest, DestructorDrainsEverything) {
  {
    auto d = make("priority");
    d->submit(kernel_op(kHp, 1));
    for (KernelId k = 10; k < 20; ++k) d->submit(kernel_op(kBe, k));
  }
  EXPECT_EQ(kernels_on(kBe).size(), 10u);
}

TEST_F(DispatcherTest, CompletionReportedFromInsideSubmitIsAppliedAtTheNextPump) {
  dev.report_in_submit = true;
  TraceWriter trace;
  DispatcherOptions opt;
  opt.background_thread = false;
  opt.trace = &trace;
  Dispatcher d(dev, make_policy("priority"), opt);
  d.set_stream_class(kHp, StreamClass::kHighPriority);
  d.set_stream_class(kBe, StreamClass::kBestEffort);
  ASSERT_EQ(d.submit(kernel_op(kHp, 1)), 0);  // must not deadlock on the stream's own mutex
  // The BE submit pumps first, which applies the HP completion: nothing HP in flight any more.
  ASSERT_EQ(d.submit(kernel_op(kBe, 10)), 0);
  EXPECT_EQ(kernels_on(kBe), std::vector<KernelId>{10});
  d.pump();
  const auto recs = trace.records();
  ASSERT_EQ(recs.size(), 2u);
  EXPECT_GE(recs[0].end_ns, 0);  // completion matched its record although it came first
  EXPECT_GE(recs[1].end_ns, 0);
}

// The pump reports completions; it must never wait for a stream another thread is submitting to
// (that thread may sit in a blocking driver call, holding the stream's mutex). The completion is
// applied at a later pump, once the stream is free.
TEST_F(DispatcherTest, APumpDoesNotWaitForAStreamWhoseSubmitBlocks) {
  auto d = make("priority");
  ASSERT_EQ(d->submit(kernel_op(kHp, 1)), 0);
  ASSERT_EQ(d->submit(kernel_op(kBe, 7)), 0);  // held: HP in flight
  ASSERT_TRUE(kernels_on(kBe).empty());
  std::atomic<bool> in_submit{false}, unblock{false};
  dev.before_submit = [&](const Op& op) {
    if (op.kernel.id != 99) return;
    in_submit = true;
    while (!unblock) std::this_thread::sleep_for(std::chrono::microseconds(100));
  };
  std::thread blocked([&] { EXPECT_EQ(d->submit(kernel_op(kHp, 99)), 0); });
  while (!in_submit) std::this_thread::sleep_for(std::chrono::microseconds(100));
  dev.complete_all();  // HP kernel 1 is done: a completion of the stream the blocked thread holds
  std::atomic<bool> pumped{false};
  std::thread pumper([&] {
    d->pump();
    pumped = true;
  });
  // Bounded by time, not by sleeps (which a loaded machine stretches); the stall is for good.
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
  while (!pumped && std::chrono::steady_clock::now() < deadline) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  EXPECT_TRUE(pumped) << "the pump waited for the mutex of a stream blocked in its submit";
  unblock = true;
  blocked.join();
  pumper.join();
  dev.before_submit = nullptr;
  dev.complete_all();
  d->pump();  // both HP completions applied now: nothing HP in flight, the held BE kernel goes
  EXPECT_EQ(kernels_on(kBe), std::vector<KernelId>{7});
  ASSERT_TRUE(profiles.find(1)) << "the put-off completion was never applied";
}

// A completion put off (its stream's mutex was held) is applied before a newer one of the same
// stream: the policy hears of the stream's kernels in order, each ready when the one before it
// ended. The newer one used to be applied first (retiring both), so the older one's observation
// was lost and the newer one's ready time missed its predecessor.
TEST_F(DispatcherTest, PutOffCompletionsReachThePolicyInOrder) {
  struct Recorder final : Policy {
    std::vector<KernelCompletion> seen;
    const char* name() const override { return "recorder"; }
    bool admit(const Op&, const OpEstimate&, const DeviceState&) const override { return true; }
    bool wants_observations() const override { return true; }
    void observe(const KernelCompletion& done) override { seen.push_back(done); }
  };
  auto owned = std::make_unique<Recorder>();
  Recorder& recorder = *owned;
  DispatcherOptions opt;
  opt.background_thread = false;
  opt.profiles = &profiles;
  Dispatcher d(dev, std::move(owned), opt);
  d.set_stream_class(kHp, StreamClass::kHighPriority);
  dev.kernel_duration_ns = 1000;
  ASSERT_EQ(d.submit(kernel_op(kHp, 1)), 0);
  dev.advance(500);
  ASSERT_EQ(d.submit(kernel_op(kHp, 2)), 0);
  std::atomic<bool> in_submit{false}, unblock{false};
  dev.before_submit = [&](const Op& op) {
    if (op.kernel.id != 99) return;
    in_submit = true;
    while (!unblock) std::this_thread::sleep_for(std::chrono::microseconds(100));
  };
  std::thread blocked([&] { EXPECT_EQ(d.submit(kernel_op(kHp, 99)), 0); });
  while (!in_submit) std::this_thread::sleep_for(std::chrono::microseconds(100));
  dev.complete_oldest();  // kernel 1
  d.pump();               // its stream is held: put off
  unblock = true;
  blocked.join();
  dev.before_submit = nullptr;
  dev.complete_oldest();  // kernel 2
  d.pump();
  ASSERT_EQ(recorder.seen.size(), 2u);
  EXPECT_EQ(recorder.seen[0].kernel, 1u);
  EXPECT_EQ(recorder.seen[1].kernel, 2u);
  EXPECT_EQ(recorder.seen[1].ready_ns, recorder.seen[0].end_ns) << "kernel 2 was ready when kernel 1 ended";
  dev.complete_all();
  d.pump();
}

TEST_F(DispatcherTest, CompletionsTeachTheProfileStore) {
  auto d = make("priority");
  dev.kernel_duration_ns = 2500;
  d->submit(kernel_op(kHp, 31));
  dev.complete_all();
  d->pump();
  ASSERT_TRUE(profiles.find(31));
  EXPECT_DOUBLE_EQ(profiles.find(31)->duration_ns, 2500);
}

}  // namespace
}  // namespace sched

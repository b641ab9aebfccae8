// Backend errors of deferred ops (the dispatcher's half of "a driver error is returned to the
// caller, never swallowed"): each reaches exactly one call, the first that synchronises with its
// op (its stream's drain, an event drain up to a record after it, a context-wide drain), however
// many ops of a stream fail before one is taken, and a destroyed stream's errors go to later
// context-wide drains, never to a legacy-stream synchronize, which does not wait on that stream.
#include <gtest/gtest.h>

#include "dispatcher_fixture.h"

namespace sched {
namespace {

using namespace dispatcher_fixture;
class DeferredErrors : public DispatcherTest {
 protected:
  // A priority dispatcher with high priority in flight; kernels 666 and 667 fail (700, 701).
  std::unique_ptr<Dispatcher> with_failing_kernels() {
    auto d = make("priority");
    dev.fail_kernel(666, 700);
    dev.fail_kernel(667, 701);
    d->submit(kernel_op(kHp, 1));
    return d;
  }
  // High priority completes: everything queued goes to the device.
  void let_everything_go(Dispatcher& d) {
    dev.complete_all();
    d.pump();
  }
};

TEST_F(DeferredErrors, BackendErrorsReachTheCaller) {
  auto d = make("priority");
  dev.fail_kernel(666, 700);
  EXPECT_EQ(d->submit(kernel_op(kHp, 666)), 700);  // inline: returned at once, not sticky
  EXPECT_EQ(d->drain_stream(kHp), 0);
  d->submit(kernel_op(kHp, 1));
  EXPECT_EQ(d->submit(kernel_op(kBe, 10)), 0);
  EXPECT_EQ(d->submit(kernel_op(kBe, 666)), 0);  // deferred: the error comes at the drain
  EXPECT_EQ(d->submit(kernel_op(kBe, 11)), 0);
  EXPECT_EQ(d->drain_stream(kBe), 700);
  EXPECT_EQ(d->drain_stream(kBe), 0);  // cleared once returned
  EXPECT_EQ(kernels_on(kBe), (std::vector<KernelId>{10, 11}));  // later ops still went
  EXPECT_EQ(d->stats().backend_errors, 2u);
}

TEST_F(DeferredErrors, DeferredErrorReturnedByDrainAllAndEventDrain) {
  auto d = make("priority");
  dev.fail_kernel(666, 999);
  d->submit(kernel_op(kHp, 1));
  d->submit(kernel_op(kBe, 666));
  d->submit(event_op(OpKind::kEventRecord, kBe, 8));
  EXPECT_EQ(d->drain_event(8), 999);
  d->submit(kernel_op(kBe2, 666));
  EXPECT_EQ(d->drain_all(), 999);
  EXPECT_EQ(d->drain_all(), 0);
}

// An event's drain or query answers for the ops up to its record only: the error of an op queued
// after the record belongs to whoever synchronises that op (its stream's drain).
TEST_F(DeferredErrors, AnEventLeavesTheErrorOfALaterOpToItsStream) {
  auto d = make("priority");
  dev.fail_kernel(666, 700);
  d->submit(kernel_op(kHp, 1));
  d->submit(event_op(OpKind::kEventRecord, kBe, 8));
  d->submit(kernel_op(kBe, 666));  // after the record
  dev.complete_all();
  d->pump();  // HP done: both go, the kernel fails
  EXPECT_EQ(d->query_event(8).error, 0);
  EXPECT_EQ(d->drain_event(8), 0);
  EXPECT_EQ(d->drain_stream(kBe), 700);
}

// Two ops of one stream fail before anything synchronises: the event drain up to the record after
// the first gets the first, the stream's drain the second (one slot per stream dropped it).
TEST_F(DeferredErrors, TwoFailuresOnOneStreamAreEachReportedOnce) {
  auto d = with_failing_kernels();
  d->submit(kernel_op(kBe, 666));
  d->submit(event_op(OpKind::kEventRecord, kBe, 8));
  d->submit(kernel_op(kBe, 667));
  let_everything_go(*d);  // both kernels fail
  EXPECT_EQ(d->drain_event(8), 700);
  EXPECT_EQ(d->drain_stream(kBe), 701);
  EXPECT_EQ(d->drain_stream(kBe), 0);
  EXPECT_EQ(d->drain_all(), 0);
}

// Streams destroyed with errors waiting: each error goes to a context-wide drain, one per call,
// and none to a legacy-stream synchronize (the first used to be taken there, the second dropped).
TEST_F(DeferredErrors, DestroyedStreamsErrorsGoEachToAContextWideDrain) {
  auto d = with_failing_kernels();
  d->submit(kernel_op(kBe, 666));
  d->submit(kernel_op(kBe2, 667));
  let_everything_go(*d);
  d->forget_stream(kBe);
  d->forget_stream(kBe2);
  EXPECT_EQ(d->drain_legacy_sync(), 0);
  const int first = d->drain_all(), second = d->drain_all();
  EXPECT_EQ(first + second, 700 + 701);
  EXPECT_NE(first, second);
  EXPECT_EQ(d->drain_all(), 0);
}

}  // namespace
}  // namespace sched

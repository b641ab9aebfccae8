// The inline high-priority path allocates nothing in steady state. Counts this thread's calls to
// the global operator new (replaced here, for this test binary only) around HP submissions.
#include <gtest/gtest.h>

#include <cstdlib>
#include <new>

#include "fake_device.h"
#include "scheduler/dispatcher.h"

namespace {
thread_local bool t_counting = false;
thread_local size_t t_allocations = 0;
}  // namespace

void* operator new(std::size_t n) {
  if (t_counting) ++t_allocations;
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }

namespace sched {
namespace {

// A device that allocates nothing per op, so any allocation counted is the dispatcher's.
class QuietDevice final : public Device {
 public:
  int submit(const Op& op) override {
    last_ = op.seq;
    stream_ = op.stream;
    return 0;
  }
  bool report = true;  // poll() reports the latest op complete
  void poll() override {
    if (report && listener_ != nullptr && last_ != 0) listener_->on_complete({last_, stream_, OpKind::kKernel, 1, 0, 0});
  }
  void set_listener(CompletionListener* l) override { listener_ = l; }
  int sm_count() const override { return 100; }
  int max_active_blocks_per_sm(const KernelInfo&) override { return 2; }
  int64_t now_ns() const override { return 0; }

 private:
  uint64_t last_ = 0;
  StreamId stream_ = 0;
  CompletionListener* listener_ = nullptr;
};

TEST(HighPriorityPath, AllocatesNothingInSteadyState) {
  QuietDevice dev;
  DispatcherOptions opt;
  opt.background_thread = false;
  Dispatcher d(dev, make_policy("orion"), opt);
  d.set_stream_class(1, StreamClass::kHighPriority);
  for (int round = 0; round < 2; ++round) {
    t_counting = round == 1;  // round 0 warms up the stream state and in-flight ring
    for (int i = 0; i < 1000; ++i) ASSERT_EQ(d.submit(testing::kernel_op(1, 1, 8)), 0);
    t_counting = false;
    d.pump();  // retires the 1000 in-flight entries
  }
  EXPECT_EQ(t_allocations, 0u);
  EXPECT_EQ(d.stats().submitted_inline, 2000u);
}

TEST(HighPriorityPath, AllocationCounterSeesAllocations) {
  // The counter itself works: a best-effort op that must queue allocates (queue node, clone).
  QuietDevice dev;
  dev.report = false;  // the HP op stays in flight
  DispatcherOptions opt;
  opt.background_thread = false;
  Dispatcher d(dev, make_policy("priority"), opt);
  d.set_stream_class(1, StreamClass::kHighPriority);
  d.set_stream_class(2, StreamClass::kBestEffort);
  d.submit(testing::kernel_op(1, 1));
  t_allocations = 0;
  t_counting = true;
  for (int i = 0; i < 100; ++i) d.submit(testing::kernel_op(2, 2));
  t_counting = false;
  EXPECT_GT(t_allocations, 0u);
  EXPECT_EQ(d.stats().deferred, 100u);
}

}  // namespace
}  // namespace sched

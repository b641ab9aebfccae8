// The dispatcher under many threads with the background thread on and a real clock: per-stream
// program order of every thread survives, drains never return early, and cross-stream event
// order holds, with mixed classes and the orion policy admitting and deferring. Also run under
// ThreadSanitizer (ctest label "sanitize").
#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>
#include <thread>

#include "fake_device.h"
#include "scheduler/dispatcher.h"

namespace sched {
namespace {

using testing::FakeDevice;

// Kernel ids encode (thread, per-thread sequence number) so the device log shows program order.
KernelId encode(int thread, uint64_t n) { return (static_cast<KernelId>(thread) << 32) | n; }
int thread_of(KernelId id) { return static_cast<int>(id >> 32); }
uint64_t number_of(KernelId id) { return id & 0xffffffffu; }

struct StressConfig {
  const char* policy;
  PolicyParams params;
};

class DispatcherStress : public ::testing::TestWithParam<StressConfig> {};

TEST_P(DispatcherStress, PerStreamProgramOrderAndDrains) {
  constexpr int kThreads = 4;
  constexpr int kOpsPerThread = 1500;
  constexpr int kStreams = 8;
  // Streams 1-2 HP, 3-6 BE, 7 communication, 8 unmanaged.
  const StreamClass classes[kStreams] = {
      StreamClass::kHighPriority, StreamClass::kHighPriority, StreamClass::kBestEffort,
      StreamClass::kBestEffort,   StreamClass::kBestEffort,   StreamClass::kBestEffort,
      StreamClass::kCommunication, StreamClass::kUnmanaged};
  FakeDevice dev;
  dev.auto_complete = true;
  dev.real_clock = true;
  dev.complete_after_ns = 30'000;  // ops stay in flight a while: BE work gets deferred
  DispatcherOptions opt;
  opt.be_max_wait_ns = 200'000;
  opt.pump_interval_ns = 20'000;
  Dispatcher d(dev, make_policy(GetParam().policy, GetParam().params), opt);
  for (int s = 0; s < kStreams; ++s) d.set_stream_class(s + 1, classes[s]);

  std::atomic<int> early_drains{0};
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(1234 + t);
      ready.fetch_add(1);
      while (ready.load() < kThreads) std::this_thread::yield();  // start together
      std::map<StreamId, uint64_t> sent;  // ops this thread put on each stream
      for (uint64_t n = 1; n <= kOpsPerThread; ++n) {
        const StreamId stream = 1 + rng() % kStreams;
        const unsigned what = rng() % 100;
        if (what < 3) {
          // Drain: every op this thread sent to `stream` must be on the device now.
          EXPECT_EQ(d.drain_stream(stream), 0);
          size_t seen = 0;
          for (const auto& s : dev.submitted()) {
            if (s.stream == stream && s.kind == OpKind::kKernel && thread_of(s.kernel) == t) ++seen;
          }
          if (seen != sent[stream]) early_drains.fetch_add(1);
          continue;
        }
        if (what < 8) {  // event record here, wait on another stream
          const EventId ev = 1000 + static_cast<EventId>(t);
          d.submit(testing::event_op(OpKind::kEventRecord, stream, ev));
          d.submit(testing::event_op(OpKind::kStreamWaitEvent, 1 + rng() % kStreams, ev));
          continue;
        }
        Op op = testing::kernel_op(stream, encode(t, n), 1 + rng() % 200,
                                   rng() % 2 ? KernelProfile::kComputeBound : KernelProfile::kMemoryBound);
        // Some launches carry caller-owned arguments: cloned, or (sizes unknown) the caller waits.
        testing::ValuePayload args(static_cast<int>(n));
        if (rng() % 10 == 0) {
          op.borrowed = &args;
          op.clone = rng() % 2 ? testing::clone_value_payload : testing::refuse_clone;
        }
        EXPECT_EQ(d.submit(std::move(op)), 0);
        args.value = -2;  // the frame is gone for a queued op: it must hold its own copy
        ++sent[stream];
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(d.drain_all(), 0);
  EXPECT_EQ(early_drains.load(), 0);

  // Per stream: seqs strictly increase (FIFO) and each thread's kernels keep program order.
  const auto log = dev.submitted();
  std::map<StreamId, uint64_t> last_seq;
  std::map<std::pair<StreamId, int>, uint64_t> last_number;
  std::map<uint64_t, size_t> position;              // seq -> index in the device log
  std::map<EventId, std::set<uint64_t>> records;    // every record's seq, per event
  for (size_t i = 0; i < log.size(); ++i) {
    position[log[i].seq] = i;
    if (log[i].kind == OpKind::kEventRecord) records[log[i].event].insert(log[i].seq);
  }
  size_t waits_checked = 0;
  size_t with_payload = 0;
  size_t kernels = 0;
  for (const auto& s : log) {
    EXPECT_GT(s.seq, last_seq[s.stream]) << "stream " << s.stream;
    last_seq[s.stream] = s.seq;
    if (s.kind == OpKind::kKernel) {
      ++kernels;
      auto& last = last_number[{s.stream, thread_of(s.kernel)}];
      EXPECT_GT(number_of(s.kernel), last);
      last = number_of(s.kernel);
      if (s.payload_value != -1) {
        EXPECT_EQ(static_cast<uint64_t>(s.payload_value), number_of(s.kernel));
        ++with_payload;
      }
    }
    if (s.kind == OpKind::kStreamWaitEvent) {
      // The event's latest record in arrival order before the wait must be on the device first.
      const auto& recs = records[s.event];
      auto it = recs.lower_bound(s.seq);
      ASSERT_NE(it, recs.begin()) << "no record before wait seq " << s.seq;
      EXPECT_LT(position[*std::prev(it)], position[s.seq]) << "wait seq " << s.seq;
      ++waits_checked;
    }
  }
  const auto st = d.stats();
  if (std::string(GetParam().policy) != "passthrough") {
    EXPECT_GT(st.deferred, 0u);  // the queued path was exercised, not only the inline one
  }
  EXPECT_EQ(st.submitted, log.size());
  EXPECT_EQ(st.queued_now, 0u);
  EXPECT_GT(kernels, kThreads * kOpsPerThread * 8u / 10u);
  EXPECT_GT(waits_checked, 100u);
  EXPECT_GT(with_payload, 100u);
}

INSTANTIATE_TEST_SUITE_P(Policies, DispatcherStress,
                         ::testing::Values(StressConfig{"orion", {{"sm_threshold", "60"}, {"allow_unknown", "1"}}},
                                           StressConfig{"priority", {}},
                                           StressConfig{"passthrough", {}}),
                         [](const auto& info) { return std::string(info.param.policy); });

}  // namespace
}  // namespace sched

// Added cost per op of the dispatcher over calling the backend directly: the inline
// high-priority path and the queued best-effort path, with 1 and 4 submitting threads (each on
// its own stream). The backend is a trivial counting device, so the numbers are the dispatcher's
// own bookkeeping. Run:
//   build/tests/scheduler/bench_dispatcher --benchmark_repetitions=5 --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <atomic>
#include <chrono>

#include "scheduler/dispatcher.h"

namespace {

using namespace sched;

// Does nothing but remember each stream's latest op; poll() reports that op complete (which
// retires everything before it on the stream). Streams outside 1-8 and 101-108 never complete.
class TrivialDevice final : public Device {
 public:
  int submit(const Op& op) override {
    if (Slot* slot = slot_of(op.stream)) {
      slot->seq.store(op.seq, std::memory_order_relaxed);
      slot->kernel.store(op.kernel.id, std::memory_order_relaxed);
    }
    return 0;
  }
  void poll() override {
    if (listener_ == nullptr) return;
    for (StreamId s : {1, 2, 3, 4, 5, 6, 7, 8, 101, 102, 103, 104, 105, 106, 107, 108}) {
      Slot& slot = *slot_of(s);
      const uint64_t seq = slot.seq.load(std::memory_order_relaxed);
      if (seq == 0 || seq == slot.reported) continue;
      slot.reported = seq;  // poll() runs under the dispatcher's pump lock
      listener_->on_complete({seq, s, OpKind::kKernel, slot.kernel.load(std::memory_order_relaxed), 0, 0});
    }
  }
  void set_listener(CompletionListener* listener) override { listener_ = listener; }
  int sm_count() const override { return 132; }
  int max_active_blocks_per_sm(const KernelInfo&) override { return 4; }
  int64_t now_ns() const override {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }

 private:
  struct alignas(64) Slot {
    std::atomic<uint64_t> seq{0};
    std::atomic<KernelId> kernel{0};
    uint64_t reported = 0;
  };
  Slot* slot_of(StreamId s) {
    if (s >= 1 && s <= 8) return &slots_[s - 1];
    if (s >= 101 && s <= 108) return &slots_[8 + s - 101];
    return nullptr;
  }
  Slot slots_[16];
  CompletionListener* listener_ = nullptr;
};

Op make_kernel(StreamId stream) {
  Op op;
  op.kind = OpKind::kKernel;
  op.stream = stream;
  op.kernel.id = 0x1000 + stream;
  op.kernel.grid.x = 64;
  op.kernel.block.x = 256;
  return op;
}

constexpr StreamId kBlockerStream = 50;  // HP stream whose ops never complete
TrivialDevice* g_device = nullptr;
Device* volatile g_backend = nullptr;  // volatile: the baseline call cannot be devirtualized
Dispatcher* g_dispatcher = nullptr;

void setup(const std::string& policy) {
  g_device = new TrivialDevice();
  g_backend = g_device;
  DispatcherOptions opt;
  opt.background_thread = false;  // measure the submit path itself
  g_dispatcher = new Dispatcher(*g_device, make_policy(policy), opt);
  for (StreamId s = 1; s <= 8; ++s) g_dispatcher->set_stream_class(s, StreamClass::kHighPriority);
  for (StreamId s = 101; s <= 108; ++s) g_dispatcher->set_stream_class(s, StreamClass::kBestEffort);
  g_dispatcher->set_stream_class(kBlockerStream, StreamClass::kHighPriority);
}

void teardown() {
  delete g_dispatcher;
  delete g_device;
  g_dispatcher = nullptr;
  g_device = nullptr;
}

// Baseline: the backend called directly (what an unscheduled launch costs the shim).
void BM_Direct(benchmark::State& state) {
  if (state.thread_index() == 0) setup("passthrough");
  const StreamId stream = 1 + static_cast<StreamId>(state.thread_index());
  uint64_t seq = 0;
  for (auto _ : state) {
    Op op = make_kernel(stream);
    op.seq = ++seq;
    benchmark::DoNotOptimize(g_backend->submit(op));  // virtual call, as the dispatcher makes
  }
  if (state.thread_index() == 0) teardown();
}

// High-priority kernel: submitted inline in the caller's thread.
void BM_HighPriorityInline(benchmark::State& state) {
  if (state.thread_index() == 0) setup("orion");
  const StreamId stream = 1 + static_cast<StreamId>(state.thread_index());
  uint64_t n = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(g_dispatcher->submit(make_kernel(stream)));
    if (++n % 4096 == 0) {  // retire bookkeeping like the background thread would
      state.PauseTiming();
      g_dispatcher->pump();
      state.ResumeTiming();
    }
  }
  if (state.thread_index() == 0) teardown();
}

// Best-effort kernel while high-priority work is in flight: cloned and queued, later admitted
// by a drain every 64 ops (so queues stay short and the measured cost includes queueing, the
// clone-free move into the queue and the deferred submission).
void BM_BestEffortQueued(benchmark::State& state) {
  if (state.thread_index() == 0) {
    setup("priority");
    g_dispatcher->submit(make_kernel(kBlockerStream));  // never completes: BE must queue
  }
  const StreamId stream = 101 + static_cast<StreamId>(state.thread_index());
  uint64_t n = 0;
  for (auto _ : state) {
    benchmark::DoNotOptimize(g_dispatcher->submit(make_kernel(stream)));
    if (++n % 64 == 0) g_dispatcher->drain_stream(stream);
  }
  if (state.thread_index() == 0) teardown();  // the destructor drains what is left
}

// CPU time per op (summed over threads): on a shared machine wall time mostly measures the
// neighbours' load.
BENCHMARK(BM_Direct)->Threads(1)->Threads(4);
BENCHMARK(BM_HighPriorityInline)->Threads(1)->Threads(4);
BENCHMARK(BM_BestEffortQueued)->Threads(1)->Threads(4);

}  // namespace

BENCHMARK_MAIN();

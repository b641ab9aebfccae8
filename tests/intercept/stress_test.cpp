// Many threads launching on high-priority and best-effort streams while high-priority work is
// held and released: every launch reaches the driver exactly once, per-stream order holds, and
// the arguments arrive intact. Run under ThreadSanitizer by the CI sanitizer pass.
#include <atomic>
#include <map>
#include <thread>

#include "test_support.h"

namespace {

using namespace icpt_test;

class Stress : public ShimTest {};

TEST_F(Stress, ConcurrentHighPriorityAndBestEffortLaunchesKeepOrderAndArguments) {
  constexpr int kThreads = 4;
  constexpr int kLaunches = 300;
  const size_t sizes[] = {sizeof(int), sizeof(int)};
  CUfunction kernel = fake_cuda_make_function("stress_kernel", 2, sizes);
  std::vector<CUstream> streams(kThreads);
  for (int t = 0; t < kThreads; ++t) {
    // Even threads high priority, odd threads best effort.
    ASSERT_EQ(cuStreamCreateWithPriority(&streams[t], 0, t % 2 == 0 ? -5 : 0), CUDA_SUCCESS);
  }
  std::atomic<bool> done{false};
  // Holds and releases the first high-priority stream, so best-effort work is deferred and
  // admitted over and over (held from the start, so the first best-effort launches defer).
  fake_cuda_set_stream_busy(streams[0], 1);
  std::thread toggler([&] {
    for (int i = 1; !done.load(); ++i) {
      std::this_thread::sleep_for(std::chrono::microseconds(i == 1 ? 5000 : 300));
      fake_cuda_set_stream_busy(streams[0], i % 2 == 0);
    }
    fake_cuda_set_stream_busy(streams[0], 0);
  });
  {
    // One held high-priority launch before the workers start.
    int tid = 0, seq = -1;
    void* params[] = {&tid, &seq};
    ASSERT_EQ(cuLaunchKernel(kernel, 1, 1, 1, 64, 1, 1, 0, streams[0], params, nullptr), CUDA_SUCCESS);
  }
  std::vector<std::thread> workers;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    workers.emplace_back([&, t] {
      if (use_device(0) == nullptr) failures.fetch_add(1);
      for (int i = 0; i < kLaunches; ++i) {
        int tid = t, seq = i;
        void* params[] = {&tid, &seq};
        if (cuLaunchKernel(kernel, 1, 1, 1, 64, 1, 1, 0, streams[t], params, nullptr) != CUDA_SUCCESS) {
          failures.fetch_add(1);
        }
        // (The held stream is only released by the toggler, never by its own thread.)
        if (t != 0 && i % 50 == 49 && cuStreamSynchronize(streams[t]) != CUDA_SUCCESS) {
          failures.fetch_add(1);
        }
      }
    });
  }
  for (auto& w : workers) w.join();
  done = true;
  toggler.join();
  ASSERT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
  EXPECT_EQ(failures.load(), 0);

  std::map<uint64_t, std::vector<int>> seen;  // stream -> sequence numbers in driver order
  for (const fake_cuda_call& c : calls()) {
    if (!is_launch(c) || c.function != h(kernel)) continue;
    int tid = -1, seq = -1;
    std::memcpy(&tid, c.params, sizeof tid);
    std::memcpy(&seq, c.params + 4, sizeof seq);
    ASSERT_GE(tid, 0);
    ASSERT_LT(tid, kThreads);
    EXPECT_EQ(c.stream, h(streams[tid])) << "arguments arrived with another stream's launch";
    if (seq >= 0) seen[c.stream].push_back(seq);  // -1: the launch made before the workers
  }
  for (int t = 0; t < kThreads; ++t) {
    const std::vector<int>& order = seen[h(streams[t])];
    ASSERT_EQ(order.size(), static_cast<size_t>(kLaunches)) << "stream of thread " << t;
    for (int i = 0; i < kLaunches; ++i) ASSERT_EQ(order[i], i) << "stream of thread " << t;
  }
  if (scheduled_) {
    EXPECT_GT(stats().deferred, 0u) << "the stress never exercised deferral";
  }
  for (CUstream s : streams) EXPECT_EQ(cuStreamDestroy(s), CUDA_SUCCESS);
}

}  // namespace

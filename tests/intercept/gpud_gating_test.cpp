// ORION_POLICY=gpud in the shim (issue 25): this process is a best-effort client of an orion-gpud
// (started below, before the shim reads its settings), and this test also plays the pipeline that
// publishes windows. A best-effort launch reaches the driver only inside a published window; a
// synchronisation still releases held work at once (safe by default beats the policy). The whole
// process is best effort: a high-priority stream, the legacy stream (in order with blocking
// streams) and a thread that classes itself high priority are all held.
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <thread>

#include "gpud/gpud.h"
#include "in_process_daemon.h"
#include "test_support.h"

namespace {

using namespace icpt_test;

struct Pipeline {
  // Stale only after 10 s (here and in the shim's policy): a heartbeat thread starved on a loaded
  // machine must not free held launches, which the tests would read as launches outside a window.
  gpud::testing::InProcessDaemon daemon{"GPU-shim", 2'000'000, gpud::testing::patient_grants()};
  std::atomic<bool> stop{false};
  std::unique_ptr<gpud::Client> client;
  std::thread beat;
  Pipeline() {
    client = std::make_unique<gpud::Client>(
        gpud::Client::connect(daemon.dir, "GPU-shim", gpud::Role::kPipeline, "test"));
    // Alive before the first test runs, as BubblePublisher is at attach: a page never beaten reads
    // as no pipeline (free), and on a loaded machine the thread below may start late (a CI run
    // once saw every launch go free).
    gpud::heartbeat(client->pipeline_writable(), gpud::monotonic_ns());
    beat = std::thread([this] {
      while (!stop.load()) {
        gpud::heartbeat(client->pipeline_writable(), gpud::monotonic_ns());
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    });
    setenv("ORION_POLICY", "gpud", 1);
    setenv("ORION_POLICY_PARAMS", ("gpu=GPU-shim,stale_ms=10000,dir=" + daemon.dir.string()).c_str(), 1);
  }
  ~Pipeline() {
    stop = true;
    beat.join();
    client.reset();
  }
  void open_for(int64_t ns) {
    const int64_t now = gpud::monotonic_ns();
    gpud::publish_window(client->pipeline_writable(), now, now + ns);
  }
  void close() { gpud::publish_window(client->pipeline_writable(), 0, 0); }
};

// Before main: the daemon must be up when the shim's first call reads ORION_POLICY. Stopped after
// the tests (not at static destruction, where its thread would still log into a dying spdlog).
Pipeline* g_pipeline = new Pipeline();
struct StopPipeline : ::testing::Environment {
  void TearDown() override {
    delete g_pipeline;
    g_pipeline = nullptr;
  }
};
[[maybe_unused]] ::testing::Environment* const g_stop_pipeline = ::testing::AddGlobalTestEnvironment(new StopPipeline);

bool launched_within(CUfunction k, int ms) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < end) {
    if (count_launches(calls(), k) == 1u) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return count_launches(calls(), k) == 1u;
}

TEST(GpudGating, BestEffortLaunchesGoOnlyInsideThePipelinesWindows) {
  ASSERT_TRUE(scheduled_mode());
  ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
  ASSERT_NE(use_device(0), nullptr);
  CUstream be = nullptr;
  ASSERT_EQ(cuStreamCreateWithPriority(&be, 0, 0), CUDA_SUCCESS);  // priority 0: best effort
  CUfunction first = fake_cuda_make_function("gpud_be_first", 0, nullptr);
  CUfunction second = fake_cuda_make_function("gpud_be_second", 0, nullptr);

  ASSERT_EQ(cuLaunchKernel(first, 1, 1, 1, 32, 1, 1, 0, be, nullptr, nullptr), CUDA_SUCCESS);
  EXPECT_FALSE(launched_within(first, 50)) << "a best-effort launch went with no window open";
  g_pipeline->open_for(5'000'000'000);  // long: a loaded machine still admits it inside
  EXPECT_TRUE(launched_within(first, 4000)) << "the window opened and the launch stayed held";

  g_pipeline->close();
  ASSERT_EQ(cuLaunchKernel(second, 1, 1, 1, 32, 1, 1, 0, be, nullptr, nullptr), CUDA_SUCCESS);
  EXPECT_FALSE(launched_within(second, 30));
  // A synchronisation needs the held work: it goes now, window or not.
  ASSERT_EQ(cuStreamSynchronize(be), CUDA_SUCCESS);
  EXPECT_EQ(count_launches(calls(), second), 1u);
  EXPECT_TRUE(wait_idle());
  EXPECT_EQ(cuStreamDestroy(be), CUDA_SUCCESS);
}

TEST(GpudGating, TheWholeProcessIsHeldTheLegacyStreamInOrder) {
  ASSERT_TRUE(scheduled_mode());
  ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
  ASSERT_NE(use_device(0), nullptr);
  auto set_thread = shim_fn<orion_set_thread_class_fn>("orion_set_thread_class");
  ASSERT_NE(set_thread, nullptr);
  ASSERT_EQ(set_thread("high_priority"), 0);  // accepted, and changes nothing in a gated process
  CUstream hp = nullptr;
  ASSERT_EQ(cuStreamCreateWithPriority(&hp, 0, -5), CUDA_SUCCESS);  // would be high priority elsewhere
  CUfunction on_hp = fake_cuda_make_function("gpud_on_hp_stream", 0, nullptr);
  CUfunction on_legacy = fake_cuda_make_function("gpud_on_legacy_stream", 0, nullptr);
  CUfunction after_legacy = fake_cuda_make_function("gpud_after_legacy", 0, nullptr);

  g_pipeline->close();
  ASSERT_EQ(cuLaunchKernel(on_hp, 1, 1, 1, 32, 1, 1, 0, hp, nullptr, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(cuLaunchKernel(on_legacy, 1, 1, 1, 32, 1, 1, 0, nullptr, nullptr, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(cuLaunchKernel(after_legacy, 1, 1, 1, 32, 1, 1, 0, hp, nullptr, nullptr), CUDA_SUCCESS);
  EXPECT_FALSE(launched_within(on_hp, 50)) << "a high-priority stream of a best-effort process went outside a window";
  EXPECT_EQ(count_launches(calls(), on_legacy), 0u) << "the legacy stream went outside a window";
  EXPECT_EQ(count_launches(calls(), after_legacy), 0u);

  g_pipeline->open_for(5'000'000'000);
  EXPECT_TRUE(launched_within(after_legacy, 4000)) << "the window opened and the launches stayed held";
  g_pipeline->close();
  const auto log = calls();
  const long a = find_launch(log, on_hp), b = find_launch(log, on_legacy), c = find_launch(log, after_legacy);
  ASSERT_GE(a, 0);
  ASSERT_GE(b, 0);
  EXPECT_LT(a, b) << "the legacy launch passed the blocking stream's earlier launch";
  EXPECT_LT(b, c) << "the blocking stream's launch passed the legacy launch before it";
  EXPECT_EQ(set_thread(nullptr), 0);
  EXPECT_TRUE(wait_idle());
  EXPECT_EQ(cuStreamDestroy(hp), CUDA_SUCCESS);
}

// cuStreamCreate streams are held like the rest; a launch on a per-thread default stream cannot be
// held for another thread to submit (its handle names the caller's stream): its caller waits until
// a window opens, then it goes.
TEST(GpudGating, PlainStreamsAreHeldAndPerThreadLaunchesWaitForAWindow) {
  ASSERT_TRUE(scheduled_mode());
  ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
  ASSERT_NE(use_device(0), nullptr);
  CUstream plain = nullptr;
  ASSERT_EQ(cuStreamCreate(&plain, 0), CUDA_SUCCESS);
  CUfunction on_plain = fake_cuda_make_function("gpud_on_plain_stream", 0, nullptr);
  CUfunction per_thread = fake_cuda_make_function("gpud_on_per_thread_stream", 0, nullptr);
  g_pipeline->close();
  ASSERT_EQ(cuLaunchKernel(on_plain, 1, 1, 1, 32, 1, 1, 0, plain, nullptr, nullptr), CUDA_SUCCESS);
  EXPECT_FALSE(launched_within(on_plain, 50)) << "a cuStreamCreate stream of a best-effort process went outside a window";
  std::atomic<bool> started{false}, returned{false};
  std::thread launcher([&] {
    ASSERT_NE(use_device(0), nullptr);  // this thread's current context
    started = true;
    EXPECT_EQ(cuLaunchKernel(per_thread, 1, 1, 1, 32, 1, 1, 0, CU_STREAM_PER_THREAD, nullptr, nullptr), CUDA_SUCCESS);
    returned = true;
  });
  while (!started.load()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  EXPECT_FALSE(returned.load()) << "a per-thread launch returned with no window open";
  EXPECT_EQ(count_launches(calls(), per_thread), 0u);
  g_pipeline->open_for(5'000'000'000);  // long: a loaded machine still admits it inside
  launcher.join();  // bounded: the shim lets a waiting per-thread launch go after 1 s in any case
  EXPECT_TRUE(returned.load());
  EXPECT_EQ(count_launches(calls(), per_thread), 1u);
  EXPECT_TRUE(launched_within(on_plain, 1000));
  g_pipeline->close();
  EXPECT_TRUE(wait_idle());
  EXPECT_EQ(cuStreamDestroy(plain), CUDA_SUCCESS);
}

}  // namespace

// ORION_POLICY=gpud through the dispatcher: best-effort ops wait for the pipeline's published
// window (no starvation bound pushes them out), go when it opens, and run freely once the pipeline
// is gone; bad parameters and a missing daemon are named.
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <thread>

#include "fake_device.h"
#include "gpud/gpud.h"
#include "in_process_daemon.h"
#include "scheduler/dispatcher.h"
#include "scheduler/policy.h"
#include "scheduler/profile_store.h"

namespace sched {
namespace {

using testing::FakeDevice;
using testing::kernel_op;

bool eventually(const std::function<bool()>& cond) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(3);
  while (std::chrono::steady_clock::now() < end) {
    if (cond()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  return cond();
}

TEST(GpudPolicyTest, ParametersAndAMissingDaemonAreNamed) {
  try {
    make_policy("gpud", {});
    ADD_FAILURE() << "accepted no gpu";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("parameter 'gpu'"), std::string::npos) << e.what();
  }
  try {
    make_policy("gpud", {{"gpu", "GPU-x"}, {"fallback", "maybe"}});
    ADD_FAILURE() << "accepted fallback=maybe";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'fallback'='maybe'"), std::string::npos) << e.what();
  }
  try {
    make_policy("gpud", {{"gpu", "GPU-none"}, {"dir", "/tmp/gpud-policy-nowhere"}});
    ADD_FAILURE() << "connected to no daemon";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("no orion-gpud for GPU GPU-none"), std::string::npos) << e.what();
  }
}

TEST(GpudPolicyTest, BestEffortWaitsForThePipelinesWindowNotForATimer) {
  // Stale after 10 s, in the daemon and the policy: the pipeline leaves by disconnecting, and a
  // stall of this thread between heartbeats must not free the held op.
  gpud::testing::InProcessDaemon daemon("GPU-policy", 2'000'000, gpud::testing::patient_grants());
  const std::filesystem::path& dir = daemon.dir;
  const gpud::DaemonOptions& options = daemon.options;
  {
    auto pipeline = std::make_unique<gpud::Client>(
        gpud::Client::connect(dir, options.gpu, gpud::Role::kPipeline, "pipeline"));
    gpud::PipelinePage& page = pipeline->pipeline_writable();
    gpud::heartbeat(page, gpud::monotonic_ns());

    FakeDevice dev;
    ProfileStore profiles;
    DispatcherOptions opt;
    opt.background_thread = false;
    opt.be_max_wait_ns = 1'000'000;  // would force a head out after 1 ms under any other policy
    opt.profiles = &profiles;
    auto policy = make_policy("gpud", {{"gpu", options.gpu}, {"dir", dir.string()}, {"stale_ms", "10000"}});
    Dispatcher d(dev, std::move(policy), opt);
    constexpr StreamId kBe = 2;
    d.set_stream_class(kBe, StreamClass::kBestEffort);

    // A pipeline is attached and heartbeating: the grant is gated from the hello on.
    ASSERT_EQ(d.submit(kernel_op(kBe, 7)), 0);
    for (int i = 0; i < 20; ++i) {  // 20 ms on the device's clock and real time: far past the bound
      dev.advance(1'000'000);
      gpud::heartbeat(page, gpud::monotonic_ns());
      d.pump();
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    EXPECT_EQ(dev.submitted_count(), 0u) << "a best-effort op went outside any window";
    EXPECT_EQ(d.stats().forced_by_starvation, 0u);

    const int64_t now = gpud::monotonic_ns();
    gpud::publish_window(page, now, now + 2'000'000'000);  // open for 2 s (a loaded machine may stall)
    ASSERT_TRUE(eventually([&] {
      d.pump();
      return dev.submitted_count() == 1;
    }));

    // The pipeline goes: best effort runs freely.
    gpud::publish_window(page, 0, 0);
    pipeline.reset();
    ASSERT_EQ(d.submit(kernel_op(kBe, 8)), 0);
    ASSERT_TRUE(eventually([&] {
      d.pump();
      return dev.submitted_count() == 2;
    }));
    d.drain_all();
  }
}

// A best-effort process (the gpud policy) of a daemon with a 50 ms lease, with no pipeline: it runs
// freely; stop_daemon() stops the daemon and waits until its lease ran out (the process holds).
struct DaemonRestart {
  gpud::testing::TempDir folder;
  gpud::DaemonOptions options;
  std::unique_ptr<gpud::testing::DaemonThread> daemon;
  std::unique_ptr<Policy> policy;
  const Op op = kernel_op(2, 7);
  OpEstimate est{.duration_ns = 10'000};
  const DeviceState state;

  explicit DaemonRestart(const std::string& gpu) {
    options.gpu = gpu;
    options.dir = folder.path;
    options.tick_ns = 2'000'000;
    options.grants.lease_ns = 50'000'000;
    daemon = std::make_unique<gpud::testing::DaemonThread>(options);
    policy = make_policy("gpud", {{"gpu", options.gpu}, {"dir", folder.path.string()}});
  }
  bool admit() { return policy->admit(op, est, state); }
  void stop_daemon() {
    daemon.reset();
    ASSERT_TRUE(eventually([&] { return !admit(); })) << "the lease never ran out";
  }
  void start_daemon() { daemon = std::make_unique<gpud::testing::DaemonThread>(options); }
};

// The daemon stops (an upgrade, a crash) and another starts on the same folder: once the old
// lease runs out the best-effort process holds (fallback=hold), then reaches the new daemon on
// its own and runs again as that daemon's client (without it, it held until it exited).
TEST(GpudPolicyTest, ABestEffortProcessReachesARestartedDaemon) {
  DaemonRestart r("GPU-restart");
  const gpud::DaemonOptions& options = r.options;
  ASSERT_TRUE(eventually([&] { return r.admit(); })) << "no pipeline: best effort runs freely";
  r.stop_daemon();
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // a retry finds no daemon and waits
  EXPECT_FALSE(r.admit());

  r.start_daemon();
  gpud::Client observer = gpud::Client::connect(r.folder.path, options.gpu, gpud::Role::kObserver, "test");
  EXPECT_TRUE(eventually([&] {
    (void)r.admit();
    return observer.status().dump().find("libgpu_scheduler") != std::string::npos;
  })) << "the best-effort process did not reach the restarted daemon";
  // The new daemon has no pipeline yet, but the pipeline may just not have reconnected: the
  // process waits for it a while instead of running free beside it.
  EXPECT_FALSE(r.admit()) << "ran free before the pipeline could reconnect";
  // The pipeline comes back and publishes a window: best effort runs inside it.
  auto pipeline = std::make_unique<gpud::Client>(
      gpud::Client::connect(r.folder.path, options.gpu, gpud::Role::kPipeline, "pipeline"));
  gpud::PipelinePage& page = pipeline->pipeline_writable();
  const int64_t now = gpud::monotonic_ns();
  gpud::heartbeat(page, now);
  gpud::publish_window(page, now, now + 2'000'000'000);
  EXPECT_TRUE(eventually([&] {
    gpud::heartbeat(page, gpud::monotonic_ns());
    return r.admit();
  })) << "the reconnected process did not run inside the pipeline's window";
}

// Each reconnection closes the socket of the connection the old daemon hung up on (its pages stay
// mapped for threads still reading them): a daemon restarted again and again used to leave one
// descriptor per restart in every best-effort process.
TEST(GpudPolicyTest, RestartsLeaveNoSocketBehind) {
  DaemonRestart r("GPU-restarts");
  ASSERT_TRUE(eventually([&] { return r.admit(); }));
  // Sockets only: a sanitizer runtime may open files of its own at any time.
  const auto open_sockets = [] {
    size_t n = 0;
    for (const auto& fd : std::filesystem::directory_iterator("/proc/self/fd")) {
      std::error_code ec;
      n += std::filesystem::read_symlink(fd.path(), ec).string().rfind("socket:", 0) == 0;
    }
    return n;
  };
  const auto restart = [&] {
    r.stop_daemon();
    r.start_daemon();
    gpud::Client observer = gpud::Client::connect(r.folder.path, r.options.gpu, gpud::Role::kObserver, "test");
    return eventually([&] {
      (void)r.admit();
      return observer.status().dump().find("libgpu_scheduler") != std::string::npos;
    });
  };
  // The in-process daemon closes its end of the observer's connection a tick after the observer
  // goes: the count is read once it settles.
  const auto settled_sockets = [&] {
    size_t before = open_sockets();
    for (int i = 0; i < 50; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      const size_t now = open_sockets();
      if (now == before) return now;
      before = now;
    }
    return before;
  };
  ASSERT_TRUE(restart());
  const size_t sockets = settled_sockets();
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(restart()) << "restart " << i;
  EXPECT_TRUE(eventually([&] { return open_sockets() <= sockets; }))
      << open_sockets() << " sockets after 3 reconnections, " << sockets << " after the first";
}

// No pipeline comes back: after the wait best effort runs freely again.
TEST(GpudPolicyTest, AfterARestartWithoutAPipelineBestEffortRunsFreeAgain) {
  DaemonRestart r("GPU-restart-alone");
  ASSERT_TRUE(eventually([&] { return r.admit(); }));
  r.stop_daemon();
  r.start_daemon();
  const auto restarted = std::chrono::steady_clock::now();
  bool ran = false;
  while (!ran && std::chrono::steady_clock::now() - restarted < std::chrono::seconds(10)) {
    ran = r.admit();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  EXPECT_TRUE(ran) << "best effort stayed held with no pipeline";
  EXPECT_GE(std::chrono::steady_clock::now() - restarted, std::chrono::milliseconds(2900))
      << "best effort ran free before a pipeline could have reconnected";
}

}  // namespace
}  // namespace sched

// The pipeline's side of bubble filling: idle windows from measured spans, and their publication
// to a live orion-gpud in step order, each before it opens.
#include <gtest/gtest.h>

#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <functional>
#include <memory>
#include <thread>

#include "gpud/gpud.h"
#include "in_process_daemon.h"
#include "trainer/colocation/bubble_publisher.h"

namespace gpipe {
namespace {

TEST(IdleWindowsTest, GapsInTheUnionOfBusySpansLongEnoughToUse) {
  // Two ranks sharing a device: busy [0,10) and [5,20) overlap; [20,30) idle; [30,32) busy; then a
  // 1 us gap (too short) and idle to the wall.
  const auto w = idle_windows({{30, 32}, {0, 10}, {5, 20}, {33, 40}}, 100, 2);
  ASSERT_EQ(w.size(), 2u);
  EXPECT_DOUBLE_EQ(w[0].start_us, 20);
  EXPECT_DOUBLE_EQ(w[0].end_us, 30);
  EXPECT_DOUBLE_EQ(w[1].start_us, 40);
  EXPECT_DOUBLE_EQ(w[1].end_us, 100);
  // Idle before the first span too; nothing when always busy; all idle when nothing ran.
  EXPECT_DOUBLE_EQ(idle_windows({{50, 100}}, 100, 1).at(0).end_us, 50);
  EXPECT_TRUE(idle_windows({{0, 100}}, 100, 1).empty());
  ASSERT_EQ(idle_windows({}, 100, 1).size(), 1u);
}

TEST(BubblePublisherTest, WindowsArePublishedInOrderBeforeTheyOpen) {
  gpud::testing::InProcessDaemon daemon("GPU-publisher");
  const std::filesystem::path& dir = daemon.dir;
  const gpud::DaemonOptions& options = daemon.options;
  {
    gpud::Client be = gpud::Client::connect(dir, options.gpu, gpud::Role::kBestEffort, "observer");
    BubblePublisher publisher(options.gpu, dir);
    // The step starts at the publisher's own clock read, somewhere in [before, after].
    const int64_t before = gpud::monotonic_ns();
    publisher.begin_step({{20'000, 40'000}, {60'000, 70'000}});  // us: [20, 40) ms and [60, 70) ms
    const int64_t after = gpud::monotonic_ns();
    std::vector<gpud::WindowView> seen;
    bool published_ahead = true;
    int64_t last_unseen_ns = before;  // the last read that did not show the newest window
    while (gpud::monotonic_ns() - after < 90'000'000) {
      const int64_t read_at = gpud::monotonic_ns();
      const gpud::WindowView w = gpud::read_window(be.pipeline());
      if (w.windows_published > 0 && (seen.empty() || seen.back().windows_published != w.windows_published)) {
        seen.push_back(w);
        // Published ahead: each window is on the page before it opens. Judged by the last read that
        // did not show it (the reader being late to see it is not the publisher being late).
        published_ahead &= last_unseen_ns <= w.open_ns + 1'000'000;
      }
      last_unseen_ns = read_at;
      std::this_thread::sleep_for(std::chrono::microseconds(200));
    }
    ASSERT_EQ(seen.size(), 2u);
    EXPECT_TRUE(published_ahead);
    EXPECT_GE(seen[0].open_ns, before + 20'000'000);
    EXPECT_LE(seen[0].open_ns, after + 20'000'000);
    EXPECT_NEAR(static_cast<double>(seen[0].close_ns - seen[0].open_ns), 20e6, 1e3);
    EXPECT_NEAR(static_cast<double>(seen[1].open_ns - seen[0].open_ns), 40e6, 1e3);
    EXPECT_EQ(publisher.windows_published(), 2u);
    // It heartbeats between windows: the grant is gated, not freed as stale.
    EXPECT_EQ(gpud::read_grant(be.grant()).mode, gpud::GrantMode::kGated);
  }
}

// The pipeline starts computing inside a predicted window: demand() closes it at once, and a
// best-effort admission after it holds; outside a window it changes nothing.
TEST(BubblePublisherTest, DemandCutsTheOpenWindowShort) {
  gpud::testing::InProcessDaemon daemon("GPU-demand");
  gpud::Client be = gpud::Client::connect(daemon.dir, daemon.options.gpu, gpud::Role::kBestEffort, "observer");
  BubblePublisher publisher(daemon.options.gpu, daemon.dir);
  publisher.demand();  // nothing open yet: nothing cut
  EXPECT_EQ(publisher.windows_cut(), 0u);
  publisher.compute_done();
  publisher.begin_step({{0, 5'000'000}});  // [0, 5) s
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (gpud::read_window(be.pipeline()).windows_published == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  gpud::AdmissionConfig config;
  auto grant = [&] {  // the daemon's tick gates the grant once it sees the pipeline
    gpud::GrantView g = gpud::read_grant(be.grant());
    return g;
  };
  while (grant().mode != gpud::GrantMode::kGated && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  int64_t now = gpud::monotonic_ns();
  ASSERT_EQ(gpud::admit(gpud::read_window(be.pipeline()), grant(), now, 100'000, 0, config).verdict, gpud::Verdict::kRun);
  const int64_t before = gpud::monotonic_ns();
  publisher.demand();
  const gpud::WindowView w = gpud::read_window(be.pipeline());
  EXPECT_GE(w.close_ns, before);
  EXPECT_LE(w.close_ns, gpud::monotonic_ns());
  EXPECT_EQ(publisher.windows_cut(), 1u);
  now = gpud::monotonic_ns();
  EXPECT_EQ(gpud::admit(w, grant(), now, 100'000, 0, config).verdict, gpud::Verdict::kHold);
  publisher.compute_done();  // the cut is for good: the rest of that window stays unused
  EXPECT_LE(gpud::read_window(be.pipeline()).close_ns, gpud::monotonic_ns());
  publisher.demand();  // already closed: nothing to cut
  EXPECT_EQ(publisher.windows_cut(), 1u);
}

// A step that ran faster than the last (whose timing planned its windows) left windows over the
// optimizer step and a checkpoint, which run on the device too: end_step() closes the one open and
// drops those ahead, until the next begin_step.
TEST(BubblePublisherTest, EndStepClosesTheStepsWindowsForWhatFollows) {
  gpud::testing::InProcessDaemon daemon("GPU-end-step");
  gpud::Client be = gpud::Client::connect(daemon.dir, daemon.options.gpu, gpud::Role::kBestEffort, "observer");
  BubblePublisher publisher(daemon.options.gpu, daemon.dir);
  publisher.begin_step({{0, 5'000'000}, {6'000'000, 7'000'000}});  // [0, 5) s and [6, 7) s
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (gpud::read_window(be.pipeline()).windows_published == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_GT(gpud::read_window(be.pipeline()).close_ns, gpud::monotonic_ns()) << "the first window is open";
  const int64_t before = gpud::monotonic_ns();
  publisher.end_step();
  const gpud::WindowView w = gpud::read_window(be.pipeline());
  EXPECT_GE(w.close_ns, before);
  EXPECT_LE(w.close_ns, gpud::monotonic_ns()) << "the open window was not closed";
  EXPECT_EQ(publisher.windows_cut(), 1u);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));  // the publishing thread runs again
  EXPECT_EQ(gpud::read_window(be.pipeline()).windows_published, w.windows_published) << "the next window was published";
  EXPECT_LE(gpud::read_window(be.pipeline()).close_ns, gpud::monotonic_ns());
}

// The publishing thread can wake after a window's planned close (an action's device work was asked
// about slowly, a reconnect): such a window was published as [now, close), open after close, and
// the page's count of idle time offered went down.
TEST(BubblePublisherTest, AWindowOverBeforeItsTurnIsNeverPublished) {
  gpud::testing::InProcessDaemon daemon("GPU-late");
  gpud::Client be = gpud::Client::connect(daemon.dir, daemon.options.gpu, gpud::Role::kBestEffort, "observer");
  BubblePublisher publisher(daemon.options.gpu, daemon.dir);
  std::atomic<int> asked{0};
  publisher.demand();
  publisher.begin_step({{0, 300}, {400, 700}});  // [0, 300) and [400, 700) us
  publisher.compute_done([&] {
    // Asked first here, then by the publishing thread, which is held 2 ms past both windows.
    if (asked.fetch_add(1) == 0) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return true;
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (asked.load() < 2 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the thread's next turns
  const gpud::WindowView w = gpud::read_window(be.pipeline());
  EXPECT_GE(w.window_ns_published, 0) << "a window over before its turn was published";
  EXPECT_LE(w.open_ns, w.close_ns);
}

// An action running when the next window was to open keeps it closed until compute_done(); then
// the window is published again, from now to its planned close.
TEST(BubblePublisherTest, AWindowStaysClosedWhileAnActionRuns) {
  gpud::testing::InProcessDaemon daemon("GPU-busy");
  gpud::Client be = gpud::Client::connect(daemon.dir, daemon.options.gpu, gpud::Role::kBestEffort, "observer");
  BubblePublisher publisher(daemon.options.gpu, daemon.dir);
  publisher.demand();  // an action starts before any window
  publisher.begin_step({{30'000, 5'000'000}});  // [30 ms, 5 s)
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  while (gpud::read_window(be.pipeline()).windows_published == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(40));  // past the planned open
  gpud::WindowView w = gpud::read_window(be.pipeline());
  EXPECT_GE(w.open_ns, w.close_ns) << "a window opened while the action ran";
  publisher.compute_done();
  w = gpud::read_window(be.pipeline());
  const int64_t now = gpud::monotonic_ns();
  EXPECT_LE(w.open_ns, now);
  EXPECT_GT(w.close_ns, now + 4'000'000'000) << "reopened to its planned close";
  publisher.compute_done();  // unmatched: ignored
  EXPECT_GT(gpud::read_window(be.pipeline()).close_ns, now);
}

// On a GPU an action's work is issued long before it has run: the window stays closed until the
// device has run it (the executor passes its finished event), not only until the host issued it.
TEST(BubblePublisherTest, AWindowStaysClosedUntilTheActionsDeviceWorkHasRun) {
  gpud::testing::InProcessDaemon daemon("GPU-issued");
  gpud::Client be = gpud::Client::connect(daemon.dir, daemon.options.gpu, gpud::Role::kBestEffort, "observer");
  BubblePublisher publisher(daemon.options.gpu, daemon.dir);
  publisher.demand();
  publisher.begin_step({{0, 5'000'000}});  // [0, 5 s): open now, were nothing running
  std::atomic<bool> ran{false};
  publisher.compute_done([&ran] { return ran.load(); });  // issued, still running on the device
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  gpud::WindowView w = gpud::read_window(be.pipeline());
  EXPECT_GE(w.open_ns, w.close_ns) << "a window opened while the device still ran the action";
  ran = true;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(2);
  do {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
    w = gpud::read_window(be.pipeline());
  } while (w.open_ns >= w.close_ns && std::chrono::steady_clock::now() < deadline);
  EXPECT_LT(w.open_ns, w.close_ns) << "the window did not open once the device had run the action";
  publisher.compute_done([] { return true; });  // unmatched: ignored
}

TEST(BubblePublisherTest, ItReattachesToARestartedDaemonAndRepublishesTheOpenWindow) {
  gpud::testing::InProcessDaemon daemon("GPU-restarted");
  const gpud::DaemonOptions& options = daemon.options;
  BubblePublisher publisher(options.gpu, daemon.dir);
  const int64_t before = gpud::monotonic_ns();  // the step starts in [before, after]
  publisher.begin_step({{0, 5'000'000}});  // [0, 5) s: still open after the restart
  const int64_t after = gpud::monotonic_ns();
  auto eventually = [](const std::function<bool()>& cond) {
    for (int i = 0; i < 1500 && !cond(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return cond();
  };
  ASSERT_TRUE(eventually([&] { return publisher.windows_published() == 1; }));
  // A best-effort process of the first daemon: it reads that daemon's page until it reconnects.
  gpud::Client old_reader = gpud::Client::connect(daemon.dir, options.gpu, gpud::Role::kBestEffort, "old reader");
  daemon.running.reset();  // stopped: the page it handed over is read by no one now
  daemon.running = std::make_unique<gpud::testing::DaemonThread>(options);
  ASSERT_TRUE(eventually([&] { return publisher.reconnects() == 1; })) << "the publisher did not reattach";
  // The publisher writes the new page only: the old one was left closed and without a heartbeat
  // (its readers hold), not open with the last window while the pipeline computes.
  const gpud::WindowView old_page = gpud::read_window(old_reader.pipeline());
  EXPECT_EQ(old_page.heartbeat_ns, 0);
  EXPECT_GE(old_page.open_ns, old_page.close_ns) << "the old page was left with its window open";
  gpud::Client be = gpud::Client::connect(daemon.dir, options.gpu, gpud::Role::kBestEffort, "observer");
  // The new daemon's page holds the open window, and the heartbeat keeps the grant gated.
  ASSERT_TRUE(eventually([&] { return gpud::read_grant(be.grant()).mode == gpud::GrantMode::kGated; }));
  const gpud::WindowView w = gpud::read_window(be.pipeline());
  EXPECT_EQ(w.windows_published, 1u);
  EXPECT_GE(w.close_ns, before + 5'000'000'000);
  EXPECT_LE(w.close_ns, after + 5'000'000'000);
}

// Best-effort processes read the page a daemon handed over until their leases on its grant run
// out, also after the daemon is gone (killed, crashed): the publisher keeps that page's heartbeat
// and windows going until a new daemon takes over. A page gone quiet read as "no pipeline" there.
TEST(BubblePublisherTest, ThePageOfADaemonThatHungUpStaysLiveUntilANewOneTakesOver) {
  gpud::testing::InProcessDaemon daemon("GPU-orphan");
  BubblePublisher publisher(daemon.options.gpu, daemon.dir);
  gpud::Client be = gpud::Client::connect(daemon.dir, daemon.options.gpu, gpud::Role::kBestEffort, "reader");
  const int64_t before = gpud::monotonic_ns();  // the step starts in [before, after]
  publisher.begin_step({{0, 5'000'000}});
  const int64_t after = gpud::monotonic_ns();
  auto eventually = [](const std::function<bool()>& cond) {
    for (int i = 0; i < 1500 && !cond(); ++i) std::this_thread::sleep_for(std::chrono::milliseconds(2));
    return cond();
  };
  ASSERT_TRUE(eventually([&] { return publisher.windows_published() == 1; }));
  daemon.running.reset();
  ASSERT_TRUE(eventually([&] { return !be.daemon_alive(); }));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // past the 200 ms staleness
  // Each reconnect attempt quiets the page for its length (a daemon still alive may reset it);
  // between attempts it is live.
  gpud::WindowView w{};
  ASSERT_TRUE(eventually([&] {
    w = gpud::read_window(be.pipeline());
    return w.heartbeat_ns > gpud::monotonic_ns() - 50'000'000 && w.open_ns < w.close_ns;
  })) << "the page the reader holds went quiet";
  EXPECT_GE(w.windows_published, 1u);
  EXPECT_GE(w.close_ns, before + 5'000'000'000);
  EXPECT_LE(w.close_ns, after + 5'000'000'000);
}

TEST(BubblePublisherTest, NoDaemonIsAClearError) {
  try {
    BubblePublisher publisher("GPU-none", "/tmp/gpub-nowhere");
    ADD_FAILURE() << "attached to no daemon";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("parallel.publish_bubbles_gpu: no orion-gpud for GPU GPU-none"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace gpipe

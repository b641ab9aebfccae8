// The pure parts of cross-process bubble filling, under a fake clock: a best-effort launch's
// admission, the shared pages' sequence locks (also under TSan), the daemon's grant decisions.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <thread>

#include "gpud/gpud.h"

namespace gpud {
namespace {

constexpr int64_t kMs = 1'000'000;
constexpr int64_t kUs = 1'000;

struct AdmissionTest : ::testing::Test {
  const int64_t now = 10'000 * kMs;
  WindowView window{now - 1 * kMs, now + 4 * kMs, 3, now - 1 * kMs};  // open, 4 ms left, live
  GrantView grant{GrantMode::kGated, 7, now + 100 * kMs, 2 * kMs};
  AdmissionConfig config;  // guard 50 us, stale 200 ms, unknown kernels need 5 ms
};

TEST_F(AdmissionTest, AKernelThatFitsTheOpenWindowRuns) {
  const Decision d = admit(window, grant, now, 500 * kUs, 500 * kUs, config);
  EXPECT_EQ(d.verdict, Verdict::kRun) << d.reason;
  EXPECT_TRUE(d.in_window) << "counts as filling the pipeline's bubble";
  grant.mode = GrantMode::kFree;  // runs too, but fills no bubble
  const Decision free = admit(window, grant, now, 500 * kUs, 500 * kUs, config);
  EXPECT_EQ(free.verdict, Verdict::kRun);
  EXPECT_FALSE(free.in_window);
}

TEST_F(AdmissionTest, WorkPastTheWindowsCloseIsHeld) {
  window.close_ns = now + 600 * kUs;  // 550 us usable after the guard
  EXPECT_EQ(admit(window, grant, now, 500 * kUs, 0, config).verdict, Verdict::kRun);
  EXPECT_EQ(admit(window, grant, now, 500 * kUs, 100 * kUs, config).verdict, Verdict::kHold);
  EXPECT_STREQ(admit(window, grant, now, 500 * kUs, 100 * kUs, config).reason, "does not fit before the window closes");
}

TEST_F(AdmissionTest, TheInFlightBudgetBoundsWorkInsideAWindow) {
  window.close_ns = now + 100 * kMs;
  EXPECT_EQ(admit(window, grant, now, 1 * kMs, 1 * kMs, config).verdict, Verdict::kRun);  // exactly the budget
  const Decision d = admit(window, grant, now, 1 * kMs, 1 * kMs + 1, config);
  EXPECT_EQ(d.verdict, Verdict::kHold);
  EXPECT_STREQ(d.reason, "in-flight budget full");
  // Alone, a kernel longer than the budget still goes (it fits the window): no stall at it.
  EXPECT_EQ(admit(window, grant, now, 30 * kMs, 0, config).verdict, Verdict::kRun);
  EXPECT_EQ(admit(window, grant, now, 3 * kMs, 1, config).verdict, Verdict::kHold);
  // With max_alone set, only up to it.
  config.max_alone_ns = 8 * kMs;
  EXPECT_EQ(admit(window, grant, now, 8 * kMs, 0, config).verdict, Verdict::kRun);
  const Decision too_long = admit(window, grant, now, 8 * kMs + 1, 0, config);
  EXPECT_EQ(too_long.verdict, Verdict::kHold);
  EXPECT_STREQ(too_long.reason, "kernel longer than max_alone");
}

TEST_F(AdmissionTest, OutsideAWindowOrBeforeItOpensNothingRuns) {
  window.open_ns = now + 1 * kMs;  // published ahead of time
  EXPECT_EQ(admit(window, grant, now, 1 * kUs, 0, config).verdict, Verdict::kHold);
  EXPECT_EQ(admit(window, grant, now + 1 * kMs, 1 * kUs, 0, config).verdict, Verdict::kRun);
  EXPECT_EQ(admit(window, grant, window.close_ns, 1 * kUs, 0, config).verdict, Verdict::kHold);
  window.windows_published = 0;
  EXPECT_EQ(admit(window, grant, now + 2 * kMs, 1 * kUs, 0, config).verdict, Verdict::kHold);
}

TEST_F(AdmissionTest, AKernelOfUnknownLengthOnlyGoesAloneIntoALongWindow) {
  EXPECT_EQ(admit(window, grant, now, -1, 0, config).verdict, Verdict::kHold);  // 4 ms left < 5 ms
  window.close_ns = now + 20 * kMs;
  EXPECT_EQ(admit(window, grant, now, -1, 0, config).verdict, Verdict::kRun);
  EXPECT_EQ(admit(window, grant, now, -1, 10 * kUs, config).verdict, Verdict::kHold);
}

// A pipeline gone quiet under a gated grant holds best-effort work: the daemon frees the grant
// once it notices (within a tick), and a page nobody writes any more (its daemon killed, the
// pipeline maybe live) must not let work run beside the pipeline until the lease runs out.
TEST_F(AdmissionTest, AStaleOrAbsentPipelineUnderAGatedGrantHolds) {
  window.heartbeat_ns = now - 201 * kMs;
  window.windows_published = 0;
  Decision d = admit(window, grant, now, -1, 5 * kMs, config);
  EXPECT_EQ(d.verdict, Verdict::kHold);
  EXPECT_STREQ(d.reason, "pipeline heartbeat stale: holding until the daemon frees the grant");
  window.heartbeat_ns = 0;
  EXPECT_EQ(admit(window, grant, now, -1, 5 * kMs, config).verdict, Verdict::kHold);
  // A heartbeat from the future (another clock) is not a live pipeline either.
  window.heartbeat_ns = now + 201 * kMs;
  EXPECT_EQ(admit(window, grant, now, -1, 5 * kMs, config).verdict, Verdict::kHold);
  window.heartbeat_ns = INT64_MAX;
  EXPECT_EQ(admit(window, grant, now, -1, 5 * kMs, config).verdict, Verdict::kHold);
  // Once the daemon frees the grant, work runs.
  grant.mode = GrantMode::kFree;
  EXPECT_EQ(admit(window, grant, now, -1, 5 * kMs, config).verdict, Verdict::kRun);
}

// A torn read (the pipeline mid-publication) has no heartbeat in it, but it is not a pipeline
// gone: the launch waits for the next read instead of running free.
TEST_F(AdmissionTest, ATornWindowHoldsRatherThanFreesTheLaunch) {
  WindowView torn{};
  torn.torn = true;
  const Decision d = admit(torn, grant, now, 1 * kUs, 0, config);
  EXPECT_EQ(d.verdict, Verdict::kHold);
  EXPECT_STREQ(d.reason, "window being published");
}

TEST_F(AdmissionTest, FreeAndRevokedGrantsOverrideTheWindow) {
  window.open_ns = now + 10 * kMs;  // closed now
  grant.mode = GrantMode::kFree;
  EXPECT_EQ(admit(window, grant, now, 1 * kUs, 0, config).verdict, Verdict::kRun);
  grant.mode = GrantMode::kRevoked;
  window.open_ns = now - 1 * kMs;  // open now
  EXPECT_EQ(admit(window, grant, now, 1 * kUs, 0, config).verdict, Verdict::kHold);
}

TEST_F(AdmissionTest, AnExpiredLeaseFallsBackAsTheUserChose) {
  grant.lease_expiry_ns = now;  // the daemon stopped renewing it
  Decision d = admit(window, grant, now, 1 * kUs, 0, config);
  EXPECT_EQ(d.verdict, Verdict::kHold);
  EXPECT_STREQ(d.reason, "lease expired: holding");
  config.fallback = Fallback::kPassThrough;
  grant.mode = GrantMode::kRevoked;  // the lease decides first: the grant is not trusted any more
  d = admit(window, grant, now, 1 * kUs, 0, config);
  EXPECT_EQ(d.verdict, Verdict::kRun);
  EXPECT_STREQ(d.reason, "lease expired: passing through");
}

// A daemon killed mid-write leaves its grant page torn for good. A reader keeping the last good
// lease holds while that lease runs, then reads an expired grant, so its fallback applies
// (orion-gpud-fill read the page directly and held for ever, even with --fallback pass).
TEST(GpudGrant, ATornPageHoldsOnlyWhileTheLastGoodLeaseRuns) {
  GrantPage page{};
  init_grant_page(page);
  const int64_t now = monotonic_ns();
  write_grant(page, GrantView{.mode = GrantMode::kGated, .lease_expiry_ns = now + 1'000'000'000});
  std::atomic<int64_t> last_good{0};
  EXPECT_FALSE(read_grant_keeping_lease(page, now, last_good).torn);
  EXPECT_EQ(last_good.load(), now + 1'000'000'000);
  page.epoch.fetch_add(1);  // odd: the daemon died writing it
  EXPECT_TRUE(read_grant_keeping_lease(page, now + 500'000'000, last_good).torn) << "inside the lease: hold";
  const GrantView after = read_grant_keeping_lease(page, now + 1'000'000'001, last_good);
  EXPECT_FALSE(after.torn);
  AdmissionConfig config;
  config.fallback = Fallback::kPassThrough;
  EXPECT_EQ(admit(WindowView{}, after, now + 1'000'000'001, 1 * kUs, 0, config).verdict, Verdict::kRun)
      << "past the lease the fallback (pass) applies";
}

// A grant read torn (the daemon preempted mid-write) holds, fallback or not: read as "lease
// expired" (it was), a fallback=pass client ran beside a live, gated pipeline.
TEST_F(AdmissionTest, ATornGrantHoldsWhateverTheFallback) {
  config.fallback = Fallback::kPassThrough;
  const Decision d = admit(window, GrantView{.torn = true}, now, 1 * kUs, 0, config);
  EXPECT_EQ(d.verdict, Verdict::kHold);
  EXPECT_STREQ(d.reason, "grant being written");
  // Revoked by a live daemon (a lease still running): held too, whatever the fallback.
  grant.mode = GrantMode::kRevoked;
  EXPECT_EQ(admit(window, grant, now, 1 * kUs, 0, config).verdict, Verdict::kHold);
}

// One writer publishes windows whose length is always 1000 ns; readers must never see the open of
// one publication with the close of another (the sequence lock), under TSan too.
TEST(SharedPagesTest, ReadersSeeWholeWindowsWhileTheWriterPublishes) {
  auto page = std::make_unique<PipelinePage>();
  init_pipeline_page(*page);
  auto grants = std::make_unique<GrantPage>();
  init_grant_page(*grants);
  std::atomic<bool> done{false}, reading{false};
  std::thread writer([&] {
    while (!reading.load()) std::this_thread::yield();  // the reader is in its loop: reads overlap writes
    for (int64_t i = 1; i <= 20000; ++i) {
      publish_window(*page, i * 7, i * 7 + 1000);
      write_grant(*grants, {i % 2 ? GrantMode::kGated : GrantMode::kFree, 0, i * 11, i * 11 + 5});
    }
    done = true;
  });
  int64_t torn = 0, reads = 0, whole = 0;
  uint64_t last_count = 0;
  reading = true;
  while (!done.load()) {
    const WindowView w = read_window(*page);
    // A read that gave up (its 50 us budget spent: likely under a sanitizer) says so and is empty;
    // every other one must be a whole window that never goes back.
    if (!w.torn) {
      ++whole;
      if (w.windows_published != 0 && w.close_ns - w.open_ns != 1000) ++torn;
      if (w.windows_published < last_count) ++torn;  // never goes back
      last_count = w.windows_published;
    } else if (w.windows_published != 0 || w.heartbeat_ns != 0) {
      ++torn;  // a given-up read must carry nothing
    }
    const GrantView g = read_grant(*grants);
    if (g.epoch != 0 && g.inflight_budget_ns - g.lease_expiry_ns != 5) ++torn;
    ++reads;
  }
  writer.join();
  EXPECT_GT(whole, 0);
  EXPECT_EQ(torn, 0) << "of " << reads << " reads";
  EXPECT_EQ(read_window(*page).windows_published, 20000u);
  EXPECT_EQ(read_grant(*grants).epoch, 20000u);
}

// A writer killed between its stores leaves the sequence odd: readers give up (the page reads as
// empty: no window, no heartbeat; a grant as revoked and expired) instead of spinning, and the
// daemon's reset makes the page readable for the next pipeline.
TEST(SharedPagesTest, APageLeftMidWriteReadsAsEmptyAndTheDaemonResetsIt) {
  auto page = std::make_unique<PipelinePage>();
  init_pipeline_page(*page);
  publish_window(*page, 100, 200);
  heartbeat(*page, 50);
  page->seq.fetch_add(1);  // killed mid-publication
  const WindowView w = read_window(*page);
  EXPECT_TRUE(w.torn);
  EXPECT_EQ(w.windows_published, 0u);
  EXPECT_EQ(w.heartbeat_ns, 0);
  reset_pipeline_page(*page);
  publish_window(*page, 300, 400);
  EXPECT_EQ(read_window(*page).open_ns, 300);
  EXPECT_EQ(read_window(*page).windows_published, 1u);

  auto grant = std::make_unique<GrantPage>();
  init_grant_page(*grant);
  write_grant(*grant, {GrantMode::kFree, 0, 1'000, 5});
  grant->epoch.fetch_add(1);  // the daemon died mid-write
  const GrantView g = read_grant(*grant);
  EXPECT_EQ(g.mode, GrantMode::kRevoked);
  EXPECT_EQ(g.lease_expiry_ns, 0);
}

// A writer that keeps the sequence odd but moving (1, 3, 5, ...: broken or hostile) used to keep
// a reader spinning for ever (the give-up clock restarted with each new odd value): every read
// now ends within its budget, torn, and the daemon's loop and best-effort launches go on.
TEST(SharedPagesTest, AWriterThatKeepsThePageOddCannotStallAReader) {
  auto page = std::make_unique<PipelinePage>();
  init_pipeline_page(*page);
  auto grant = std::make_unique<GrantPage>();
  init_grant_page(*grant);
  std::atomic<bool> stop{false};
  std::thread hostile([&] {
    uint64_t odd = 1;
    while (!stop.load()) {
      page->seq.store(odd);
      grant->epoch.store(odd);
      odd += 2;
    }
  });
  while ((page->seq.load() & 1) == 0 || (grant->epoch.load() & 1) == 0) std::this_thread::yield();
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 20; ++i) {
    EXPECT_TRUE(read_window(*page).torn);
    EXPECT_TRUE(read_grant(*grant).torn);
  }
  const auto took = std::chrono::steady_clock::now() - start;
  stop = true;
  hostile.join();
  // 40 reads of at most 50 us each: far under a second even on a loaded machine (was: never).
  EXPECT_LT(took, std::chrono::seconds(1));
}

TEST(GrantBookTest, LeasesRenewEveryTickAndModesFollowThePipelinesHeartbeat) {
  GrantConfig config{.lease_ns = 100 * kMs, .stale_after_ns = 50 * kMs, .inflight_budget_ns = 2 * kMs};
  GrantBook book(config);
  int64_t t = 1'000 * kMs;
  const int be = book.add(Role::kBestEffort, 100, "eval", t);
  WindowView pipeline{};  // no pipeline yet
  book.tick(pipeline, t);
  EXPECT_EQ(book.grant(be).mode, GrantMode::kFree);
  EXPECT_EQ(book.grant(be).lease_expiry_ns, t + 100 * kMs);

  const int p = book.add(Role::kPipeline, 200, "gpipe_runner", t);
  EXPECT_THROW(book.add(Role::kPipeline, 201, "second", t), ProtocolError);
  pipeline.heartbeat_ns = t;
  t += 10 * kMs;
  book.tick(pipeline, t);
  EXPECT_EQ(book.grant(be).mode, GrantMode::kGated);
  EXPECT_EQ(book.grant(be).lease_expiry_ns, t + 100 * kMs);
  const uint64_t epoch = book.grant(be).epoch;

  t += 51 * kMs;  // heartbeat 61 ms old: stale
  book.tick(pipeline, t);
  EXPECT_EQ(book.grant(be).mode, GrantMode::kFree);
  EXPECT_GT(book.grant(be).epoch, epoch);

  book.remove(p, "killed");
  pipeline.heartbeat_ns = t;  // a fresh heartbeat on the page means nothing without the client
  book.tick(pipeline, t);
  EXPECT_EQ(book.grant(be).mode, GrantMode::kFree);
  EXPECT_EQ(book.add(Role::kPipeline, 202, "next", t), p + 1);  // a new pipeline may attach

  // A heartbeat far ahead of the daemon's clock (CLOCK_REALTIME by mistake, or forged) is not
  // live: it would otherwise gate best-effort work for ever. Extreme page values do not overflow.
  pipeline.heartbeat_ns = t + 1'000'000 * kMs;
  book.tick(pipeline, t);
  EXPECT_EQ(book.grant(be).mode, GrantMode::kFree);
  pipeline.heartbeat_ns = t;
  book.tick(pipeline, t);
  EXPECT_EQ(book.grant(be).mode, GrantMode::kGated);
  pipeline.heartbeat_ns = INT64_MAX;
  pipeline.open_ns = INT64_MIN;
  pipeline.close_ns = INT64_MAX;
  EXPECT_LT(book.status(pipeline, t)["pipeline"]["heartbeat_age_ms"].get<double>(), 0.0);

  book.remove(be, "exited");
  EXPECT_EQ(book.grant(be).mode, GrantMode::kRevoked);
  const nlohmann::json s = book.status(pipeline, t);
  EXPECT_EQ(s["grants_revoked"], 1);
  EXPECT_EQ(s["clients"].size(), 1u);
  EXPECT_EQ(s["recent_departures"].size(), 2u);
}

}  // namespace
}  // namespace gpud

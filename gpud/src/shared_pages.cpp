// The shared pages' layout and their lock-free reads and writes.
#include <ctime>
#include <type_traits>

#include "gpud/gpud.h"

namespace gpud {

static_assert(std::atomic<int64_t>::is_always_lock_free && std::atomic<uint64_t>::is_always_lock_free &&
                  std::atomic<uint32_t>::is_always_lock_free,
              "shared pages need address-free atomics");
static_assert(std::is_standard_layout_v<PipelinePage> && std::is_standard_layout_v<GrantPage> &&
              std::is_standard_layout_v<UsagePage>);
static_assert(sizeof(PipelinePage) <= 4096 && sizeof(GrantPage) <= 4096 && sizeof(UsagePage) <= 4096, "one page each");

int64_t monotonic_ns() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

void init_pipeline_page(PipelinePage& page) {
  page.magic = kPageMagic;
  page.version = kProtocolVersion;
  page.seq.store(0, std::memory_order_relaxed);
  page.window_open_ns.store(0, std::memory_order_relaxed);
  page.window_close_ns.store(0, std::memory_order_relaxed);
  page.windows_published.store(0, std::memory_order_relaxed);
  page.heartbeat_ns.store(0, std::memory_order_relaxed);
  page.window_ns_published.store(0, std::memory_order_relaxed);
  page.pipeline_pid.store(0, std::memory_order_release);
}

void init_usage_page(UsagePage& page) {
  page.magic = kPageMagic;
  page.version = kProtocolVersion;
  page.launches_admitted.store(0, std::memory_order_relaxed);
  page.admitted_kernel_ns.store(0, std::memory_order_release);
}

void record_admitted(UsagePage& page, int64_t kernel_ns) {
  page.launches_admitted.fetch_add(1, std::memory_order_relaxed);
  if (kernel_ns > 0) page.admitted_kernel_ns.fetch_add(kernel_ns, std::memory_order_relaxed);
}

UsageView read_usage(const UsagePage& page) {
  return {page.launches_admitted.load(std::memory_order_relaxed), page.admitted_kernel_ns.load(std::memory_order_relaxed)};
}

void init_grant_page(GrantPage& page) {
  page.magic = kPageMagic;
  page.version = kProtocolVersion;
  page.epoch.store(0, std::memory_order_relaxed);
  page.mode.store(static_cast<uint32_t>(GrantMode::kRevoked), std::memory_order_relaxed);
  page.lease_expiry_ns.store(0, std::memory_order_relaxed);
  page.inflight_budget_ns.store(0, std::memory_order_release);
}

// A sequence lock with one writer (the pipeline process): odd while writing. The fields are
// atomics themselves, so a reader racing a writer reads torn pairs only, never torn values, and
// the sequence check throws those away.
void publish_window(PipelinePage& page, int64_t open_ns, int64_t close_ns) {
  const uint64_t s = page.seq.load(std::memory_order_relaxed);
  page.seq.store(s + 1, std::memory_order_relaxed);
  std::atomic_thread_fence(std::memory_order_release);
  const int64_t prev_open = page.window_open_ns.load(std::memory_order_relaxed);
  const int64_t prev_close = page.window_close_ns.load(std::memory_order_relaxed);
  const bool same_window = page.windows_published.load(std::memory_order_relaxed) > 0 && prev_open == open_ns;
  const int64_t added = same_window ? close_ns - prev_close : close_ns - open_ns;
  page.window_ns_published.store(page.window_ns_published.load(std::memory_order_relaxed) + added,
                                 std::memory_order_relaxed);
  page.window_open_ns.store(open_ns, std::memory_order_relaxed);
  page.window_close_ns.store(close_ns, std::memory_order_relaxed);
  page.windows_published.store(page.windows_published.load(std::memory_order_relaxed) + 1,
                               std::memory_order_relaxed);
  page.seq.store(s + 2, std::memory_order_release);
}

void heartbeat(PipelinePage& page, int64_t now_ns) { page.heartbeat_ns.store(now_ns, std::memory_order_release); }

namespace {
// A publication is a few stores long. One reader call spins for at most kReadBudgetNs on an odd
// (being written) sequence, then gives up: a writer killed between its stores leaves the value
// odd for good, and one that keeps it odd but moving (1, 3, 5, ...: broken or hostile) must not
// stall the daemon's loop or a best-effort launch either. Giving up costs little: the daemon
// keeps its last good snapshot (WindowView::torn), a best-effort launch holds for that call.
// The clock starts at the first retry: a read that finds the page still (every best-effort launch
// reads the window) pays no clock call.
class ReadBudget {
 public:
  bool spent() {
    const int64_t now = monotonic_ns();
    if (start_ns_ == 0) start_ns_ = now;
    return now - start_ns_ >= kReadBudgetNs;
  }

 private:
  static constexpr int64_t kReadBudgetNs = 50'000;
  int64_t start_ns_ = 0;
};
}  // namespace

WindowView read_window(const PipelinePage& page) {
  for (ReadBudget budget;;) {
    WindowView v;
    const uint64_t before = page.seq.load(std::memory_order_acquire);
    if (before & 1) {
      if (budget.spent()) return WindowView{.torn = true};
      continue;
    }
    v.open_ns = page.window_open_ns.load(std::memory_order_relaxed);
    v.close_ns = page.window_close_ns.load(std::memory_order_relaxed);
    v.windows_published = page.windows_published.load(std::memory_order_relaxed);
    v.window_ns_published = page.window_ns_published.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (page.seq.load(std::memory_order_relaxed) != before) {
      if (budget.spent()) return WindowView{.torn = true};
      continue;
    }
    v.heartbeat_ns = page.heartbeat_ns.load(std::memory_order_acquire);
    return v;
  }
}

void reset_pipeline_page(PipelinePage& page) {
  // Only the daemon calls this, once the page's writer is gone: make the sequence even again
  // (a writer killed mid-publication left it odd), clear what the pipeline published, and write
  // the header again (a pipeline that scribbled over it would fail every later client's check).
  page.magic = kPageMagic;
  page.version = kProtocolVersion;
  const uint64_t s = page.seq.load(std::memory_order_relaxed);
  page.seq.store((s | 1) + 2, std::memory_order_relaxed);  // odd: being written
  std::atomic_thread_fence(std::memory_order_release);
  page.window_open_ns.store(0, std::memory_order_relaxed);
  page.window_close_ns.store(0, std::memory_order_relaxed);
  page.windows_published.store(0, std::memory_order_relaxed);
  page.heartbeat_ns.store(0, std::memory_order_relaxed);
  page.window_ns_published.store(0, std::memory_order_relaxed);
  page.pipeline_pid.store(0, std::memory_order_relaxed);
  page.seq.store((s | 1) + 3, std::memory_order_release);
}

GrantView read_grant(const GrantPage& page) {
  // One writer (the daemon) bumps the epoch last: reread until the epoch is the same around the
  // fields, so mode, lease and budget belong together.
  GrantView g;
  for (ReadBudget budget;;) {
    const uint64_t before = page.epoch.load(std::memory_order_acquire);
    if (before & 1) {
      if (budget.spent()) return GrantView{.torn = true};
      continue;
    }
    g.mode = static_cast<GrantMode>(page.mode.load(std::memory_order_relaxed));
    g.lease_expiry_ns = page.lease_expiry_ns.load(std::memory_order_relaxed);
    g.inflight_budget_ns = page.inflight_budget_ns.load(std::memory_order_relaxed);
    std::atomic_thread_fence(std::memory_order_acquire);
    if (page.epoch.load(std::memory_order_relaxed) == before) {
      g.epoch = before / 2;
      return g;
    }
    if (budget.spent()) return GrantView{.torn = true};
  }
}

GrantView read_grant_keeping_lease(const GrantPage& page, int64_t now_ns, std::atomic<int64_t>& last_good_lease_ns) {
  const GrantView g = read_grant(page);
  if (!g.torn) {
    if (last_good_lease_ns.load(std::memory_order_relaxed) != g.lease_expiry_ns) {
      last_good_lease_ns.store(g.lease_expiry_ns, std::memory_order_relaxed);
    }
    return g;
  }
  return last_good_lease_ns.load(std::memory_order_relaxed) > now_ns ? g : GrantView{};
}

void write_grant(GrantPage& page, const GrantView& grant) {
  const uint64_t e = page.epoch.load(std::memory_order_relaxed);
  page.epoch.store(e + 1, std::memory_order_relaxed);  // odd: being written
  std::atomic_thread_fence(std::memory_order_release);
  page.mode.store(static_cast<uint32_t>(grant.mode), std::memory_order_relaxed);
  page.lease_expiry_ns.store(grant.lease_expiry_ns, std::memory_order_relaxed);
  page.inflight_budget_ns.store(grant.inflight_budget_ns, std::memory_order_relaxed);
  page.epoch.store(e + 2, std::memory_order_release);
}

}  // namespace gpud

#include "trainer/colocation/bubble_publisher.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>

#include <spdlog/spdlog.h>

#include "gpud/gpud.h"

namespace gpipe {

std::vector<IdleWindow> idle_windows(std::vector<std::pair<double, double>> busy, double wall_us, double min_us) {
  std::sort(busy.begin(), busy.end());
  std::vector<IdleWindow> out;
  double cursor = 0;  // end of the busy union so far
  auto gap = [&](double start, double end) {
    end = std::min(end, wall_us);
    if (end - start >= min_us) out.push_back({start, end});
  };
  for (const auto& [s, e] : busy) {
    if (s > cursor) gap(cursor, s);
    cursor = std::max(cursor, e);
  }
  if (wall_us > cursor) gap(cursor, wall_us);
  return out;
}

BubblePublisher::BubblePublisher(const std::string& gpu, std::filesystem::path dir)
    : gpu_(gpu), dir_(dir.empty() ? gpud::default_runtime_dir() : std::move(dir)) {
  try {
    client_ = std::make_unique<gpud::Client>(gpud::Client::connect(dir_, gpu_, gpud::Role::kPipeline, "gpipe_runner"));
  } catch (const gpud::ProtocolError& e) {
    throw std::runtime_error(std::string("parallel.publish_bubbles_gpu: ") + e.what());
  }
  gpud::heartbeat(client_->pipeline_writable(), gpud::monotonic_ns());
  thread_ = std::thread([this] { loop(); });
}

BubblePublisher::~BubblePublisher() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
  log_notes(notes_);
}

// The publishing thread's notes, logged by the caller's thread: logging from one thread only
// keeps spdlog's lazily made registry out of races (what TSan flagged in a test whose in-process
// daemon logs from a thread of its own).
void BubblePublisher::log_notes(const std::vector<Note>& notes) {
  for (const Note& n : notes) spdlog::log(static_cast<spdlog::level::level_enum>(n.level), "{}", n.text);
}

void BubblePublisher::begin_step(std::vector<IdleWindow> windows) {
  std::vector<Note> notes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    windows_ = std::move(windows);
    step_start_ns_ = gpud::monotonic_ns();
    ++step_generation_;
    notes.swap(notes_);
  }
  wake_.notify_all();
  log_notes(notes);
}

gpud::PipelinePage* BubblePublisher::page() {
  if (client_) return &client_->pipeline_writable();
  return orphaned_ && !connecting_ ? &orphaned_->pipeline_writable() : nullptr;
}

void BubblePublisher::quiet_orphan() {
  if (!orphaned_) return;
  gpud::PipelinePage& p = orphaned_->pipeline_writable();
  gpud::publish_window(p, shown_open_, shown_open_);
  gpud::heartbeat(p, 0);
}

void BubblePublisher::show_window(int64_t now) {
  gpud::PipelinePage* p = page();
  if (p == nullptr) return;
  if (busy_ == 0) {
    shown_open_ = std::max(current_open_, now);
    gpud::publish_window(*p, shown_open_, current_close_);
  } else {
    // Closed: [open, open) admits nothing, and tells readers the window is not to be used.
    shown_open_ = current_open_;
    gpud::publish_window(*p, shown_open_, shown_open_);
  }
}

void BubblePublisher::demand() {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t now = gpud::monotonic_ns();
  if (busy_++ > 0 || current_close_ <= now) return;  // already closed, or no window open or ahead
  if (current_open_ <= now) {
    // Open now: cut short here, with the open the page shows (the same window, for the page's
    // accounting of idle time offered).
    current_close_ = now;
    if (gpud::PipelinePage* p = page()) gpud::publish_window(*p, shown_open_, std::max(shown_open_, now));
    cut_.fetch_add(1);
  } else {
    show_window(now);  // ahead: closed until the action is done
  }
}

void BubblePublisher::end_step() {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t now = gpud::monotonic_ns();
  windows_.clear();  // the publishing thread's next index is past the end now: nothing more opens
  if (current_close_ <= now) return;
  if (gpud::PipelinePage* p = page(); p != nullptr && busy_ == 0) {
    // Open now: cut short here, with the open the page shows; ahead: published closed.
    gpud::publish_window(*p, shown_open_, current_open_ <= now ? std::max(shown_open_, now) : shown_open_);
  }
  if (current_open_ <= now && busy_ == 0) cut_.fetch_add(1);
  current_close_ = now;
}

void BubblePublisher::compute_done(std::function<bool()> finished) {
  std::lock_guard<std::mutex> lock(mu_);
  if (busy_ == 0) return;  // unmatched
  if (finished && !finished()) {
    issued_.push_back(std::move(finished));
    wake_.notify_all();
    return;
  }
  action_ended(gpud::monotonic_ns());
}

void BubblePublisher::action_ended(int64_t now) {
  if (busy_ == 0 || --busy_ > 0) return;
  if (current_close_ > now) show_window(now);
}

void BubblePublisher::retire_finished(int64_t now) {
  const size_t before = issued_.size();
  std::erase_if(issued_, [](const std::function<bool()>& finished) { return finished(); });
  for (size_t n = before - issued_.size(); n > 0; --n) action_ended(now);
}

// Publishes the current step's windows one at a time, each as soon as the previous one closed
// (so it is there before it opens), and heartbeats every 5 ms. A daemon that hung up (restarted,
// killed) reads the page it handed over no more, but best-effort processes still do until their
// leases run out: the thread keeps writing that page (orphaned_) and reconnects, backing off from
// 50 ms to 2 s, without the lock (begin_step never waits for it), then republishes the window
// still open or ahead on the new daemon's page.
void BubblePublisher::loop() {
  constexpr int64_t kHeartbeatNs = 5'000'000;
  constexpr int64_t kIssuedPollNs = 200'000;  // how often an issued action's device work is asked about
  constexpr int64_t kFirstRetryNs = 50'000'000;
  constexpr int64_t kMaxRetryNs = 2'000'000'000;
  constexpr int64_t kConnectTimeoutNs = 500'000'000;
  std::unique_lock<std::mutex> lock(mu_);
  uint64_t generation = 0;
  size_t next = 0;
  int64_t retry_at = 0;
  int64_t retry_ns = kFirstRetryNs;
  std::string last_connect_error;  // kept for the log line of the next begin_step
  while (!stop_) {
    int64_t now = gpud::monotonic_ns();
    if (client_ && !client_->daemon_alive()) {
      orphaned_ = std::move(client_);
      notes_.push_back({spdlog::level::warn,
                          fmt::format("parallel.publish_bubbles_gpu: orion-gpud of GPU {} hung up; reconnecting (every "
                                      "{} s at most); its page keeps the windows for best-effort "
                                      "processes until their leases run out",
                                      gpu_, kMaxRetryNs / 1'000'000'000)});
      retry_at = now;
      retry_ns = kFirstRetryNs;
    }
    if (!client_ && now >= retry_at) {
      quiet_orphan();
      connecting_ = true;
      lock.unlock();
      std::unique_ptr<gpud::Client> fresh;
      try {
        fresh = std::make_unique<gpud::Client>(
            gpud::Client::connect(dir_, gpu_, gpud::Role::kPipeline, "gpipe_runner", kConnectTimeoutNs));
      } catch (const gpud::ProtocolError& e) {
        last_connect_error = e.what();
      }
      lock.lock();
      connecting_ = false;
      now = gpud::monotonic_ns();
      if (fresh) {
        client_ = std::move(fresh);
        orphaned_.reset();  // quiet since before the attempt
        reconnects_.fetch_add(1);
        notes_.push_back({spdlog::level::info,
                            fmt::format("parallel.publish_bubbles_gpu: attached to orion-gpud of GPU {} again", gpu_)});
        if (current_close_ > now) show_window(now);
      } else {
        // The orphan again (quiet during the attempt). A daemon that stopped in order reset it (and
        // revoked the grants), one that was killed did not: either way it shows the planned window.
        if (current_close_ > now) show_window(now);
        if (retry_ns == kFirstRetryNs) {
          notes_.push_back({spdlog::level::debug,
                              "parallel.publish_bubbles_gpu: reconnecting to orion-gpud: " + last_connect_error});
        }
        retry_at = now + retry_ns;
        retry_ns = std::min(2 * retry_ns, kMaxRetryNs);
      }
      continue;  // stop_ may have been set meanwhile
    }
    if (generation != step_generation_) {
      // A new step: the last one's window still on the page ends now (published cut short, so the
      // idle time the page counts as offered loses what was never offered).
      if (page() != nullptr && current_close_ > now && busy_ == 0) {
        gpud::publish_window(*page(), shown_open_, std::clamp(now, shown_open_, current_close_));
      }
      generation = step_generation_;
      next = 0;
      current_close_ = 0;
    }
    if (now >= current_close_ && next < windows_.size()) {
      const IdleWindow w = windows_[next++];
      if (!std::isfinite(w.start_us) || !std::isfinite(w.end_us) || w.end_us <= w.start_us) continue;
      current_open_ = step_start_ns_ + static_cast<int64_t>(w.start_us * 1e3);
      current_close_ = step_start_ns_ + static_cast<int64_t>(w.end_us * 1e3);
      // Over already (this thread woke late, or was reconnecting): never offered, never published
      // (as [now, close) it would count negative idle time on the page).
      if (current_close_ <= now) continue;
      if (page() != nullptr) {
        show_window(now);  // closed while an action runs
        published_.fetch_add(1);
      }
    }
    if (gpud::PipelinePage* p = page()) gpud::heartbeat(*p, now);
    retire_finished(now);
    int64_t until = now + kHeartbeatNs;
    if (!issued_.empty()) until = std::min(until, now + kIssuedPollNs);
    if (next < windows_.size()) until = std::min(until, std::max(current_close_, now));
    wake_.wait_for(lock, std::chrono::nanoseconds(std::max<int64_t>(until - now, 100'000)));
  }
}

}  // namespace gpipe

#include "trainer/colocation/bubble_publisher.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <stdexcept>

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

BubblePublisher::BubblePublisher(const std::string& gpu, std::filesystem::path dir) {
  if (dir.empty()) dir = gpud::default_runtime_dir();
  try {
    client_ = std::make_unique<gpud::Client>(gpud::Client::connect(dir, gpu, gpud::Role::kPipeline, "gpipe_runner"));
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
}

void BubblePublisher::begin_step(std::vector<IdleWindow> windows) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    windows_ = std::move(windows);
    step_start_ns_ = gpud::monotonic_ns();
    ++step_generation_;
  }
  wake_.notify_all();
}

// Publishes the current step's windows one at a time, each as soon as the previous one closed
// (so it is there before it opens), and heartbeats every 5 ms.
void BubblePublisher::loop() {
  constexpr int64_t kHeartbeatNs = 5'000'000;
  gpud::PipelinePage& page = client_->pipeline_writable();
  std::unique_lock<std::mutex> lock(mu_);
  uint64_t generation = 0;
  size_t next = 0;
  int64_t current_close = 0;
  while (!stop_) {
    const int64_t now = gpud::monotonic_ns();
    if (generation != step_generation_) {
      generation = step_generation_;
      next = 0;
      current_close = 0;
    }
    if (now >= current_close && next < windows_.size()) {
      const IdleWindow w = windows_[next++];
      if (!std::isfinite(w.start_us) || !std::isfinite(w.end_us) || w.end_us <= w.start_us) continue;
      const int64_t open = step_start_ns_ + static_cast<int64_t>(w.start_us * 1e3);
      current_close = step_start_ns_ + static_cast<int64_t>(w.end_us * 1e3);
      gpud::publish_window(page, open, current_close);
      published_.fetch_add(1);
    }
    gpud::heartbeat(page, now);
    int64_t until = now + kHeartbeatNs;
    if (next < windows_.size()) until = std::min(until, std::max(current_close, now));
    wake_.wait_for(lock, std::chrono::nanoseconds(std::max<int64_t>(until - now, 100'000)));
  }
}

}  // namespace gpipe

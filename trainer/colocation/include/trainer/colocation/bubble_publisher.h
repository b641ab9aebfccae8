// The pipeline's side of cross-process bubble filling (issue 25): the idle windows of a step,
// predicted from the last step's measured actions, published to orion-gpud (gpud/) as the step
// runs, so a best-effort process on the same GPU runs only inside them. Torch-free.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace gpud {
class Client;
struct PipelinePage;
}

namespace gpipe {

struct IdleWindow {
  double start_us = 0;  // since the step began
  double end_us = 0;
};

// The gaps of at least min_us in the union of `busy` spans (start, end in us since the step
// began) over [0, wall_us): when no rank sharing the device computed.
std::vector<IdleWindow> idle_windows(std::vector<std::pair<double, double>> busy, double wall_us, double min_us);

class BubblePublisher {
 public:
  // Attaches to the orion-gpud of `gpu` (runtime folder `dir`, empty: gpud::default_runtime_dir())
  // as its pipeline; throws std::runtime_error naming the daemon's answer (none running, another
  // pipeline attached, ...). If the daemon later hangs up (restarted, killed), the publishing
  // thread reconnects with a bounded backoff and republishes the current window.
  BubblePublisher(const std::string& gpu, std::filesystem::path dir);
  ~BubblePublisher();
  BubblePublisher(const BubblePublisher&) = delete;
  BubblePublisher& operator=(const BubblePublisher&) = delete;

  // A step begins now: its windows (offsets from now) are published in order as the step runs,
  // each before it opens; the heartbeat goes on between steps.
  void begin_step(std::vector<IdleWindow> windows);
  // The step's pipeline part is over (its last action ran): the step's windows still ahead never
  // open and one open now closes here, as demand() cuts it. What follows (the optimizer step, a
  // checkpoint) runs on the device too, and the timing that planned those windows was a prediction:
  // a faster step left them over that work. Windows come back with the next begin_step.
  void end_step();
  uint64_t windows_published() const { return published_.load(); }
  // The pipeline computes from now on (an action started): a window open now is cut short here,
  // so best-effort processes stop launching at once instead of at the predicted close (the last
  // step's timing is only a prediction), and until compute_done() no window opens (a window
  // already published ahead is published closed). Cheap: one uncontended lock and, when a window
  // is affected, one sequence-locked write. Called from any thread; calls nest (ranks sharing the
  // device).
  void demand();
  // The action demand() announced has issued its work. `finished` (a GPU action) tells, without
  // waiting, whether the device has run it: until then the action counts as running (the
  // publishing thread asks again every 200 us). With no action running, the planned window, if
  // still ahead or open, is published again from now.
  void compute_done(std::function<bool()> finished = {});
  // Open windows demand() cut short (windows still ahead that it kept closed are not counted).
  uint64_t windows_cut() const { return cut_.load(); }
  // Attaches to a daemon after the first (each restart it noticed).
  uint64_t reconnects() const { return reconnects_.load(); }

 private:
  void loop();
  const std::string gpu_;
  const std::filesystem::path dir_;
  std::unique_ptr<gpud::Client> client_;  // null while the daemon is gone; the thread's own after start
  // The last daemon's client after it hung up, until a new daemon takes over: best-effort
  // processes still read its page (their leases on the old grant run on), so the page keeps its
  // heartbeat and windows; a page gone quiet would read as "no pipeline" to them.
  std::unique_ptr<gpud::Client> orphaned_;
  // The page goes quiet (window closed, heartbeat 0: best-effort processes hold) before each
  // connect attempt and when a new daemon took over: a daemon that dropped us but lives may hand
  // the same page to our next hello and reset it, and two writers would tear its sequence lock.
  void quiet_orphan();
  bool connecting_ = false;  // a connect attempt runs (without mu_): the orphan is not written
  gpud::PipelinePage* page();  // client_'s page, else orphaned_'s (not while connecting); null with neither
  std::mutex mu_;
  std::condition_variable wake_;
  std::vector<IdleWindow> windows_;  // of the current step
  int64_t step_start_ns_ = 0;
  uint64_t step_generation_ = 0;
  bool stop_ = false;
  // Guarded by mu_: the planned window (from the last step's spans) and what the page shows of it
  // (closed while an action runs).
  int64_t current_open_ = 0;
  int64_t current_close_ = 0;
  int64_t shown_open_ = 0;      // the open of the window the page shows
  int busy_ = 0;                // compute actions running (demand() without compute_done())
  // Actions whose work is issued but not yet run on the device (compute_done with `finished`):
  // still counted in busy_; the thread retires them (retire_finished).
  std::vector<std::function<bool()>> issued_;
  void retire_finished(int64_t now);
  void action_ended(int64_t now);  // one action fewer running: the window back when none is
  void show_window(int64_t now);  // the planned window on the page as busy_ allows
  std::atomic<uint64_t> published_{0};
  std::atomic<uint64_t> cut_{0};
  // What the publishing thread has to say (daemon gone, back), logged by the next begin_step.
  struct Note {
    int level;  // spdlog's level number
    std::string text;
  };
  std::vector<Note> notes_;
  static void log_notes(const std::vector<Note>& notes);
  std::atomic<uint64_t> reconnects_{0};
  std::thread thread_;
};

}  // namespace gpipe

// A rank's second thread, for the forward half of an overlapped pair (Action::overlaps_next,
// torch's OVERLAP_F_B). The async executor hands the forward to the lane and runs the backward on
// the rank's own thread, so both are in flight at once on the rank's device: the forward enters
// its micro-batch's stream with the best-effort class and the backward its own with the
// high-priority class (RankStreams::enter), and a scheduler under the Orion shim fills the
// backward's idle SMs with the forward. One lane per rank, alive for the rank's program of one
// step, named "rank<r>-fwd" for Nsight and joined to an active Kineto profile.
#pragma once

#include <c10/core/Device.h>
#include <tbb/concurrent_queue.h>

#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>

namespace gpipe {

class ForwardLane {
 public:
  ForwardLane(c10::Device device, int rank);
  ~ForwardLane();  // lets queued work finish, then joins
  ForwardLane(const ForwardLane&) = delete;
  ForwardLane& operator=(const ForwardLane&) = delete;

  // Runs `work` on the lane under the calling thread's LibTorch thread-local state (grad mode,
  // autocast settings, RecordFunction / profiler scopes: at::ThreadLocalState); get() on the
  // result waits for it and rethrows what it threw.
  std::future<void> run(std::function<void()> work);

 private:
  using Task = std::shared_ptr<std::packaged_task<void()>>;  // null: stop
  tbb::concurrent_bounded_queue<Task> tasks_;
  std::thread thread_;
};

}  // namespace gpipe

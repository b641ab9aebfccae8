// A rank's second thread, for the forward half of an overlapped pair (Action::overlaps_next,
// torch's OVERLAP_F_B). The async executor hands the forward to the lane and runs the backward on
// the rank's own thread, so both are in flight at once on the rank's device: the forward enters
// its micro-batch's stream with the best-effort class and the backward its own with the
// high-priority class (RankStreams::enter), and a scheduler under the Orion shim fills the
// backward's idle SMs with the forward. One lane per rank, made at the rank's first overlapped
// pair and kept across steps (a WorkerThread named "rank<r>-fwd").
#pragma once

#include <c10/core/Device.h>

#include <functional>
#include <future>

#include "worker_thread.h"

namespace gpipe {

class ForwardLane {
 public:
  ForwardLane(c10::Device device, int rank);

  // Runs `work` on the lane under the calling thread's LibTorch thread-local state (grad mode,
  // autocast settings, RecordFunction / profiler scopes: at::ThreadLocalState); get() on the
  // result waits for it and rethrows what it threw.
  std::future<void> run(std::function<void()> work);

 private:
  WorkerThread thread_;
};

}  // namespace gpipe

#include "forward_lane.h"

#include <ATen/ThreadLocalState.h>

#include <string>
#include <utility>

namespace gpipe {

ForwardLane::ForwardLane(c10::Device device, int rank) : thread_(device, "rank" + std::to_string(rank) + "-fwd") {}

std::future<void> ForwardLane::run(std::function<void()> work) {
  return thread_.run([state = at::ThreadLocalState(), work = std::move(work)] {
    const at::ThreadLocalStateGuard same_state(state);
    work();
  });
}

}  // namespace gpipe

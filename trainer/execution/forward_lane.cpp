#include "forward_lane.h"

#include <ATen/ThreadLocalState.h>
#include <pthread.h>

#include <utility>

#include "trainer/device/device.h"
#include "trainer/metrics/kineto_profile.h"

namespace gpipe {

ForwardLane::ForwardLane(c10::Device device, int rank) {
  tasks_.set_capacity(1);  // the rank thread waits for each forward before it hands the next
  thread_ = std::thread([this, device] {
    bind_thread_to_device(device);
    const ProfileThisThread profile_here;
    for (;;) {
      Task task;
      tasks_.pop(task);
      if (!task) return;
      (*task)();
    }
  });
  // Linux thread names hold 15 characters: "rank12345-fwd" fits any real rank count.
  const std::string name = "rank" + std::to_string(rank) + "-fwd";
  pthread_setname_np(thread_.native_handle(), name.substr(0, 15).c_str());
}

ForwardLane::~ForwardLane() {
  tasks_.push(nullptr);
  thread_.join();
}

std::future<void> ForwardLane::run(std::function<void()> work) {
  auto task = std::make_shared<std::packaged_task<void()>>(
      [state = at::ThreadLocalState(), work = std::move(work)] {
        const at::ThreadLocalStateGuard same_state(state);
        work();
      });
  std::future<void> done = task->get_future();
  tasks_.push(std::move(task));
  return done;
}

}  // namespace gpipe

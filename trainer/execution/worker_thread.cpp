#include "worker_thread.h"

#include <pthread.h>

#include <utility>

#include "trainer/device/device.h"
#include "trainer/metrics/kineto_profile.h"

namespace gpipe {

WorkerThread::WorkerThread(c10::Device device, const std::string& name) {
  // Owners wait for each task before they hand the next (a rank's step, a pair's forward); the
  // bound keeps one that does not from queueing without limit.
  tasks_.set_capacity(1);
  thread_ = std::thread([this, device] {
    bind_thread_to_device(device);
    for (;;) {
      Task task;
      tasks_.pop(task);
      if (!task) return;
      const ProfileThisThread profile_here;  // no-op unless this task runs in the profiled step
      (*task)();
    }
  });
  pthread_setname_np(thread_.native_handle(), name.substr(0, 15).c_str());
}

WorkerThread::~WorkerThread() {
  tasks_.push(nullptr);
  thread_.join();
}

std::future<void> WorkerThread::run(std::function<void()> work) {
  auto task = std::make_shared<std::packaged_task<void()>>(std::move(work));
  std::future<void> done = task->get_future();
  tasks_.push(std::move(task));
  return done;
}

}  // namespace gpipe

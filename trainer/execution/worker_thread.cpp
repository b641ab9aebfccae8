#include "worker_thread.h"

#include <pthread.h>

#include <utility>

#include "trainer/device/device.h"
#include "trainer/metrics/kineto_profile.h"

namespace gpipe {

WorkerThread::WorkerThread(c10::Device device, const std::string& name) : device_(device) {
  // Owners wait for each task before they hand the next (a rank's step, a pair's forward); the
  // bound keeps one that does not from queueing without limit.
  tasks_.set_capacity(1);
  thread_ = std::thread([this] {
    for (;;) {
      Task task;
      tasks_.pop(task);
      if (!task) return;
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
  // Everything the task does happens inside it, so what throws reaches the caller's future, and
  // the future is ready only after the thread has left an active profile again.
  auto task = std::make_shared<std::packaged_task<void()>>([device = device_, work = std::move(work)] {
    bind_thread_to_device(device);  // cheap when already bound; a CUDA error here fails the task
    const ProfileThisThread profile_here;  // no-op unless this task runs in the profiled step
    work();
  });
  std::future<void> done = task->get_future();
  tasks_.push(std::move(task));
  return done;
}

}  // namespace gpipe

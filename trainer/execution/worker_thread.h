// A named thread bound to one device that runs the tasks handed to it, one at a time, for as long
// as its owner lives. The async executor keeps one per co-located rank (and one per rank's forward
// lane) across steps: no thread is created per step, so what LibTorch and the CUDA libraries keep
// per thread (cuBLAS/cuBLASLt handles and their per-stream workspaces, the autograd engine's ready
// queue, OpenMP teams on CPU) is made once, and Nsight Systems, Perfetto and Kineto traces show one
// thread per rank under the same name ("rank2", "rank2-fwd") in every step.
#pragma once

#include <c10/core/Device.h>
#include <tbb/concurrent_queue.h>

#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>

namespace gpipe {

class WorkerThread {
 public:
  // `name` is what `top -H`, Nsight and Perfetto show (Linux keeps the first 15 characters).
  WorkerThread(c10::Device device, const std::string& name);
  ~WorkerThread();  // lets queued work finish, then joins
  WorkerThread(const WorkerThread&) = delete;
  WorkerThread& operator=(const WorkerThread&) = delete;

  // Runs `work` on the thread, after the work handed to it before; get() on the result waits for
  // it and rethrows what it threw. Each task joins an active Kineto profile (ProfileThisThread)
  // for its own duration: the thread outlives the profiled step.
  std::future<void> run(std::function<void()> work);
  c10::Device device() const { return device_; }

 private:
  using Task = std::shared_ptr<std::packaged_task<void()>>;  // null: stop
  c10::Device device_;
  tbb::concurrent_bounded_queue<Task> tasks_;
  std::thread thread_;
};

}  // namespace gpipe

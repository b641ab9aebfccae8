// A PyTorch profiler (Kineto) trace of one training step, as the Python OurGPipe writes with
// torch.profiler and tensorboard_trace_handler: CPU ops of every thread that runs actions (and,
// on a GPU, CUDA kernels and copies with their streams), one file per process at
//   <dir>/<hostname>_<pid>.<milliseconds>.pt.trace.json
// which TensorBoard's PyTorch profiler plugin reads and Perfetto (or chrome://tracing) opens.
// The trainer puts it in <output_dir>/profiler_<executor>/rank<N>/ for training.profile_iteration.
#pragma once

#include <memory>
#include <string>

namespace gpipe {

class KinetoStepProfile {
 public:
  // Starts collecting on the calling thread; `cuda` adds GPU activities (kernels, copies, syncs).
  // Threads that run actions join with ProfileThisThread. Throws if a profiler is already active.
  explicit KinetoStepProfile(bool cuda);
  ~KinetoStepProfile();  // stops without writing if finish() was not called
  KinetoStepProfile(const KinetoStepProfile&) = delete;
  KinetoStepProfile& operator=(const KinetoStepProfile&) = delete;
  // Stops and writes the trace into `dir` (created if missing); returns the file's path.
  std::string finish(const std::string& dir);
  // What the trace holds, for the log: CPU ops of every action thread, and GPU activity on a GPU.
  std::string contents() const;

 private:
  bool active_ = false;
  bool cuda_ = false;
  int saved_log_level_ = 0;  // LibTorch's log level, silenced to errors while the step is profiled
};

// Joins the calling (non-main) thread to an active profile for its lifetime, so that its ops are
// recorded too (Kineto records only the enabling thread otherwise); no-op when none is active.
class ProfileThisThread {
 public:
  ProfileThisThread();
  ~ProfileThisThread();
  ProfileThisThread(const ProfileThisThread&) = delete;
  ProfileThisThread& operator=(const ProfileThisThread&) = delete;

 private:
  bool joined_ = false;
};

}  // namespace gpipe

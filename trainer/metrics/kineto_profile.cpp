// KinetoStepProfile: LibTorch's Kineto profiler driven from C++ (prepare, enable, disable, save).
#include "trainer/metrics/kineto_profile.h"

#include <c10/util/Logging.h>
#include <torch/csrc/autograd/profiler_kineto.h>
#include <unistd.h>

#include <cstdlib>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <set>
#include <stdexcept>

#include <fmt/format.h>

#include "trainer/launch/world.h"

namespace gpipe {
namespace {
namespace prof = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

}  // namespace

KinetoStepProfile::KinetoStepProfile(bool cuda) : cuda_(cuda) {
  if (torch::profiler::impl::profilerEnabled()) {
    throw std::runtime_error("a PyTorch profiler is already active on this thread; cannot profile the step");
  }
  // What LibTorch's profiler prints about itself is nothing a user can act on: warnings about
  // per-thread callbacks as action threads join and leave the trace (record_function.cpp,
  // observer.cpp; the trace is complete), and on a CPU machine Kineto's "gpuGetDeviceCount failed
  // with code 35" (no driver) as an ERROR line. LibTorch's own warnings are silenced while the
  // profiled step runs (its errors still print); Kineto's log level is set before Kineto first
  // starts, on CPU runs only (on a GPU its messages are about the trace), and never over a
  // KINETO_LOG_LEVEL the user set. The runner's log says what the trace holds instead.
  if (!cuda) setenv("KINETO_LOG_LEVEL", "5", /*overwrite=*/0);
  saved_log_level_ = FLAGS_caffe2_log_level;
  FLAGS_caffe2_log_level = std::max(FLAGS_caffe2_log_level, 2);  // c10: 0 info, 1 warning, 2 error
  const ProfilerConfig config(ProfilerState::KINETO, /*report_input_shapes=*/true);
  std::set<ActivityType> activities{ActivityType::CPU};
  if (cuda) activities.insert(ActivityType::CUDA);
  try {
    prof::prepareProfiler(config, activities);
    prof::enableProfiler(config, activities);
  } catch (...) {  // no destructor runs for a constructor that throws
    FLAGS_caffe2_log_level = saved_log_level_;
    throw;
  }
  active_ = true;
}

KinetoStepProfile::~KinetoStepProfile() {
  if (active_) prof::disableProfiler();
  FLAGS_caffe2_log_level = saved_log_level_;
}

std::string KinetoStepProfile::contents() const {
  return cuda_ ? "CPU ops of every rank thread, GPU kernels, copies and syncs with their streams"
               : "CPU ops of every rank thread; no GPU activity (a CPU run)";
}

std::string KinetoStepProfile::finish(const std::string& dir) {
  if (!active_) throw std::logic_error("KinetoStepProfile::finish called twice");
  active_ = false;
  std::unique_ptr<prof::ProfilerResult> result = prof::disableProfiler();
  std::filesystem::create_directories(dir);
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                      std::chrono::system_clock::now().time_since_epoch())
                      .count();
  const std::string path =
      (std::filesystem::path(dir) / fmt::format("{}_{}.{}.pt.trace.json", this_host_name(), getpid(), ms)).string();
  result->save(path);
  FLAGS_caffe2_log_level = saved_log_level_;
  return path;
}

ProfileThisThread::ProfileThisThread() {
  if (prof::isProfilerEnabledInMainThread()) {
    prof::enableProfilerInChildThread();
    joined_ = true;
  }
}

ProfileThisThread::~ProfileThisThread() {
  if (joined_) prof::disableProfilerInChildThread();
}

}  // namespace gpipe

// KinetoStepProfile: LibTorch's Kineto profiler driven from C++ (prepare, enable, disable, save).
#include "trainer/metrics/kineto_profile.h"

#include <torch/csrc/autograd/profiler_kineto.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <set>
#include <stdexcept>

#include <fmt/format.h>

namespace gpipe {
namespace {
namespace prof = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;

std::string host_name() {
  char name[256] = {};
  if (gethostname(name, sizeof(name) - 1) != 0) return "localhost";
  return name;
}
}  // namespace

KinetoStepProfile::KinetoStepProfile(bool cuda) {
  if (torch::profiler::impl::profilerEnabled()) {
    throw std::runtime_error("a PyTorch profiler is already active on this thread; cannot profile the step");
  }
  const ProfilerConfig config(ProfilerState::KINETO, /*report_input_shapes=*/true);
  std::set<ActivityType> activities{ActivityType::CPU};
  if (cuda) activities.insert(ActivityType::CUDA);
  prof::prepareProfiler(config, activities);
  prof::enableProfiler(config, activities);
  active_ = true;
}

KinetoStepProfile::~KinetoStepProfile() {
  if (active_) prof::disableProfiler();
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
      (std::filesystem::path(dir) / fmt::format("{}_{}.{}.pt.trace.json", host_name(), getpid(), ms)).string();
  result->save(path);
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

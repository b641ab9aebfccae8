// Device selection, per-rank streams and events, autocast and memory statistics. Everything
// CUDA-specific sits behind OURGPIPE_HAVE_TORCH_CUDA (compiled in CI, run on a GPU).
#include "trainer/device.h"

#include <ATen/autocast_mode.h>

#include <map>
#include <set>
#include <utility>

#include <fmt/format.h>

#include "trainer/config.h"
#include "trainer/metrics.h"

#ifdef OURGPIPE_HAVE_TORCH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

namespace gpipe {

bool cuda_usable() {
#ifdef OURGPIPE_HAVE_TORCH_CUDA
  return c10::cuda::device_count() > 0;
#else
  return false;
#endif
}

std::vector<c10::Device> resolve_rank_devices(const std::string& requested, int num_ranks) {
  if (requested != "auto" && requested != "cpu" && requested != "cuda") {
    throw ConfigError("parallel.device='" + requested + "' is not one of auto, cpu, cuda");
  }
  const bool use_cuda = requested == "cuda" || (requested == "auto" && cuda_usable());
  if (use_cuda && !cuda_usable()) {
    throw ConfigError(
#ifdef OURGPIPE_HAVE_TORCH_CUDA
        "parallel.device='cuda' but no CUDA device is visible (check CUDA_VISIBLE_DEVICES and the driver), "
        "or use parallel.device=cpu"
#else
        "parallel.device='cuda' but this build has no LibTorch-CUDA support; rebuild with a CUDA LibTorch "
        "or use parallel.device=cpu"
#endif
    );
  }
  std::vector<c10::Device> devices;
  for (int r = 0; r < num_ranks; ++r) {
#ifdef OURGPIPE_HAVE_TORCH_CUDA
    if (use_cuda) {
      devices.emplace_back(c10::kCUDA, static_cast<c10::DeviceIndex>(r % c10::cuda::device_count()));
      continue;
    }
#endif
    devices.emplace_back(c10::kCPU);
  }
  return devices;
}

std::string device_display_name(const c10::Device& device) {
#ifdef OURGPIPE_HAVE_TORCH_CUDA
  if (device.is_cuda()) {
    cudaDeviceProp prop{};
    if (cudaGetDeviceProperties(&prop, device.index()) == cudaSuccess) return prop.name;
    return "cuda (unknown name)";
  }
#endif
  return device.str();
}

int count_distinct_devices(const std::vector<c10::Device>& devices) {
  std::set<std::string> names;
  for (const auto& d : devices) names.insert(d.str());
  return static_cast<int>(names.size());
}

int64_t peak_memory_bytes(const std::vector<c10::Device>& devices) {
  int64_t peak = 0;
  bool any_cuda = false;
#ifdef OURGPIPE_HAVE_TORCH_CUDA
  std::set<c10::DeviceIndex> seen;
  for (const auto& d : devices) {
    if (!d.is_cuda() || !seen.insert(d.index()).second) continue;
    any_cuda = true;
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(d.index());
    const auto& agg = stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
    peak = std::max<int64_t>(peak, agg.peak);
  }
#else
  (void)devices;
#endif
  return any_cuda ? peak : max_rss_bytes();
}

void reset_peak_memory(const std::vector<c10::Device>& devices) {
#ifdef OURGPIPE_HAVE_TORCH_CUDA
  for (const auto& d : devices) {
    if (d.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(d.index());
  }
#else
  (void)devices;
#endif
}

void synchronize_devices(const std::vector<c10::Device>& devices) {
#ifdef OURGPIPE_HAVE_TORCH_CUDA
  std::set<c10::DeviceIndex> seen;
  for (const auto& d : devices) {
    if (d.is_cuda() && seen.insert(d.index()).second) c10::cuda::device_synchronize();
  }
#else
  (void)devices;
#endif
}

void bind_thread_to_device(c10::Device device) {
#ifdef OURGPIPE_HAVE_TORCH_CUDA
  if (device.is_cuda()) c10::cuda::set_device(device.index());
#else
  (void)device;
#endif
}

namespace {
bool is_backward(ActionType type) {
  return type == ActionType::kBackward || type == ActionType::kBackwardInput ||
         type == ActionType::kBackwardWeight || type == ActionType::kSendBackward ||
         type == ActionType::kRecvBackward;
}

#ifdef OURGPIPE_HAVE_TORCH_CUDA
class CudaReadyEvent final : public ReadyEvent {
 public:
  explicit CudaReadyEvent(const c10::cuda::CUDAStream& stream) { event_.record(stream); }
  void block_current_stream() const override {
    // CUDAEvent::block is non-const only because it may create the event lazily; it exists here.
    const_cast<at::cuda::CUDAEvent&>(event_).block(c10::cuda::getCurrentCUDAStream());
  }

 private:
  at::cuda::CUDAEvent event_;
};
#endif
}  // namespace

struct RankStreams::Impl {
  c10::Device device{c10::kCPU};
  StreamPolicy policy = StreamPolicy::kSingle;
  std::string priority;
#ifdef OURGPIPE_HAVE_TORCH_CUDA
  // (is_backward, micro-batch) -> stream, taken from LibTorch's pool on first use.
  std::map<std::pair<bool, int>, c10::cuda::CUDAStream> streams;
#endif
};

RankStreams::RankStreams(c10::Device device, StreamPolicy policy, const std::string& priority)
    : impl_(std::make_unique<Impl>()) {
  impl_->device = device;
  impl_->policy = policy;
  impl_->priority = priority;
  if (priority != "backward_first" && priority != "forward_first" && priority != "none") {
    throw ConfigError("parallel.priority='" + priority + "' is not one of backward_first, forward_first, none");
  }
}

RankStreams::~RankStreams() = default;

std::shared_ptr<void> RankStreams::enter(ActionType type, int microbatch) {
#ifdef OURGPIPE_HAVE_TORCH_CUDA
  if (impl_->device.is_cuda() && impl_->policy == StreamPolicy::kPerMicrobatch) {
    const bool backward = is_backward(type);
    auto key = std::make_pair(backward, microbatch);
    auto it = impl_->streams.find(key);
    if (it == impl_->streams.end()) {
      const bool high = impl_->priority == "backward_first"  ? backward
                        : impl_->priority == "forward_first" ? !backward
                                                             : false;
      it = impl_->streams.emplace(key, c10::cuda::getStreamFromPool(high, impl_->device.index())).first;
    }
    return std::make_shared<c10::cuda::CUDAStreamGuard>(it->second);
  }
#else
  (void)type;
  (void)microbatch;
#endif
  return nullptr;
}

std::shared_ptr<const ReadyEvent> RankStreams::record_ready() const {
#ifdef OURGPIPE_HAVE_TORCH_CUDA
  if (impl_->device.is_cuda()) return std::make_shared<CudaReadyEvent>(c10::cuda::getCurrentCUDAStream());
#endif
  return nullptr;
}

void RankStreams::wait(const std::shared_ptr<const ReadyEvent>& event) {
  if (event) event->block_current_stream();
}

void RankStreams::record_use(const at::Tensor& tensor) const {
#ifdef OURGPIPE_HAVE_TORCH_CUDA
  if (tensor.defined() && tensor.is_cuda()) {
    c10::cuda::CUDACachingAllocator::recordStream(tensor.storage().data_ptr(), c10::cuda::getCurrentCUDAStream());
  }
#else
  (void)tensor;
#endif
}

std::string RankStreams::describe() const {
  if (!impl_->device.is_cuda()) {
    return "CPU: no streams exist; each rank's actions run in order on its thread (parallel.priority '" +
           impl_->priority + "' has no effect)";
  }
  if (impl_->policy == StreamPolicy::kSingle) return impl_->device.str() + ": one stream (the current stream)";
  const std::string fwd = impl_->priority == "forward_first" ? "high" : impl_->priority == "none" ? "default" : "low";
  const std::string bwd = impl_->priority == "backward_first" ? "high" : impl_->priority == "none" ? "default" : "low";
  return fmt::format("{}: per-micro-batch pool streams, forward {} priority, backward {} priority", impl_->device.str(),
                     fwd, bwd);
}

AutocastScope::AutocastScope(c10::Device device, bool enabled) {
  if (!enabled || !device.is_cuda()) return;
  active_ = true;
  at::autocast::set_autocast_enabled(at::kCUDA, true);
  at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
  at::autocast::increment_nesting();
}

AutocastScope::~AutocastScope() {
  if (!active_) return;
  if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
  at::autocast::set_autocast_enabled(at::kCUDA, false);
}

}  // namespace gpipe

// Device selection, per-rank streams and events, autocast and memory statistics. Everything
// CUDA-specific sits behind OURGPIPE_HAVE_TORCH_CUDA (compiled in CI, run on a GPU).
#include "trainer/device/device.h"

#include <ATen/autocast_mode.h>

#include <map>
#include <mutex>
#include <set>
#include <stdexcept>
#include <utility>

#include <fmt/format.h>

#include "trainer/config/config.h"
#include "trainer/metrics/metrics.h"

#ifdef OURGPIPE_HAVE_TORCH_CUDA
#include <ATen/cuda/CUDAEvent.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include "trainer/device/orion_thread_class.h"
#include "trainer/log/engine_log.h"
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

std::string gpu_uuid(const c10::Device& device) {
#ifdef OURGPIPE_HAVE_TORCH_CUDA
  if (device.is_cuda()) {
    cudaDeviceProp prop{};
    const cudaError_t rc = cudaGetDeviceProperties(&prop, device.index());
    if (rc != cudaSuccess) {
      throw std::runtime_error(fmt::format("cannot read the UUID of {}: {}", device.str(), cudaGetErrorString(rc)));
    }
    return format_gpu_uuid(reinterpret_cast<const unsigned char*>(prop.uuid.bytes));
  }
#endif
  throw std::runtime_error(fmt::format("{} is not a CUDA GPU: it has no UUID", device.str()));
}

std::string format_gpu_uuid(const unsigned char* bytes) {
  // nvidia-smi -L's spelling: GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx
  std::string out = "GPU-";
  for (int i = 0; i < 16; ++i) {
    if (i == 4 || i == 6 || i == 8 || i == 10) out += '-';
    out += fmt::format("{:02x}", bytes[i]);
  }
  return out;
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
    peak = std::max<int64_t>(peak, cuda_allocated_bytes_peak(d.index()));
  }
#else
  (void)devices;
#endif
  return any_cuda ? peak : max_rss_bytes();
}

int64_t total_memory_bytes(const std::vector<c10::Device>& devices) {
  int64_t total = 0;
  bool cpu = false;
  std::set<c10::DeviceIndex> seen;
  for (const auto& d : devices) {
    if (!d.is_cuda()) {
      cpu = true;
      continue;
    }
#ifdef OURGPIPE_HAVE_TORCH_CUDA
    if (seen.insert(d.index()).second) {
      size_t free = 0, device_total = 0;
      c10::cuda::CUDAGuard guard(d.index());
      C10_CUDA_CHECK(cudaMemGetInfo(&free, &device_total));
      total += static_cast<int64_t>(device_total);
    }
#endif
  }
  if (cpu) total += static_cast<int64_t>(sysconf(_SC_PHYS_PAGES)) * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
  return total;
}

std::optional<GpuMemory> gpu_memory(const c10::Device& device) {
#ifdef OURGPIPE_HAVE_TORCH_CUDA
  if (!device.is_cuda()) return std::nullopt;
  c10::cuda::CUDAGuard guard(device.index());
  size_t free = 0, total = 0;
  C10_CUDA_CHECK(cudaMemGetInfo(&free, &total));
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
  const auto all = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
  return GpuMemory{static_cast<int64_t>(total), static_cast<int64_t>(free), stats.reserved_bytes[all].current};
#else
  (void)device;
  return std::nullopt;
#endif
}

void reset_peak_memory(const std::vector<c10::Device>& devices) {
#ifdef OURGPIPE_HAVE_TORCH_CUDA
  for (const auto& d : devices) {
    if (d.is_cuda()) reset_cuda_allocator_peak(d.index());
  }
#else
  (void)devices;
#endif
}

void synchronize_devices(const std::vector<c10::Device>& devices) {
#ifdef OURGPIPE_HAVE_TORCH_CUDA
  std::set<c10::DeviceIndex> seen;
  for (const auto& d : devices) {
    if (!d.is_cuda() || !seen.insert(d.index()).second) continue;
    // device_synchronize() waits for the calling thread's current device only.
    c10::cuda::CUDAGuard guard(d.index());
    c10::cuda::device_synchronize();
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

std::shared_ptr<void> use_own_stream(c10::Device device) {
#ifdef OURGPIPE_HAVE_TORCH_CUDA
  if (device.is_cuda()) {
    return std::make_shared<c10::cuda::CUDAStreamGuard>(c10::cuda::getStreamFromPool(false, device.index()));
  }
#else
  (void)device;
#endif
  return nullptr;
}

void synchronize_current_stream(c10::Device device) {
#ifdef OURGPIPE_HAVE_TORCH_CUDA
  if (device.is_cuda()) c10::cuda::getCurrentCUDAStream(device.index()).synchronize();
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
  bool reached() const override { return event_.query(); }

 private:
  at::cuda::CUDAEvent event_;
};

class CudaTimingEvent final : public TimingEvent {
 public:
  explicit CudaTimingEvent(const c10::cuda::CUDAStream& stream) { event_.record(stream); }
  double ms_since(const TimingEvent& earlier) const override {
    const auto* e = dynamic_cast<const CudaTimingEvent*>(&earlier);
    if (e == nullptr) throw std::logic_error("ms_since: the earlier event is not a CUDA timing event");
    return e->event_.elapsed_time(event_);
  }

 private:
  at::cuda::CUDAEvent event_{cudaEventDefault};  // timing on (the default CUDAEvent has none)
};

// A stream of this rank alone. LibTorch's pool has 32 streams per priority and device, handed out
// round-robin: 4 ranks x 8 micro-batches already wrap around, so ranks would share streams
// (independent work serialised, and one rank's stream-class change would hit another rank's
// forward). Non-blocking like the pool's, at the device's greatest priority for high and 0 for
// low. Never destroyed: the caching allocator keeps blocks and events tied to it until exit, as it
// does for the pool's streams.
c10::cuda::CUDAStream create_rank_stream(c10::DeviceIndex device, bool high) {
  c10::cuda::CUDAGuard guard(device);
  int least = 0;
  int greatest = 0;
  C10_CUDA_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  cudaStream_t raw = nullptr;
  C10_CUDA_CHECK(cudaStreamCreateWithPriority(&raw, cudaStreamNonBlocking, high ? greatest : least));
  return c10::cuda::getStreamFromExternal(raw, device);
}

// Logs once per process whether the shim's per-thread class is there.
void log_orion_thread_class_once() {
  static const bool logged = [] {
    engine_log_info(find_orion_set_thread_class() != nullptr
                        ? "Orion shim API found: each action sets its thread's class (parallel.priority)"
                        : "Orion shim API not found: stream priorities come from CUDA stream priorities only");
    return true;
  }();
  (void)logged;
}
#endif
}  // namespace

struct RankStreams::Impl {
  c10::Device device{c10::kCPU};
  StreamPolicy policy = StreamPolicy::kSingle;
  std::string priority;
#ifdef OURGPIPE_HAVE_TORCH_CUDA
  // enter() runs on the rank's thread and, for an overlapped pair's forward, on its forward lane.
  std::mutex mu;  // guards streams, step_start, waited_step_start
  // (is_backward, micro-batch) -> this rank's own stream, created on first use.
  // Micro-batch kAllWeights keys the one stream every W of the rank runs on.
  std::map<std::pair<bool, int>, c10::cuda::CUDAStream> streams;
  // Set by begin_step(): the previous optimizer step's work; each stream waits once per step.
  std::shared_ptr<const ReadyEvent> step_start;
  std::set<std::pair<bool, int>> waited_step_start;
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

void RankStreams::begin_step() {
#ifdef OURGPIPE_HAVE_TORCH_CUDA
  // optimizer_step updates the weights on this device's current (default) stream; without this
  // the next step's forwards on the rank streams could read weights mid-update (train() happens to
  // synchronize, but nothing here relied on it).
  if (impl_->device.is_cuda() && impl_->policy != StreamPolicy::kSingle) {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->step_start = std::make_shared<CudaReadyEvent>(c10::cuda::getCurrentCUDAStream(impl_->device.index()));
    impl_->waited_step_start.clear();
  }
#endif
}

std::shared_ptr<void> RankStreams::enter(ActionType type, int microbatch) {
#ifdef OURGPIPE_HAVE_TORCH_CUDA
  if (impl_->device.is_cuda() && impl_->policy != StreamPolicy::kSingle) {
    constexpr int kAllWeights = -1;
    const bool per_rank = impl_->policy == StreamPolicy::kPerRank;
    const bool backward = is_backward(type);
    // Every W of the rank on one stream: W's of different micro-batches add into the same .grad
    // (StageRuntime::backward_weight), which on per-micro-batch streams would race. kPerRank: one
    // key for every action.
    auto key = per_rank ? std::make_pair(false, 0)
                        : std::make_pair(backward, type == ActionType::kBackwardWeight ? kAllWeights : microbatch);
    std::lock_guard<std::mutex> lock(impl_->mu);
    auto it = impl_->streams.find(key);
    if (it == impl_->streams.end()) {
      // One stream for forward and backward has no side to favour: default (lowest) priority.
      const bool high = per_rank                                ? false
                        : impl_->priority == "backward_first"  ? backward
                        : impl_->priority == "forward_first"   ? !backward
                                                               : false;
      it = impl_->streams.emplace(key, create_rank_stream(impl_->device.index(), high)).first;
    }
    // Orion: autograd runs mb's backward kernels on F(mb)'s stream, so the shim classes this
    // action's launches by the thread that issues them, whatever their stream (orion.h).
    log_orion_thread_class_once();
    struct ActionScope {
      ActionScope(const c10::cuda::CUDAStream& stream, const char* cls) : stream_guard(stream), thread_class(cls) {}
      c10::cuda::CUDAStreamGuard stream_guard;
      OrionThreadClassScope thread_class;
    };
    auto guard = std::make_shared<ActionScope>(it->second, orion_thread_class(type, impl_->priority));
    if (impl_->step_start && impl_->waited_step_start.insert(key).second) impl_->step_start->block_current_stream();
    return guard;
  }
#else
  (void)type;
  (void)microbatch;
#endif
  return nullptr;
}

std::shared_ptr<const TimingEvent> record_timing_event(c10::Device device) {
#ifdef OURGPIPE_HAVE_TORCH_CUDA
  if (device.is_cuda()) return std::make_shared<CudaTimingEvent>(c10::cuda::getCurrentCUDAStream(device.index()));
#else
  (void)device;
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

void RankStreams::record_use(const at::Tensor& tensor) const { record_stream_use(tensor); }

void record_stream_use(const at::Tensor& tensor) {
#ifdef OURGPIPE_HAVE_TORCH_CUDA
  if (tensor.defined() && tensor.is_cuda()) {
    c10::cuda::CUDACachingAllocator::recordStream(tensor.storage().data_ptr(),
                                                  c10::cuda::getCurrentCUDAStream(tensor.device().index()));
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
  const std::string shim_classes =
      "; under the Orion shim each action sets its thread's class (F " + fwd + ", B/I/W " + bwd + " priority)";
  if (impl_->policy == StreamPolicy::kPerRank) {
    return impl_->device.str() + ": one stream of this rank for all its actions (parallel.streams=per_rank, default "
           "priority)" + (impl_->priority != "none" ? shim_classes : "");
  }
  // Honest about LibTorch: autograd runs each backward kernel on the stream its forward op used,
  // so CUDA stream priority alone cannot favour backward over forward here.
  std::string text = fmt::format(
      "{}: per-micro-batch streams of this rank (F(mb) on a {}-priority stream, B/I(mb) on a {}-priority stream, all W on one "
      "{}-priority stream); autograd runs backward kernels on their forward's {}-priority stream, so the {}-priority "
      "streams carry only synchronisation and gradient accumulation",
      impl_->device.str(), fwd, bwd, bwd, fwd, bwd);
  if (impl_->priority != "none") text += shim_classes + ", so backward kernels are scheduled as backward on their forward's stream";
  return text;
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

// Allocated-bytes statistics for every device kind: CUDA's from its caching allocator, CPU's from
// a counting CPU allocator installed in place of LibTorch's (which keeps no statistics a program
// can read). It adds a relaxed atomic update or two and a 64-byte header per allocation.
#include <ATen/core/Tensor.h>
#include <c10/core/Allocator.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/impl/alloc_cpu.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <cstdint>
#include <mutex>
#include <set>

#include "trainer/device/device.h"

#ifdef OURGPIPE_HAVE_TORCH_CUDA
#include <ATen/Context.h>
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace gpipe {
namespace {

std::atomic<int64_t> g_cpu_now{0};
std::atomic<int64_t> g_cpu_peak{0};

void raise_peak(int64_t now) {
  int64_t peak = g_cpu_peak.load(std::memory_order_relaxed);
  while (now > peak && !g_cpu_peak.compare_exchange_weak(peak, now, std::memory_order_relaxed)) {
  }
}

// LibTorch's CPU allocation (c10::alloc_cpu: aligned, huge pages for large blocks) with a
// 64-byte header holding the size, so the deleter can count it down. The DataPtr's context is
// its data pointer, as LibTorch's raw_allocate() requires of a CPU allocator.
constexpr size_t kHeader = 64;  // keeps c10's 64-byte alignment

void counted_free(void* data) {
  if (data == nullptr) return;
  auto* base = static_cast<char*>(data) - kHeader;
  int64_t bytes = 0;
  std::memcpy(&bytes, base, sizeof bytes);
  g_cpu_now.fetch_sub(bytes, std::memory_order_relaxed);
  c10::free_cpu(base);
}

class CountingCpuAllocator final : public c10::Allocator {
 public:
  c10::DataPtr allocate(size_t n) override {
    auto* base = static_cast<char*>(c10::alloc_cpu(n + kHeader));
    const auto bytes = static_cast<int64_t>(n);
    std::memcpy(base, &bytes, sizeof bytes);
    raise_peak(g_cpu_now.fetch_add(bytes, std::memory_order_relaxed) + bytes);
    void* data = base + kHeader;
    return {data, data, &counted_free, c10::Device(c10::DeviceType::CPU)};
  }
  c10::DeleterFnPtr raw_deleter() const override { return &counted_free; }
  void copy_data(void* dest, const void* src, std::size_t count) const override { default_copy_data(dest, src, count); }
};

std::once_flag g_install_once;
std::atomic<bool> g_installed{false};

}  // namespace

void install_cpu_allocation_counter() {
  std::call_once(g_install_once, [] {
    // Leaked on purpose: tensors freed during static destruction still call its deleter.
    static auto* counting = new CountingCpuAllocator();
    c10::SetCPUAllocator(counting, /*priority=*/1);
    g_installed = true;
  });
}

bool cpu_allocation_counter_installed() { return g_installed.load(); }

#ifdef OURGPIPE_HAVE_TORCH_CUDA
namespace {
c10::CachingDeviceAllocator::DeviceStats cuda_allocator_stats(c10::DeviceIndex index) {
  // The caching allocator sizes its per-device tables when CUDA is first initialized (the first
  // CUDA tensor); before that getDeviceStats throws "Invalid device argument ...: did you call
  // init?". The planner reads its baseline before it allocates anything (H100, first GPU run).
  at::globalContext().lazyInitDevice(c10::kCUDA);
  return c10::cuda::CUDACachingAllocator::getDeviceStats(index);
}
constexpr auto kAggregate = static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE);
}  // namespace

int64_t cuda_allocated_bytes_now(c10::DeviceIndex index) {
  return cuda_allocator_stats(index).allocated_bytes[kAggregate].current;
}
int64_t cuda_allocated_bytes_peak(c10::DeviceIndex index) {
  return cuda_allocator_stats(index).allocated_bytes[kAggregate].peak;
}
void reset_cuda_allocator_peak(c10::DeviceIndex index) {
  at::globalContext().lazyInitDevice(c10::kCUDA);
  c10::cuda::CUDACachingAllocator::resetPeakStats(index);
}

std::optional<AllocatorActivity> allocator_activity(const std::vector<c10::Device>& devices) {
  std::optional<AllocatorActivity> sum;
  std::set<c10::DeviceIndex> seen;
  for (const auto& d : devices) {
    if (!d.is_cuda() || !seen.insert(d.index()).second) continue;
    const auto stats = cuda_allocator_stats(d.index());
    if (!sum) sum.emplace();
    sum->device_mallocs += stats.num_device_alloc;
    sum->device_frees += stats.num_device_free;
    sum->alloc_retries += stats.num_alloc_retries;
    sum->sync_all_streams += stats.num_sync_all_streams;
    sum->reserved_peak_bytes = std::max(sum->reserved_peak_bytes, stats.reserved_bytes[kAggregate].peak);
  }
  return sum;
}
#else
std::optional<AllocatorActivity> allocator_activity(const std::vector<c10::Device>&) { return std::nullopt; }
int64_t cuda_allocated_bytes_now(c10::DeviceIndex) { return -1; }
int64_t cuda_allocated_bytes_peak(c10::DeviceIndex) { return -1; }
void reset_cuda_allocator_peak(c10::DeviceIndex) {}
#endif

AllocatorActivity allocator_activity_since(const AllocatorActivity& before, const AllocatorActivity& now) {
  AllocatorActivity d = now;
  d.device_mallocs -= before.device_mallocs;
  d.device_frees -= before.device_frees;
  d.alloc_retries -= before.alloc_retries;
  d.sync_all_streams -= before.sync_all_streams;
  return d;
}

int64_t allocated_bytes(const c10::Device& device) {
#ifdef OURGPIPE_HAVE_TORCH_CUDA
  if (device.is_cuda()) {
    return cuda_allocated_bytes_now(device.index());
  }
#endif
  if (device.is_cpu() && g_installed) return g_cpu_now.load(std::memory_order_relaxed);
  return -1;
}

int64_t peak_allocated_bytes(const std::vector<c10::Device>& devices) {
  int64_t peak = -1;
  for (const auto& d : devices) {
#ifdef OURGPIPE_HAVE_TORCH_CUDA
    if (d.is_cuda()) {
      peak = std::max<int64_t>(peak, cuda_allocated_bytes_peak(d.index()));
      continue;
    }
#endif
    if (d.is_cpu() && g_installed) peak = std::max(peak, g_cpu_peak.load(std::memory_order_relaxed));
  }
  return peak;
}

void reset_peak_allocated(const std::vector<c10::Device>& devices) {
  for (const auto& d : devices) {
#ifdef OURGPIPE_HAVE_TORCH_CUDA
    if (d.is_cuda()) {
      reset_cuda_allocator_peak(d.index());
      continue;
    }
#endif
    if (d.is_cpu()) g_cpu_peak.store(g_cpu_now.load(std::memory_order_relaxed), std::memory_order_relaxed);
  }
}

}  // namespace gpipe

// Devices and streams for the executors. Device selection (auto | cpu | cuda), per-rank CUDA
// streams whose priority says forward or backward (parallel.priority), events that order work
// across streams, bf16 autocast per thread, and memory statistics. On CPU, streams and events
// do not exist: every stream call is a no-op and describe() says so.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "trainer/schedule/schedule.h"

namespace gpipe {

// True when this build has LibTorch-CUDA code paths and a CUDA device is visible.
bool cuda_usable();
// One device per pipeline rank: cpu for all, or cuda:(rank % device count). "auto" picks cuda
// when usable. Throws ConfigError naming parallel.device if "cuda" is asked and absent, or the
// value is unknown.
std::vector<c10::Device> resolve_rank_devices(const std::string& requested, int num_ranks);
// "cpu" or the GPU's marketing name ("NVIDIA H100 80GB HBM3").
std::string device_display_name(const c10::Device& device);
// The GPU's UUID as nvidia-smi -L spells it ("GPU-8-4-4-4-12 hex digits"), which orion-gpud serves
// (parallel.publish_bubbles_gpu=auto). Throws std::runtime_error for a CPU device or a failed query.
std::string gpu_uuid(const c10::Device& device);
std::string format_gpu_uuid(const unsigned char* bytes);  // 16 bytes
// Distinct devices among `devices`.
int count_distinct_devices(const std::vector<c10::Device>& devices);
// Largest peak allocated bytes over the CUDA devices since reset_peak_memory, or max RSS on CPU.
int64_t peak_memory_bytes(const std::vector<c10::Device>& devices);
void reset_peak_memory(const std::vector<c10::Device>& devices);
// Allocated-bytes statistics (what a tensor holds, not what an allocator caches). CUDA: the
// caching allocator's. CPU: counted once install_cpu_allocation_counter() replaced LibTorch's CPU
// allocator with a counting one (gpipe_runner does at start; CPU allocations then no longer reach
// the PyTorch profiler's memory view); -1 where nothing counts.
void install_cpu_allocation_counter();
bool cpu_allocation_counter_installed();
int64_t allocated_bytes(const c10::Device& device);
// Largest allocated bytes over `devices` since reset_peak_allocated (-1: none counted).
int64_t peak_allocated_bytes(const std::vector<c10::Device>& devices);
void reset_peak_allocated(const std::vector<c10::Device>& devices);
// The CUDA caching allocator's allocated bytes on one GPU, now and at their peak, and the peak's
// reset. Safe before the process's first CUDA tensor (they initialize CUDA first, as the first
// allocation would); -1 / nothing in a build without LibTorch-CUDA.
int64_t cuda_allocated_bytes_now(c10::DeviceIndex index);
int64_t cuda_allocated_bytes_peak(c10::DeviceIndex index);
void reset_cuda_allocator_peak(c10::DeviceIndex index);
// The CUDA caching allocator's dealings with the driver, summed over the distinct GPUs among
// `devices` since the process began (counts) or since reset_peak_memory (reserved peak): what
// torch.cuda.memory_stats() calls num_device_alloc / num_device_free (cudaMalloc / cudaFree: a
// warm training step should make none), num_alloc_retries (an allocation failed, the allocator
// freed its cache, synchronising every stream, and tried again: a step near the memory limit) and
// num_sync_all_streams. nullopt when none of `devices` is a GPU.
struct AllocatorActivity {
  int64_t device_mallocs = 0, device_frees = 0, alloc_retries = 0, sync_all_streams = 0;
  int64_t reserved_peak_bytes = 0;  // the largest over the GPUs
};
std::optional<AllocatorActivity> allocator_activity(const std::vector<c10::Device>& devices);
// `now` minus `before` for the counts; `now`'s reserved peak.
AllocatorActivity allocator_activity_since(const AllocatorActivity& before, const AllocatorActivity& now);

// Memory the distinct devices among `devices` have in all: each GPU's total memory, or the
// machine's physical memory (once) for CPU.
int64_t total_memory_bytes(const std::vector<c10::Device>& devices);
// One GPU's memory now: its total, what is free (cudaMemGetInfo), and what this process's caching
// allocator holds (reserved). nullopt for a CPU device or a build without LibTorch-CUDA.
struct GpuMemory {
  int64_t total = 0, free = 0, reserved_here = 0;
};
std::optional<GpuMemory> gpu_memory(const c10::Device& device);
// Waits for all queued work on every one of the devices, each under its own device guard (no-op
// on CPU).
void synchronize_devices(const std::vector<c10::Device>& devices);

// Tells the caching allocator that `tensor` (made on another stream) is used on the calling
// thread's current stream, so its memory is not reused before this stream's work on it is done
// (no-op on CPU).
void record_stream_use(const at::Tensor& tensor);

// Something a stream can wait on (a CUDA event); null pointers stand for "ready".
class ReadyEvent {
 public:
  virtual ~ReadyEvent() = default;
  virtual void block_current_stream() const = 0;
  // Whether the GPU has run past it (cudaEventQuery): for a host thread that must not wait.
  virtual bool reached() const = 0;
};

// A CUDA event with timing, recorded on a stream: the GPU clock of the action timeline.
class TimingEvent {
 public:
  virtual ~TimingEvent() = default;
  // Milliseconds of GPU time from `earlier` to this event. Both on one device, both complete
  // (read after the device was synchronised).
  virtual double ms_since(const TimingEvent& earlier) const = 0;
};
// Records a timing event on `device`'s current stream of the calling thread; null on CPU.
std::shared_ptr<const TimingEvent> record_timing_event(c10::Device device);

enum class StreamPolicy {
  kSingle,         // the device's current (default) stream: the naive executor
  kPerMicrobatch,  // each micro-batch's forward and backward on streams of their own (per rank)
  kPerRank,        // every action of the rank on one stream of its own (parallel.streams=per_rank)
};

// The streams of one rank. kPerMicrobatch, parallel.priority: backward_first (backward on
// high-priority streams, forward on low), forward_first (the reverse), none (all at default
// priority). kPerRank: one default-priority stream for every action of the rank.
// Caveat: LibTorch autograd runs each backward kernel on the stream its forward op used, so the
// backward kernels of mb run on F(mb)'s stream; the backward stream mostly carries the engine's
// synchronisation. Under the Orion shim (found at run time) enter() sets the calling thread's
// class for the action (orion_set_thread_class), so the backward kernels on F(mb)'s stream get the
// backward class; see describe(). Thread-safe: an overlapped pair enters from two threads.
class RankStreams {
 public:
  RankStreams(c10::Device device, StreamPolicy policy, const std::string& priority);
  ~RankStreams();
  RankStreams(const RankStreams&) = delete;
  RankStreams& operator=(const RankStreams&) = delete;
  // Makes the stream for this action current on the calling thread until the result dies.
  // kPerMicrobatch: F(mb) and B/I(mb) get streams of their own, never shared with another rank; every W of the rank shares one
  // stream, because W's of different micro-batches add into the same .grad tensors. kPerRank: the rank's one stream.
  [[nodiscard]] std::shared_ptr<void> enter(ActionType type, int microbatch);
  // Call on the thread that ran the optimizer step, before the step's actions: every rank stream
  // waits (at its first enter() of the step) for the work queued so far on this device's current
  // stream, i.e. the previous optimizer step's weight updates. No-op on CPU or kSingle.
  void begin_step();
  // An event recorded on the current stream (null on CPU).
  std::shared_ptr<const ReadyEvent> record_ready() const;
  // The current stream waits for `event` (null: nothing to wait for).
  static void wait(const std::shared_ptr<const ReadyEvent>& event);
  // Tells the caching allocator that `tensor` (made on another stream) is used on the current
  // stream, so its memory is not reused early (no-op on CPU).
  void record_use(const at::Tensor& tensor) const;
  // One line for the log, e.g. "CPU: no streams; actions run in order on the rank's thread".
  std::string describe() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Thread-local bf16 autocast on a CUDA device for the lifetime of the object; clears the
// autocast weight cache on exit (weights change after each optimizer step). No-op when
// `enabled` is false or the device is not CUDA.
class AutocastScope {
 public:
  AutocastScope(c10::Device device, bool enabled);
  ~AutocastScope();
  AutocastScope(const AutocastScope&) = delete;
  AutocastScope& operator=(const AutocastScope&) = delete;

 private:
  bool active_ = false;
};

// Binds the calling thread to `device` (cudaSetDevice) so its kernels and streams go there.
void bind_thread_to_device(c10::Device device);

// Makes a stream of the device's pool (default priority) current on the calling thread until the
// result dies, as a rank's own stream: kernels of threads that each hold one may run at once
// (on the default stream they would run one after another). Null on CPU.
[[nodiscard]] std::shared_ptr<void> use_own_stream(c10::Device device);
// Waits for the calling thread's current stream on `device` only (no-op on CPU).
void synchronize_current_stream(c10::Device device);

}  // namespace gpipe

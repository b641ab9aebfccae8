// A discrete-event simulated GPU: the Device the scheduler is tested and studied on without a GPU.
//
// Model (virtual clock in ns, deterministic for a seed):
//  - `sm_count` SMs, each with a thread / block / shared-memory budget. A kernel is grid.count()
//    blocks; each block takes KernelInfo::sim_block_ns when it runs alone. Resident blocks per SM
//    come from sim_blocks_per_sm, or from block size and shared memory (max_active_blocks_per_sm).
//  - Per-stream FIFO: an op starts only when the previous op of its stream finished. Event
//    records complete when they reach the head of their stream; a stream-wait-event waits for the
//    event's latest record submitted before it (CUDA semantics).
//  - Block dispatch: free SM resources go to waiting blocks of high-priority streams first, then
//    to lower priority, oldest kernel first within a priority (the one that reached the head of
//    its stream first, then submission order); blocks are spread breadth-first
//    over SMs. Running blocks are never preempted. A lower-priority block may take a slot that the
//    waiting higher-priority blocks do not fit in (different block shape).
//  - Memory bandwidth: a memory-bound kernel (profile_hint kMemoryBound) that has b blocks running
//    demands min(1, b / (memory_saturation_fraction * sm_count * blocks_per_sm)) of the device's
//    bandwidth (a kernel saturates bandwidth once it holds that share of the GPU). While the
//    summed demand D of running memory-bound kernels exceeds 1, every memory-bound block progresses
//    at rate 1/D (proportional bandwidth share). Alone, a memory-bound kernel never exceeds D = 1,
//    so its alone time is the wave formula.
//  - SM issue capacity: a compute-bound (or unknown) kernel with b blocks running holds
//    b / (sm_count * blocks_per_sm) of the GPU's issue capacity (its blocks_per_sm is what it runs
//    with alone). Blocks of different shapes can co-reside past 1 (e.g. a thread-limited block next
//    to shared-memory-limited ones); while the sum C exceeds 1, compute blocks progress at 1/C.
//    This assumes blocks spread evenly over SMs (no per-SM rates).
//  - Copies take bytes / copy bandwidth, memsets bytes / memset bandwidth; they use no SMs and do
//    not contend with each other (copy engines are modelled as unlimited). Host functions and
//    memory-pool ops take no time; a graph launch takes sim_block_ns and no SMs (opaque).
//  - Jitter: with `jitter` > 0 each kernel launch's block time is scaled by a factor drawn once
//    per launch from a seeded normal(1, jitter), clipped to [0.5, 1.5].
//  - Block spread: with `block_spread` > 0 the blocks dispatched together are dealt into up to 8
//    groups (of at least 16 blocks), each taking block time * a factor drawn uniformly from [1 - spread, 1 + spread], so
//    slots free up gradually as on real GPUs instead of whole waves in lock-step (with 0, every
//    wave ends at once and a waiting kernel gets slots only at wave boundaries).
//  - Processes (contexts): each stream belongs to a context (set_stream_context; 0 by default),
//    one per process on the GPU. With ContextSharing::kMps (NVIDIA MPS, or one process) kernels of
//    every context share the SMs as above. With kTimeSlice (several processes without MPS) blocks
//    of one context at a time are resident: the active context keeps the GPU while it has kernels
//    waiting or running; when it has none and another context has blocks waiting, or when another
//    context has waited a whole time slice, the active one stops receiving blocks, its running
//    blocks finish (the model does not preempt inside a block), and after context_switch_ns the
//    next context in round-robin order gets the GPU. Only the very first context pays no switch:
//    the GPU keeps the last active context loaded, so another one pays a switch even after idle
//    time. Copies, memsets and graph launches are not time-sliced (copy engines).
//  - Submission is lazy: blocks of newly submitted ops are dispatched when the clock is next driven
//    (advance_to / run_until_idle), so ops submitted at the same virtual time compete fairly by
//    priority whatever order they were submitted in. next_event_ns() returns now_ns() while such a
//    dispatch is pending.
//
// Thread-safe: every call takes one mutex; completions are handed to the listener from poll()
// outside that mutex (the listener may call submit()).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "scheduler/device.h"

namespace sched {

// How kernels of different contexts (processes) share the GPU (see the model above).
enum class ContextSharing {
  kMps,        // concurrent, like streams of one process (MPS, or a single process)
  kTimeSlice,  // one context's blocks at a time, switched with a cost (several processes, no MPS)
};

struct SimGpuConfig {
  int sm_count = 132;                    // H100 SXM
  uint32_t max_threads_per_sm = 2048;
  uint32_t max_blocks_per_sm = 32;
  uint32_t shared_mem_per_sm = 228 * 1024;
  uint32_t max_threads_per_block = 1024;
  double default_block_ns = 5'000;       // block time of a kernel whose sim_block_ns is 0
  double memory_saturation_fraction = 0.5;
  double copy_bytes_per_ns = 25.0;       // 25 GB/s (host <-> device)
  double memset_bytes_per_ns = 2'000.0;  // 2 TB/s
  double jitter = 0.0;                   // relative std-dev of per-launch block time
  double block_spread = 0.0;             // blocks' times vary in [1 - spread, 1 + spread] within a launch
  uint64_t seed = 1;
  ContextSharing context_sharing = ContextSharing::kMps;
  // kTimeSlice: a context waited on by another keeps the GPU at most this long (the driver's
  // default time slice is on the order of milliseconds), and a switch costs this much (save and
  // restore of a context: tens of microseconds on recent GPUs).
  int64_t time_slice_ns = 2'000'000;
  int64_t context_switch_ns = 25'000;
};

// Error codes submit() returns; the values are the CUDA driver's for the same situation.
inline constexpr int kSimErrorInvalidValue = 1;  // CUDA_ERROR_INVALID_VALUE: block cannot fit an SM

class SimulatedGpu final : public Device {
 public:
  explicit SimulatedGpu(SimGpuConfig config = {});
  ~SimulatedGpu() override;
  SimulatedGpu(const SimulatedGpu&) = delete;
  SimulatedGpu& operator=(const SimulatedGpu&) = delete;

  // Device
  int submit(const Op& op) override;
  void poll() override;
  void set_listener(CompletionListener* listener) override;
  int sm_count() const override;
  int max_active_blocks_per_sm(const KernelInfo& kernel) override;
  int64_t now_ns() const override;

  // Hardware stream priority (cuStreamCreateWithPriority): high-priority streams' blocks are
  // dispatched first. Streams are normal priority until set.
  void set_stream_priority(StreamId stream, bool high_priority);
  // A CUDA green context's SM partition (cuDevSmResourceSplitByCount, cuGreenCtxStreamCreate):
  // the stream's blocks go only to SMs [first_sm, first_sm + sm_count); sm_count 0 lifts it. Block
  // priority still orders blocks within an SM. May be changed at any time (a resized partition):
  // blocks dispatched from then on use the new range, running blocks keep their SMs. Throws
  // std::invalid_argument outside the GPU.
  void set_stream_sms(StreamId stream, int first_sm, int sm_count);

  // The context (process) a stream belongs to; 0 until set. Matters only with kTimeSlice.
  void set_stream_context(StreamId stream, int context);
  // kTimeSlice: context switches so far.
  uint64_t context_switches() const;

  // Time of the next state change: now_ns() while a dispatch is pending, -1 when idle.
  int64_t next_event_ns() const;
  // Processes every event up to `t_ns` (>= now_ns(); earlier values are an error) and moves the
  // clock to `t_ns`.
  void advance_to(int64_t t_ns);
  // Runs until every submitted op completed; returns the final clock.
  int64_t run_until_idle();
  bool idle() const;

  // Integral over time of the number of SMs holding at least one block, in SM*ns. Utilisation
  // over an interval is its growth divided by (sm_count * interval).
  double busy_sm_ns() const;

  // Every completion so far, in completion order (independent of the listener): completions(i)
  // returns those from index i on.
  size_t completed_count() const;
  std::vector<Completion> completions(size_t from = 0) const;

  const SimGpuConfig& config() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace sched

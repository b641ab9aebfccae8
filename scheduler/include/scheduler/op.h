// Ops: the unit of work the scheduler orders. One op is one stream-ordered thing a program asked
// the GPU to do (a kernel launch, a copy, an event record, ...). The scheduler never includes CUDA
// headers: what it needs to decide (kernel identity, grid, block, SM need, profile) is described
// here, and what the backend needs to actually submit the op travels as an opaque OpPayload.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

namespace sched {

// Which scheduling treatment a stream's ops get.
enum class StreamClass : uint8_t {
  kHighPriority,   // latency-critical: submitted at once, inline in the caller's thread
  kBestEffort,     // admitted by the policy when it will not hurt high-priority work
  kCommunication,  // NCCL & co: never deferred (peers spin waiting for it), submitted at once
  kUnmanaged,      // not scheduled: submitted at once, in program order (the default class)
};
const char* to_string(StreamClass c);
// Parses "high_priority"/"hp", "best_effort"/"be", "communication"/"comm", "unmanaged".
// Returns false for anything else.
bool parse_stream_class(const std::string& text, StreamClass* out);

enum class OpKind : uint8_t {
  kKernel,           // kernel launch (any launch entry point)
  kCopy,             // async memcpy
  kMemset,           // async memset
  kEventRecord,      // record `event` on the stream
  kStreamWaitEvent,  // the stream waits for `event`'s latest record
  kHostFunc,         // host function / callback
  kGraphLaunch,      // CUDA graph launch: opaque, never split or reordered
  kMemPool,          // stream-ordered alloc/free
};
const char* to_string(OpKind k);
// Parses the names to_string(OpKind) prints ("kernel", "copy", ..., "mem_pool"). False otherwise.
bool parse_op_kind(const std::string& text, OpKind* out);

// Orion's profile classes (its CSV column "Profile": 1 compute, 0 memory, -1 unknown).
enum class KernelProfile : int8_t { kUnknown = -1, kMemoryBound = 0, kComputeBound = 1 };

using StreamId = uint64_t;  // opaque stream handle value (a CUstream, or a simulated id)
using EventId = uint64_t;   // opaque event handle value
using KernelId = uint64_t;  // kernel identity (a CUfunction/CUkernel value, or a name hash)

struct Dim3 {
  uint32_t x = 1, y = 1, z = 1;
  uint64_t count() const { return uint64_t{x} * y * z; }
};

// Backend-specific part of an op (the driver entry point and an owned copy of its arguments for
// the real driver; nothing for the simulated GPU). The scheduler only moves it around.
class OpPayload {
 public:
  virtual ~OpPayload() = default;
};

// Makes an owned deep copy of a borrowed payload, so the op can outlive the caller's frame.
// Returns nullptr when that is impossible (argument sizes unknown): the dispatcher then makes the
// caller wait until its op is submitted, which keeps the borrowed payload valid.
using PayloadCloner = std::unique_ptr<OpPayload> (*)(const OpPayload& borrowed);

struct KernelInfo {
  KernelId id = 0;
  const char* name = nullptr;  // stable for the process lifetime (owned by the profile store), may be null
  Dim3 grid, block;
  uint32_t shared_mem_bytes = 0;
  // Known nature of the kernel where the caller knows it (workload file, imported profile);
  // otherwise the profile store's learned answer is used.
  KernelProfile profile_hint = KernelProfile::kUnknown;
  // Simulated GPU only (workload replay): time of one block when it runs alone, and resident
  // blocks per SM (0: derive from block size and shared memory).
  double sim_block_ns = 0;
  uint32_t sim_blocks_per_sm = 0;
};

struct Op {
  OpKind kind = OpKind::kKernel;
  StreamId stream = 0;
  KernelInfo kernel;        // kKernel (and kGraphLaunch for its name, if any)
  // kEventRecord, kStreamWaitEvent: the event; kKernel: an event the launch records itself (a
  // launch-completion or programmatic-event attribute), 0 for none; kGraphLaunch, and kCopy for a
  // graph upload: its executable's order id (see records_event()).
  EventId event = 0;
  uint64_t bytes = 0;       // kCopy, kMemset
  // Borrowed (caller-owned, valid only during the submit call) or owned payload.
  const OpPayload* borrowed = nullptr;
  std::unique_ptr<OpPayload> owned;
  PayloadCloner clone = nullptr;
  // The class the program asked for this op itself (the shim: the calling thread's phase, set
  // with orion_set_thread_class), or nullopt: the class of its stream. A communication stream
  // keeps its class whatever is asked (its NCCL kernels spin until their peers arrive).
  std::optional<StreamClass> requested_class;

  const OpPayload* payload() const { return owned ? owned.get() : borrowed; }
  // Whether the op records `event` (an event record, or a launch recording one implicitly). A
  // graph launch or upload "records" its executable (`event` = an id the shim derives from the
  // handle): CUDA orders each launch or upload of an executable behind its earlier ones, on any
  // stream, which is exactly how a record is ordered behind the event's earlier records.
  bool records_event() const {
    return event != 0 && (kind == OpKind::kEventRecord || kind == OpKind::kKernel ||
                          kind == OpKind::kGraphLaunch || kind == OpKind::kCopy);
  }

  // Filled in by the dispatcher.
  uint64_t seq = 0;           // global arrival order
  int64_t arrival_ns = 0;     // device clock at submit()
  int64_t submitted_ns = 0;   // device clock when handed to the backend
  StreamClass cls = StreamClass::kUnmanaged;  // the class it was scheduled with
  // A tracked kernel the backend should time exactly: its duration is still being learned (few
  // samples in the profile store) or this is a periodic re-sample. A backend that tracks
  // completions in batches (the real-driver one) marks such a kernel's start and end with events
  // of its own; others may ignore it.
  bool wants_timing = false;
};

}  // namespace sched

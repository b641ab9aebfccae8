// The `partition` policy on a real GPU: best-effort kernels run on the SMs of a CUDA green context
// (cuDevSmResourceSplitByCount, cuGreenCtxCreate), so high-priority kernels always find free SMs.
//
// How a best-effort launch on the program's stream S moves:
//   record fork on S  ->  shadow waits fork  ->  launch on shadow  ->  record join on shadow
//   ->  S waits join
// The shadow is S's own stream in the green context of the partition size the policy wants now
// (one per stream and size: two best-effort streams never serialise on one shadow). Program order
// holds both ways: the kernel follows everything before it on S, everything after it on S
// follows the kernel, and a synchronisation of S, of an event recorded on S later, or of the
// context covers it (S waits for the join). Consecutive moved launches of S to the same shadow
// skip the fork (S has had nothing but the join since). Green contexts are made once per size, on
// first use (a small ladder: resizing is choosing another one, never a new context per launch).
//
// What stays in place, counted per reason (PartitionStats): launches on the NULL / per-thread
// streams; cooperative launches and launches with attributes other than priority (clusters,
// programmatic events and completion events need their own stream and all of the GPU); streams of a
// context that is not its device's primary context (a green context shares the primary context's
// memory only); kernels the driver refuses on the green context (a CUfunction from a module is
// bound to the context that loaded it; a CUkernel from a library is context-independent) - each
// refused kernel is remembered and launched in place from then on; everything while a stream
// capture is active; and every launch when the driver has no green contexts (before 12.4, or
// CUDA_ERROR_NOT_SUPPORTED).
//
// Thread safety: one lock per instance, held for the whole move. A green context may be current to
// one thread at a time (cuGreenCtxCreate), and the move makes it current on the calling thread.
#pragma once

#include <array>
#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>

#include "cuda_api.h"
#include "scheduler/op.h"
#include "scheduler/policy.h"

namespace orion {

class KernelLaunch;

// Why a best-effort launch stayed on its own stream.
enum class InPlaceReason : uint8_t {
  kDefaultStream,       // NULL / legacy / per-thread stream
  kCooperativeOrAttrs,  // cooperative launch, or launch attributes other than priority
  kNotPrimaryContext,   // the stream's context is not its device's primary context
  kFunctionRefused,     // the driver refused this kernel on a green-context stream
  kNoGreenContexts,     // the driver cannot make green contexts (or this size failed)
  kNoPartition,         // the policy's partition is empty on this GPU (fewer than two steps)
  kDriverError,         // a fork event could not be recorded or waited on
  kCount
};
const char* to_string(InPlaceReason r);

struct PartitionStats {
  uint64_t moved = 0;                     // best-effort launches run in a green context
  std::array<uint64_t, static_cast<size_t>(InPlaceReason::kCount)> in_place{};  // by reason
  std::map<int, uint64_t> moved_by_sms;   // partition size (SMs the driver gave) -> launches
  uint64_t forks = 0;                     // fork events recorded (the rest reused the join)
  std::string summary() const;
};

class GreenPartitions {
 public:
  // Reads policy.sm_partition() at every launch (an adaptive policy may change its size).
  explicit GreenPartitions(const sched::Policy& policy) : policy_(policy) {}
  GreenPartitions(const GreenPartitions&) = delete;
  GreenPartitions& operator=(const GreenPartitions&) = delete;

  // Launches `call`, a best-effort kernel of program stream `stream` (scheduler id `id`), in the
  // green context of the current partition. Called from DriverDevice::submit with the caller's
  // context current and no capture active. nullopt: the launch cannot move (counted; launch it in
  // place); otherwise the launch's result.
  std::optional<CUresult> launch(const KernelLaunch& call, sched::StreamId id, CUstream stream);
  // Any other op submitted on `id`: the next moved launch must fork again.
  void note_in_place(sched::StreamId id);
  // Work reached the driver without DriverDevice::submit (a synchronous copy or set, a call of the
  // release_all class): any stream may have new work the shadows did not wait for, so every
  // stream's next moved launch forks again.
  void forget_tails();
  // Before the program's stream is destroyed: its shadows and events go with it (work already
  // submitted to them still completes).
  void stream_destroying(sched::StreamId id);
  // The program's stream went without a destroy call, with its context (cuCtxDestroy, a primary
  // context's last release or reset): its shadows and join events (of the shim's green contexts)
  // go; its fork event went with the program's context and is only forgotten (its handle may be
  // reused).
  void stream_gone(sched::StreamId id);
  // cuDevicePrimaryCtxReset(dev) "destroys and cleans up all resources associated with the
  // device": its streams' fork events went with the primary context, and the green contexts
  // made on it (with their shadow streams) may have gone too. All of them are forgotten, never
  // destroyed (a leak where the driver kept them); the next move makes new green contexts.
  void device_reset(CUdevice dev);

  PartitionStats stats() const;

 private:
  struct Green {
    CUgreenCtx handle = nullptr;
    CUcontext context = nullptr;  // cuCtxFromGreenCtx
    int sms = 0;                  // what the driver gave (>= what was asked, on its granularity)
  };
  struct DeviceGreens {
    bool probed = false;
    bool usable = false;           // the driver can split this device's SMs
    int sm_count = 0;
    CUcontext primary = nullptr;
    std::map<int, Green> by_request;  // asked SM count -> green context (failed sizes absent)
    std::set<int> failed;             // asked sizes the driver refused
  };
  struct Shadow {
    CUstream stream = nullptr;
    CUevent join = nullptr;  // of the green context: recorded on the shadow, waited on by S
  };
  struct Binding {
    bool checked = false;
    bool movable = false;      // the stream's context is its device's primary context
    CUdevice device = 0;
    CUevent fork = nullptr;    // of the program's context: recorded on S, waited on by a shadow
    std::map<int, Shadow> shadows;  // by asked SM count
    const Shadow* tail = nullptr;   // S's newest op is the wait for this shadow's join
  };

  // Under mu_. Null when no green context of `sms` can be had.
  const Green* green_for(DeviceGreens& d, CUdevice dev, int sms);
  DeviceGreens& device_greens(CUdevice dev);
  bool check_binding(Binding& b);
  void drop_binding(sched::StreamId id, bool fork_alive);
  std::optional<CUresult> stay(InPlaceReason r);

  const sched::Policy& policy_;
  mutable std::mutex mu_;
  std::unordered_map<int, DeviceGreens> devices_;
  std::unordered_map<sched::StreamId, Binding> bindings_;
  std::atomic<bool> any_binding_{false};
  std::set<CUfunction> refused_;
  PartitionStats stats_;
};

}  // namespace orion

// The backend the scheduler submits to. Two implementations: the simulated GPU (sim_gpu.h, here)
// and the real CUDA driver (intercept/). The scheduler never includes CUDA headers.
#pragma once

#include <cstdint>

#include "scheduler/op.h"

namespace sched {

// One finished op, as observed by the backend.
struct Completion {
  uint64_t seq = 0;  // Op::seq of the finished op
  StreamId stream = 0;
  OpKind kind = OpKind::kKernel;
  KernelId kernel = 0;
  int64_t start_ns = 0;  // device clock; start == end when the backend cannot time it
  int64_t end_ns = 0;
};

class CompletionListener {
 public:
  virtual ~CompletionListener() = default;
  virtual void on_complete(const Completion& done) = 0;
};

class Device {
 public:
  virtual ~Device() = default;

  // Hands `op` to the GPU (in the real driver: makes the driver call). Returns 0 or the backend's
  // error code (a CUresult for the real driver), which the dispatcher hands back to the caller.
  // Called with ops of one stream in FIFO order; may be called from several threads.
  virtual int submit(const Op& op) = 0;

  // Reports completions observed since the last call to the listener. Cheap enough to call on
  // every launch; thread-safe. Contract with the dispatcher: call the listener without holding a
  // lock that submit() takes (a completion reported from inside submit() is fine: the dispatcher
  // applies it at its next pump); ops of one stream complete in submission order, and a
  // completion implies those before it on its stream (so reporting a stream's newest finished op
  // is enough). Every submitted op must eventually be reported, directly or by a later op of its
  // stream: an unreported high-priority op counts as in flight and holds best-effort work back
  // (up to the starvation bound).
  virtual void poll() = 0;
  virtual void set_listener(CompletionListener* listener) = 0;

  // Streaming multiprocessors on the device. Asked at every admission decision (cheap; may
  // change from a placeholder to the real count once the backend can tell).
  virtual int sm_count() const = 0;
  // Resident blocks per SM for this launch shape (cuOccupancyMaxActiveBlocksPerMultiprocessor);
  // 0: the shape cannot launch; kOccupancyUnknown: cannot be told now (the asking thread has no
  // context, a driver error): nothing may keep that answer, a later call asks again.
  static constexpr int kOccupancyUnknown = -1;
  virtual int max_active_blocks_per_sm(const KernelInfo& kernel) = 0;
  // The device clock used for arrival/submission stamps, in ns (virtual time for the simulator).
  virtual int64_t now_ns() const = 0;
};

// SMs a kernel occupies while it runs: min(SM count, ceil(blocks / blocks-per-SM)).
int sms_needed(const KernelInfo& kernel, int sm_count, int blocks_per_sm);

}  // namespace sched

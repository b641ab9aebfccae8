#include "driver_device.h"

#include <chrono>

#include "log.h"

#include "driver_calls.h"
#include "real_driver.h"

namespace orion {

namespace {
thread_local bool t_shim_thread = false;

// CUDA 12.8+ exports the elapsed-time ABI as cuEventElapsedTime_v2 (same signature).
CUresult elapsed_ms(float* ms, CUevent a, CUevent b) {
  if (real::cuEventElapsedTime_v2) return real::cuEventElapsedTime_v2(ms, a, b);
  if (real::cuEventElapsedTime) return real::cuEventElapsedTime(ms, a, b);
  return CUDA_ERROR_NOT_FOUND;
}
}  // namespace

void DriverDevice::mark_shim_thread() {
  t_shim_thread = true;
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_RELAXED;
  if (real::cuThreadExchangeStreamCaptureMode) real::cuThreadExchangeStreamCaptureMode(&mode);
}

int DriverDevice::submit(const sched::Op& op) {
  const auto* call = static_cast<const DriverCall*>(op.payload());
  // A deferred op runs under its caller's context; this thread keeps its own.
  ContextGuard guard(call->context());
  if (guard.status() != CUDA_SUCCESS) return guard.status();
  CUresult rc = call->call();
  if (rc != CUDA_SUCCESS) {
    if (op.owned) {
      // A deferred op: its caller already returned; the dispatcher hands the error back at the
      // next call that synchronises with it.
      shim_log().error("deferred {} on stream {:#x} failed in the driver with CUresult {}",
                    sched::to_string(op.kind), op.stream, static_cast<int>(rc));
    }
    return rc;
  }
  if (op.cls == sched::StreamClass::kHighPriority || op.cls == sched::StreamClass::kBestEffort) {
    track(op, call->stream());
  }
  return CUDA_SUCCESS;
}

CUevent DriverDevice::take_event(StreamTrack& t) {
  if (!t.free_events.empty()) {
    CUevent e = t.free_events.back();
    t.free_events.pop_back();
    return e;
  }
  CUevent e = nullptr;
  if (real::cuEventCreate(&e, CU_EVENT_DEFAULT) != CUDA_SUCCESS) return nullptr;
  return e;
}

void DriverDevice::track(const sched::Op& op, CUstream stream) {
  std::vector<sched::Completion> immediate;
  {
    std::lock_guard lock(mutex_);
    StreamTrack& t = streams_[op.stream];
    CUevent e = take_event(t);
    // The completion-tracking record must use the stream's own ABI; special handles (NULL,
    // legacy, per-thread) are never classed high-priority or best-effort, but stay safe.
    // Never during a capture: the record would go into the program's graph.
    CUresult rc = (e != nullptr && reinterpret_cast<uintptr_t>(stream) > 2 && !capturing())
                      ? real::cuEventRecord(e, stream)
                      : CUDA_ERROR_INVALID_HANDLE;
    if (rc != CUDA_SUCCESS) {
      if (e != nullptr) t.free_events.push_back(e);
      // Untrackable: report it complete now rather than leave the policy waiting forever.
      int64_t now = now_ns();
      immediate.push_back({op.seq, op.stream, op.kind, op.kernel.id, now, now});
    } else {
      t.pending.push_back({op.seq, op.kind, op.kernel.id, e, !t.pending.empty()});
      in_flight_.fetch_add(1, std::memory_order_relaxed);
    }
  }
  if (!immediate.empty()) report(immediate);
}

void DriverDevice::poll() {
  // A program thread may be in global capture mode: its query could invalidate a capture.
  if (!t_shim_thread && capturing()) return;
  std::unique_lock poll_lock(poll_mutex_, std::try_to_lock);
  if (!poll_lock.owns_lock()) return;  // another thread is polling right now
  // Only this poller pops from the queues, so the events seen here stay valid outside mutex_.
  std::vector<Look>& looks = looks_;
  std::vector<sched::Completion>& done = done_;
  looks.clear();
  done.clear();
  {
    std::lock_guard lock(mutex_);
    for (auto& [stream, t] : streams_) {
      if (!t.pending.empty()) looks.push_back({stream, t.pending.back().done, t.pending.size()});
    }
  }
  for (const Look& look : looks) {
    // Everything up to the newest is done: retire the backlog at once, report the newest (the
    // earlier ones are untimed in this case).
    size_t ready = 0;
    if (real::cuEventQuery(look.newest) == CUDA_SUCCESS) {
      ready = look.pending;
    } else {
      // Otherwise walk from the oldest while they are done.
      std::vector<CUevent>& oldest = oldest_;
      oldest.clear();
      {
        std::lock_guard lock(mutex_);
        const StreamTrack& t = streams_[look.stream];
        for (size_t i = 0; i + 1 < look.pending && i < t.pending.size(); ++i) oldest.push_back(t.pending[i].done);
      }
      while (ready < oldest.size() && real::cuEventQuery(oldest[ready]) == CUDA_SUCCESS) ++ready;
    }
    if (ready == 0) continue;
    std::lock_guard lock(mutex_);
    StreamTrack& t = streams_[look.stream];
    const int64_t end = now_ns();
    // The newest finished op is timed against the op before it, when it was queued behind that
    // one (the stream was busy, so it started when the previous one ended).
    const Pending& newest = t.pending[ready - 1];
    CUevent before = ready >= 2 ? t.pending[ready - 2].done : t.last_done;
    int64_t start = end;
    float ms = 0;
    if (newest.stream_was_busy && before != nullptr &&
        elapsed_ms(&ms, before, newest.done) == CUDA_SUCCESS && ms >= 0) {
      start = end - static_cast<int64_t>(static_cast<double>(ms) * 1e6);
    }
    done.push_back({newest.seq, look.stream, newest.kind, newest.kernel, start, end});
    for (size_t i = 0; i < ready; ++i) {
      if (t.last_done != nullptr) t.free_events.push_back(t.last_done);
      t.last_done = t.pending.front().done;
      t.pending.pop_front();
    }
    in_flight_.fetch_sub(ready, std::memory_order_relaxed);
  }
  if (!done.empty()) report(done);
}

void DriverDevice::report(const std::vector<sched::Completion>& done) {
  sched::CompletionListener* l = listener_.load(std::memory_order_acquire);
  if (l == nullptr) return;
  for (const auto& c : done) l->on_complete(c);
}

void DriverDevice::set_listener(sched::CompletionListener* listener) {
  listener_.store(listener, std::memory_order_release);
}

int DriverDevice::sm_count() const {
  int cached = sm_count_.load(std::memory_order_relaxed);
  if (cached > 0) return cached;
  CUdevice dev = 0;
  int n = 0;
  if (real::cuCtxGetDevice && real::cuCtxGetDevice(&dev) == CUDA_SUCCESS &&
      real::cuDeviceGetAttribute(&n, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev) ==
          CUDA_SUCCESS &&
      n > 0) {
    sm_count_.store(n, std::memory_order_relaxed);
    return n;
  }
  return 1;  // no context yet: ask again next time
}

int DriverDevice::max_active_blocks_per_sm(const sched::KernelInfo& kernel) {
  uint64_t threads = kernel.block.count();
  auto key = std::make_tuple(kernel.id, threads, kernel.shared_mem_bytes);
  {
    std::lock_guard lock(occupancy_mutex_);
    if (auto it = occupancy_.find(key); it != occupancy_.end()) return it->second;
  }
  int blocks = 0;
  auto f = reinterpret_cast<CUfunction>(kernel.id);
  CUresult rc = real::cuOccupancyMaxActiveBlocksPerMultiprocessor(
      &blocks, f, static_cast<int>(threads), kernel.shared_mem_bytes);
  if (rc != CUDA_SUCCESS && real::cuKernelGetFunction) {
    // A CUkernel passed as a CUfunction: occupancy needs the context's function.
    CUfunction fn = nullptr;
    if (real::cuKernelGetFunction(&fn, reinterpret_cast<CUkernel>(f)) == CUDA_SUCCESS) {
      rc = real::cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, fn, static_cast<int>(threads),
                                                             kernel.shared_mem_bytes);
    }
  }
  if (rc != CUDA_SUCCESS || blocks <= 0) blocks = 1;  // unknown: assume one block per SM
  std::lock_guard lock(occupancy_mutex_);
  occupancy_[key] = blocks;
  return blocks;
}

void DriverDevice::forget_occupancy() {
  std::lock_guard lock(occupancy_mutex_);
  occupancy_.clear();
}

int64_t DriverDevice::now_ns() const {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

uint64_t DriverDevice::tracked_in_flight() const {
  return in_flight_.load(std::memory_order_relaxed);
}

}  // namespace orion

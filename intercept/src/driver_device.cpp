#include "driver_device.h"

#include <algorithm>
#include <chrono>

#include "log.h"

#include "driver_calls.h"
#include "green_partitions.h"
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
  const bool tracked = op.cls == sched::StreamClass::kHighPriority || op.cls == sched::StreamClass::kBestEffort;
  const CUstream stream = call->stream();
  // A kernel to time exactly gets an event right before it (never during a capture: the record
  // would become a node of the program's graph; never on the special handles NULL / legacy /
  // per-thread, which are never classed high-priority or best-effort anyway).
  CUevent started = nullptr;
  if (tracked && op.wants_timing && reinterpret_cast<uintptr_t>(stream) > 2 && !capturing()) {
    std::lock_guard lock(mutex_);
    started = take_event(streams_[op.stream]);
    if (started != nullptr && real::cuEventRecord(started, stream) != CUDA_SUCCESS) {
      streams_[op.stream].free_events.push_back(started);
      started = nullptr;
    }
  }
  CUresult rc = CUDA_SUCCESS;
  std::optional<CUresult> moved;
  if (partitions_ != nullptr && op.kind == sched::OpKind::kKernel && op.cls == sched::StreamClass::kBestEffort &&
      !capturing()) {
    // The partition policy: a best-effort kernel runs in a green context (green_partitions.h).
    moved = partitions_->launch(static_cast<const KernelLaunch&>(*call), op.stream, stream);
  }
  if (moved) {
    rc = *moved;
  } else {
    rc = call->call();
    if (partitions_ != nullptr) partitions_->note_in_place(op.stream);
  }
  if (rc != CUDA_SUCCESS) {
    if (started != nullptr) {
      std::lock_guard lock(mutex_);
      streams_[op.stream].free_events.push_back(started);  // recorded, but nothing waits on it
    }
    if (op.owned) {
      // A deferred op: its caller already returned; the dispatcher hands the error back at the
      // next call that synchronises with it.
      shim_log().error("deferred {} on stream {:#x} failed in the driver with CUresult {}",
                    sched::to_string(op.kind), op.stream, static_cast<int>(rc));
    }
    return rc;
  }
  if (tracked) track(op, stream, started);
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

void DriverDevice::return_event(StreamTrack& t, CUevent e, uint32_t generation) {
  if (e == nullptr) return;
  if (generation == t.generation) {
    t.free_events.push_back(e);
  } else if (real::cuEventDestroy_v2 != nullptr) {
    real::cuEventDestroy_v2(e);
  }
}

bool DriverDevice::cover_uncovered(StreamTrack& t, CUcontext ctx, int64_t now) {
  if (t.handle == nullptr || capturing()) return false;
  // The stream's context first: a new event belongs to the context current at its creation, and
  // the helper thread has none of its own (issue 24, finding 6).
  ContextGuard guard(ctx);
  if (guard.status() != CUDA_SUCCESS) return false;
  CUevent e = take_event(t);
  if (e == nullptr) return false;
  if (real::cuEventRecord(e, t.handle) != CUDA_SUCCESS) {
    t.free_events.push_back(e);
    return false;
  }
  t.pending.push_back({t.uncovered_seq, t.uncovered_kind, t.uncovered_kernel, e, nullptr, t.uncovered,
                       t.generation, t.context_known ? t.context : nullptr});
  t.uncovered = 0;
  t.last_record_ns = now;
  return true;
}

void DriverDevice::complete_uncovered(StreamTrack& t, sched::StreamId id, int64_t now,
                                      std::vector<sched::Completion>& out) {
  if (t.uncovered == 0) return;
  // Untrackable: report them complete now rather than leave the policy waiting forever.
  out.push_back({t.uncovered_seq, id, t.uncovered_kind, t.uncovered_kernel, now, now});
  in_flight_.fetch_sub(t.uncovered, std::memory_order_relaxed);
  t.uncovered = 0;
}

void DriverDevice::track(const sched::Op& op, CUstream stream, CUevent started) {
  std::vector<sched::Completion> immediate;
  {
    std::lock_guard lock(mutex_);
    StreamTrack& t = streams_[op.stream];
    if (!t.context_known) {
      // Once per stream: the context a tail record from the helper thread must make current.
      t.context_known = true;
      if (!real::cuStreamGetCtx || real::cuStreamGetCtx(stream, &t.context) != CUDA_SUCCESS) t.context = nullptr;
    }
    if (reinterpret_cast<uintptr_t>(stream) > 2) t.handle = stream;
    t.high_priority = op.cls == sched::StreamClass::kHighPriority;
    in_flight_.fetch_add(1, std::memory_order_relaxed);
    t.uncovered += 1;
    t.uncovered_seq = op.seq;
    t.uncovered_kind = op.kind;
    t.uncovered_kernel = op.kernel.id;
    const int64_t now = now_ns();
    const int64_t window = batch_ns_.load(std::memory_order_relaxed);
    // Record now when the window since the stream's newest record is over, or the op is timed
    // (its end event must follow it directly); otherwise the op waits for the next record.
    if (started != nullptr || window <= 0 || now - t.last_record_ns >= window) {
      // This thread's current context is the stream's (it just launched on it): no switch.
      const bool recorded = reinterpret_cast<uintptr_t>(stream) > 2 && cover_uncovered(t, nullptr, now);
      if (recorded && started != nullptr) t.pending.back().started = started;
      if (!recorded) {
        if (started != nullptr) t.free_events.push_back(started);
        complete_uncovered(t, op.stream, now, immediate);
      }
    }
  }
  if (!immediate.empty()) report(immediate);
}

void DriverDevice::record_tails() {
  const int64_t window = batch_ns_.load(std::memory_order_relaxed);
  if (window <= 0) return;  // every tracked op has its own event
  std::vector<sched::Completion>& immediate = tails_done_;
  immediate.clear();
  {
    std::lock_guard lock(mutex_);
    if (capturing()) return;  // a record on a captured stream would join the program's graph
    const int64_t now = now_ns();
    for (auto& [id, t] : streams_) {
      if (t.uncovered == 0 || now - t.last_record_ns < window) continue;
      if (!cover_uncovered(t, t.context, now)) complete_uncovered(t, id, now, immediate);
    }
  }
  if (!immediate.empty()) report(immediate);
}

void DriverDevice::stream_destroying(sched::StreamId id) {
  if (partitions_ != nullptr) partitions_->stream_destroying(id);
  std::vector<sched::Completion> immediate;
  {
    std::lock_guard lock(mutex_);
    auto it = streams_.find(id);
    if (it == streams_.end()) return;
    StreamTrack& t = it->second;
    const int64_t now = now_ns();
    if (t.uncovered > 0 && !cover_uncovered(t, t.context, now)) complete_uncovered(t, id, now, immediate);
    // The handle may come back for another stream, of another context: its pooled events go, and
    // those still pending are destroyed when they retire.
    if (real::cuEventDestroy_v2 != nullptr) {
      for (CUevent e : t.free_events) real::cuEventDestroy_v2(e);
    }
    t.free_events.clear();
    ++t.generation;
    t.handle = nullptr;
    t.context = nullptr;
    t.context_known = false;
  }
  if (!immediate.empty()) report(immediate);
}

DriverDevice::PollsBlocked DriverDevice::block_polls() {
  PollsBlocked blocked;
  blocked.lock_ = std::unique_lock(poll_mutex_);
  return blocked;
}

std::vector<sched::StreamId> DriverDevice::drop_context(CUcontext ctx, std::optional<sched::StreamId> also,
                                                        int64_t now, std::vector<sched::Completion>& out) {
  std::vector<sched::StreamId> gone;
  for (auto& [id, t] : streams_) {
    const bool whole = (ctx != nullptr && t.context_known && t.context == ctx) || (also && *also == id);
    // Pending events of ctx (this stream's, or left by an earlier stream of this handle destroyed
    // before ctx ended); when the whole stream goes, its current ones too, whatever is known of
    // their context. Older ones of another context stay to retire as usual.
    uint64_t ops = 0;
    std::erase_if(t.pending, [&](const Pending& p) {
      const bool of_ctx = ctx != nullptr && p.context == ctx;
      if (!of_ctx && !(whole && p.generation == t.generation)) return false;
      out.push_back({p.seq, id, p.kind, p.kernel, now, now});
      ops += p.ops;
      return true;
    });
    in_flight_.fetch_sub(ops, std::memory_order_relaxed);
    if (!whole) continue;
    complete_uncovered(t, id, now, out);
    t.free_events.clear();
    ++t.generation;
    t.handle = nullptr;
    t.context = nullptr;
    t.context_known = false;
    t.high_priority = false;
    gone.push_back(id);
  }
  return gone;
}

std::vector<sched::StreamId> DriverDevice::context_destroyed(CUcontext ctx, const PollsBlocked& polls_blocked) {
  (void)polls_blocked;  // the poller holds the events it queries outside mutex_, under poll_mutex_
  std::vector<sched::StreamId> gone;
  std::vector<sched::Completion> done;
  {
    std::lock_guard lock(mutex_);
    gone = drop_context(ctx, std::nullopt, now_ns(), done);
  }
  dropped(gone, done);
  return gone;
}

void DriverDevice::dropped(const std::vector<sched::StreamId>& gone, const std::vector<sched::Completion>& done) {
  if (partitions_ != nullptr) {
    for (const sched::StreamId id : gone) partitions_->stream_gone(id);
  }
  if (!done.empty()) report(done);
}

std::vector<sched::StreamId> DriverDevice::stream_handle_reused(sched::StreamId id) {
  auto tracked_alive = [&] {
    auto it = streams_.find(id);
    return it != streams_.end() && it->second.handle != nullptr;
  };
  {
    std::lock_guard lock(mutex_);  // the common case, a handle value not tracked, stays cheap
    if (!tracked_alive()) return {};
  }
  std::vector<sched::StreamId> gone;
  std::vector<sched::Completion> done;
  {
    std::lock_guard poll_lock(poll_mutex_);
    std::lock_guard lock(mutex_);
    if (!tracked_alive()) return {};
    const StreamTrack& t = streams_[id];
    gone = drop_context(t.context_known ? t.context : nullptr, id, now_ns(), done);
  }
  dropped(gone, done);
  return gone;
}

void DriverDevice::poll() {
  // A program thread may be in global capture mode: its query could invalidate a capture.
  if (!t_shim_thread && capturing()) return;
  std::unique_lock poll_lock(poll_mutex_, std::try_to_lock);
  if (!poll_lock.owns_lock()) return;  // another thread is polling right now
  // Again under the lock: a capture that began since the check above raised its count under it
  // (with_records_blocked), and this thread must not query beside it.
  if (!t_shim_thread && capturing()) return;
  // Tail records only from the shim's own thread (relaxed capture mode; off the launch path).
  if (t_shim_thread) record_tails();
  // Only this poller pops from the queues, so the events seen here stay valid outside mutex_.
  std::vector<Look>& looks = looks_;
  std::vector<sched::Completion>& done = done_;
  looks.clear();
  done.clear();
  {
    std::lock_guard lock(mutex_);
    for (auto& [stream, t] : streams_) {
      if (!t.pending.empty()) {
        (t.high_priority ? looks : looks_others_).push_back({stream, t.pending.back().done, t.pending.size()});
      }
    }
    // The others: kPolledPerPass of them, from where the last pass stopped.
    const size_t n = looks_others_.size();
    const size_t take = std::min(n, kPolledPerPass);
    for (size_t i = 0; i < take; ++i) looks.push_back(looks_others_[(poll_cursor_ + i) % n]);
    poll_cursor_ = n == 0 ? 0 : (poll_cursor_ + take) % n;
    looks_others_.clear();
  }
  for (const Look& look : looks) {
    // Everything up to the newest is done: retire the backlog at once. Any answer but NOT_READY
    // means the work will not run any longer (done, or its context was destroyed or reset):
    // waiting for it would hold best-effort work back until the starvation bound, every time.
    auto finished = [](CUevent e) { return real::cuEventQuery(e) != CUDA_ERROR_NOT_READY; };
    size_t ready = 0;
    if (finished(look.newest)) {
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
      while (ready < oldest.size() && finished(oldest[ready])) ++ready;
    }
    if (ready == 0) continue;
    std::lock_guard lock(mutex_);
    StreamTrack& t = streams_[look.stream];
    const int64_t end = now_ns();
    uint64_t retired_ops = 0;
    for (size_t i = 0; i < ready; ++i) {
      const Pending& p = t.pending.front();
      // A timed op (start marker right before it) is reported with its exact duration; the
      // newest retired event is always reported (it retires everything before it).
      float ms = 0;
      if (p.started != nullptr && elapsed_ms(&ms, p.started, p.done) == CUDA_SUCCESS && ms >= 0) {
        done.push_back({p.seq, look.stream, p.kind, p.kernel, end - static_cast<int64_t>(static_cast<double>(ms) * 1e6), end});
      } else if (i + 1 == ready) {
        done.push_back({p.seq, look.stream, p.kind, p.kernel, end, end});
      }
      return_event(t, p.started, p.generation);
      return_event(t, p.done, p.generation);
      retired_ops += p.ops;
      t.pending.pop_front();
    }
    in_flight_.fetch_sub(retired_ops, std::memory_order_relaxed);
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
  // No current context (the helper thread): the query would fail, and a CUkernel's answer is the
  // current context's; a launching thread asks with one.
  CUcontext current = nullptr;
  if (real::cuCtxGetCurrent != nullptr && (real::cuCtxGetCurrent(&current) != CUDA_SUCCESS || current == nullptr)) {
    return kOccupancyUnknown;
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
  if (rc != CUDA_SUCCESS) return kOccupancyUnknown;  // a driver error is not kept either
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

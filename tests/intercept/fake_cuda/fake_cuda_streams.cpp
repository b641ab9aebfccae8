// The fake driver's streams, events and capture (see fake_cuda.cpp; cuGetProcAddress is
// fake_cuda_proc_address.cpp).
#include "fake_cuda_state.h"  // first: it selects cuda.h's internal (all-variants) mode

#include <algorithm>
#include <cstring>


namespace fake_cuda_impl {

uint64_t new_handle(State& s, std::vector<uint64_t>& freed) {
  if (!s.reuse_handles || freed.empty()) return s.next_handle += 0x100;
  const uint64_t h = freed.back();
  freed.pop_back();
  return h;
}

// Records `event_handle` at stream `id`'s current time (under s.mu): a later record replaces the
// earlier one. Returns the record's number.
uint64_t record_event_now(State& s, uint64_t event_handle, uint64_t id) {
  auto it = s.events.find(event_handle);
  if (it == s.events.end()) return 0;
  Stream& str = s.streams[id];
  // The event's own context and creation flags stay (a record used to reset the flags, and with
  // them CU_EVENT_INTERPROCESS and CU_EVENT_DISABLE_TIMING).
  Event& e = it->second;
  e.time_ns = str.time_ns;
  e.stream = id;
  e.held = str.busy;
  e.epoch = str.busy_epoch;
  e.record_seq = s.next_record_seq++;
  return e.record_seq;
}

namespace {

// Event and stream must be of one context; a later record replaces the earlier one.
CUresult record(const char* name, CUevent e, CUstream hs, bool per_thread) {
  State& s = st();
  std::lock_guard lock(s.mu);
  fake_cuda_call& c = begin(s, name);
  c.stream = reinterpret_cast<uint64_t>(hs);
  c.event = reinterpret_cast<uint64_t>(e);
  auto it = s.events.find(c.event);
  if (it == s.events.end()) return finish(s, c, CUDA_ERROR_INVALID_HANDLE);
  const uint64_t id = sid(hs, per_thread);
  if (CUresult dead = dead_stream_answer(s, id); dead != CUDA_SUCCESS) return finish(s, c, dead);
  auto sit = s.streams.find(id);
  const uint64_t stream_ctx =
      (default_stream_id(id) || sit == s.streams.end() || sit->second.ctx == 0) ? current_ctx()
                                                                              : sit->second.ctx;
  if (stream_ctx == 0) return finish(s, c, CUDA_ERROR_INVALID_CONTEXT);
  if (stream_ctx != it->second.ctx) return finish(s, c, CUDA_ERROR_INVALID_HANDLE);
  if (legacy_stream_id(id) && legacy_work_waits_for_a_capture(s, stream_ctx)) {
    return finish(s, c, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
  }
  // A record into a capture becomes a graph node: the event itself is left as it was.
  if (advance(s, id, 0, c)) return finish(s, c);
  c.value = record_event_now(s, c.event, id);
  return finish(s, c);
}

bool event_ready(State& s, const Event& e) {
  if (!e.held) return true;
  const Stream& str = s.streams[e.stream];
  return !(str.busy && str.busy_epoch == e.epoch);
}

}  // namespace
}  // namespace fake_cuda_impl

using namespace fake_cuda_impl;

// ---------------- streams and events ----------------

namespace {
CUresult create_stream(const char* name, CUstream* out, unsigned flags, int priority) {
  State& s = st();
  std::lock_guard lock(s.mu);
  fake_cuda_call& c = begin(s, name);
  c.context = current_ctx();
  if (c.context == 0) return finish(s, c, CUDA_ERROR_INVALID_CONTEXT);
  const uint64_t h = new_handle(s, s.free_stream_handles);
  s.dead_streams.erase(h);
  Stream& str = s.streams[h];
  str.priority = priority;
  str.ctx = c.context;
  str.flags = flags;
  c.stream = h;
  c.value = static_cast<uint64_t>(static_cast<int64_t>(priority));
  CUresult rc = finish(s, c);
  if (rc == CUDA_SUCCESS) *out = reinterpret_cast<CUstream>(h);
  return rc;
}
CUresult stream_sync(const char* name, CUstream hs, bool per_thread, bool query) {
  State& s = st();
  std::lock_guard lock(s.mu);
  fake_cuda_call& c = begin(s, name);
  c.stream = reinterpret_cast<uint64_t>(hs);
  c.context = current_ctx();
  const uint64_t id = sid(hs, per_thread);
  // A stream whose context ended answers as it does everywhere else (driver_model.json).
  if (CUresult dead = dead_stream_answer(s, id); dead != CUDA_SUCCESS) return finish(s, c, dead);
  if (auto cap = s.captures.find(id); cap != s.captures.end()) {
    cap->second.invalidated = true;  // synchronising with a capturing stream is illegal
    return finish(s, c, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  }
  // "When a blocking stream is capturing, the legacy stream is in an unusable state" (cuda.h): a
  // query or sync of it would depend on the capture, in any capture mode.
  if (legacy_stream_id(id) && legacy_work_waits_for_a_capture(s, legacy_stream_ctx(id))) {
    return finish(s, c, CUDA_ERROR_STREAM_CAPTURE_IMPLICIT);
  }
  if (CUresult rc = unsafe_call(s); rc != CUDA_SUCCESS) return finish(s, c, rc);
  Stream& str = s.streams[id];
  if (query) return finish(s, c, str.busy ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS);
  if (str.busy) {  // synchronising waits the work out
    str.busy = false;
    ++str.busy_epoch;
  }
  return finish(s, c);
}
CUresult event_sync(const char* name, CUevent e, bool query) {
  State& s = st();
  sleep_if_delayed(s, name);
  std::lock_guard lock(s.mu);
  fake_cuda_call& c = begin(s, name);
  c.event = reinterpret_cast<uint64_t>(e);
  c.context = current_ctx();
  auto it = s.events.find(c.event);
  if (it == s.events.end()) return finish(s, c, CUDA_ERROR_INVALID_HANDLE);
  if (CUresult rc = unsafe_call(s); rc != CUDA_SUCCESS) return finish(s, c, rc);
  c.value = it->second.record_seq;
  if (query) return finish(s, c, event_ready(s, it->second) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY);
  if (!event_ready(s, it->second)) {
    Stream& str = s.streams[it->second.stream];
    str.busy = false;
    ++str.busy_epoch;
  }
  return finish(s, c);
}
// Waits out every stream of the current context.
CUresult ctx_sync(const char* name, CUcontext arg) {
  State& s = st();
  std::lock_guard lock(s.mu);
  fake_cuda_call& c = begin(s, name);
  c.value = reinterpret_cast<uint64_t>(arg);
  c.context = current_ctx();
  const uint64_t ctx = arg != nullptr ? reinterpret_cast<uint64_t>(arg) : c.context;
  if (ctx == 0) return finish(s, c, CUDA_ERROR_INVALID_CONTEXT);
  // Synchronizing "a broader handle which encompasses an active stream capture, such as a device
  // or context handle" is invalid in every capture mode (CUDA programming guide) and invalidates it.
  bool encompasses = false;
  for (auto& [id, capture] : s.captures) {
    if (capture.ctx == ctx && !capture.invalidated) {
      capture.invalidated = true;
      encompasses = true;
    }
  }
  if (encompasses) return finish(s, c, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  if (CUresult rc = unsafe_call(s); rc != CUDA_SUCCESS) return finish(s, c, rc);
  for (auto& [id, str] : s.streams) {
    const bool other_context = legacy_stream_id(id) ? legacy_stream_ctx(id) != ctx : str.ctx != 0 && str.ctx != ctx;
    if (other_context) continue;
    if (str.busy) ++str.busy_epoch;
    str.busy = false;
  }
  return finish(s, c);
}
}  // namespace

FAKE_EXPORT CUresult CUDAAPI cuStreamCreate(CUstream* out, unsigned int flags) {
  return create_stream("cuStreamCreate", out, flags, 0);
}
FAKE_EXPORT CUresult CUDAAPI cuStreamCreateWithPriority(CUstream* out, unsigned int flags, int prio) {
  return create_stream("cuStreamCreateWithPriority", out, flags, prio);
}
// A stream of any context may be destroyed (the handle names its context).
namespace {
CUresult destroy_stream(const char* name, CUstream hs) {
  State& s = st();
  std::lock_guard lock(s.mu);
  fake_cuda_call& c = begin(s, name);
  c.stream = reinterpret_cast<uint64_t>(hs);
  c.context = current_ctx();
  const uint64_t id = sid(hs, false);
  // A destroyed green context's stream: "any subsequent API calls involving these streams
  // (including cuStreamDestroy) will return CUDA_ERROR_CONTEXT_IS_DESTROYED".
  if (dead_stream_answer(s, id) == CUDA_ERROR_CONTEXT_IS_DESTROYED) {
    return finish(s, c, CUDA_ERROR_CONTEXT_IS_DESTROYED);
  }
  // A destroy refused (fake_cuda_fail_next) leaves the stream alive, as a real refusal does.
  if (s.fail_next.count(name) != 0) return finish(s, c);
  if (!default_stream_id(id)) {
    auto it = s.streams.find(id);
    // A stream the fake made is gone: every later use of its handle fails, as at its context's
    // end, until a new stream gets the handle (held work the shim submits after the destroy is
    // caught). A handle it never made (tests' made-up ones) is only forgotten.
    if (it != s.streams.end() && it->second.ctx != 0) s.dead_streams[id] = CUDA_ERROR_INVALID_HANDLE;
    s.streams.erase(id);  // the legacy stream no longer waits for it
  }
  return finish(s, c);
}
}  // namespace
FAKE_EXPORT CUresult CUDAAPI cuStreamDestroy_v2(CUstream hs) { return destroy_stream("cuStreamDestroy_v2", hs); }
// The pre-4000 ABI: the same semantics.
FAKE_EXPORT CUresult CUDAAPI cuStreamDestroy(CUstream hs) { return destroy_stream("cuStreamDestroy", hs); }
FAKE_EXPORT int64_t fake_cuda_stream_time_ns(CUstream hs) {
  State& s = st();
  std::lock_guard lock(s.mu);
  auto it = s.streams.find(sid(hs, false));
  return it == s.streams.end() ? -1 : it->second.time_ns;
}
FAKE_EXPORT CUresult CUDAAPI cuStreamGetFlags(CUstream hs, unsigned int* flags) {
  State& s = st();
  std::lock_guard lock(s.mu);
  const uint64_t id = sid(hs, false);
  if (flags == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult dead = dead_stream_answer(s, id); dead != CUDA_SUCCESS) return dead;
  auto it = s.streams.find(id);
  *flags = it == s.streams.end() ? 0 : it->second.flags;
  return CUDA_SUCCESS;
}
// The priority a stream runs at: the one it was made with, clamped to the device's range
// (cuCtxGetStreamPriorityRange: 0 .. -5), as the driver clamps at creation (cuda.h); the legacy
// and per-thread streams run at 0.
namespace {
CUresult stream_priority(CUstream hs, bool per_thread, int* priority) {
  State& s = st();
  std::lock_guard lock(s.mu);
  const uint64_t id = sid(hs, per_thread);
  if (priority == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (CUresult dead = dead_stream_answer(s, id); dead != CUDA_SUCCESS) return dead;
  auto it = s.streams.find(id);
  *priority = default_stream_id(id) || it == s.streams.end() ? 0 : std::clamp(it->second.priority, -5, 0);
  return CUDA_SUCCESS;
}
}  // namespace
FAKE_EXPORT CUresult CUDAAPI cuStreamGetPriority(CUstream hs, int* priority) { return stream_priority(hs, false, priority); }
FAKE_EXPORT CUresult CUDAAPI cuStreamGetPriority_ptsz(CUstream hs, int* priority) {
  return stream_priority(hs, true, priority);
}
FAKE_EXPORT CUresult CUDAAPI cuStreamSynchronize(CUstream s) { return stream_sync("cuStreamSynchronize", s, false, false); }
FAKE_EXPORT CUresult CUDAAPI cuStreamSynchronize_ptsz(CUstream s) { return stream_sync("cuStreamSynchronize_ptsz", s, true, false); }
FAKE_EXPORT CUresult CUDAAPI cuStreamQuery(CUstream s) { return stream_sync("cuStreamQuery", s, false, true); }
FAKE_EXPORT CUresult CUDAAPI cuStreamQuery_ptsz(CUstream s) { return stream_sync("cuStreamQuery_ptsz", s, true, true); }
FAKE_EXPORT CUresult CUDAAPI cuCtxSynchronize() { return ctx_sync("cuCtxSynchronize", nullptr); }
FAKE_EXPORT CUresult CUDAAPI cuCtxSynchronize_v2(CUcontext ctx) {
  return ctx_sync("cuCtxSynchronize_v2", ctx);
}

namespace {
CUresult create_event(CUevent* out, unsigned int flags) {
  State& s = st();
  std::lock_guard lock(s.mu);
  if (current_ctx() == 0) return CUDA_ERROR_INVALID_CONTEXT;
  const uint64_t h = new_handle(s, s.free_event_handles);
  s.events[h] = Event{};
  s.events[h].ctx = current_ctx();
  s.events[h].flags = flags;
  *out = reinterpret_cast<CUevent>(h);
  return CUDA_SUCCESS;  // not logged: the shim creates pool events too
}
}  // namespace
FAKE_EXPORT CUresult CUDAAPI cuEventCreate(CUevent* out, unsigned int flags) { return create_event(out, flags); }
// Not through cuEventCreate: the shim interposes that name, and this entry point must bypass it.
FAKE_EXPORT CUresult CUDAAPI fake_cuEventCreate_newer_abi(CUevent* out, unsigned int flags) {
  return create_event(out, flags);
}
// Interprocess events: a handle can be taken only of an event made with CU_EVENT_INTERPROCESS and
// CU_EVENT_DISABLE_TIMING (as the driver requires); opening one gives this process a new CUevent
// (another process's event, as far as the caller knows) that is interprocess itself. The handle's
// bytes carry a tag and the exported event.
namespace {
constexpr uint64_t kIpcEventTag = 0x1bc0e7e17ULL;
}  // namespace
FAKE_EXPORT CUresult CUDAAPI cuIpcGetEventHandle(CUipcEventHandle* handle, CUevent e) {
  State& s = st();
  std::lock_guard lock(s.mu);
  fake_cuda_call& c = begin(s, "cuIpcGetEventHandle");
  c.event = reinterpret_cast<uint64_t>(e);
  auto it = s.events.find(c.event);
  if (handle == nullptr || it == s.events.end()) return finish(s, c, CUDA_ERROR_INVALID_HANDLE);
  const unsigned need = CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING;
  if ((it->second.flags & need) != need) return finish(s, c, CUDA_ERROR_INVALID_VALUE);
  std::memset(handle, 0, sizeof *handle);
  std::memcpy(handle->reserved, &kIpcEventTag, sizeof kIpcEventTag);
  std::memcpy(handle->reserved + sizeof kIpcEventTag, &c.event, sizeof c.event);
  return finish(s, c);
}
FAKE_EXPORT CUresult CUDAAPI cuIpcOpenEventHandle(CUevent* out, CUipcEventHandle handle) {
  State& s = st();
  std::lock_guard lock(s.mu);
  fake_cuda_call& c = begin(s, "cuIpcOpenEventHandle");
  uint64_t tag = 0;
  std::memcpy(&tag, handle.reserved, sizeof tag);
  if (out == nullptr || tag != kIpcEventTag) return finish(s, c, CUDA_ERROR_INVALID_VALUE);
  if (current_ctx() == 0) return finish(s, c, CUDA_ERROR_INVALID_CONTEXT);
  const uint64_t h = (s.next_handle += 0x100);
  s.events[h] = Event{};
  s.events[h].ctx = current_ctx();
  s.events[h].flags = CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING;
  c.event = h;
  *out = reinterpret_cast<CUevent>(h);
  return finish(s, c);
}
namespace {
CUresult destroy_event(const char* name, CUevent e) {
  State& s = st();
  std::lock_guard lock(s.mu);
  fake_cuda_call& c = begin(s, name);
  c.event = reinterpret_cast<uint64_t>(e);
  if (s.events.erase(c.event) == 0) return finish(s, c, CUDA_ERROR_INVALID_HANDLE);
  return finish(s, c);
}
}  // namespace
FAKE_EXPORT CUresult CUDAAPI cuEventDestroy_v2(CUevent e) { return destroy_event("cuEventDestroy_v2", e); }
FAKE_EXPORT CUresult CUDAAPI cuEventDestroy(CUevent e) { return destroy_event("cuEventDestroy", e); }
FAKE_EXPORT CUresult CUDAAPI cuEventRecord(CUevent e, CUstream s) { return record("cuEventRecord", e, s, false); }
FAKE_EXPORT CUresult CUDAAPI cuEventRecord_ptsz(CUevent e, CUstream s) { return record("cuEventRecord_ptsz", e, s, true); }
FAKE_EXPORT CUresult CUDAAPI cuEventRecordWithFlags(CUevent e, CUstream s, unsigned int) {
  return record("cuEventRecordWithFlags", e, s, false);
}
FAKE_EXPORT CUresult CUDAAPI cuEventRecordWithFlags_ptsz(CUevent e, CUstream s, unsigned int) {
  return record("cuEventRecordWithFlags_ptsz", e, s, true);
}
FAKE_EXPORT CUresult CUDAAPI cuEventQuery(CUevent e) { return event_sync("cuEventQuery", e, true); }
FAKE_EXPORT CUresult CUDAAPI cuEventSynchronize(CUevent e) { return event_sync("cuEventSynchronize", e, false); }
// Both events must be timing events and have been recorded (else CUDA_ERROR_INVALID_HANDLE: "if
// either event was created with the CU_EVENT_DISABLE_TIMING flag", cuda.h) and be complete (else
// CUDA_ERROR_NOT_READY).
namespace {
CUresult elapsed(float* ms, CUevent a, CUevent b) {
  State& s = st();
  std::lock_guard lock(s.mu);
  auto ia = s.events.find(reinterpret_cast<uint64_t>(a));
  auto ib = s.events.find(reinterpret_cast<uint64_t>(b));
  if (ia == s.events.end() || ib == s.events.end()) return CUDA_ERROR_INVALID_HANDLE;
  if (ia->second.record_seq == 0 || ib->second.record_seq == 0) return CUDA_ERROR_INVALID_HANDLE;
  if (((ia->second.flags | ib->second.flags) & CU_EVENT_DISABLE_TIMING) != 0) return CUDA_ERROR_INVALID_HANDLE;
  if (!event_ready(s, ia->second) || !event_ready(s, ib->second)) return CUDA_ERROR_NOT_READY;
  *ms = static_cast<float>(ib->second.time_ns - ia->second.time_ns) / 1e6f;
  return CUDA_SUCCESS;
}
}  // namespace
FAKE_EXPORT CUresult CUDAAPI cuEventElapsedTime(float* ms, CUevent a, CUevent b) { return elapsed(ms, a, b); }
FAKE_EXPORT CUresult CUDAAPI cuEventElapsedTime_v2(float* ms, CUevent a, CUevent b) { return elapsed(ms, a, b); }
// The wait binds to the event's record current when the driver executes the call (the event
// may be of another context); the log's value is that record (0: never recorded, no wait).
#define FAKE_WAIT(sym, per_thread)                                           \
  FAKE_EXPORT CUresult CUDAAPI sym(CUstream hs, CUevent e, unsigned int) {   \
    State& s = st();                                                         \
    std::lock_guard lock(s.mu);                                              \
    fake_cuda_call& c = begin(s, #sym);                                      \
    c.stream = reinterpret_cast<uint64_t>(hs);                               \
    c.event = reinterpret_cast<uint64_t>(e);                                 \
    auto it = s.events.find(c.event);                                        \
    if (it == s.events.end()) return finish(s, c, CUDA_ERROR_INVALID_HANDLE); \
    const uint64_t id = sid(hs, per_thread);                                 \
    if (CUresult rc = check_enqueue(s, id); rc != CUDA_SUCCESS) return finish(s, c, rc); \
    c.value = it->second.record_seq;                                         \
    if (!advance(s, id, 0, c)) {                                             \
      Stream& str = s.streams[id];                                           \
      str.time_ns = std::max(str.time_ns, it->second.time_ns);               \
    }                                                                        \
    return finish(s, c);                                                     \
  }
FAKE_WAIT(cuStreamWaitEvent, false)
FAKE_WAIT(cuStreamWaitEvent_ptsz, true)

// ---------------- capture ----------------

namespace {
CUresult begin_capture(const char* name, CUstream hs, bool per_thread, CUstreamCaptureMode mode) {
  State& s = st();
  std::lock_guard lock(s.mu);
  fake_cuda_call& c = begin(s, name);
  c.stream = reinterpret_cast<uint64_t>(hs);
  c.value = static_cast<uint64_t>(mode);
  c.context = current_ctx();
  const uint64_t id = sid(hs, per_thread);
  if (legacy_stream_id(id)) return finish(s, c, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);  // legacy stream
  if (CUresult rc = check_stream(s, id); rc != CUDA_SUCCESS) return finish(s, c, rc);
  if (s.captures.count(id) != 0) return finish(s, c, CUDA_ERROR_ILLEGAL_STATE);
  CUresult rc = finish(s, c);
  if (rc == CUDA_SUCCESS) s.captures[id] = Capture{thread_token(), mode, false, 0, c.context};
  return rc;
}
CUresult end_capture(const char* name, CUstream hs, bool per_thread, CUgraph* graph) {
  State& s = st();
  std::lock_guard lock(s.mu);
  fake_cuda_call& c = begin(s, name);
  c.stream = reinterpret_cast<uint64_t>(hs);
  c.context = current_ctx();
  auto it = s.captures.find(sid(hs, per_thread));
  if (it == s.captures.end()) return finish(s, c, CUDA_ERROR_ILLEGAL_STATE);
  if (it->second.mode != CU_STREAM_CAPTURE_MODE_RELAXED && it->second.thread != thread_token()) {
    return finish(s, c, CUDA_ERROR_STREAM_CAPTURE_WRONG_THREAD);
  }
  const Capture cap = it->second;
  s.captures.erase(it);
  c.value = cap.nodes;
  if (cap.invalidated) return finish(s, c, CUDA_ERROR_STREAM_CAPTURE_INVALIDATED);
  CUresult rc = finish(s, c);
  if (rc == CUDA_SUCCESS && graph != nullptr) {
    const uint64_t made = s.next_handle += 0x100;
    s.graphs[made] = {};  // its nodes are not kept: it instantiates as a graph without any
    *graph = reinterpret_cast<CUgraph>(made);
  }
  return rc;
}
}  // namespace

// CUDA 10.0's ABI had no mode argument: its captures are global-mode ones.
FAKE_EXPORT CUresult CUDAAPI cuStreamBeginCapture(CUstream s) {
  return begin_capture("cuStreamBeginCapture", s, false, CU_STREAM_CAPTURE_MODE_GLOBAL);
}
FAKE_EXPORT CUresult CUDAAPI cuStreamBeginCapture_ptsz(CUstream s) {
  return begin_capture("cuStreamBeginCapture_ptsz", s, true, CU_STREAM_CAPTURE_MODE_GLOBAL);
}
FAKE_EXPORT CUresult CUDAAPI cuStreamBeginCapture_v2(CUstream s, CUstreamCaptureMode mode) {
  return begin_capture("cuStreamBeginCapture_v2", s, false, mode);
}
FAKE_EXPORT CUresult CUDAAPI cuStreamBeginCapture_v2_ptsz(CUstream s, CUstreamCaptureMode mode) {
  return begin_capture("cuStreamBeginCapture_v2_ptsz", s, true, mode);
}
FAKE_EXPORT CUresult CUDAAPI cuStreamBeginCaptureToGraph(CUstream s, CUgraph, const CUgraphNode*,
                                                         const CUgraphEdgeData*, size_t,
                                                         CUstreamCaptureMode mode) {
  return begin_capture("cuStreamBeginCaptureToGraph", s, false, mode);
}
FAKE_EXPORT CUresult CUDAAPI cuStreamBeginCaptureToGraph_ptsz(CUstream s, CUgraph,
                                                              const CUgraphNode*,
                                                              const CUgraphEdgeData*, size_t,
                                                              CUstreamCaptureMode mode) {
  return begin_capture("cuStreamBeginCaptureToGraph_ptsz", s, true, mode);
}
FAKE_EXPORT CUresult CUDAAPI cuStreamEndCapture(CUstream s, CUgraph* g) {
  return end_capture("cuStreamEndCapture", s, false, g);
}
FAKE_EXPORT CUresult CUDAAPI cuStreamEndCapture_ptsz(CUstream s, CUgraph* g) {
  return end_capture("cuStreamEndCapture_ptsz", s, true, g);
}
FAKE_EXPORT CUresult CUDAAPI cuStreamIsCapturing(CUstream hs, CUstreamCaptureStatus* status) {
  State& s = st();
  std::lock_guard lock(s.mu);
  if (status == nullptr) return CUDA_ERROR_INVALID_VALUE;
  const uint64_t id = sid(hs, false);
  // The legacy stream beside a blocking capture of its context: CUDA_ERROR_STREAM_CAPTURE_IMPLICIT,
  // and "the blocking stream capture is not invalidated" (cuda.h).
  if (legacy_stream_id(id)) {
    for (const auto& [capturing, capture] : s.captures) {
      if (blocks_legacy_stream(s, capturing, capture, legacy_stream_ctx(id))) return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
    }
  }
  auto it = s.captures.find(id);
  *status = it == s.captures.end() ? CU_STREAM_CAPTURE_STATUS_NONE
            : it->second.invalidated ? CU_STREAM_CAPTURE_STATUS_INVALIDATED
                                     : CU_STREAM_CAPTURE_STATUS_ACTIVE;
  return CUDA_SUCCESS;
}

// ---------------- context-wide events (CUDA 12.5) ----------------
// cuCtxRecordEvent captures all work submitted to the context so far (every stream of it);
// cuCtxWaitEvent makes all later work of the context wait for the event. The fake logs both;
// the record takes the latest end time of the context's streams.
namespace {
// Logs a context-event call (*out); the event, or nullptr for an event not of that context.
Event* ctx_event_call(State& s, const char* name, CUcontext ctx, CUevent e, fake_cuda_call** out) {
  fake_cuda_call& c = begin(s, name);
  c.event = reinterpret_cast<uint64_t>(e);
  c.context = reinterpret_cast<uint64_t>(ctx);
  *out = &c;
  auto it = s.events.find(c.event);
  return it == s.events.end() || it->second.ctx != c.context ? nullptr : &it->second;
}
}  // namespace
FAKE_EXPORT CUresult CUDAAPI cuCtxRecordEvent(CUcontext ctx, CUevent e) {
  State& s = st();
  std::lock_guard lock(s.mu);
  fake_cuda_call* c = nullptr;
  Event* ev = ctx_event_call(s, "cuCtxRecordEvent", ctx, e, &c);
  if (ev == nullptr) return finish(s, *c, CUDA_ERROR_INVALID_HANDLE);
  if (!s.captures.empty()) return finish(s, *c, CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED);
  int64_t latest = 0;
  for (const auto& [id, str] : s.streams) {
    if (str.ctx == c->context || id == legacy_stream_of(c->context)) latest = std::max(latest, str.time_ns);
  }
  ev->time_ns = latest;
  ev->held = false;
  ev->record_seq = c->value = s.next_record_seq++;
  return finish(s, *c);
}
FAKE_EXPORT CUresult CUDAAPI cuCtxWaitEvent(CUcontext ctx, CUevent e) {
  State& s = st();
  std::lock_guard lock(s.mu);
  fake_cuda_call* c = nullptr;
  Event* ev = ctx_event_call(s, "cuCtxWaitEvent", ctx, e, &c);
  if (ev == nullptr) return finish(s, *c, CUDA_ERROR_INVALID_HANDLE);
  c->value = ev->record_seq;
  return finish(s, *c);
}

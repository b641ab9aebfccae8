// The fake driver's streams, events, capture and cuGetProcAddress (see fake_cuda.cpp).
#include "fake_cuda_state.h"  // first: it selects cuda.h's internal (all-variants) mode

#include <algorithm>
#include <cstring>

#include <cudaTypedefs.h>

namespace fake_cuda_impl {
namespace {

CUresult record(const char* name, CUevent e, CUstream hs, bool per_thread) {
  State& s = st();
  std::lock_guard lock(s.mu);
  fake_cuda_call& c = begin(s, name);
  c.stream = reinterpret_cast<uint64_t>(hs);
  c.event = reinterpret_cast<uint64_t>(e);
  auto it = s.events.find(c.event);
  if (it == s.events.end()) return finish(s, c, CUDA_ERROR_INVALID_HANDLE);
  Stream& str = s.streams[sid(hs, per_thread)];
  it->second = {str.time_ns, sid(hs, per_thread), str.busy, str.busy_epoch};
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
CUresult create_stream(const char* name, CUstream* out, int priority) {
  State& s = st();
  std::lock_guard lock(s.mu);
  fake_cuda_call& c = begin(s, name);
  uint64_t h = (s.next_handle += 0x100);
  s.streams[h].priority = priority;
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
  Stream& str = s.streams[sid(hs, per_thread)];
  if (query) return finish(s, c, str.busy ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS);
  if (str.busy) {  // synchronising waits the work out
    str.busy = false;
    ++str.busy_epoch;
  }
  return finish(s, c);
}
CUresult event_sync(const char* name, CUevent e, bool query) {
  State& s = st();
  std::lock_guard lock(s.mu);
  fake_cuda_call& c = begin(s, name);
  c.event = reinterpret_cast<uint64_t>(e);
  auto it = s.events.find(c.event);
  if (it == s.events.end()) return finish(s, c, CUDA_ERROR_INVALID_HANDLE);
  if (query) return finish(s, c, event_ready(s, it->second) ? CUDA_SUCCESS : CUDA_ERROR_NOT_READY);
  if (!event_ready(s, it->second)) {
    Stream& str = s.streams[it->second.stream];
    str.busy = false;
    ++str.busy_epoch;
  }
  return finish(s, c);
}
}  // namespace

FAKE_EXPORT CUresult CUDAAPI cuStreamCreate(CUstream* out, unsigned int) {
  return create_stream("cuStreamCreate", out, 0);
}
FAKE_EXPORT CUresult CUDAAPI cuStreamCreateWithPriority(CUstream* out, unsigned int, int prio) {
  return create_stream("cuStreamCreateWithPriority", out, prio);
}
FAKE_EXPORT CUresult CUDAAPI cuStreamDestroy_v2(CUstream hs) {
  return simple("cuStreamDestroy_v2", hs, 0, 0);
}
FAKE_EXPORT CUresult CUDAAPI cuStreamSynchronize(CUstream s) { return stream_sync("cuStreamSynchronize", s, false, false); }
FAKE_EXPORT CUresult CUDAAPI cuStreamSynchronize_ptsz(CUstream s) { return stream_sync("cuStreamSynchronize_ptsz", s, true, false); }
FAKE_EXPORT CUresult CUDAAPI cuStreamQuery(CUstream s) { return stream_sync("cuStreamQuery", s, false, true); }
FAKE_EXPORT CUresult CUDAAPI cuStreamQuery_ptsz(CUstream s) { return stream_sync("cuStreamQuery_ptsz", s, true, true); }
FAKE_EXPORT CUresult CUDAAPI cuCtxSynchronize() {
  State& s = st();
  std::lock_guard lock(s.mu);
  fake_cuda_call& c = begin(s, "cuCtxSynchronize");
  for (auto& [id, str] : s.streams) {
    if (str.busy) ++str.busy_epoch;
    str.busy = false;
  }
  return finish(s, c);
}

FAKE_EXPORT CUresult CUDAAPI cuCtxSynchronize_v2(CUcontext ctx) {
  State& s = st();
  std::lock_guard lock(s.mu);
  fake_cuda_call& c = begin(s, "cuCtxSynchronize_v2");
  c.value = reinterpret_cast<uint64_t>(ctx);
  for (auto& [id, str] : s.streams) {
    if (str.busy) ++str.busy_epoch;
    str.busy = false;
  }
  return finish(s, c);
}

FAKE_EXPORT CUresult CUDAAPI cuEventCreate(CUevent* out, unsigned int) {
  State& s = st();
  std::lock_guard lock(s.mu);
  uint64_t h = (s.next_handle += 0x100);
  s.events[h] = Event{};
  *out = reinterpret_cast<CUevent>(h);
  return CUDA_SUCCESS;  // not logged: the shim creates pool events too
}
FAKE_EXPORT CUresult CUDAAPI cuEventDestroy_v2(CUevent e) {
  State& s = st();
  std::lock_guard lock(s.mu);
  fake_cuda_call& c = begin(s, "cuEventDestroy_v2");
  c.event = reinterpret_cast<uint64_t>(e);
  if (s.events.erase(c.event) == 0) return finish(s, c, CUDA_ERROR_INVALID_HANDLE);
  return finish(s, c);
}
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
FAKE_EXPORT CUresult CUDAAPI cuEventElapsedTime(float* ms, CUevent a, CUevent b) {
  State& s = st();
  std::lock_guard lock(s.mu);
  auto ia = s.events.find(reinterpret_cast<uint64_t>(a));
  auto ib = s.events.find(reinterpret_cast<uint64_t>(b));
  if (ia == s.events.end() || ib == s.events.end()) return CUDA_ERROR_INVALID_HANDLE;
  *ms = static_cast<float>(ib->second.time_ns - ia->second.time_ns) / 1e6f;
  return CUDA_SUCCESS;
}
#define FAKE_WAIT(sym, per_thread)                                           \
  FAKE_EXPORT CUresult CUDAAPI sym(CUstream hs, CUevent e, unsigned int) {   \
    State& s = st();                                                         \
    std::lock_guard lock(s.mu);                                              \
    fake_cuda_call& c = begin(s, #sym);                                      \
    c.stream = reinterpret_cast<uint64_t>(hs);                               \
    c.event = reinterpret_cast<uint64_t>(e);                                 \
    auto it = s.events.find(c.event);                                        \
    if (it == s.events.end()) return finish(s, c, CUDA_ERROR_INVALID_HANDLE); \
    Stream& str = s.streams[sid(hs, per_thread)];                            \
    str.time_ns = std::max(str.time_ns, it->second.time_ns);                 \
    return finish(s, c);                                                     \
  }
FAKE_WAIT(cuStreamWaitEvent, false)
FAKE_WAIT(cuStreamWaitEvent_ptsz, true)

// ---------------- capture ----------------

#define FAKE_CAPTURE(sym, PARAMS, delta)                        \
  FAKE_EXPORT CUresult CUDAAPI sym PARAMS {                     \
    CUresult rc = simple(#sym, s, 0, 0);                        \
    if (rc == CUDA_SUCCESS) {                                   \
      std::lock_guard lock(st().mu);                            \
      st().capturing += delta;                                  \
    }                                                           \
    return rc;                                                  \
  }
FAKE_CAPTURE(cuStreamBeginCapture_v2, (CUstream s, CUstreamCaptureMode), 1)
FAKE_CAPTURE(cuStreamBeginCapture_v2_ptsz, (CUstream s, CUstreamCaptureMode), 1)
FAKE_CAPTURE(cuStreamBeginCaptureToGraph, (CUstream s, CUgraph, const CUgraphNode*, const CUgraphEdgeData*, size_t, CUstreamCaptureMode), 1)
FAKE_CAPTURE(cuStreamBeginCaptureToGraph_ptsz, (CUstream s, CUgraph, const CUgraphNode*, const CUgraphEdgeData*, size_t, CUstreamCaptureMode), 1)
FAKE_CAPTURE(cuStreamEndCapture, (CUstream s, CUgraph*), -1)
FAKE_CAPTURE(cuStreamEndCapture_ptsz, (CUstream s, CUgraph*), -1)

// ---------------- cuGetProcAddress ----------------

namespace {

struct ProcEntry {
  const char* base;
  const char* symbol;
  int min_version;
  int max_version;
  bool per_thread;
  void* fn;
};

// The same entry-point list the shim is generated from, pointing at the fake's functions; plus
// driver functions the shim does not wrap.
const ProcEntry kProcs[] = {
#define ORION_ENTRY(base, sym, pfn, lo, hi, pt) {#base, #sym, lo, hi, pt != 0, reinterpret_cast<void*>(&::sym)},
#include "entry_points.def"
#undef ORION_ENTRY
    {"cuInit", "cuInit", 2000, 0x7fffffff, false, reinterpret_cast<void*>(&cuInit)},
    {"cuCtxGetCurrent", "cuCtxGetCurrent", 4000, 0x7fffffff, false, reinterpret_cast<void*>(&cuCtxGetCurrent)},
    {"cuFuncGetName", "cuFuncGetName", 12030, 0x7fffffff, false, reinterpret_cast<void*>(&cuFuncGetName)},
    {"cuEventCreate", "cuEventCreate", 2000, 0x7fffffff, false, reinterpret_cast<void*>(&cuEventCreate)},
};

CUresult lookup(const char* symbol, void** pfn, int version, cuuint64_t flags,
                CUdriverProcAddressQueryResult* status) {
  {
    std::lock_guard lock(st().mu);
    ++st().proc_lookups;
  }
  if (pfn == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *pfn = nullptr;
  auto set_status = [&](CUdriverProcAddressQueryResult r) { if (status) *status = r; };
  if (symbol == nullptr || symbol[0] == '\0') {  // libcudart's probe of a real (non-stub) driver
    set_status(CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    return CUDA_ERROR_NOT_FOUND;
  }
  const bool per_thread = (flags & CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM) != 0;
  bool known = false, has_pt = false;
  const ProcEntry* legacy = nullptr;
  const ProcEntry* threaded = nullptr;
  for (const ProcEntry& e : kProcs) {
    if (std::strcmp(e.base, symbol) != 0) continue;
    known = true;
    has_pt |= e.per_thread;
    if (version >= e.min_version && version < e.max_version) (e.per_thread ? threaded : legacy) = &e;
  }
  const ProcEntry* hit = (per_thread && has_pt) ? threaded : legacy;
  if (hit == nullptr) {
    set_status(known ? CU_GET_PROC_ADDRESS_VERSION_NOT_SUFFICIENT : CU_GET_PROC_ADDRESS_SYMBOL_NOT_FOUND);
    return CUDA_ERROR_NOT_FOUND;
  }
  *pfn = hit->fn;
  set_status(CU_GET_PROC_ADDRESS_SUCCESS);
  return CUDA_SUCCESS;
}

}  // namespace

FAKE_EXPORT void fake_cuda_set_logging(int enabled) {
  std::lock_guard lock(st().mu);
  st().logging = enabled != 0;
}
FAKE_EXPORT void* fake_cuda_own_symbol(const char* symbol) {
  for (const ProcEntry& e : kProcs) {
    if (std::strcmp(e.symbol, symbol) == 0) return e.fn;
  }
  return nullptr;
}

FAKE_EXPORT CUresult CUDAAPI cuGetProcAddress(const char* symbol, void** pfn, int version,
                                              cuuint64_t flags) {
  return lookup(symbol, pfn, version, flags, nullptr);
}
FAKE_EXPORT CUresult CUDAAPI cuGetProcAddress_v2(const char* symbol, void** pfn, int version,
                                                 cuuint64_t flags,
                                                 CUdriverProcAddressQueryResult* status) {
  return lookup(symbol, pfn, version, flags, status);
}

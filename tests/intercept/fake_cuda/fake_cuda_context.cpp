// The fake driver's contexts (a per-thread current-context stack, two devices with distinct
// primary contexts), stream capture modes and the legacy-stream rule of its timelines (see
// fake_cuda.cpp for the rest).
#include "fake_cuda_state.h"  // first: it selects cuda.h's internal (all-variants) mode

#include <algorithm>
#include <atomic>
#include <mutex>
#include <unordered_map>
#include <vector>

namespace fake_cuda_impl {
namespace {

std::vector<uint64_t>& ctx_stack() {
  thread_local std::vector<uint64_t> stack;
  return stack;
}

// The capture that keeps the calling thread (token `self`, mode `mode`) from an unsafe call.
bool prohibits(const Capture& c, uint64_t self, CUstreamCaptureMode mode) {
  if (mode == CU_STREAM_CAPTURE_MODE_RELAXED || c.invalidated) return false;
  if (c.thread == self) return c.mode != CU_STREAM_CAPTURE_MODE_RELAXED;
  return mode == CU_STREAM_CAPTURE_MODE_GLOBAL && c.mode == CU_STREAM_CAPTURE_MODE_GLOBAL;
}

}  // namespace

// Contexts made by cuCtxCreate: handle -> device (-1 once destroyed). Own mutex, taken after
// State::mu when both are held.
std::mutex g_created_mu;
std::unordered_map<uint64_t, int> g_created;
uint64_t g_next_created = 0x5C000000000ULL;

int device_of(uint64_t ctx) {
  for (int d = 0; d < kDevices; ++d) {
    if (kPrimaryContext[d] == ctx) return d;
  }
  {
    std::lock_guard lock(g_created_mu);
    if (auto it = g_created.find(ctx); it != g_created.end()) return it->second;
  }
  return green_device(ctx);
}

// Primary contexts' retains (under g_created_mu). The last release, or a reset, ends the context:
// its streams, events and functions go as at cuCtxDestroy (it is not popped from any thread's
// stack), and work in it fails with CUDA_ERROR_CONTEXT_IS_DESTROYED ("a primary context which has
// not yet been initialized") until a retain makes it active again, under the same handle: the
// harder case for the shim, whose streams of the old and the new context then share it.
// A primary context never retained is not active either (cuDevicePrimaryCtxGetState answers 0,
// work in it fails as in one that ended): the real driver hands its handle out only through a
// retain, which initializes it.
struct Primary {
  int retains = 0;
  bool ended = true;  // not initialized: never retained, or its last release or a reset ended it
};
Primary g_primary[kDevices];

bool context_destroyed(uint64_t ctx) {
  if (green_ended(ctx)) return true;
  std::lock_guard lock(g_created_mu);
  for (int d = 0; d < kDevices; ++d) {
    if (kPrimaryContext[d] == ctx) return g_primary[d].ended;
  }
  auto it = g_created.find(ctx);
  return it != g_created.end() && it->second < 0;
}

void take_context_along(State& s, uint64_t ctx, CUresult streams_answer) {
  s.streams.erase(legacy_stream_of(ctx));  // a revived primary context's legacy stream starts idle
  for (auto it = s.streams.begin(); it != s.streams.end();) {
    if (it->second.ctx == ctx) {
      s.dead_streams[it->first] = streams_answer;
      if (streams_answer == CUDA_ERROR_INVALID_HANDLE) s.free_stream_handles.push_back(it->first);
      it = s.streams.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = s.events.begin(); it != s.events.end();) {
    if (it->second.ctx == ctx) {
      s.free_event_handles.push_back(it->first);
      it = s.events.erase(it);
    } else {
      ++it;
    }
  }
  // Its modules are unloaded with it: their functions' handles are invalid and handed out again.
  for (auto& [handle, module] : s.modules) {
    if (module.ctx == ctx) module.loaded = false;
  }
  // A library's CUkernels are not of any context (cuLibraryLoad is context-independent).
  for (auto f = s.functions.begin(); f != s.functions.end();) {
    if (f->second->ctx == ctx && !f->second->is_kernel) {
      s.free_function_handles.push_back(f->first);
      s.unloaded.push_back(f->second);
      f = s.functions.erase(f);
    } else {
      ++f;
    }
  }
}

void primary_retain(int device) {
  std::lock_guard lock(g_created_mu);
  ++g_primary[device].retains;
  g_primary[device].ended = false;
}

CUresult primary_release(State& s, int device) {
  {
    std::lock_guard lock(g_created_mu);
    Primary& p = g_primary[device];
    if (p.retains == 0) return CUDA_ERROR_INVALID_CONTEXT;  // "has not been previously retained"
    if (--p.retains != 0 || p.ended) return CUDA_SUCCESS;
    p.ended = true;
  }
  take_context_along(s, kPrimaryContext[device], CUDA_ERROR_INVALID_HANDLE);
  return CUDA_SUCCESS;
}

void primary_reset_all() {
  std::lock_guard lock(g_created_mu);
  for (Primary& p : g_primary) p.ended = p.retains == 0;
}

uint64_t current_ctx() {
  const auto& stack = ctx_stack();
  return stack.empty() ? 0 : stack.back();
}

CUstreamCaptureMode& thread_capture_mode() {
  thread_local CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  return mode;
}

uint64_t thread_token() {
  static std::atomic<uint64_t> next{1};
  thread_local uint64_t token = next.fetch_add(1);
  return token;
}

// Work on the legacy stream of context `ctx` waits for every blocking stream of it, a capturing
// one too: the driver refuses it (CUDA_ERROR_STREAM_CAPTURE_IMPLICIT, "a disallowed implicit
// dependency on a current capture sequence from cudaStreamLegacy") and, as for every prohibited
// operation, invalidates the capture, whatever its mode. A per-thread default stream is blocking.
bool blocks_legacy_stream(const State& s, uint64_t capturing, const Capture& capture, uint64_t ctx) {
  if (capture.ctx != ctx) return false;
  if ((capturing & kPerThreadStream) != 0) return true;
  auto it = s.streams.find(capturing);
  return it != s.streams.end() && (it->second.flags & CU_STREAM_NON_BLOCKING) == 0;
}

bool legacy_work_waits_for_a_capture(State& s, uint64_t ctx) {
  bool implicit = false;
  for (auto& [id, capture] : s.captures) {
    if (blocks_legacy_stream(s, id, capture, ctx)) {
      capture.invalidated = true;
      implicit = true;
    }
  }
  return implicit;
}

CUresult dead_stream_answer(const State& s, uint64_t id) {
  const auto dead = s.dead_streams.find(id);
  return dead == s.dead_streams.end() ? CUDA_SUCCESS : dead->second;
}

CUresult check_stream(State& s, uint64_t id) {
  const uint64_t cur = current_ctx();
  if (cur == 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (context_destroyed(cur)) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  if (CUresult dead = dead_stream_answer(s, id); dead != CUDA_SUCCESS) return dead;
  if (default_stream_id(id)) return CUDA_SUCCESS;  // the current context's legacy / per-thread stream
  auto it = s.streams.find(id);
  if (it == s.streams.end() || it->second.ctx == 0) return CUDA_SUCCESS;
  return it->second.ctx == cur ? CUDA_SUCCESS : CUDA_ERROR_INVALID_HANDLE;
}

CUresult check_enqueue(State& s, uint64_t id) {
  if (CUresult rc = check_stream(s, id); rc != CUDA_SUCCESS) return rc;
  if (legacy_stream_id(id) && legacy_work_waits_for_a_capture(s, legacy_stream_ctx(id))) {
    return CUDA_ERROR_STREAM_CAPTURE_IMPLICIT;
  }
  return CUDA_SUCCESS;
}

CUresult unsafe_call(State& s) {
  const uint64_t self = thread_token();
  const CUstreamCaptureMode mode = thread_capture_mode();
  bool prohibited = false;
  for (auto& [id, c] : s.captures) {
    if (prohibits(c, self, mode)) {
      c.invalidated = true;
      prohibited = true;
    }
  }
  return prohibited ? CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED : CUDA_SUCCESS;
}

bool advance(State& s, uint64_t id, int64_t duration_ns, fake_cuda_call& c) {
  c.context = current_ctx();
  if (auto cap = s.captures.find(id); cap != s.captures.end()) {
    ++cap->second.nodes;
    c.captured = 1;
    return true;
  }
  Stream& str = s.streams[id];
  int64_t start = str.time_ns;
  if (legacy_stream_id(id)) {
    // A context's legacy stream waits for every blocking stream of that context (a per-thread
    // stream, or a handle the fake never made, counts as one of every context).
    const uint64_t ctx = legacy_stream_ctx(id);
    for (const auto& [other, o] : s.streams) {
      if (!legacy_stream_id(other) && (o.ctx == ctx || o.ctx == 0) && (o.flags & CU_STREAM_NON_BLOCKING) == 0) {
        start = std::max(start, o.time_ns);
      }
    }
  } else if ((str.flags & CU_STREAM_NON_BLOCKING) == 0) {
    // A blocking stream waits for its context's legacy stream.
    const uint64_t ctx = str.ctx != 0 ? str.ctx : current_ctx();
    start = std::max(start, s.streams[legacy_stream_of(ctx)].time_ns);
  }
  s.streams[id].time_ns = start + duration_ns;
  return false;
}

}  // namespace fake_cuda_impl

using namespace fake_cuda_impl;

FAKE_EXPORT CUcontext fake_cuda_primary_context(int device) {
  return device >= 0 && device < kDevices ? reinterpret_cast<CUcontext>(kPrimaryContext[device])
                                          : nullptr;
}

FAKE_EXPORT int fake_cuda_primary_retains(int device) {
  if (device < 0 || device >= kDevices) return -1;
  std::lock_guard lock(g_created_mu);
  return g_primary[device].retains;
}

// ---------------- devices and contexts ----------------

FAKE_EXPORT CUresult CUDAAPI cuDeviceGetCount(int* n) {
  if (n == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *n = kDevices;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult CUDAAPI cuDeviceGet(CUdevice* d, int ordinal) {
  if (d == nullptr || ordinal < 0 || ordinal >= kDevices) return CUDA_ERROR_INVALID_DEVICE;
  *d = ordinal;
  return CUDA_SUCCESS;
}
namespace {
CUresult device_attribute(int* v, CUdevice_attribute a, CUdevice d) {
  if (v == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (d < 0 || d >= kDevices) return CUDA_ERROR_INVALID_DEVICE;
  *v = (a == CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT) ? kSmCount[d] : 0;
  return CUDA_SUCCESS;
}
}  // namespace
FAKE_EXPORT CUresult CUDAAPI cuDeviceGetAttribute(int* v, CUdevice_attribute a, CUdevice d) {
  return device_attribute(v, a, d);
}
FAKE_EXPORT CUresult CUDAAPI fake_cuDeviceGetAttribute_newer_abi(int* v, CUdevice_attribute a, CUdevice d) {
  return device_attribute(v, a, d);
}
// Retains are not logged (every test's set-up makes one); releases and resets are.
FAKE_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext* c, CUdevice d) {
  if (c == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (d < 0 || d >= kDevices) return CUDA_ERROR_INVALID_DEVICE;
  primary_retain(d);
  *c = reinterpret_cast<CUcontext>(kPrimaryContext[d]);
  return CUDA_SUCCESS;
}
namespace {
// A logged primary-context call on device d: `then` runs once the call may go ahead.
template <typename Then>
CUresult primary_call(const char* name, CUdevice d, Then then) {
  State& s = st();
  std::lock_guard lock(s.mu);
  fake_cuda_call& c = begin(s, name);
  c.value = static_cast<uint64_t>(d);
  if (d < 0 || d >= kDevices) return finish(s, c, CUDA_ERROR_INVALID_DEVICE);
  const CUresult rc = finish(s, c);
  if (rc != CUDA_SUCCESS) return rc;
  c.result = then(s, d);  // the log holds what the call answered (a release never retained fails)
  return static_cast<CUresult>(c.result);
}
// Everything of the primary context goes, whatever its retains (which stay: "resetting the
// primary context does not release it").
CUresult primary_reset(State& s, int device) {
  {
    std::lock_guard created(g_created_mu);
    g_primary[device].ended = true;
  }
  take_context_along(s, kPrimaryContext[device], CUDA_ERROR_INVALID_HANDLE);
  return CUDA_SUCCESS;
}
}  // namespace
FAKE_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRelease_v2(CUdevice d) {
  return primary_call("cuDevicePrimaryCtxRelease_v2", d, primary_release);
}
FAKE_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxReset_v2(CUdevice d) {
  return primary_call("cuDevicePrimaryCtxReset_v2", d, primary_reset);
}
// Honours fake_cuda_delay_next: a slow look, to open the window between a last release and the
// look at what it ended.
FAKE_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxGetState(CUdevice d, unsigned int* flags, int* active) {
  if (flags == nullptr || active == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (d < 0 || d >= kDevices) return CUDA_ERROR_INVALID_DEVICE;
  sleep_if_delayed(st(), "cuDevicePrimaryCtxGetState");
  std::lock_guard lock(g_created_mu);
  *flags = 0;
  *active = g_primary[d].ended ? 0 : 1;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult CUDAAPI cuCtxGetCurrent(CUcontext* c) {
  if (c == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *c = reinterpret_cast<CUcontext>(current_ctx());
  return CUDA_SUCCESS;
}
// Replaces the top of the calling thread's stack (NULL pops it).
FAKE_EXPORT CUresult CUDAAPI cuCtxSetCurrent(CUcontext c) {
  auto& stack = ctx_stack();
  const auto v = reinterpret_cast<uint64_t>(c);
  if (v != 0 && device_of(v) < 0) return CUDA_ERROR_INVALID_CONTEXT;
  const uint64_t before = current_ctx();
  if (v == 0) {
    if (!stack.empty()) stack.pop_back();
  } else if (stack.empty()) {
    stack.push_back(v);
  } else {
    stack.back() = v;
  }
  green_current_changed(before, current_ctx());
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult CUDAAPI cuCtxPushCurrent_v2(CUcontext c) {
  const auto v = reinterpret_cast<uint64_t>(c);
  if (device_of(v) < 0) return CUDA_ERROR_INVALID_CONTEXT;
  const uint64_t before = current_ctx();
  ctx_stack().push_back(v);
  green_current_changed(before, v);
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult CUDAAPI cuCtxPopCurrent_v2(CUcontext* c) {
  auto& stack = ctx_stack();
  if (stack.empty()) return CUDA_ERROR_INVALID_CONTEXT;
  if (c != nullptr) *c = reinterpret_cast<CUcontext>(stack.back());
  const uint64_t before = current_ctx();
  stack.pop_back();
  green_current_changed(before, current_ctx());
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult CUDAAPI cuCtxGetDevice(CUdevice* d) {
  const uint64_t cur = current_ctx();
  if (cur == 0) return CUDA_ERROR_INVALID_CONTEXT;
  *d = device_of(cur);
  return CUDA_SUCCESS;
}
// cuCtxCreate: a new context of the device, pushed as the calling thread's current one.
// cuCtxDestroy: its streams, events and functions go (work on them fails from now on, a query of
// its events answers CUDA_ERROR_INVALID_HANDLE, its function handles are handed out again, and so
// are its stream and event handles with fake_cuda_set_handle_reuse), it is
// popped if current on the calling thread, and a thread that still has it current gets
// CUDA_ERROR_CONTEXT_IS_DESTROYED. Primary contexts cannot be destroyed this way.
FAKE_EXPORT CUresult CUDAAPI cuCtxCreate_v4(CUcontext* out, CUctxCreateParams*, unsigned int, CUdevice dev) {
  if (out == nullptr) return CUDA_ERROR_INVALID_VALUE;
  if (dev < 0 || dev >= kDevices) return CUDA_ERROR_INVALID_DEVICE;
  uint64_t ctx = 0;
  {
    std::lock_guard lock(g_created_mu);
    ctx = (g_next_created += 0x1000);
    g_created[ctx] = dev;
  }
  State& s = st();
  std::lock_guard lock(s.mu);
  fake_cuda_call& c = begin(s, "cuCtxCreate_v4");
  c.value = ctx;
  const uint64_t before = current_ctx();
  ctx_stack().push_back(ctx);
  green_current_changed(before, ctx);
  *out = reinterpret_cast<CUcontext>(ctx);
  return finish(s, c);
}
namespace {
CUresult destroy_context(const char* name, CUcontext hctx) {
  const auto ctx = reinterpret_cast<uint64_t>(hctx);
  State& s = st();
  std::lock_guard lock(s.mu);
  fake_cuda_call& c = begin(s, name);
  c.value = ctx;
  {
    std::lock_guard created(g_created_mu);
    auto it = g_created.find(ctx);
    if (it == g_created.end() || it->second < 0) return finish(s, c, CUDA_ERROR_INVALID_CONTEXT);
    it->second = -1;
  }
  take_context_along(s, ctx, CUDA_ERROR_INVALID_HANDLE);
  auto& stack = ctx_stack();
  if (!stack.empty() && stack.back() == ctx) {
    stack.pop_back();
    green_current_changed(ctx, current_ctx());
  }
  return finish(s, c);
}
}  // namespace
FAKE_EXPORT CUresult CUDAAPI cuCtxDestroy_v2(CUcontext hctx) { return destroy_context("cuCtxDestroy_v2", hctx); }
FAKE_EXPORT CUresult fake_cuda_end_context(CUcontext hctx) { return destroy_context("fake_cuda_end_context", hctx); }

FAKE_EXPORT CUresult CUDAAPI cuStreamGetCtx(CUstream hs, CUcontext* c) {
  State& s = st();
  std::lock_guard lock(s.mu);
  const uint64_t id = sid(hs, false);
  uint64_t ctx = current_ctx();
  if (!legacy_stream_id(id)) {
    auto it = s.streams.find(id);
    if (it == s.streams.end() || it->second.ctx == 0) return CUDA_ERROR_INVALID_HANDLE;
    ctx = it->second.ctx;
  }
  if (ctx == 0) return CUDA_ERROR_INVALID_CONTEXT;
  *c = reinterpret_cast<CUcontext>(ctx);
  return CUDA_SUCCESS;
}

// ---------------- capture modes ----------------

FAKE_EXPORT CUresult CUDAAPI cuThreadExchangeStreamCaptureMode(CUstreamCaptureMode* mode) {
  if (mode == nullptr) return CUDA_ERROR_INVALID_VALUE;
  std::swap(*mode, thread_capture_mode());
  return CUDA_SUCCESS;
}

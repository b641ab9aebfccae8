// A fake CUDA driver (libcuda.so.1) for testing the shim without a GPU. Every exported driver
// function records itself in an in-process log; streams keep a virtual timeline (kernels take a
// configurable duration), events remember the time they were recorded. Nothing runs on a GPU.
// This file: state, control API, functions, launches. fake_cuda_init.cpp: cuInit, versions, error
// names. fake_cuda_copies.cpp: copies, sets, memory ops. fake_cuda_streams.cpp: streams, events,
// capture and cuGetProcAddress.
#include "fake_cuda_state.h"  // first: it selects cuda.h's internal (all-variants) mode

#include <algorithm>
#include <cstdio>
#include <chrono>
#include <cstring>
#include <ctime>
#include <thread>

namespace fake_cuda_impl {

State& st() {
  static State* s = new State();  // never destroyed: calls may come from atexit handlers
  return *s;
}

fake_cuda_call& begin(State& s, const char* name) {
  ++s.calls_made;
  if (s.call_cost_ns > 0) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::nanoseconds(s.call_cost_ns);
    while (std::chrono::steady_clock::now() < until) {
    }
  }
  if (!s.logging) {
    // Benchmarks: no log, no failure injection (finish() finds nothing under an empty name).
    static fake_cuda_call scratch;  // written under s.mu only
    return scratch;
  }
  fake_cuda_call c{};
  std::snprintf(c.name, sizeof c.name, "%s", name);
  c.index = s.log.size();
  c.thread = thread_token();
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  c.time_ns = static_cast<int64_t>(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
  s.log.push_back(c);
  return s.log.back();
}

CUresult finish(State& s, fake_cuda_call& c, CUresult ok) {
  if (s.fail_next.empty()) {
    c.result = ok;
    return ok;
  }
  auto it = s.fail_next.find(c.name);
  if (it != s.fail_next.end()) {
    c.result = it->second;
    s.fail_next.erase(it);
    return static_cast<CUresult>(c.result);
  }
  c.result = ok;
  return ok;
}

uint64_t sid(CUstream s, bool per_thread) {
  auto v = reinterpret_cast<uint64_t>(s);
  if ((v == 0 && per_thread) || v == 2) return kPerThreadStream | thread_token();
  if (v == 0 || v == 1) return legacy_stream_of(current_ctx());
  return v;
}

namespace {
// fake_cuda_delay_next_on_this_thread's delays, and how many calls sleep in a delay right now.
std::map<std::string, int64_t>& thread_delays() {
  thread_local std::map<std::string, int64_t> delays;
  return delays;
}
std::atomic<int> g_sleeping_in_delays{0};
}  // namespace

void sleep_if_delayed(State& s, const char* name) {
  int64_t delay_us = 0;
  if (auto it = thread_delays().find(name); it != thread_delays().end()) {
    delay_us = it->second;
    thread_delays().erase(it);
  } else {
    std::lock_guard lock(s.mu);
    if (auto it = s.delay_next_us.find(name); it != s.delay_next_us.end()) {
      delay_us = it->second;
      s.delay_next_us.erase(it);
    }
  }
  if (delay_us > 0) {
    g_sleeping_in_delays.fetch_add(1);
    std::this_thread::sleep_for(std::chrono::microseconds(delay_us));
    g_sleeping_in_delays.fetch_sub(1);
  }
}

CUresult launch(const char* name, CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                unsigned bx, unsigned by, unsigned bz, unsigned smem, CUstream hs, void** params,
                void** extra, bool per_thread) {
  State& s = st();
  sleep_if_delayed(s, name);
  std::lock_guard lock(s.mu);
  fake_cuda_call& c = begin(s, name);
  c.stream = reinterpret_cast<uint64_t>(hs);
  c.function = reinterpret_cast<uint64_t>(f);
  c.grid[0] = gx, c.grid[1] = gy, c.grid[2] = gz;
  c.block[0] = bx, c.block[1] = by, c.block[2] = bz;
  c.shared_mem = smem;
  const uint64_t id = sid(hs, per_thread);
  if (CUresult rc = check_enqueue(s, id); rc != CUDA_SUCCESS) return finish(s, c, rc);
  auto fit = s.functions.find(c.function);
  // A function is valid only in the context it was loaded in (a CUkernel in any context).
  if (fit == s.functions.end() || (!fit->second->is_kernel && fit->second->ctx != current_ctx())) {
    return finish(s, c, CUDA_ERROR_INVALID_HANDLE);
  }
  Function& fn = *fit->second;
  if (params != nullptr && fn.params_known) {
    for (size_t i = 0; i < fn.sizes.size(); ++i) {
      size_t end = fn.offsets[i] + fn.sizes[i];
      if (end > FAKE_CUDA_MAX_PARAM_BYTES) break;
      std::memcpy(c.params + fn.offsets[i], params[i], fn.sizes[i]);
      c.param_bytes = std::max(c.param_bytes, end);
    }
  } else if (extra != nullptr) {
    const void* buf = nullptr;
    size_t size = 0;
    for (void** e = extra; *e != CU_LAUNCH_PARAM_END; e += 2) {
      if (e[0] == CU_LAUNCH_PARAM_BUFFER_POINTER) buf = e[1];
      if (e[0] == CU_LAUNCH_PARAM_BUFFER_SIZE) size = *static_cast<size_t*>(e[1]);
    }
    if (buf == nullptr || size > FAKE_CUDA_MAX_PARAM_BYTES) return finish(s, c, CUDA_ERROR_INVALID_VALUE);
    std::memcpy(c.params, buf, size);
    c.param_bytes = size;
  }
  advance(s, id, fn.duration_ns, c);
  return finish(s, c);
}

// A logged call with no effect beyond the log (copies, sets, graph launches, frees, ...).
CUresult simple(const char* name, CUstream hs, uint64_t value, int64_t duration_ns, bool unsafe,
                bool* captured) {
  State& s = st();
  std::lock_guard lock(s.mu);
  fake_cuda_call& c = begin(s, name);
  c.stream = reinterpret_cast<uint64_t>(hs);
  c.value = value;
  const uint64_t id = sid(hs, std::strstr(name, "_pt") != nullptr);
  // A synchronous call (no stream) is an unsafe call during a capture, modelled as such.
  if (CUresult rc = unsafe ? check_stream(s, id) : check_enqueue(s, id); rc != CUDA_SUCCESS) return finish(s, c, rc);
  if (unsafe) {
    if (CUresult rc = unsafe_call(s); rc != CUDA_SUCCESS) return finish(s, c, rc);
  }
  const bool in_capture = advance(s, id, duration_ns, c);
  if (captured != nullptr) *captured = in_capture;
  return finish(s, c);
}


}  // namespace fake_cuda_impl

using namespace fake_cuda_impl;


// ---------------- control API ----------------

FAKE_EXPORT void fake_cuda_reset(void) {
  State& s = st();
  std::lock_guard lock(s.mu);
  s.log.clear();
  s.fail_next.clear();
  s.delay_next_us.clear();
  for (auto& [id, str] : s.streams) str.busy = false;
  s.captures.clear();
  s.proc_lookups = 0;
  s.newer_launch_abi_from = 0;
  s.early_per_thread_answer = 0;
  s.reuse_handles = false;
  s.free_stream_handles.clear();
  s.free_event_handles.clear();
  primary_reset_all();
}
FAKE_EXPORT void fake_cuda_set_handle_reuse(int enabled) {
  std::lock_guard lock(st().mu);
  st().reuse_handles = enabled != 0;
}
FAKE_EXPORT size_t fake_cuda_call_count(void) {
  State& s = st();
  std::lock_guard lock(s.mu);
  return s.log.size();
}
FAKE_EXPORT int fake_cuda_get_call(size_t index, fake_cuda_call* out) {
  State& s = st();
  std::lock_guard lock(s.mu);
  if (index >= s.log.size() || out == nullptr) return -1;
  *out = s.log[index];
  return 0;
}
namespace fake_cuda_impl {
uint64_t make_function(uint64_t owner, const char* name, size_t count, const size_t* sizes, bool is_kernel,
                       const size_t* aligns) {
  State& s = st();
  std::lock_guard lock(s.mu);
  auto* fn = new Function();
  fn->name = name ? name : "";
  fn->ctx = current_ctx() != 0 ? current_ctx() : kPrimaryContext[0];
  fn->owner = owner;
  fn->is_kernel = is_kernel;
  if (sizes != nullptr) {
    fn->params_known = true;
    size_t off = 0;
    for (size_t i = 0; i < count; ++i) {
      const size_t align = std::max<size_t>(1, aligns != nullptr ? aligns[i] : std::min<size_t>(sizes[i], 8));
      off = (off + align - 1) / align * align;
      fn->offsets.push_back(off);
      fn->sizes.push_back(sizes[i]);
      off += sizes[i];
    }
  }
  uint64_t h = 0;
  if (!s.free_function_handles.empty()) {
    h = s.free_function_handles.back();
    s.free_function_handles.pop_back();
  } else {
    h = (s.next_handle += 0x100);
  }
  s.functions[h] = fn;
  return h;
}
}  // namespace fake_cuda_impl

namespace {
// Unloads a module or library: its functions' handles become invalid and reusable.
CUresult unload(const char* name, uint64_t owner) {
  State& s = st();
  std::lock_guard lock(s.mu);
  fake_cuda_call& c = begin(s, name);
  c.value = owner;
  c.context = current_ctx();
  auto it = s.modules.find(owner);
  if (it == s.modules.end() || !it->second.loaded) return finish(s, c, CUDA_ERROR_INVALID_HANDLE);
  it->second.loaded = false;
  for (auto f = s.functions.begin(); f != s.functions.end();) {
    if (f->second->owner == owner) {
      s.free_function_handles.push_back(f->first);
      s.unloaded.push_back(f->second);  // its name may still be referenced
      f = s.functions.erase(f);
    } else {
      ++f;
    }
  }
  return finish(s, c);
}
// The function or kernel `h` as the calling API family sees it (null: an invalid handle for it).
Function* find_function(State& s, uint64_t h, bool as_kernel) {
  auto it = s.functions.find(h);
  if (it == s.functions.end() || it->second->is_kernel != as_kernel) return nullptr;
  return it->second;
}
CUresult param_info(uint64_t h, bool as_kernel, size_t i, size_t* off, size_t* size) {
  State& s = st();
  std::lock_guard lock(s.mu);
  Function* fn = find_function(s, h, as_kernel);
  if (fn == nullptr) return CUDA_ERROR_INVALID_VALUE;  // what cuda.h documents for a bad handle
  if (!fn->params_known) return CUDA_ERROR_NOT_SUPPORTED;
  if (i >= fn->sizes.size()) return CUDA_ERROR_INVALID_VALUE;
  if (off != nullptr) *off = fn->offsets[i];
  if (size != nullptr) *size = fn->sizes[i];
  return CUDA_SUCCESS;
}
CUresult get_name(const char** name, uint64_t h, bool as_kernel) {
  State& s = st();
  std::lock_guard lock(s.mu);
  Function* fn = find_function(s, h, as_kernel);
  if (fn == nullptr || name == nullptr) return CUDA_ERROR_INVALID_VALUE;
  *name = fn->name.c_str();
  return CUDA_SUCCESS;
}
}  // namespace

FAKE_EXPORT CUfunction fake_cuda_make_function(const char* name, size_t count, const size_t* sizes) {
  return reinterpret_cast<CUfunction>(make_function(0, name, count, sizes, false));
}
FAKE_EXPORT uint64_t fake_cuda_make_module(void) {
  State& s = st();
  std::lock_guard lock(s.mu);
  uint64_t h = (s.next_handle += 0x100);
  s.modules[h] = Module{};
  return h;
}
FAKE_EXPORT CUfunction fake_cuda_make_function_in(uint64_t module, const char* name, size_t count,
                                                  const size_t* sizes) {
  return reinterpret_cast<CUfunction>(make_function(module, name, count, sizes, false));
}
FAKE_EXPORT CUkernel fake_cuda_make_kernel(uint64_t library, const char* name, size_t count,
                                           const size_t* sizes) {
  return reinterpret_cast<CUkernel>(make_function(library, name, count, sizes, true));
}
FAKE_EXPORT CUresult CUDAAPI cuModuleUnload(CUmodule m) {
  return unload("cuModuleUnload", reinterpret_cast<uint64_t>(m));
}
FAKE_EXPORT CUresult CUDAAPI cuLibraryUnload(CUlibrary l) {
  return unload("cuLibraryUnload", reinterpret_cast<uint64_t>(l));
}
FAKE_EXPORT CUresult CUDAAPI cuKernelGetName(const char** name, CUkernel k) {
  return get_name(name, reinterpret_cast<uint64_t>(k), true);
}
FAKE_EXPORT CUresult CUDAAPI cuKernelGetParamInfo(CUkernel k, size_t i, size_t* off, size_t* size) {
  return param_info(reinterpret_cast<uint64_t>(k), true, i, off, size);
}
FAKE_EXPORT void fake_cuda_set_kernel_duration_ns(CUfunction f, int64_t ns) {
  State& s = st();
  std::lock_guard lock(s.mu);
  if (auto it = s.functions.find(reinterpret_cast<uint64_t>(f)); it != s.functions.end()) {
    it->second->duration_ns = ns;
  }
}
FAKE_EXPORT void fake_cuda_fail_next(const char* symbol, int result) {
  State& s = st();
  std::lock_guard lock(s.mu);
  s.fail_next[symbol] = result;
}
FAKE_EXPORT void fake_cuda_set_call_cost_ns(int64_t ns) {
  State& s = st();
  std::lock_guard lock(s.mu);
  s.call_cost_ns = ns;
}
FAKE_EXPORT uint64_t fake_cuda_calls_made(void) {
  State& s = st();
  std::lock_guard lock(s.mu);
  return s.calls_made;
}
FAKE_EXPORT uint64_t fake_cuda_thread_token(void) { return thread_token(); }
FAKE_EXPORT void fake_cuda_delay_next(const char* symbol, int64_t us) {
  State& s = st();
  std::lock_guard lock(s.mu);
  s.delay_next_us[symbol] = us;
}
FAKE_EXPORT void fake_cuda_delay_next_on_this_thread(const char* symbol, int64_t us) { thread_delays()[symbol] = us; }
FAKE_EXPORT int fake_cuda_delays_sleeping(void) { return g_sleeping_in_delays.load(); }
FAKE_EXPORT int fake_cuda_delay_pending_on_this_thread(const char* symbol) {
  return thread_delays().count(symbol) != 0 ? 1 : 0;
}
FAKE_EXPORT void fake_cuda_set_stream_busy(CUstream hs, int busy) {
  State& s = st();
  std::lock_guard lock(s.mu);
  Stream& str = s.streams[sid(hs, false)];
  if (str.busy && !busy) ++str.busy_epoch;
  str.busy = busy != 0;
}
FAKE_EXPORT size_t fake_cuda_proc_lookups(void) {
  State& s = st();
  std::lock_guard lock(s.mu);
  return s.proc_lookups;
}

// ---------------- driver: contexts, devices, functions (cuInit: fake_cuda_init.cpp) ----------------

FAKE_EXPORT CUresult CUDAAPI cuCtxGetStreamPriorityRange(int* least, int* greatest) {
  if (least) *least = 0;
  if (greatest) *greatest = -5;
  return CUDA_SUCCESS;
}
FAKE_EXPORT CUresult CUDAAPI cuFuncGetName(const char** name, CUfunction f) {
  return get_name(name, reinterpret_cast<uint64_t>(f), false);
}
FAKE_EXPORT CUresult CUDAAPI cuFuncGetParamInfo(CUfunction f, size_t i, size_t* off, size_t* size) {
  return param_info(reinterpret_cast<uint64_t>(f), false, i, off, size);
}
// Needs a current context (a CUkernel's occupancy is computed for it, cuda.h) and a function of it.
FAKE_EXPORT CUresult CUDAAPI cuOccupancyMaxActiveBlocksPerMultiprocessor(int* n, CUfunction f,
                                                                         int block, size_t) {
  if (n == nullptr) return CUDA_ERROR_INVALID_VALUE;
  State& s = st();
  std::lock_guard lock(s.mu);
  const uint64_t ctx = current_ctx();
  if (ctx == 0) return CUDA_ERROR_INVALID_CONTEXT;
  if (context_destroyed(ctx)) return CUDA_ERROR_CONTEXT_IS_DESTROYED;
  auto it = s.functions.find(reinterpret_cast<uint64_t>(f));
  if (it == s.functions.end() || (!it->second->is_kernel && it->second->ctx != ctx)) return CUDA_ERROR_INVALID_HANDLE;
  *n = std::max(1, std::min(32, 2048 / std::max(block, 1)));
  return CUDA_SUCCESS;
}

// Function attributes: what cuFuncSetAttribute / cuKernelSetAttribute set, read back by the Get
// calls; a set is logged (value = the attribute's new value), a get is not.
namespace {
CUresult function_attribute(const char* name, uint64_t f, bool kernel_api, int attrib, int* get, int set) {
  State& s = st();
  std::lock_guard lock(s.mu);
  auto it = s.functions.find(f);
  if (get != nullptr) {
    if (it == s.functions.end() || it->second->is_kernel != kernel_api) return CUDA_ERROR_INVALID_HANDLE;
    auto a = it->second->attributes.find(attrib);
    *get = a == it->second->attributes.end() ? 0 : a->second;
    return CUDA_SUCCESS;
  }
  fake_cuda_call& c = begin(s, name);
  c.function = f;
  c.value = static_cast<uint64_t>(set);
  if (it == s.functions.end() || it->second->is_kernel != kernel_api) return finish(s, c, CUDA_ERROR_INVALID_HANDLE);
  it->second->attributes[attrib] = set;
  return finish(s, c);
}
}  // namespace
FAKE_EXPORT CUresult CUDAAPI cuFuncGetAttribute(int* v, CUfunction_attribute a, CUfunction f) {
  return function_attribute("cuFuncGetAttribute", reinterpret_cast<uint64_t>(f), false, a, v, 0);
}
FAKE_EXPORT CUresult CUDAAPI cuFuncSetAttribute(CUfunction f, CUfunction_attribute a, int v) {
  return function_attribute("cuFuncSetAttribute", reinterpret_cast<uint64_t>(f), false, a, nullptr, v);
}
FAKE_EXPORT CUresult CUDAAPI cuKernelGetAttribute(int* v, CUfunction_attribute a, CUkernel k, CUdevice) {
  return function_attribute("cuKernelGetAttribute", reinterpret_cast<uint64_t>(k), true, a, v, 0);
}
FAKE_EXPORT CUresult CUDAAPI cuKernelSetAttribute(CUfunction_attribute a, int v, CUkernel k, CUdevice) {
  return function_attribute("cuKernelSetAttribute", reinterpret_cast<uint64_t>(k), true, a, nullptr, v);
}

// Device memory: small test addresses and what cuMemAllocAsync handed out. Anything else is
// "pageable host memory" the driver does not know.
FAKE_EXPORT CUresult CUDAAPI cuPointerGetAttribute(void* data, CUpointer_attribute attr,
                                                   CUdeviceptr p) {
  State& s = st();
  std::lock_guard lock(s.mu);
  const bool device = (p != 0 && p < 0x10000000) || (p >= 0x7f0000000000 && p <= s.next_devptr);
  const bool pinned = !device && host_pinned(s, reinterpret_cast<const void*>(p));
  if (!device && !pinned) return CUDA_ERROR_INVALID_VALUE;
  if (attr == CU_POINTER_ATTRIBUTE_MEMORY_TYPE) {
    *static_cast<CUmemorytype*>(data) = device ? CU_MEMORYTYPE_DEVICE : CU_MEMORYTYPE_HOST;
  }
  return CUDA_SUCCESS;
}

// ---------------- launches ----------------

FAKE_EXPORT CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                            unsigned bx, unsigned by, unsigned bz, unsigned smem,
                                            CUstream s, void** p, void** e) {
  return launch("cuLaunchKernel", f, gx, gy, gz, bx, by, bz, smem, s, p, e, false);
}
// The entry point a newer driver answers for cuLaunchKernel at a newer ABI version (a real driver
// answers each ABI range with its own function). Here the same launch, logged under its own name.
FAKE_EXPORT CUresult CUDAAPI fake_cuLaunchKernel_newer_abi(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                                           unsigned bx, unsigned by, unsigned bz, unsigned smem,
                                                           CUstream s, void** p, void** e) {
  return launch("cuLaunchKernel_newer_abi", f, gx, gy, gz, bx, by, bz, smem, s, p, e, false);
}
FAKE_EXPORT void fake_cuda_set_newer_launch_abi(int version) {
  std::lock_guard lock(st().mu);
  st().newer_launch_abi_from = version;
}
FAKE_EXPORT void fake_cuda_set_early_per_thread_answer(int answer) {
  std::lock_guard lock(st().mu);
  st().early_per_thread_answer = answer;
}
FAKE_EXPORT CUresult CUDAAPI cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy,
                                                 unsigned gz, unsigned bx, unsigned by,
                                                 unsigned bz, unsigned smem, CUstream s, void** p,
                                                 void** e) {
  return launch("cuLaunchKernel_ptsz", f, gx, gy, gz, bx, by, bz, smem, s, p, e, true);
}
FAKE_EXPORT CUresult CUDAAPI cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy,
                                                       unsigned gz, unsigned bx, unsigned by,
                                                       unsigned bz, unsigned smem, CUstream s,
                                                       void** p) {
  return launch("cuLaunchCooperativeKernel", f, gx, gy, gz, bx, by, bz, smem, s, p, nullptr, false);
}
FAKE_EXPORT CUresult CUDAAPI cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx,
                                                            unsigned gy, unsigned gz, unsigned bx,
                                                            unsigned by, unsigned bz,
                                                            unsigned smem, CUstream s, void** p) {
  return launch("cuLaunchCooperativeKernel_ptsz", f, gx, gy, gz, bx, by, bz, smem, s, p, nullptr,
                true);
}
// cuLaunchKernelEx: a launch-completion or programmatic-event attribute records its event when
// the launch is made (the log's `event` names it, `value` the record number).
namespace {
CUresult launch_ex(const char* name, const CUlaunchConfig* c, CUfunction f, void** p, void** e,
                   bool per_thread) {
  CUresult rc = launch(name, f, c->gridDimX, c->gridDimY, c->gridDimZ, c->blockDimX,
                       c->blockDimY, c->blockDimZ, c->sharedMemBytes, c->hStream, p, e, per_thread);
  if (rc != CUDA_SUCCESS) return rc;
  for (unsigned i = 0; c->attrs != nullptr && i < c->numAttrs; ++i) {
    CUevent ev = nullptr;
    if (c->attrs[i].id == CU_LAUNCH_ATTRIBUTE_LAUNCH_COMPLETION_EVENT) ev = c->attrs[i].value.launchCompletionEvent.event;
    if (c->attrs[i].id == CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_EVENT) ev = c->attrs[i].value.programmaticEvent.event;
    if (ev == nullptr) continue;
    State& s = st();
    std::lock_guard lock(s.mu);
    const uint64_t seq = record_event_now(s, reinterpret_cast<uint64_t>(ev), sid(c->hStream, per_thread));
    // The launch's own entry: another thread (the shim's helper polling its events) may have
    // logged calls since launch() returned, so it is not necessarily the last one.
    for (auto it = s.log.rbegin(); s.logging && it != s.log.rend(); ++it) {
      if (std::strcmp(it->name, name) == 0 && it->function == reinterpret_cast<uint64_t>(f) &&
          it->stream == reinterpret_cast<uint64_t>(c->hStream) && it->event == 0) {
        it->event = reinterpret_cast<uint64_t>(ev);
        it->value = seq;
        break;
      }
    }
  }
  return rc;
}
}  // namespace
FAKE_EXPORT CUresult CUDAAPI cuLaunchKernelEx(const CUlaunchConfig* c, CUfunction f, void** p,
                                              void** e) {
  return launch_ex("cuLaunchKernelEx", c, f, p, e, false);
}
FAKE_EXPORT CUresult CUDAAPI cuLaunchKernelEx_ptsz(const CUlaunchConfig* c, CUfunction f,
                                                   void** p, void** e) {
  return launch_ex("cuLaunchKernelEx_ptsz", c, f, p, e, true);
}
// Host functions run when submitted (the fake has no device to wait for), unless captured.
FAKE_EXPORT CUresult CUDAAPI cuLaunchHostFunc(CUstream s, CUhostFn fn, void* data) {
  bool captured = false;
  CUresult rc = simple("cuLaunchHostFunc", s, reinterpret_cast<uint64_t>(data), 100, false, &captured);
  if (rc == CUDA_SUCCESS && fn != nullptr && !captured) fn(data);
  return rc;
}
FAKE_EXPORT CUresult CUDAAPI cuLaunchHostFunc_ptsz(CUstream s, CUhostFn fn, void* data) {
  bool captured = false;
  CUresult rc = simple("cuLaunchHostFunc_ptsz", s, reinterpret_cast<uint64_t>(data), 100, false, &captured);
  if (rc == CUDA_SUCCESS && fn != nullptr && !captured) fn(data);
  return rc;
}

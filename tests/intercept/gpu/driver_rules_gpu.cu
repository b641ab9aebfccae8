// GPU checks of libgpu_scheduler.so against the driver rules of issue 11 (what the fake driver of
// tests/intercept models, on a real GPU):
//   contexts  two threads on two contexts of device 0: one on the primary context (runtime API,
//             <<<>>> launches), one on a context made with cuCtxCreate (driver API: the same
//             kernel compiled by NVRTC, cuModuleLoadData, cuLaunchKernel). Each has a
//             high-priority (greatest priority) and a priority-0 (best-effort under the shim)
//             stream and launches many kernels on both. The shim submits deferred work of one
//             thread from another (or from its helper thread) under the work's own context: every
//             result must be right, and after every launch and at the end each thread's current
//             context must still be its own (cuCtxGetCurrent).
//   capture   a priority-0 stream with many long kernels queued while a high-priority stream keeps
//             a long kernel in flight, then on a third stream (priority 0) a capture in
//             cudaStreamCaptureModeGlobal of a few kernels (with one more launch on each of the
//             other two streams during the capture), which cudaStreamEndCapture must not report
//             invalidated (cudaErrorStreamCaptureInvalidated: a prohibited call, e.g. a query,
//             made by the shim during the capture); the graph must not have run at capture time;
//             then it is instantiated and launched (twice on its stream, once on the best-effort
//             one, again behind queued work) and every result is checked.
//   all       both.
// Every kernel does y = y * 3 + k (mod 2^32) after a busy loop, with k unique per launch: the
// host replays each stream's sequence, so a lost, repeated or reordered launch is a wrong result.
// Prints one summary line per check (with the shim's orion_get_stats counters over the check
// when it is loaded), e.g.
//   contexts: PASS threads=2 launches=400/400 ctx_checks=404 results=ok orion_scheduler=on ... deferred=312 ...
// Built as gpu_driver_rules (tests/intercept/CMakeLists.txt); scripts/gpu/check_driver_rules.sh runs
//   gpu_driver_rules contexts|capture|all
//   USE_ORION_SCHEDULER=1 ORION_POLICY=priority LD_PRELOAD=/path/libgpu_scheduler.so gpu_driver_rules all
// Exit status: 0 every check passed, 1 a wrong result (results, current context, invalidated
// capture, graph run at capture time), 2 a CUDA/NVRTC error or a bad argument.
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include <cuda.h>
#include <cuda_runtime.h>
#include <nvrtc.h>

#include "orion.h"

// The kernel is written once: compiled here by nvcc (the primary context's thread launches it
// with <<<>>>) and kept as text for NVRTC (the second context's thread loads it with
// cuModuleLoadData), so both contexts run the same code.
#define KERNEL_AND_SOURCE(source_name, ...) \
  __VA_ARGS__                               \
  const char source_name[] = #__VA_ARGS__;

KERNEL_AND_SOURCE(kStepKernelSource,
extern "C" __global__ void step_kernel(unsigned* y, unsigned* scratch, int n, unsigned k,
                                       int rounds) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= n) return;
  unsigned v = (unsigned)i;
  for (int r = 0; r < rounds; ++r) v = v * 1664525u + 1013904223u;
  scratch[i] = v;
  y[i] = y[i] * 3u + k;
})

namespace {

// A CUDA, driver or NVRTC error: the check cannot go on (exit status 2).
struct CudaFailure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

std::string where(const char* file, int line, const char* call) {
  return std::string(file) + ":" + std::to_string(line) + ": " + call + ": ";
}

#define RT_CHECK(call)                                                                   \
  do {                                                                                   \
    const cudaError_t err_ = (call);                                                     \
    if (err_ != cudaSuccess)                                                             \
      throw CudaFailure(where(__FILE__, __LINE__, #call) + cudaGetErrorName(err_) + " (" + \
                        cudaGetErrorString(err_) + ")");                                 \
  } while (0)

#define CU_CHECK(call)                                                                   \
  do {                                                                                   \
    const CUresult res_ = (call);                                                        \
    if (res_ != CUDA_SUCCESS) {                                                          \
      const char* name_ = nullptr;                                                       \
      cuGetErrorName(res_, &name_);                                                      \
      throw CudaFailure(where(__FILE__, __LINE__, #call) +                               \
                        (name_ != nullptr ? name_ : std::to_string(int(res_))));         \
    }                                                                                    \
  } while (0)

#define NVRTC_CHECK(call)                                                                \
  do {                                                                                   \
    const nvrtcResult res_ = (call);                                                     \
    if (res_ != NVRTC_SUCCESS)                                                           \
      throw CudaFailure(where(__FILE__, __LINE__, #call) + nvrtcGetErrorString(res_));   \
  } while (0)

constexpr int kThreadsPerBlock = 256;

unsigned blocks_for(int n) { return unsigned((n + kThreadsPerBlock - 1) / kThreadsPerBlock); }

// Host replay of one stream's launches: the value every element must hold.
struct Expected {
  unsigned value = 0;
  void apply(unsigned k) { value = value * 3u + k; }
};

// Counts elements of `got` that differ from `expect`.
int mismatches(const std::vector<unsigned>& got, unsigned expect) {
  int bad = 0;
  for (unsigned v : got) bad += v != expect;
  return bad;
}

// --- the shim's C API (orion.h), looked up so the program also runs without it ---------------

const char* scheduler_mode() {
  auto active = reinterpret_cast<orion_is_active_fn>(dlsym(RTLD_DEFAULT, "orion_is_active"));
  return active == nullptr ? "not-loaded" : (active() ? "on" : "pass-through");
}

bool read_stats(orion_stats* out) {
  auto get = reinterpret_cast<orion_get_stats_fn>(dlsym(RTLD_DEFAULT, "orion_get_stats"));
  std::memset(out, 0, sizeof *out);
  return get != nullptr && get(out, sizeof *out) == 0;
}

// " orion_scheduler=<mode>" and, with the shim scheduling, the counters' change since `before`
// (queued_now and tracked_in_flight as they are now).
std::string stats_since(const orion_stats& before) {
  std::string out = std::string(" orion_scheduler=") + scheduler_mode();
  orion_stats now;
  if (!read_stats(&now)) return out;
  auto field = [&](const char* name, uint64_t v) { out += std::string(" ") + name + "=" + std::to_string(v); };
  field("intercepted", now.intercepted - before.intercepted);
  field("submitted", now.submitted - before.submitted);
  field("deferred", now.deferred - before.deferred);
  field("forced_by_starvation", now.forced_by_starvation - before.forced_by_starvation);
  field("caller_waits", now.caller_waits - before.caller_waits);
  field("backend_errors", now.backend_errors - before.backend_errors);
  field("communication_streams", now.communication_streams - before.communication_streams);
  field("queued_now", now.queued_now);
  field("tracked_in_flight", now.tracked_in_flight);
  return out;
}

// --- contexts ------------------------------------------------------------------------------------

constexpr int kCtxIterations = 40;   // per thread: one high-priority kernel, then kCtxBePerIter best-effort
constexpr int kCtxBePerIter = 4;
constexpr int kCtxElements = 1 << 20;
constexpr int kCtxHpRounds = 4000;   // the high-priority kernel is the longer one: it is in flight
constexpr int kCtxBeRounds = 2000;   // while the best-effort ones arrive (so the shim defers them)

struct ThreadResult {
  std::string name;
  std::string error;       // a CUDA error: the thread stopped
  std::string wrong_ctx;   // the first wrong current context seen
  int launches = 0;
  int ctx_checks = 0;
  int bad_hp = 0, bad_be = 0;
  bool started = false;    // reached the start line
};

// Both threads start launching together, so their work interleaves in the shim.
struct StartLine {
  std::atomic<int> arrived{0};
  static constexpr int kParties = 2;
  void wait(ThreadResult& r) {
    r.started = true;
    arrived.fetch_add(1);
    while (arrived.load() < kParties) std::this_thread::yield();
  }
  // A thread that failed before the start line still counts as arrived (the other goes on).
  void leave(const ThreadResult& r) {
    if (!r.started) arrived.fetch_add(1);
  }
};

// Records a context check; false (and the first offence) when `own` is not current.
bool context_is(ThreadResult& r, CUcontext own, const char* after) {
  CUcontext current = nullptr;
  CU_CHECK(cuCtxGetCurrent(&current));
  ++r.ctx_checks;
  if (current == own) return true;
  if (r.wrong_ctx.empty()) {
    char text[200];
    std::snprintf(text, sizeof text, "%s: current context %p instead of its own %p after %s",
                  r.name.c_str(), static_cast<void*>(current), static_cast<void*>(own), after);
    r.wrong_ctx = text;
  }
  return false;
}

unsigned launch_key(int thread, int stream, int index) {
  return (unsigned(thread) << 28) | (unsigned(stream) << 24) | unsigned(index);
}

// The launches both threads make: per iteration one high-priority kernel, then kCtxBePerIter
// best-effort ones, each followed by a context check. `launch(stream, key, rounds)` launches one
// kernel (stream 0: high priority, 1: best effort). False when a check found a foreign context.
template <class Launch>
bool launch_loop(ThreadResult& r, CUcontext own, int thread, Launch&& launch, Expected& e_hp, Expected& e_be) {
  for (int it = 0; it < kCtxIterations; ++it) {
    const unsigned k = launch_key(thread, 0, it);
    launch(0, k, kCtxHpRounds);
    e_hp.apply(k);
    ++r.launches;
    if (!context_is(r, own, "a high-priority launch")) return false;
    for (int j = 0; j < kCtxBePerIter; ++j) {
      const unsigned kb = launch_key(thread, 1, it * kCtxBePerIter + j);
      launch(1, kb, kCtxBeRounds);
      e_be.apply(kb);
      ++r.launches;
      if (!context_is(r, own, "a best-effort launch")) return false;
    }
  }
  return true;
}

// Thread 0: the primary context through the runtime API.
void primary_context_thread(ThreadResult& r, StartLine& start) {
  r.name = "primary-context thread (runtime API)";
  RT_CHECK(cudaSetDevice(0));
  RT_CHECK(cudaFree(nullptr));  // makes the primary context current
  CUdevice dev;
  CU_CHECK(cuDeviceGet(&dev, 0));
  CUcontext primary = nullptr, own = nullptr;
  CU_CHECK(cuDevicePrimaryCtxRetain(&primary, dev));
  CU_CHECK(cuCtxGetCurrent(&own));
  if (own != primary) throw CudaFailure("the runtime did not make the primary context current");
  int least = 0, greatest = 0;
  RT_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  cudaStream_t hp, be;
  RT_CHECK(cudaStreamCreateWithPriority(&hp, cudaStreamNonBlocking, greatest));
  RT_CHECK(cudaStreamCreateWithPriority(&be, cudaStreamNonBlocking, 0));
  unsigned *y_hp, *y_be, *scratch_hp, *scratch_be;
  const size_t bytes = kCtxElements * sizeof(unsigned);
  RT_CHECK(cudaMalloc(&y_hp, bytes));
  RT_CHECK(cudaMalloc(&y_be, bytes));
  RT_CHECK(cudaMalloc(&scratch_hp, bytes));
  RT_CHECK(cudaMalloc(&scratch_be, bytes));
  RT_CHECK(cudaMemset(y_hp, 0, bytes));
  RT_CHECK(cudaMemset(y_be, 0, bytes));
  RT_CHECK(cudaDeviceSynchronize());
  Expected e_hp, e_be;
  auto launch = [&](int stream, unsigned k, int rounds) {
    step_kernel<<<blocks_for(kCtxElements), kThreadsPerBlock, 0, stream == 0 ? hp : be>>>(
        stream == 0 ? y_hp : y_be, stream == 0 ? scratch_hp : scratch_be, kCtxElements, k, rounds);
    RT_CHECK(cudaGetLastError());
  };
  start.wait(r);
  if (!launch_loop(r, own, 0, launch, e_hp, e_be)) return;
  RT_CHECK(cudaStreamSynchronize(hp));
  RT_CHECK(cudaStreamSynchronize(be));
  if (!context_is(r, own, "the stream synchronisations")) return;
  std::vector<unsigned> got(kCtxElements);
  RT_CHECK(cudaMemcpy(got.data(), y_hp, bytes, cudaMemcpyDeviceToHost));
  r.bad_hp = mismatches(got, e_hp.value);
  RT_CHECK(cudaMemcpy(got.data(), y_be, bytes, cudaMemcpyDeviceToHost));
  r.bad_be = mismatches(got, e_be.value);
  context_is(r, own, "the copies back");
  for (void* p : {static_cast<void*>(y_hp), static_cast<void*>(y_be), static_cast<void*>(scratch_hp),
                  static_cast<void*>(scratch_be)})
    RT_CHECK(cudaFree(p));
  RT_CHECK(cudaStreamDestroy(hp));
  RT_CHECK(cudaStreamDestroy(be));
  CU_CHECK(cuDevicePrimaryCtxRelease(dev));
}

// Compiles kStepKernelSource for `dev` (a cubin for its exact architecture: no JIT needed).
std::vector<char> compile_step_kernel(CUdevice dev) {
  int major = 0, minor = 0;
  CU_CHECK(cuDeviceGetAttribute(&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev));
  CU_CHECK(cuDeviceGetAttribute(&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev));
  const std::string arch = "--gpu-architecture=sm_" + std::to_string(major) + std::to_string(minor);
  nvrtcProgram prog;
  NVRTC_CHECK(nvrtcCreateProgram(&prog, kStepKernelSource, "step_kernel.cu", 0, nullptr, nullptr));
  const char* options[] = {arch.c_str()};
  const nvrtcResult compiled = nvrtcCompileProgram(prog, 1, options);
  if (compiled != NVRTC_SUCCESS) {
    size_t log_size = 0;
    nvrtcGetProgramLogSize(prog, &log_size);
    std::string log(log_size, '\0');
    nvrtcGetProgramLog(prog, log.data());
    nvrtcDestroyProgram(&prog);
    throw CudaFailure(std::string("NVRTC could not compile step_kernel (") + arch + "): " +
                      nvrtcGetErrorString(compiled) + "\n" + log);
  }
  size_t size = 0;
  NVRTC_CHECK(nvrtcGetCUBINSize(prog, &size));
  std::vector<char> cubin(size);
  NVRTC_CHECK(nvrtcGetCUBIN(prog, cubin.data()));
  NVRTC_CHECK(nvrtcDestroyProgram(&prog));
  return cubin;
}

// Thread 1: a second context made with cuCtxCreate, through the driver API.
void created_context_thread(ThreadResult& r, StartLine& start, const std::vector<char>& cubin) {
  r.name = "created-context thread (driver API)";
  CUdevice dev;
  CU_CHECK(cuDeviceGet(&dev, 0));
  CUcontext own = nullptr, primary = nullptr;
#if CUDA_VERSION >= 13000
  CU_CHECK(cuCtxCreate(&own, nullptr, 0, dev));  // cuCtxCreate_v4(ctx, CUctxCreateParams*, flags, dev)
#else
  CU_CHECK(cuCtxCreate(&own, 0, dev));
#endif
  CU_CHECK(cuDevicePrimaryCtxRetain(&primary, dev));
  CU_CHECK(cuDevicePrimaryCtxRelease(dev));
  if (own == primary) throw CudaFailure("cuCtxCreate returned the primary context");
  CUmodule module;
  CUfunction fn;
  CU_CHECK(cuModuleLoadData(&module, cubin.data()));
  CU_CHECK(cuModuleGetFunction(&fn, module, "step_kernel"));
  int least = 0, greatest = 0;
  CU_CHECK(cuCtxGetStreamPriorityRange(&least, &greatest));
  CUstream hp, be;
  CU_CHECK(cuStreamCreateWithPriority(&hp, CU_STREAM_NON_BLOCKING, greatest));
  CU_CHECK(cuStreamCreateWithPriority(&be, CU_STREAM_NON_BLOCKING, 0));
  const size_t bytes = kCtxElements * sizeof(unsigned);
  CUdeviceptr y_hp, y_be, scratch_hp, scratch_be;
  CU_CHECK(cuMemAlloc(&y_hp, bytes));
  CU_CHECK(cuMemAlloc(&y_be, bytes));
  CU_CHECK(cuMemAlloc(&scratch_hp, bytes));
  CU_CHECK(cuMemAlloc(&scratch_be, bytes));
  CU_CHECK(cuMemsetD32(y_hp, 0, kCtxElements));
  CU_CHECK(cuMemsetD32(y_be, 0, kCtxElements));
  CU_CHECK(cuCtxSynchronize());
  Expected e_hp, e_be;
  auto launch = [&](int stream, unsigned k, int rounds) {
    // Arguments live in this frame only: a deferred launch must own a copy of them.
    CUdeviceptr y = stream == 0 ? y_hp : y_be, scratch = stream == 0 ? scratch_hp : scratch_be;
    int n = kCtxElements;
    void* params[] = {&y, &scratch, &n, &k, &rounds};
    CU_CHECK(cuLaunchKernel(fn, blocks_for(n), 1, 1, kThreadsPerBlock, 1, 1, 0, stream == 0 ? hp : be, params,
                            nullptr));
  };
  start.wait(r);
  if (!launch_loop(r, own, 1, launch, e_hp, e_be)) return;
  CU_CHECK(cuStreamSynchronize(hp));
  CU_CHECK(cuStreamSynchronize(be));
  if (!context_is(r, own, "the stream synchronisations")) return;
  std::vector<unsigned> got(kCtxElements);
  CU_CHECK(cuMemcpyDtoH(got.data(), y_hp, bytes));
  r.bad_hp = mismatches(got, e_hp.value);
  CU_CHECK(cuMemcpyDtoH(got.data(), y_be, bytes));
  r.bad_be = mismatches(got, e_be.value);
  if (!context_is(r, own, "the copies back")) return;
  for (CUdeviceptr p : {y_hp, y_be, scratch_hp, scratch_be}) CU_CHECK(cuMemFree(p));
  CU_CHECK(cuStreamDestroy(hp));
  CU_CHECK(cuStreamDestroy(be));
  CU_CHECK(cuModuleUnload(module));
  CU_CHECK(cuCtxDestroy(own));
}

int check_contexts() {
  CUdevice dev;
  CU_CHECK(cuDeviceGet(&dev, 0));
  const std::vector<char> cubin = compile_step_kernel(dev);  // before the threads: NVRTC is slow
  orion_stats before;
  read_stats(&before);
  ThreadResult results[2];
  StartLine start;
  auto guarded = [&](int i, auto&& body) {
    try {
      body();
    } catch (const std::exception& e) {
      results[i].error = e.what();
    }
    start.leave(results[i]);
  };
  std::thread t0([&] { guarded(0, [&] { primary_context_thread(results[0], start); }); });
  std::thread t1([&] { guarded(1, [&] { created_context_thread(results[1], start, cubin); }); });
  t0.join();
  t1.join();
  int status = 0, launches = 0, ctx_checks = 0;
  std::string detail;
  for (const ThreadResult& r : results) {
    launches += r.launches;
    ctx_checks += r.ctx_checks;
    if (!r.error.empty()) {
      std::fprintf(stderr, "contexts: %s: %s\n", r.name.c_str(), r.error.c_str());
      status = 2;
    }
    if (!r.wrong_ctx.empty()) {
      std::fprintf(stderr, "contexts: %s\n", r.wrong_ctx.c_str());
      detail += " wrong_context=\"" + r.wrong_ctx + "\"";
      if (status == 0) status = 1;
    }
    if (r.bad_hp + r.bad_be != 0) {
      detail += " " + std::string(r.name.substr(0, r.name.find(' '))) + "_mismatches=hp:" +
                std::to_string(r.bad_hp) + ",be:" + std::to_string(r.bad_be);
      if (status == 0) status = 1;
    }
  }
  const bool complete = launches == 2 * kCtxIterations * (1 + kCtxBePerIter);
  std::printf("contexts: %s threads=2 launches=%d/%d ctx_checks=%d results=%s%s%s\n",
              status == 0 && complete ? "PASS" : "FAIL", launches,
              2 * kCtxIterations * (1 + kCtxBePerIter), ctx_checks,
              status == 0 && complete ? "ok" : (status == 2 ? "cuda-error" : "WRONG"), detail.c_str(),
              stats_since(before).c_str());
  std::fflush(stdout);
  return status == 0 && !complete ? 1 : status;
}

// --- capture -------------------------------------------------------------------------------------

constexpr int kCapElements = 1 << 20;
constexpr int kCapHpLongRounds = 200000;  // about 15 ms on an H100: in flight through the setup
constexpr int kCapBeQueued = 32;          // long best-effort kernels queued behind it
constexpr int kCapBeRounds = 20000;
constexpr int kCapCaptured = 4;           // kernels in the graph
constexpr int kCapShortRounds = 100;
constexpr int kCapGraphLaunches = 3;

int check_capture() {
  RT_CHECK(cudaSetDevice(0));
  RT_CHECK(cudaFree(nullptr));
  int least = 0, greatest = 0;
  RT_CHECK(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  cudaStream_t hp, be, cap;
  RT_CHECK(cudaStreamCreateWithPriority(&hp, cudaStreamNonBlocking, greatest));
  RT_CHECK(cudaStreamCreateWithPriority(&be, cudaStreamNonBlocking, 0));
  RT_CHECK(cudaStreamCreateWithPriority(&cap, cudaStreamNonBlocking, 0));
  const size_t bytes = kCapElements * sizeof(unsigned);
  unsigned *y_hp, *y_be, *y_cap, *scratch_hp, *scratch_be, *scratch_cap;
  for (unsigned** p : {&y_hp, &y_be, &y_cap, &scratch_hp, &scratch_be, &scratch_cap})
    RT_CHECK(cudaMalloc(p, bytes));
  for (unsigned* p : {y_hp, y_be, y_cap}) RT_CHECK(cudaMemset(p, 0, bytes));
  RT_CHECK(cudaDeviceSynchronize());
  orion_stats before;
  read_stats(&before);
  Expected e_hp, e_be;
  std::vector<unsigned> captured_keys;
  unsigned next_key = 1;
  auto launch = [&](cudaStream_t s, unsigned* y, unsigned* scratch, int rounds) {
    const unsigned k = next_key++;
    step_kernel<<<blocks_for(kCapElements), kThreadsPerBlock, 0, s>>>(y, scratch, kCapElements, k, rounds);
    RT_CHECK(cudaGetLastError());
    return k;
  };
  // A long high-priority kernel in flight, long best-effort kernels queued behind it (deferred
  // by the shim's policy while the high-priority kernel runs).
  auto load = [&] {
    e_hp.apply(launch(hp, y_hp, scratch_hp, kCapHpLongRounds));
    for (int i = 0; i < kCapBeQueued; ++i) e_be.apply(launch(be, y_be, scratch_be, kCapBeRounds));
  };
  load();
  orion_stats at_capture;
  const std::string queued_at_capture =
      read_stats(&at_capture) ? std::to_string(at_capture.queued_now) : std::string("n/a");
  RT_CHECK(cudaStreamBeginCapture(cap, cudaStreamCaptureModeGlobal));
  // Launches are legal in global mode: the captured ones, and one on each other stream (not
  // captured; the shim defers nothing while a capture is active).
  for (int i = 0; i < kCapCaptured; ++i) {
    captured_keys.push_back(launch(cap, y_cap, scratch_cap, kCapShortRounds));
    if (i == 1) e_be.apply(launch(be, y_be, scratch_be, kCapShortRounds));
    if (i == 2) e_hp.apply(launch(hp, y_hp, scratch_hp, kCapShortRounds));
  }
  cudaGraph_t graph = nullptr;
  const cudaError_t ended = cudaStreamEndCapture(cap, &graph);
  int status = 0;
  std::string detail;
  int launched = 0;
  if (ended == cudaErrorStreamCaptureInvalidated) {
    // The shim made a call the global capture mode prohibits (a query or synchronisation) while
    // the capture was active.
    detail += " end_capture=cudaErrorStreamCaptureInvalidated";
    status = 1;
  } else if (ended != cudaSuccess) {
    throw CudaFailure(std::string("cudaStreamEndCapture: ") + cudaGetErrorName(ended) + " (" +
                      cudaGetErrorString(ended) + ")");
  } else {
    size_t nodes = 0;
    RT_CHECK(cudaGraphGetNodes(graph, nullptr, &nodes));
    if (nodes != size_t(kCapCaptured)) {
      detail += " graph_nodes=" + std::to_string(nodes) + "(expected " + std::to_string(kCapCaptured) + ")";
      status = 1;
    }
    // Captured work is recorded, not run: nothing else ever touched y_cap, so it is still zero
    // (the synchronous copy waits for nothing on the non-blocking streams, and needs nothing).
    std::vector<unsigned> got(kCapElements);
    RT_CHECK(cudaMemcpy(got.data(), y_cap, bytes, cudaMemcpyDeviceToHost));
    const int ran = mismatches(got, 0u);  // elements that are not zero
    if (ran != 0) {
      detail += " changed_at_capture=" + std::to_string(ran);
      status = 1;
    }
    cudaGraphExec_t exec = nullptr;
    RT_CHECK(cudaGraphInstantiate(&exec, graph, 0));
    // Again behind queued best-effort work: the graph twice on its stream and once on the
    // best-effort stream (there behind the queued kernels; launches of one executable graph
    // are serialised, so each applies the captured sequence once).
    load();
    RT_CHECK(cudaGraphLaunch(exec, cap));
    RT_CHECK(cudaGraphLaunch(exec, be));
    RT_CHECK(cudaGraphLaunch(exec, cap));
    launched = kCapGraphLaunches;
    for (cudaStream_t s : {hp, be, cap}) RT_CHECK(cudaStreamSynchronize(s));
    RT_CHECK(cudaGraphExecDestroy(exec));
    RT_CHECK(cudaGraphDestroy(graph));
  }
  for (cudaStream_t s : {hp, be, cap}) RT_CHECK(cudaStreamSynchronize(s));
  Expected e_cap;
  for (int g = 0; g < launched; ++g)
    for (unsigned k : captured_keys) e_cap.apply(k);
  std::vector<unsigned> got(kCapElements);
  int bad = 0;
  const std::pair<unsigned*, Expected*> buffers[] = {{y_hp, &e_hp}, {y_be, &e_be}, {y_cap, &e_cap}};
  const char* names[] = {"hp", "be", "graph"};
  for (int i = 0; i < 3; ++i) {
    RT_CHECK(cudaMemcpy(got.data(), buffers[i].first, bytes, cudaMemcpyDeviceToHost));
    const int b = mismatches(got, buffers[i].second->value);
    if (b != 0) detail += std::string(" ") + names[i] + "_mismatches=" + std::to_string(b);
    bad += b;
  }
  if (bad != 0) status = 1;
  for (unsigned* p : {y_hp, y_be, y_cap, scratch_hp, scratch_be, scratch_cap}) RT_CHECK(cudaFree(p));
  for (cudaStream_t s : {hp, be, cap}) RT_CHECK(cudaStreamDestroy(s));
  std::printf("capture: %s mode=global captured=%d graph_launches=%d be_queued_at_capture=%s end_capture=%s "
              "results=%s%s%s\n",
              status == 0 ? "PASS" : "FAIL", kCapCaptured, launched, queued_at_capture.c_str(),
              cudaGetErrorName(ended), status == 0 ? "ok" : "WRONG", detail.c_str(),
              stats_since(before).c_str());
  std::fflush(stdout);
  return status;
}

}  // namespace

// Runs one check; a CUDA error ends it with status 2 and a FAIL line naming the check.
int run_check(const char* name, int (*check)()) {
  try {
    return check();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", name, e.what());
    std::printf("%s: FAIL cuda-error: %s orion_scheduler=%s\n", name, e.what(), scheduler_mode());
    std::fflush(stdout);
    return 2;
  }
}

int main(int argc, char** argv) {
  const std::string mode = argc == 2 ? argv[1] : "";
  if (mode != "contexts" && mode != "capture" && mode != "all") {
    std::fprintf(stderr, "usage: %s contexts|capture|all\n", argv[0]);
    return 2;
  }
  const CUresult init = cuInit(0);
  if (init != CUDA_SUCCESS) {
    const char* name = nullptr;
    cuGetErrorName(init, &name);
    std::printf("%s: FAIL cuda-error: cuInit: %s (CUresult %d)\n", mode.c_str(), name != nullptr ? name : "?",
                int(init));
    return 2;
  }
  int status = 0;
  if (mode == "contexts" || mode == "all") status = std::max(status, run_check("contexts", check_contexts));
  if (mode == "capture" || mode == "all") status = std::max(status, run_check("capture", check_capture));
  return status;
}

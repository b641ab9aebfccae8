// The probes of driver_model_check (driver_model_probes.h).
#include "driver_model_probes.h"

#include <dlfcn.h>

#include <stdexcept>
#include <string>
#include <thread>

#include <fmt/format.h>

namespace driver_model {

#define DRIVER_MODEL_STR(x) #x
#define DRIVER_MODEL_NAME(x) DRIVER_MODEL_STR(x)

Driver open_driver(const std::string& path) {
  void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) throw std::runtime_error(fmt::format("cannot open {}: {}", path, dlerror()));
  Driver d;
#define DRIVER_MODEL_LOOKUP(fn)                                                                  \
  d.fn = reinterpret_cast<decltype(d.fn)>(dlsym(h, DRIVER_MODEL_NAME(fn)));                       \
  if (d.fn == nullptr) throw std::runtime_error(fmt::format("{} has no {}", path, DRIVER_MODEL_NAME(fn)));
  DRIVER_MODEL_FUNCTIONS(DRIVER_MODEL_LOOKUP)
#undef DRIVER_MODEL_LOOKUP
  d.error_name = reinterpret_cast<decltype(d.error_name)>(dlsym(h, "cuGetErrorName"));
  return d;
}

std::string name_of(const Driver& d, CUresult rc) {
  const char* name = nullptr;
  if (d.error_name != nullptr && d.error_name(rc, &name) == CUDA_SUCCESS && name != nullptr) return name;
  return fmt::format("CUresult {}", static_cast<int>(rc));
}

void must(const Driver& d, CUresult rc, const char* call) {
  if (rc != CUDA_SUCCESS) throw SetupFailed(fmt::format("set-up failed: {} = {}", call, name_of(d, rc)));
}

namespace {

int primary_active(const Driver& d, CUdevice dev) {
  unsigned flags = 0;
  int active = -1;
  MUST(d, d.cuDevicePrimaryCtxGetState(dev, &flags, &active));
  return active;
}

CUcontext retain_current(const Driver& d, CUdevice dev) {
  CUcontext c = nullptr;
  MUST(d, d.cuDevicePrimaryCtxRetain(&c, dev));
  MUST(d, d.cuCtxSetCurrent(c));
  return c;
}

CUstream make_stream(const Driver& d) {
  CUstream s = nullptr;
  MUST(d, d.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING));
  return s;
}

CUevent make_event(const Driver& d) {
  CUevent e = nullptr;
  MUST(d, d.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING));
  return e;
}

// A green context of the smallest SM group the device splits off (8 SMs on sm_90).
CUgreenCtx make_green(const Driver& d, CUdevice dev) {
  CUdevResource all{}, part{}, rest{};
  unsigned groups = 1;
  CUdevResourceDesc desc = nullptr;
  CUgreenCtx g = nullptr;
  MUST(d, d.cuDeviceGetDevResource(dev, &all, CU_DEV_RESOURCE_TYPE_SM));
  MUST(d, d.cuDevSmResourceSplitByCount(&part, &groups, &all, &rest, 0, 8));
  MUST(d, d.cuDevResourceGenerateDesc(&desc, &part, 1));
  MUST(d, d.cuGreenCtxCreate(&g, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM));
  return g;
}

// What a stream and an event of the device's primary context (retained, current) answer after
// `end` ended it, and whether the primary context then reads active.
struct AfterEnd {
  CUstream stream = nullptr;
  int active = -1;
  CUresult stream_query = CUDA_SUCCESS;
  CUresult event_query = CUDA_SUCCESS;
};
AfterEnd end_primary(const Driver& d, CUdevice dev, const std::function<void()>& end) {
  retain_current(d, dev);
  AfterEnd after;
  after.stream = make_stream(d);
  CUevent e = make_event(d);
  end();
  after.active = primary_active(d, dev);
  after.stream_query = d.cuStreamQuery(after.stream);
  after.event_query = d.cuEventQuery(e);
  return after;
}

// A capture in global mode on this thread while another thread, in capture mode `other_mode`,
// queries a stream that is not capturing: what that query and the capture's end answer.
std::string capture_beside_another_thread(const Driver& d, CUdevice dev, CUstreamCaptureMode other_mode) {
  CUcontext c = retain_current(d, dev);
  CUstream capturing = make_stream(d);
  CUstream idle = make_stream(d);
  MUST(d, d.cuStreamBeginCapture(capturing, CU_STREAM_CAPTURE_MODE_GLOBAL));
  CUresult query = CUDA_ERROR_UNKNOWN;
  std::string other_failed;
  std::thread other([&] {
    try {
      MUST(d, d.cuCtxSetCurrent(c));
      CUstreamCaptureMode mode = other_mode;
      MUST(d, d.cuThreadExchangeStreamCaptureMode(&mode));
      query = d.cuStreamQuery(idle);
    } catch (const SetupFailed& e) {
      other_failed = e.what();
    }
  });
  other.join();
  if (!other_failed.empty()) throw SetupFailed(other_failed);
  CUgraph graph = nullptr;
  const CUresult end = d.cuStreamEndCapture(capturing, &graph);
  return fmt::format("the other thread's query={} end capture={}", name_of(d, query), name_of(d, end));
}

// The device's primary context retained and current, and a green context with a stream of its own.
struct GreenStream {
  CUgreenCtx ctx = nullptr;
  CUstream stream = nullptr;
};
GreenStream green_stream(const Driver& d, CUdevice dev) {
  retain_current(d, dev);
  GreenStream g;
  g.ctx = make_green(d, dev);
  MUST(d, d.cuGreenCtxStreamCreate(&g.stream, g.ctx, CU_STREAM_NON_BLOCKING, 0));
  return g;
}

// A relaxed-mode capture (so that no unsafe-call rule applies) on a stream made with `flags`, and an
// event recorded on the legacy stream meanwhile: what the record and the capture's end answer.
std::string legacy_record_beside_capture(const Driver& d, CUdevice dev, unsigned flags) {
  retain_current(d, dev);
  CUstream capturing = nullptr;
  MUST(d, d.cuStreamCreate(&capturing, flags));
  CUevent e = make_event(d);
  MUST(d, d.cuStreamBeginCapture(capturing, CU_STREAM_CAPTURE_MODE_RELAXED));
  const CUresult record = d.cuEventRecord(e, CU_STREAM_LEGACY);
  CUgraph graph = nullptr;
  const CUresult end = d.cuStreamEndCapture(capturing, &graph);
  return fmt::format("legacy-stream record={} end capture={}", name_of(d, record), name_of(d, end));
}

// A kernel that does nothing, as PTX: the real driver compiles it for the device at load time,
// the fake reads its entry and parameter from the text.
constexpr const char* kProbePtx = R"(.version 7.8
.target sm_80
.address_size 64
.visible .entry driver_model_probe(.param .u64 driver_model_probe_param_0)
{
  ret;
}
)";

// The probe kernel, loaded into the current context.
CUfunction load_probe_kernel(const Driver& d, CUmodule* module = nullptr) {
  CUmodule m = nullptr;
  MUST(d, d.cuModuleLoadData(&m, kProbePtx));
  CUfunction f = nullptr;
  MUST(d, d.cuModuleGetFunction(&f, m, "driver_model_probe"));
  if (module != nullptr) *module = m;
  return f;
}

// One launch of the probe kernel (one block of 32 threads) on `stream`: the driver's answer.
CUresult launch_probe(const Driver& d, CUfunction f, CUstream stream) {
  unsigned long long arg = 0;
  void* params[] = {&arg};
  return d.cuLaunchKernel(f, 1, 1, 1, 32, 1, 1, 0, stream, params, nullptr);
}

// The probe kernel of the primary context (current) and a context made with cuCtxCreate (current
// when this returns), with a stream each.
struct TwoContexts {
  CUcontext primary = nullptr, created = nullptr;
  CUfunction kernel = nullptr;  // of the primary
  CUstream primary_stream = nullptr, created_stream = nullptr;
};
TwoContexts two_contexts(const Driver& d, CUdevice dev) {
  TwoContexts t;
  t.primary = retain_current(d, dev);
  t.kernel = load_probe_kernel(d);
  t.primary_stream = make_stream(d);
  MUST(d, d.cuCtxCreate(&t.created, nullptr, 0, dev));
  t.created_stream = make_stream(d);
  return t;
}

}  // namespace

// Each answer is compared as text. Calls are made one statement each: a format's arguments are
// evaluated in no set order.
const std::map<std::string, Probe>& probes() {
  static const std::map<std::string, Probe> all = {
      {"primary.retains_are_counted",
       [](const Driver& d, CUdevice dev) {
         CUcontext c = nullptr;
         MUST(d, d.cuDevicePrimaryCtxRetain(&c, dev));
         MUST(d, d.cuDevicePrimaryCtxRetain(&c, dev));
         const int two = primary_active(d, dev);
         MUST(d, d.cuDevicePrimaryCtxRelease(dev));
         const int one = primary_active(d, dev);
         MUST(d, d.cuDevicePrimaryCtxRelease(dev));
         const int none = primary_active(d, dev);
         return fmt::format("active with 2 retains={} 1 retain={} 0 retains={}", two, one, none);
       }},
      {"stream.use_after_destroy",
       [](const Driver& d, CUdevice dev) {
         retain_current(d, dev);
         CUstream s = make_stream(d);
         MUST(d, d.cuStreamDestroy(s));
         return fmt::format("query of a destroyed stream={}", name_of(d, d.cuStreamQuery(s)));
       }},
      {"capture.context_synchronize_beside_a_relaxed_capture",
       [](const Driver& d, CUdevice dev) {
         retain_current(d, dev);
         CUstream capturing = make_stream(d);
         MUST(d, d.cuStreamBeginCapture(capturing, CU_STREAM_CAPTURE_MODE_RELAXED));
         const CUresult sync = d.cuCtxSynchronize();
         CUgraph graph = nullptr;
         const CUresult end = d.cuStreamEndCapture(capturing, &graph);
         return fmt::format("context synchronize={} end capture={}", name_of(d, sync), name_of(d, end));
       }},
      {"capture.legacy_is_capturing_beside_a_blocking_capture",
       [](const Driver& d, CUdevice dev) {
         retain_current(d, dev);
         CUstream capturing = nullptr;
         MUST(d, d.cuStreamCreate(&capturing, CU_STREAM_DEFAULT));
         MUST(d, d.cuStreamBeginCapture(capturing, CU_STREAM_CAPTURE_MODE_RELAXED));
         CUstreamCaptureStatus status = CU_STREAM_CAPTURE_STATUS_NONE;
         const CUresult asked = d.cuStreamIsCapturing(CU_STREAM_LEGACY, &status);
         CUgraph graph = nullptr;
         const CUresult end = d.cuStreamEndCapture(capturing, &graph);
         return fmt::format("legacy is capturing={} end capture={}", name_of(d, asked), name_of(d, end));
       }},
      {"primary.inactive_before_its_first_retain",
       [](const Driver& d, CUdevice dev) {
         const int before = primary_active(d, dev);
         CUcontext c = nullptr;
         MUST(d, d.cuDevicePrimaryCtxRetain(&c, dev));
         const int after = primary_active(d, dev);
         return fmt::format("active before any retain={} after one={}", before, after);
       }},
      {"primary.revived_under_the_same_handle",
       [](const Driver& d, CUdevice dev) {
         CUcontext first = nullptr, second = nullptr;
         MUST(d, d.cuDevicePrimaryCtxRetain(&first, dev));
         MUST(d, d.cuDevicePrimaryCtxRelease(dev));
         MUST(d, d.cuDevicePrimaryCtxRetain(&second, dev));
         return std::string(first == second ? "same handle" : "another handle");
       }},
      {"primary.last_release_ends_streams_and_events",
       [](const Driver& d, CUdevice dev) {
         const AfterEnd after = end_primary(d, dev, [&] { MUST(d, d.cuDevicePrimaryCtxRelease(dev)); });
         CUcontext again = nullptr;
         MUST(d, d.cuDevicePrimaryCtxRetain(&again, dev));
         const CUresult revived = d.cuStreamQuery(after.stream);
         return fmt::format("stream query={} event query={}; after a new retain: stream query={}",
                            name_of(d, after.stream_query), name_of(d, after.event_query), name_of(d, revived));
       }},
      {"primary.reset_ends_streams_and_events",
       [](const Driver& d, CUdevice dev) {
         const AfterEnd after = end_primary(d, dev, [&] { MUST(d, d.cuDevicePrimaryCtxReset(dev)); });
         return fmt::format("stream query={} event query={}", name_of(d, after.stream_query),
                            name_of(d, after.event_query));
       }},
      {"primary.reset_reads_inactive_until_a_retain",
       [](const Driver& d, CUdevice dev) {
         retain_current(d, dev);
         MUST(d, d.cuDevicePrimaryCtxReset(dev));
         const int after_reset = primary_active(d, dev);
         CUcontext again = nullptr;
         MUST(d, d.cuDevicePrimaryCtxRetain(&again, dev));
         const int after_retain = primary_active(d, dev);
         return fmt::format("active after the reset={} after a new retain={}", after_reset, after_retain);
       }},
      {"primary.reset_keeps_the_retains",
       [](const Driver& d, CUdevice dev) {
         retain_current(d, dev);
         MUST(d, d.cuDevicePrimaryCtxReset(dev));
         // The retain taken before the reset: is it still there to release?
         const CUresult first = d.cuDevicePrimaryCtxRelease(dev);
         const CUresult second = d.cuDevicePrimaryCtxRelease(dev);
         return fmt::format("release after the reset={} then a second release={}", name_of(d, first), name_of(d, second));
       }},
      {"created.destroy_ends_streams",
       [](const Driver& d, CUdevice dev) {
         CUcontext c = nullptr;
         MUST(d, d.cuCtxCreate(&c, nullptr, 0, dev));
         CUstream s = make_stream(d);
         MUST(d, d.cuCtxDestroy(c));
         return fmt::format("stream query={}", name_of(d, d.cuStreamQuery(s)));
       }},
      {"green.holds_a_primary_retain",
       [](const Driver& d, CUdevice dev) {
         CUcontext c = nullptr;
         MUST(d, d.cuDevicePrimaryCtxRetain(&c, dev));
         CUgreenCtx g = make_green(d, dev);
         MUST(d, d.cuDevicePrimaryCtxRelease(dev));
         const int with_green = primary_active(d, dev);
         MUST(d, d.cuGreenCtxDestroy(g));
         const int after = primary_active(d, dev);
         return fmt::format("primary active with only the green context={} after its destroy={}", with_green, after);
       }},
      {"green.destroy_leaves_streams_destroyed",
       [](const Driver& d, CUdevice dev) {
         const GreenStream green = green_stream(d, dev);  // the primary outlives the green context
         MUST(d, d.cuGreenCtxDestroy(green.ctx));
         const CUresult query = d.cuStreamQuery(green.stream);
         const CUresult destroy = d.cuStreamDestroy(green.stream);
         return fmt::format("stream query={} stream destroy={}", name_of(d, query), name_of(d, destroy));
       }},
      {"green.destroy_then_its_event",
       [](const Driver& d, CUdevice dev) {
         CUcontext c = retain_current(d, dev);
         CUgreenCtx g = make_green(d, dev);
         CUcontext gc = nullptr;
         MUST(d, d.cuCtxFromGreenCtx(&gc, g));
         MUST(d, d.cuCtxSetCurrent(gc));
         CUevent e = make_event(d);
         MUST(d, d.cuCtxSetCurrent(c));
         MUST(d, d.cuGreenCtxDestroy(g));
         return fmt::format("event query={}", name_of(d, d.cuEventQuery(e)));
       }},
      {"green.primary_reset_and_its_green_contexts",
       [](const Driver& d, CUdevice dev) {
         const GreenStream green = green_stream(d, dev);
         MUST(d, d.cuDevicePrimaryCtxReset(dev));
         const CUresult query = d.cuStreamQuery(green.stream);
         const CUresult destroy = d.cuGreenCtxDestroy(green.ctx);
         return fmt::format("green stream query={} green destroy={}", name_of(d, query), name_of(d, destroy));
       }},
      {"context.none_current",
       [](const Driver& d, CUdevice) {
         CUstream s = nullptr;
         return fmt::format("stream create={}", name_of(d, d.cuStreamCreate(&s, CU_STREAM_NON_BLOCKING)));
       }},
      {"capture.query_of_the_capturing_stream",
       [](const Driver& d, CUdevice dev) {
         retain_current(d, dev);
         CUstream s = make_stream(d);
         // Relaxed: no unsafe-call rule applies, only the capture's own.
         MUST(d, d.cuStreamBeginCapture(s, CU_STREAM_CAPTURE_MODE_RELAXED));
         const CUresult query = d.cuStreamQuery(s);
         CUgraph graph = nullptr;
         const CUresult end = d.cuStreamEndCapture(s, &graph);
         return fmt::format("query of the capturing stream={} end capture={}", name_of(d, query), name_of(d, end));
       }},
      {"capture.other_thread_global_mode",
       [](const Driver& d, CUdevice dev) { return capture_beside_another_thread(d, dev, CU_STREAM_CAPTURE_MODE_GLOBAL); }},
      {"capture.other_thread_relaxed_mode",
       [](const Driver& d, CUdevice dev) { return capture_beside_another_thread(d, dev, CU_STREAM_CAPTURE_MODE_RELAXED); }},
      {"capture.legacy_work_beside_a_blocking_capture",
       [](const Driver& d, CUdevice dev) { return legacy_record_beside_capture(d, dev, CU_STREAM_DEFAULT); }},
      {"capture.legacy_work_beside_a_non_blocking_capture",
       [](const Driver& d, CUdevice dev) { return legacy_record_beside_capture(d, dev, CU_STREAM_NON_BLOCKING); }},
      {"profiler.start_without_context",
       [](const Driver& d, CUdevice dev) {
         const CUresult none = d.cuProfilerStart();
         retain_current(d, dev);
         const CUresult start = d.cuProfilerStart();
         const CUresult stop = d.cuProfilerStop();
         return fmt::format("start without a context={} start={} stop={}", name_of(d, none), name_of(d, start),
                            name_of(d, stop));
       }},
      {"event.create_without_context",
       [](const Driver& d, CUdevice) {
         CUevent e = nullptr;
         return fmt::format("event create={}", name_of(d, d.cuEventCreate(&e, CU_EVENT_DISABLE_TIMING)));
       }},
      {"event.across_contexts",
       [](const Driver& d, CUdevice dev) {
         CUcontext primary = retain_current(d, dev);
         CUstream own = make_stream(d);
         CUevent e = make_event(d);
         MUST(d, d.cuEventRecord(e, own));
         CUcontext created = nullptr;
         MUST(d, d.cuCtxCreate(&created, nullptr, 0, dev));  // current from here on
         CUstream other = make_stream(d);
         const CUresult wait = d.cuStreamWaitEvent(other, e, 0);
         const CUresult record = d.cuEventRecord(e, other);
         MUST(d, d.cuCtxSetCurrent(primary));
         MUST(d, d.cuCtxDestroy(created));
         return fmt::format("wait on a stream of another context={} record on it={}", name_of(d, wait),
                            name_of(d, record));
       }},
      {"stream.flags",
       [](const Driver& d, CUdevice dev) {
         retain_current(d, dev);
         CUstream blocking = nullptr, non_blocking = nullptr;
         MUST(d, d.cuStreamCreate(&blocking, CU_STREAM_DEFAULT));
         MUST(d, d.cuStreamCreate(&non_blocking, CU_STREAM_NON_BLOCKING));
         unsigned f1 = 99, f2 = 99;
         MUST(d, d.cuStreamGetFlags(blocking, &f1));
         MUST(d, d.cuStreamGetFlags(non_blocking, &f2));
         return fmt::format("default={} non-blocking={}", f1, f2);
       }},
      {"launch.in_its_context",
       [](const Driver& d, CUdevice dev) {
         retain_current(d, dev);
         CUfunction f = load_probe_kernel(d);
         CUstream s = make_stream(d);
         const CUresult launch = launch_probe(d, f, s);
         const CUresult sync = d.cuStreamSynchronize(s);
         const char* name = nullptr;
         const CUresult named = d.cuFuncGetName(&name, f);
         return fmt::format("launch={} synchronize={} cuFuncGetName={} '{}'", name_of(d, launch), name_of(d, sync),
                            name_of(d, named), name != nullptr ? name : "(null)");
       }},
      {"launch.with_no_current_context",
       [](const Driver& d, CUdevice dev) {
         retain_current(d, dev);
         CUfunction f = load_probe_kernel(d);
         MUST(d, d.cuCtxSetCurrent(nullptr));
         return fmt::format("launch on the legacy stream={}", name_of(d, launch_probe(d, f, CU_STREAM_LEGACY)));
       }},
      {"launch.occupancy_needs_a_current_context",
       [](const Driver& d, CUdevice dev) {
         CUcontext c = retain_current(d, dev);
         CUfunction f = load_probe_kernel(d);
         int blocks = 0;
         MUST(d, d.cuCtxSetCurrent(nullptr));
         const CUresult none = d.cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, f, 32, 0);
         MUST(d, d.cuCtxSetCurrent(c));
         const CUresult own = d.cuOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, f, 32, 0);
         return fmt::format("occupancy with no current context={} in its context={}", name_of(d, none),
                            name_of(d, own));
       }},
      {"launch.function_of_another_context",
       [](const Driver& d, CUdevice dev) {
         const TwoContexts t = two_contexts(d, dev);  // the created context is current
         const CUresult launch = launch_probe(d, t.kernel, t.created_stream);
         MUST(d, d.cuCtxSetCurrent(t.primary));
         MUST(d, d.cuCtxDestroy(t.created));
         return fmt::format("launch of the primary's kernel on the created context's stream={}", name_of(d, launch));
       }},
      {"launch.stream_of_another_context",
       [](const Driver& d, CUdevice dev) {
         const TwoContexts t = two_contexts(d, dev);
         MUST(d, d.cuCtxSetCurrent(t.primary));
         const CUresult launch = launch_probe(d, t.kernel, t.created_stream);
         MUST(d, d.cuCtxDestroy(t.created));
         return fmt::format("launch with the primary current on the created context's stream={}", name_of(d, launch));
       }},
      {"launch.in_a_context_not_current",
       [](const Driver& d, CUdevice dev) {
         const TwoContexts t = two_contexts(d, dev);  // the created context is current
         CUfunction own = load_probe_kernel(d);      // the created context's kernel
         MUST(d, d.cuCtxSetCurrent(t.primary));
         const CUresult launch = launch_probe(d, own, t.created_stream);
         MUST(d, d.cuCtxDestroy(t.created));
         return fmt::format("launch of the created context's kernel on its stream, the primary current={}",
                            name_of(d, launch));
       }},
      {"module.unload_then_launch",
       [](const Driver& d, CUdevice dev) {
         retain_current(d, dev);
         CUmodule m = nullptr;
         CUfunction f = load_probe_kernel(d, &m);
         CUstream s = make_stream(d);
         MUST(d, d.cuModuleUnload(m));
         return fmt::format("launch of an unloaded module's kernel={}", name_of(d, launch_probe(d, f, s)));
       }},
      {"stream.priorities",
       [](const Driver& d, CUdevice dev) {
         retain_current(d, dev);
         int least = 99, greatest = 99;
         MUST(d, d.cuCtxGetStreamPriorityRange(&least, &greatest));
         // Asked for far past each end: what the stream runs at.
         CUstream low = nullptr, high = nullptr;
         MUST(d, d.cuStreamCreateWithPriority(&low, CU_STREAM_NON_BLOCKING, least + 100));
         MUST(d, d.cuStreamCreateWithPriority(&high, CU_STREAM_NON_BLOCKING, greatest - 100));
         int low_reads = 99, high_reads = 99, legacy_reads = 99;
         MUST(d, d.cuStreamGetPriority(low, &low_reads));
         MUST(d, d.cuStreamGetPriority(high, &high_reads));
         MUST(d, d.cuStreamGetPriority(CU_STREAM_LEGACY, &legacy_reads));
         return fmt::format("range least={} greatest={}; least+100 reads {}, greatest-100 reads {}, legacy reads {}",
                            least, greatest, low_reads, high_reads, legacy_reads);
       }},
      {"event.never_recorded",
       [](const Driver& d, CUdevice dev) {
         retain_current(d, dev);
         CUevent e = make_event(d);
         const CUresult query = d.cuEventQuery(e);
         const CUresult destroy = d.cuEventDestroy(e);
         return fmt::format("query={} destroy={}", name_of(d, query), name_of(d, destroy));
       }},
  };
  return all;
}

}  // namespace driver_model

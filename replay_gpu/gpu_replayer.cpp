// The real-GPU replay (gpu_replayer.h): set-up, the issuing loop (this thread) and the completion
// watcher (a second thread polling CUDA events).
#include "gpu_replayer.h"

#include <dlfcn.h>
#include <sys/prctl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <map>
#include <mutex>
#include <queue>
#include <thread>
#include <vector>

#include "driver.h"
#include "orion.h"
#include "spin_kernels.h"

namespace replay_gpu {
namespace {

using Clock = std::chrono::steady_clock;
using sched::OpKind;
using sched::StreamClass;

int64_t ns_since(Clock::time_point t0) {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
}

// Busy-waits: sleeping would cost the timer slack (tens of us) on every short gap.
void spin_for_ns(int64_t ns) {
  const auto end = Clock::now() + std::chrono::nanoseconds(ns);
  while (Clock::now() < end) {
  }
}

void CUDA_CB noop_host_func(void*) {}

constexpr int64_t kSpinBelowNs = 300'000;     // closer arrivals are waited for by spinning
constexpr int64_t kWakeEarlyNs = 200'000;     // a sleep ends this long before the arrival
constexpr int64_t kPollPauseNs = 2'000;       // completion watcher: pause between sweeps
constexpr int64_t kStuckAfterNs = 120'000'000'000;  // no completion for this long: give up

double percentile_us(std::vector<double> v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  double rank = std::ceil(p / 100.0 * static_cast<double>(v.size()));
  size_t i = rank < 1 ? 0 : static_cast<size_t>(rank) - 1;
  return v[std::min(i, v.size() - 1)];
}

}  // namespace

ShimState shim_state() {
  ShimState s;
  auto is_active = reinterpret_cast<orion_is_active_fn>(dlsym(RTLD_DEFAULT, "orion_is_active"));
  if (is_active == nullptr) return s;
  s.loaded = true;
  s.active = is_active() == 1;
  auto get_stats = reinterpret_cast<orion_get_stats_fn>(dlsym(RTLD_DEFAULT, "orion_get_stats"));
  orion_stats stats{};
  if (get_stats != nullptr && get_stats(&stats, sizeof stats) == 0) s.forced_by_starvation = stats.forced_by_starvation;
  return s;
}

struct GpuReplayer::Impl {
  sched::Workload workload;
  ReplayerOptions options;
  const Driver& d = Driver::get();
  GpuDescription gpu;
  Plan plan;
  CUdevice dev = 0;
  CUcontext ctx = nullptr;
  CUlibrary lib = nullptr;
  std::vector<CUkernel> kernels;  // per slot
  int least_priority = 0, greatest_priority = 0;
  std::map<sched::StreamId, CUstream> streams;
  CUstream side = nullptr;  // unmanaged: warm-up, calibration, graph capture
  CUdeviceptr buffer = 0, sink = 0;
  size_t buffer_bytes = 0, host_bytes = 0;
  void* host = nullptr;
  std::map<int, CUgraphExec> graph_execs;  // by the graph op's line
  std::vector<CUgraph> graphs;
  std::map<int, size_t> plan_index;        // op line -> plan op
  double h2d_gbps = 0, copy_scale = 1;
  float cycles_per_ns = 1;
  std::vector<double> lags_us;

  Impl(const sched::Workload& w, const ReplayerOptions& o) : workload(w), options(o) {}

  CUstream create_stream(StreamClass cls) {
    const int priority = cls == StreamClass::kHighPriority ? greatest_priority : least_priority;
    CUstream s = nullptr;
    d.check(d.cuStreamCreateWithPriority(&s, CU_STREAM_NON_BLOCKING, priority), "cuStreamCreateWithPriority");
    // Priorities say high priority / best effort; the other classes (and every class on a GPU
    // without stream priorities) are told to the shim through its C API, when it is loaded.
    const bool tell = cls == StreamClass::kCommunication || cls == StreamClass::kUnmanaged ||
                      greatest_priority == least_priority;
    if (tell) {
      if (auto set = reinterpret_cast<orion_set_stream_class_fn>(dlsym(RTLD_DEFAULT, "orion_set_stream_class"))) {
        set(reinterpret_cast<void*>(s), sched::to_string(cls));  // ENODEV when scheduling is off: nothing to tell
      }
    }
    return s;
  }

  void launch_spin(CUkernel kernel, const sched::Dim3& grid, const sched::Dim3& block, uint32_t smem, double block_ns,
                   CUstream stream, const char* what) {
    unsigned long long ns = static_cast<unsigned long long>(std::llround(block_ns));
    unsigned int smem_bytes = smem;
    unsigned int use_clock = options.use_clock64 ? 1u : 0u;
    float cpn = cycles_per_ns;
    CUdeviceptr sink_ptr = sink;
    void* args[] = {&ns, &smem_bytes, &use_clock, &cpn, &sink_ptr};
    d.check(d.cuLaunchKernel(reinterpret_cast<CUfunction>(kernel), grid.x, grid.y, grid.z, block.x, block.y, block.z,
                             smem, stream, args, nullptr),
            what);
  }

  void calibrate_copies() {
    if (plan.max_copy_bytes == 0) return;
    if (options.copy_rate_gbps > 0) {
      // Best of three 32 MiB host-to-device copies from pinned memory.
      const size_t bytes = 32u << 20;
      void* h = nullptr;
      CUdeviceptr dptr = 0;
      d.check(d.cuMemHostAlloc(&h, bytes, 0), "cuMemHostAlloc (copy calibration)");
      d.check(d.cuMemAlloc(&dptr, bytes), "cuMemAlloc (copy calibration)");
      CUevent a = nullptr, b = nullptr;
      d.check(d.cuEventCreate(&a, CU_EVENT_DEFAULT), "cuEventCreate");
      d.check(d.cuEventCreate(&b, CU_EVENT_DEFAULT), "cuEventCreate");
      float best_ms = 0;
      for (int i = 0; i < 4; ++i) {
        d.check(d.cuEventRecord(a, side), "cuEventRecord");
        d.check(d.cuMemcpyHtoDAsync(dptr, h, bytes, side), "cuMemcpyHtoDAsync (copy calibration)");
        d.check(d.cuEventRecord(b, side), "cuEventRecord");
        d.check(d.cuStreamSynchronize(side), "cuStreamSynchronize");
        float ms = 0;
        d.check(d.cuEventElapsedTime(&ms, a, b), "cuEventElapsedTime");
        if (i > 0 && (best_ms == 0 || ms < best_ms)) best_ms = ms;  // the first one warms up
      }
      d.cuEventDestroy(a);
      d.cuEventDestroy(b);
      d.cuMemFree(dptr);
      d.cuMemFreeHost(h);
      h2d_gbps = best_ms > 0 ? static_cast<double>(bytes) / (static_cast<double>(best_ms) * 1e6) : 0;
      copy_scale = h2d_gbps > 0 ? h2d_gbps / options.copy_rate_gbps : 1;
    }
    host_bytes = static_cast<size_t>(std::ceil(static_cast<double>(plan.max_copy_bytes) * copy_scale));
  }

  void set_up() {
    const DeviceInfo info = probe_device(options.device);
    gpu = {info.name, info.sm_count, info.cc_major, info.cc_minor, info.clock_khz, info.driver_version};
    cycles_per_ns = static_cast<float>(info.clock_khz) / 1e6f;
    plan = make_plan(workload, gpu.sm_count);
    for (size_t i = 0; i < workload.ops.size(); ++i) plan_index[workload.ops[i].line] = i;
    d.check(d.cuDeviceGet(&dev, options.device), "cuDeviceGet");
    // Spin-wait synchronisation: what latency-critical programs use. Fails harmlessly when the
    // primary context is already active (someone else set its flags).
    d.cuDevicePrimaryCtxSetFlags(dev, CU_CTX_SCHED_SPIN);
    d.check(d.cuDevicePrimaryCtxRetain(&ctx, dev), "cuDevicePrimaryCtxRetain");
    d.check(d.cuCtxSetCurrent(ctx), "cuCtxSetCurrent");
    d.check(d.cuCtxGetStreamPriorityRange(&least_priority, &greatest_priority), "cuCtxGetStreamPriorityRange");

    // Context-independent kernels (CUkernel): the shim's partition policy can move these onto
    // green-context streams.
    d.check(d.cuLibraryLoadData(&lib, kSpinKernelsFatbin, nullptr, nullptr, 0, nullptr, nullptr, 0),
            "cuLibraryLoadData (embedded spin kernels: built for sm_90 plus PTX)");
    int optin_smem = 0;
    d.check(d.cuDeviceGetAttribute(&optin_smem, CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev),
            "cuDeviceGetAttribute(shared memory per block)");
    const size_t slots = std::max<size_t>(1, std::min<size_t>(plan.kernels.size(), kSpinKernelSlots));
    for (size_t slot = 0; slot < slots; ++slot) {
      CUkernel k = nullptr;
      const std::string name = spin_kernel_name(static_cast<int>(slot));
      d.check(d.cuLibraryGetKernel(&k, lib, name.c_str()), "cuLibraryGetKernel");
      d.check(d.cuKernelSetAttribute(CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, optin_smem, k, dev),
              "cuKernelSetAttribute(max dynamic shared memory)");
      d.check(d.cuKernelSetAttribute(CU_FUNC_ATTRIBUTE_PREFERRED_SHARED_MEMORY_CARVEOUT, 100, k, dev),
              "cuKernelSetAttribute(shared memory carveout)");
      kernels.push_back(k);
    }
    for (const PlanStream& s : plan.streams) streams[s.id] = create_stream(s.cls);
    side = create_stream(StreamClass::kUnmanaged);
    d.check(d.cuMemAlloc(&sink, sizeof(unsigned long long)), "cuMemAlloc (sink)");
    calibrate_copies();
    host_bytes = std::max<size_t>(host_bytes, 1);  // copies of 0 bytes still copy one
    buffer_bytes = std::max<size_t>({host_bytes, plan.max_memset_bytes, 1});
    d.check(d.cuMemAlloc(&buffer, buffer_bytes), "cuMemAlloc (copy / memset buffer)");
    d.check(d.cuMemHostAlloc(&host, host_bytes, 0), "cuMemHostAlloc (copy source)");

    // Graph launches: a captured graph of one spin block for the op's time.
    for (size_t i = 0; i < workload.ops.size(); ++i) {
      if (workload.ops[i].kind != OpKind::kGraphLaunch) continue;
      CUgraph g = nullptr;
      CUgraphExec exec = nullptr;
      d.check(d.cuStreamBeginCapture(side, CU_STREAM_CAPTURE_MODE_RELAXED), "cuStreamBeginCapture");
      launch_spin(kernels[0], {}, {32, 1, 1}, 0, plan.ops[i].block_ns, side, "cuLaunchKernel (graph capture)");
      d.check(d.cuStreamEndCapture(side, &g), "cuStreamEndCapture");
      d.check(d.cuGraphInstantiate(&exec, g, 0), "cuGraphInstantiate");
      graphs.push_back(g);
      graph_execs[workload.ops[i].line] = exec;
    }
    // Warm-up on the unmanaged stream (the shim learns nothing about the workload's kernels from
    // it): every kernel copy loaded, the copy and memset paths exercised.
    for (CUkernel k : kernels) launch_spin(k, {}, {32, 1, 1}, 0, 1000, side, "cuLaunchKernel (warm-up)");
    d.check(d.cuMemcpyHtoDAsync(buffer, host, 1, side), "cuMemcpyHtoDAsync (warm-up)");
    d.check(d.cuMemsetD8Async(buffer, 0, 1, side), "cuMemsetD8Async (warm-up)");
    d.check(d.cuStreamSynchronize(side), "cuStreamSynchronize (warm-up)");
  }

  void tear_down() noexcept {
    if (ctx == nullptr) return;
    d.cuCtxSetCurrent(ctx);
    d.cuCtxSynchronize();
    for (auto& [line, exec] : graph_execs) d.cuGraphExecDestroy(exec);
    for (CUgraph g : graphs) d.cuGraphDestroy(g);
    for (auto& [id, s] : streams) d.cuStreamDestroy(s);
    if (side) d.cuStreamDestroy(side);
    if (host) d.cuMemFreeHost(host);
    if (buffer) d.cuMemFree(buffer);
    if (sink) d.cuMemFree(sink);
    if (lib) d.cuLibraryUnload(lib);
    d.cuDevicePrimaryCtxRelease(dev);
    ctx = nullptr;
  }

  sched::ReplayResult run(const sched::Workload& w, const std::string& label);
};

namespace {

struct StreamSpan {
  CUevent start = nullptr, done = nullptr;
  size_t left = 0;      // ops of the request on this stream not yet issued
  bool started = false;
};

struct Request : sched::WorkloadRequest {
  bool started = false;
  size_t issued = 0;
  std::map<sched::StreamId, StreamSpan> spans;
};

struct Arrival {
  int64_t t;
  size_t op;
  bool operator>(const Arrival& o) const { return t != o.t ? t > o.t : op > o.op; }
};

}  // namespace

sched::ReplayResult GpuReplayer::Impl::run(const sched::Workload& w, const std::string& label) {
  prctl(PR_SET_TIMERSLACK, 1UL, 0, 0, 0);
  d.check(d.cuCtxSetCurrent(ctx), "cuCtxSetCurrent");

  // Requests and the closed-loop graph, as the simulator's replay builds them.
  for (const sched::WorkloadOp& op : w.ops) {
    if (!plan_index.count(op.line) || !streams.count(op.stream_id)) {
      throw std::invalid_argument(w.source + ":" + std::to_string(op.line) + ": not an op of the planned workload");
    }
  }
  sched::RequestGraph graph = sched::request_graph(w);
  const std::vector<size_t>& op_request = graph.op_request;
  std::vector<Request> requests;
  for (sched::WorkloadRequest& r : graph.requests) {
    Request state;
    static_cast<sched::WorkloadRequest&>(state) = std::move(r);
    for (size_t i : state.ops) ++state.spans[w.ops[i].stream_id].left;
    requests.push_back(std::move(state));
  }
  // Fresh events for this run (a wait on an event not recorded in this run waits for nothing).
  std::vector<CUevent> created;
  auto new_event = [&](unsigned flags) {
    CUevent e = nullptr;
    d.check(d.cuEventCreate(&e, flags), "cuEventCreate");
    created.push_back(e);
    return e;
  };
  for (Request& r : requests) {
    for (auto& [id, span] : r.spans) {
      span.start = new_event(CU_EVENT_DEFAULT);
      span.done = new_event(CU_EVENT_DEFAULT);
    }
  }
  std::map<sched::EventId, CUevent> events;
  for (const sched::WorkloadOp& op : w.ops) {
    if (op.event != 0 && !events.count(op.event)) events[op.event] = new_event(CU_EVENT_DISABLE_TIMING);
  }

  const uint64_t forced_before = shim_state().forced_by_starvation;
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Arrival> released;          // closed-loop ops released by completions
  std::atomic<size_t> released_count{0};
  std::vector<size_t> to_watch;           // requests whose ops were all issued
  size_t completed = 0;
  int64_t last_completion_ns = 0;
  std::string error;
  bool stop = false;
  sched::ReplayResult result;
  result.policy = label;
  const Clock::time_point t0 = Clock::now();

  std::thread watcher([&] {
    if (CUresult rc = d.cuCtxSetCurrent(ctx); rc != CUDA_SUCCESS) {
      std::lock_guard lock(mu);
      error = "completion watcher: cuCtxSetCurrent: " + d.describe(rc);
      cv.notify_all();
      return;
    }
    std::vector<size_t> pending;
    for (;;) {
      {
        std::lock_guard lock(mu);
        pending.insert(pending.end(), to_watch.begin(), to_watch.end());
        to_watch.clear();
        if (stop || !error.empty()) return;
      }
      for (size_t k = 0; k < pending.size();) {
        Request& r = requests[pending[k]];
        bool ready = true;
        for (auto& [id, span] : r.spans) {
          // Queries never force work out of the shim (a synchronize would).
          CUresult rc = d.cuEventQuery(span.done);
          if (rc == CUDA_ERROR_NOT_READY) {
            ready = false;
            break;
          }
          if (rc != CUDA_SUCCESS) {
            std::lock_guard lock(mu);
            error = "request " + r.result.request + ": cuEventQuery: " + d.describe(rc);
            cv.notify_all();
            return;
          }
        }
        if (!ready) {
          ++k;
          continue;
        }
        const int64_t now = ns_since(t0);
        // Time on the device, from the GPU's clock: first start event to last done event.
        const CUevent ref = r.spans.begin()->second.start;
        double first_ms = 0, last_ms = 0;
        for (auto& [id, span] : r.spans) {
          float a = 0, b = 0;
          d.cuEventElapsedTime(&a, ref, span.start);
          d.cuEventElapsedTime(&b, ref, span.done);
          first_ms = std::min<double>(first_ms, a);
          last_ms = std::max<double>(last_ms, b);
        }
        const auto exec_ns = static_cast<int64_t>((last_ms - first_ms) * 1e6);
        r.result.done_ns = now;
        r.result.first_start_ns = std::max(r.result.arrival_ns, now - exec_ns);
        r.result.ops = r.ops.size();
        {
          std::lock_guard lock(mu);
          result.requests.push_back(r.result);
          for (size_t f : r.followers) {
            for (size_t oi : requests[f].ops) released.push_back({now + w.ops[oi].after_ns, oi});
          }
          released_count.store(released.size(), std::memory_order_release);
          ++completed;
          last_completion_ns = now;
        }
        cv.notify_all();
        pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(k));
      }
      spin_for_ns(kPollPauseNs);
    }
  });

  std::priority_queue<Arrival, std::vector<Arrival>, std::greater<>> arrivals;
  for (size_t i = 0; i < w.ops.size(); ++i) {
    if (!requests[op_request[i]].closed_loop) arrivals.push({w.ops[i].arrival_ns, i});
  }
  lags_us.clear();

  auto issue = [&](const Arrival& a, int64_t now) {
    const sched::WorkloadOp& op = w.ops[a.op];
    const PlanOp& p = plan.ops[plan_index.at(op.line)];
    Request& r = requests[op_request[a.op]];
    if (!r.started) {
      r.started = true;
      r.result.arrival_ns = now;
    }
    lags_us.push_back(static_cast<double>(now - a.t) / 1e3);
    CUstream s = streams.at(op.stream_id);
    StreamSpan& span = r.spans.at(op.stream_id);
    const std::string where = w.source + ":" + std::to_string(op.line) + ": ";
    if (!span.started) {
      span.started = true;
      d.check(d.cuEventRecord(span.start, s), (where + "cuEventRecord (request start)").c_str());
    }
    switch (op.kind) {
      case OpKind::kKernel:
        launch_spin(kernels[static_cast<size_t>(plan.kernels[static_cast<size_t>(p.kernel)].slot)], op.grid, op.block,
                    p.launch_smem, p.block_ns, s, (where + "cuLaunchKernel " + op.name).c_str());
        break;
      case OpKind::kCopy: {
        const auto bytes = std::clamp<size_t>(
            static_cast<size_t>(std::llround(static_cast<double>(op.bytes) * copy_scale)), 1, host_bytes);
        d.check(d.cuMemcpyHtoDAsync(buffer, host, bytes, s), (where + "cuMemcpyHtoDAsync").c_str());
        break;
      }
      case OpKind::kMemset:
        d.check(d.cuMemsetD8Async(buffer, 0, std::max<size_t>(op.bytes, 1), s), (where + "cuMemsetD8Async").c_str());
        break;
      case OpKind::kEventRecord:
        d.check(d.cuEventRecord(events.at(op.event), s), (where + "cuEventRecord").c_str());
        break;
      case OpKind::kStreamWaitEvent:
        d.check(d.cuStreamWaitEvent(s, events.at(op.event), 0), (where + "cuStreamWaitEvent").c_str());
        break;
      case OpKind::kHostFunc:
        d.check(d.cuLaunchHostFunc(s, noop_host_func, nullptr), (where + "cuLaunchHostFunc").c_str());
        break;
      case OpKind::kMemPool: {
        CUdeviceptr ptr = 0;
        d.check(d.cuMemAllocAsync(&ptr, std::max<size_t>(op.bytes, 1), s), (where + "cuMemAllocAsync").c_str());
        d.check(d.cuMemFreeAsync(ptr, s), (where + "cuMemFreeAsync").c_str());
        break;
      }
      case OpKind::kGraphLaunch:
        d.check(d.cuGraphLaunch(graph_execs.at(op.line), s), (where + "cuGraphLaunch").c_str());
        break;
    }
    if (--span.left == 0) d.check(d.cuEventRecord(span.done, s), (where + "cuEventRecord (request done)").c_str());
    if (++r.issued == r.ops.size()) {
      std::lock_guard lock(mu);
      to_watch.push_back(op_request[a.op]);
    }
  };

  try {
    for (;;) {
      {
        std::unique_lock lock(mu);
        for (const Arrival& a : released) arrivals.push(a);
        released.clear();
        released_count.store(0, std::memory_order_release);
        if (!error.empty()) throw DriverError(error);
        if (completed == requests.size()) break;
        if (ns_since(t0) - last_completion_ns > kStuckAfterNs) {
          throw std::runtime_error(w.source + ": replay stuck: no request completed for 120 s (" +
                                   std::to_string(requests.size() - completed) + " of " +
                                   std::to_string(requests.size()) + " outstanding)");
        }
        if (arrivals.empty()) {
          cv.wait_for(lock, std::chrono::milliseconds(1));
          continue;
        }
      }
      const int64_t next = arrivals.top().t;
      const int64_t now = ns_since(t0);
      if (next > now) {
        if (next - now > kSpinBelowNs) {
          std::unique_lock lock(mu);
          cv.wait_for(lock, std::chrono::nanoseconds(next - now - kWakeEarlyNs),
                      [&] { return !released.empty() || !error.empty(); });
        } else {
          while (ns_since(t0) < next && released_count.load(std::memory_order_acquire) == 0) {
          }
        }
        continue;  // a release may have come in before `next`
      }
      const Arrival a = arrivals.top();
      arrivals.pop();
      issue(a, now);
    }
  } catch (...) {
    {
      std::lock_guard lock(mu);
      stop = true;
    }
    watcher.join();
    d.cuCtxSynchronize();
    for (CUevent e : created) d.cuEventDestroy(e);
    throw;
  }
  {
    std::lock_guard lock(mu);
    stop = true;
  }
  watcher.join();
  d.check(d.cuCtxSynchronize(), "cuCtxSynchronize (end of run)");
  for (CUevent e : created) d.cuEventDestroy(e);

  for (const sched::RequestResult& r : result.requests) result.makespan_ns = std::max(result.makespan_ns, r.done_ns);
  result.ops_completed = w.ops.size();
  result.sm_utilisation = -1;  // not measured on a real GPU
  result.forced_by_starvation = shim_state().forced_by_starvation - forced_before;
  return result;
}

GpuReplayer::GpuReplayer(const sched::Workload& workload, const ReplayerOptions& options)
    : impl_(std::make_unique<Impl>(workload, options)) {
  try {
    impl_->set_up();
  } catch (...) {
    impl_->tear_down();
    throw;
  }
}

GpuReplayer::~GpuReplayer() { impl_->tear_down(); }

sched::ReplayResult GpuReplayer::run(const sched::Workload& subset, const std::string& label) {
  return impl_->run(subset, label);
}
double GpuReplayer::last_issue_lag_p99_us() const { return percentile_us(impl_->lags_us, 99); }
double GpuReplayer::last_issue_lag_max_us() const { return percentile_us(impl_->lags_us, 100); }
const GpuDescription& GpuReplayer::gpu() const { return impl_->gpu; }
const Plan& GpuReplayer::plan() const { return impl_->plan; }
double GpuReplayer::h2d_gbps() const { return impl_->h2d_gbps; }
double GpuReplayer::copy_scale() const { return impl_->copy_scale; }

}  // namespace replay_gpu

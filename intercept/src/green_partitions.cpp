#include "green_partitions.h"

#include <cstring>

#include "driver_calls.h"
#include "log.h"
#include "real_driver.h"

namespace orion {

namespace {

// Launch attributes that do not tie a launch to its own stream or to the whole GPU.
bool attributes_movable(const CUlaunchConfig& c) {
  for (unsigned i = 0; c.attrs != nullptr && i < c.numAttrs; ++i) {
    switch (c.attrs[i].id) {
      case CU_LAUNCH_ATTRIBUTE_PRIORITY:
      case CU_LAUNCH_ATTRIBUTE_ACCESS_POLICY_WINDOW:
        continue;
      default:
        return false;
    }
  }
  return true;
}

// Errors that mean "this kernel cannot run in that context", as opposed to a bad launch.
bool refusal(CUresult rc) {
  return rc == CUDA_ERROR_INVALID_HANDLE || rc == CUDA_ERROR_INVALID_CONTEXT ||
         rc == CUDA_ERROR_NOT_SUPPORTED || rc == CUDA_ERROR_CONTEXT_IS_DESTROYED;
}

}  // namespace

const char* to_string(InPlaceReason r) {
  switch (r) {
    case InPlaceReason::kDefaultStream: return "default stream";
    case InPlaceReason::kCooperativeOrAttrs: return "cooperative or launch attributes";
    case InPlaceReason::kNotPrimaryContext: return "not the primary context";
    case InPlaceReason::kFunctionRefused: return "kernel refused in a green context";
    case InPlaceReason::kNoGreenContexts: return "no green contexts";
    case InPlaceReason::kNoPartition: return "partition empty on this GPU";
    case InPlaceReason::kDriverError: return "driver error";
    case InPlaceReason::kCount: break;
  }
  return "?";
}

std::string PartitionStats::summary() const {
  std::string s = std::to_string(moved) + " best-effort launches moved to green contexts (";
  bool first = true;
  for (const auto& [sms, n] : moved_by_sms) {
    s += (first ? "" : ", ") + std::to_string(n) + " on " + std::to_string(sms) + " SMs";
    first = false;
  }
  s += std::string(first ? "none" : "") + "; " + std::to_string(forks) + " forks), in place:";
  first = true;
  for (size_t i = 0; i < in_place.size(); ++i) {
    if (in_place[i] == 0) continue;
    s += std::string(first ? " " : ", ") + std::to_string(in_place[i]) + " " +
         to_string(static_cast<InPlaceReason>(i));
    first = false;
  }
  if (first) s += " none";
  return s;
}

std::optional<CUresult> GreenPartitions::stay(InPlaceReason r) {
  ++stats_.in_place[static_cast<size_t>(r)];
  return std::nullopt;
}

GreenPartitions::DeviceGreens& GreenPartitions::device_greens(CUdevice dev) {
  DeviceGreens& d = devices_[dev];
  if (d.probed) return d;
  d.probed = true;
  CUdevResource all;
  std::memset(&all, 0, sizeof all);
  if (!real::cuDeviceGetDevResource || !real::cuDevSmResourceSplitByCount || !real::cuDevResourceGenerateDesc ||
      !real::cuGreenCtxCreate || !real::cuCtxFromGreenCtx || !real::cuGreenCtxStreamCreate) {
    shim_log().warn("partition: this driver has no green-context API (CUDA 12.4+ needed); best-effort work stays in place");
    return d;
  }
  CUresult rc = real::cuDeviceGetDevResource(dev, &all, CU_DEV_RESOURCE_TYPE_SM);
  if (rc != CUDA_SUCCESS) {
    shim_log().warn("partition: cuDeviceGetDevResource(device {}) failed with CUresult {}; best-effort work stays in place",
                    static_cast<int>(dev), static_cast<int>(rc));
    return d;
  }
  d.sm_count = static_cast<int>(all.sm.smCount);
  d.usable = d.sm_count > 0;
  return d;
}

const GreenPartitions::Green* GreenPartitions::green_for(DeviceGreens& d, CUdevice dev, int sms) {
  if (auto it = d.by_request.find(sms); it != d.by_request.end()) return &it->second;
  if (d.failed.count(sms) != 0) return nullptr;
  // One group of at least `sms` SMs from the whole device; the rest is not used by us.
  CUdevResource all, group, rest;
  std::memset(&all, 0, sizeof all);
  std::memset(&group, 0, sizeof group);
  std::memset(&rest, 0, sizeof rest);
  unsigned groups = 1;
  CUdevResourceDesc desc = nullptr;
  Green g;
  CUresult rc = real::cuDeviceGetDevResource(dev, &all, CU_DEV_RESOURCE_TYPE_SM);
  if (rc == CUDA_SUCCESS) rc = real::cuDevSmResourceSplitByCount(&group, &groups, &all, &rest, 0, static_cast<unsigned>(sms));
  if (rc == CUDA_SUCCESS && groups != 1) rc = CUDA_ERROR_INVALID_RESOURCE_CONFIGURATION;
  if (rc == CUDA_SUCCESS) rc = real::cuDevResourceGenerateDesc(&desc, &group, 1);
  if (rc == CUDA_SUCCESS) rc = real::cuGreenCtxCreate(&g.handle, desc, dev, CU_GREEN_CTX_DEFAULT_STREAM);
  if (rc == CUDA_SUCCESS) rc = real::cuCtxFromGreenCtx(&g.context, g.handle);
  if (rc != CUDA_SUCCESS) {
    shim_log().warn("partition: no green context of {} SMs on device {} (CUresult {}); those launches stay in place",
                    sms, static_cast<int>(dev), static_cast<int>(rc));
    d.failed.insert(sms);
    return nullptr;
  }
  g.sms = static_cast<int>(group.sm.smCount);
  shim_log().info("partition: green context of {} SMs (asked {}) of {} on device {}", g.sms, sms, d.sm_count,
                  static_cast<int>(dev));
  return &d.by_request.emplace(sms, g).first->second;
}

bool GreenPartitions::check_binding(Binding& b) {
  if (b.checked) return b.movable;
  b.checked = true;
  // The stream is of the calling thread's current context (the launch is made under it).
  CUcontext current = nullptr;
  if (real::cuCtxGetCurrent(&current) != CUDA_SUCCESS || current == nullptr) return false;
  if (real::cuCtxGetDevice(&b.device) != CUDA_SUCCESS) return false;
  DeviceGreens& d = devices_[b.device];
  if (d.primary == nullptr && real::cuDevicePrimaryCtxRetain) {
    // Kept retained: the green contexts retain it too, for the process lifetime.
    if (real::cuDevicePrimaryCtxRetain(&d.primary, b.device) != CUDA_SUCCESS) d.primary = nullptr;
  }
  b.movable = d.primary != nullptr && d.primary == current;
  if (b.movable && real::cuEventCreate(&b.fork, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
    b.fork = nullptr;
    b.movable = false;
  }
  return b.movable;
}

std::optional<CUresult> GreenPartitions::launch(const KernelLaunch& call, sched::StreamId id, CUstream stream) {
  const std::optional<sched::SmPartition> partition = policy_.sm_partition();
  if (!partition) return std::nullopt;
  std::lock_guard lock(mu_);
  if (reinterpret_cast<uintptr_t>(stream) <= 2) return stay(InPlaceReason::kDefaultStream);
  if (call.cooperative() || !attributes_movable(call.config())) return stay(InPlaceReason::kCooperativeOrAttrs);
  if (refused_.count(call.function()) != 0) return stay(InPlaceReason::kFunctionRefused);
  Binding& b = bindings_[id];
  any_binding_.store(true, std::memory_order_release);
  if (!check_binding(b)) return stay(InPlaceReason::kNotPrimaryContext);
  DeviceGreens& d = device_greens(b.device);
  if (!d.usable) return stay(InPlaceReason::kNoGreenContexts);
  const int sms = partition->best_effort_sms(d.sm_count);
  if (sms <= 0) return stay(InPlaceReason::kNoPartition);
  const Green* g = green_for(d, b.device, sms);
  if (g == nullptr) return stay(InPlaceReason::kNoGreenContexts);

  Shadow& sh = b.shadows[sms];
  const bool fork = b.tail != &sh;
  if (fork && real::cuEventRecord(b.fork, stream) != CUDA_SUCCESS) return stay(InPlaceReason::kDriverError);
  CUresult rc = CUDA_SUCCESS;
  {
    // The green context current on this thread for the shadow's calls (its stream and join event
    // are its own); the caller's context comes back at the end of the scope.
    ContextGuard in_green(g->context);
    if (in_green.status() != CUDA_SUCCESS) return stay(InPlaceReason::kDriverError);
    if (sh.stream == nullptr) {
      int least = 0, greatest = 0;
      if (real::cuCtxGetStreamPriorityRange(&least, &greatest) != CUDA_SUCCESS) least = 0;
      if (real::cuGreenCtxStreamCreate(&sh.stream, g->handle, CU_STREAM_NON_BLOCKING, least) != CUDA_SUCCESS) {
        sh.stream = nullptr;
        return stay(InPlaceReason::kNoGreenContexts);
      }
      if (real::cuEventCreate(&sh.join, CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS) {
        real::cuStreamDestroy_v2(sh.stream);
        sh.stream = nullptr;
        sh.join = nullptr;
        return stay(InPlaceReason::kDriverError);
      }
    }
    if (fork && real::cuStreamWaitEvent(sh.stream, b.fork, 0) != CUDA_SUCCESS) {
      b.tail = nullptr;
      return stay(InPlaceReason::kDriverError);
    }
    rc = call.call_on(sh.stream);
    if (rc != CUDA_SUCCESS) {
      b.tail = nullptr;
      if (!refusal(rc)) return rc;  // a bad launch fails the same way anywhere: the caller's error
      refused_.insert(call.function());
      shim_log().info("partition: kernel {:#x} refused in a green context (CUresult {}); it stays in place",
                      reinterpret_cast<uintptr_t>(call.function()), static_cast<int>(rc));
      return stay(InPlaceReason::kFunctionRefused);
    }
    rc = real::cuEventRecord(sh.join, sh.stream);
  }
  if (rc == CUDA_SUCCESS) rc = real::cuStreamWaitEvent(stream, sh.join, 0);
  if (rc != CUDA_SUCCESS) {
    // The kernel is running but S no longer follows it: wait for it here rather than lose order.
    shim_log().error("partition: joining a green-context launch back to stream {:#x} failed with CUresult {}; waiting for it",
                     id, static_cast<int>(rc));
    real::cuStreamSynchronize(sh.stream);
    b.tail = nullptr;
    return rc;
  }
  b.tail = &sh;
  ++stats_.moved;
  stats_.forks += fork ? 1 : 0;
  ++stats_.moved_by_sms[g->sms];
  return CUDA_SUCCESS;
}

void GreenPartitions::note_in_place(sched::StreamId id) {
  if (!any_binding_.load(std::memory_order_acquire)) return;  // nothing moved yet: no lock on the launch path
  std::lock_guard lock(mu_);
  if (id == 0) {
    // Blocking streams wait for the legacy stream's work: their next moved launch must fork again
    // so that its shadow waits for it too.
    for (auto& [stream, b] : bindings_) b.tail = nullptr;
    return;
  }
  if (auto it = bindings_.find(id); it != bindings_.end()) it->second.tail = nullptr;
}

void GreenPartitions::forget_tails() {
  if (!any_binding_.load(std::memory_order_acquire)) return;
  std::lock_guard lock(mu_);
  for (auto& [stream, b] : bindings_) b.tail = nullptr;
}

void GreenPartitions::stream_destroying(sched::StreamId id) { drop_binding(id, /*fork_alive=*/true); }

void GreenPartitions::stream_gone(sched::StreamId id) { drop_binding(id, /*fork_alive=*/false); }

void GreenPartitions::device_reset(CUdevice dev) {
  std::lock_guard lock(mu_);
  std::erase_if(bindings_, [&](const auto& entry) { return entry.second.checked && entry.second.device == dev; });
  if (auto d = devices_.find(dev); d != devices_.end()) {
    d->second.by_request.clear();
    d->second.failed.clear();  // the driver may give what it refused before
  }
}

void GreenPartitions::drop_binding(sched::StreamId id, bool fork_alive) {
  std::lock_guard lock(mu_);
  auto it = bindings_.find(id);
  if (it == bindings_.end()) return;
  // Destroying a stream or an event with work pending is fine: the work still completes.
  for (auto& [sms, sh] : it->second.shadows) {
    if (sh.stream != nullptr) real::cuStreamDestroy_v2(sh.stream);
    if (sh.join != nullptr) real::cuEventDestroy_v2(sh.join);
  }
  if (fork_alive && it->second.fork != nullptr) real::cuEventDestroy_v2(it->second.fork);
  bindings_.erase(it);
}

PartitionStats GreenPartitions::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

}  // namespace orion

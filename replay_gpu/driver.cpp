// The driver table (driver.h): dlopen + global-scope lookups, and the device probe.
#include "driver.h"

#include <dlfcn.h>

#include <mutex>

namespace replay_gpu {
namespace {

#define REPLAY_STRINGIFY_EXPANDED(f) REPLAY_STRINGIFY(f)
#define REPLAY_STRINGIFY(f) #f

std::string g_open_error;

Driver* open_driver() {
  // RTLD_GLOBAL: the driver's symbols join the global scope, behind a preloaded shim's.
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_GLOBAL);
  if (lib == nullptr) {
    const char* why = dlerror();
    g_open_error = std::string("no CUDA device: no driver (cannot load libcuda.so.1: ") + (why ? why : "unknown") +
                   "); run on a machine with an NVIDIA GPU and its driver (use --dry-run to check a workload "
                   "without one)";
    return nullptr;
  }
  auto* d = new Driver();
  std::string missing;
#define REPLAY_DRIVER_LOOKUP(f)                                                     \
  d->f = reinterpret_cast<decltype(&::f)>(dlsym(RTLD_DEFAULT, REPLAY_STRINGIFY_EXPANDED(f))); \
  if (d->f == nullptr) missing += std::string(missing.empty() ? "" : ", ") + REPLAY_STRINGIFY_EXPANDED(f);
  REPLAY_DRIVER_FUNCTIONS(REPLAY_DRIVER_LOOKUP)
#undef REPLAY_DRIVER_LOOKUP
  if (!missing.empty()) {
    g_open_error = "the CUDA driver (libcuda.so.1) lacks " + missing +
                   "; the replayer needs a CUDA 12.8+ driver (CUDA 13 toolkit build)";
    delete d;
    return nullptr;
  }
  return d;
}

}  // namespace

const Driver& Driver::get() {
  static Driver* driver = open_driver();  // never freed: used until exit
  if (driver == nullptr) throw NoGpuError(g_open_error);
  return *driver;
}

std::string Driver::describe(CUresult rc) const {
  const char* name = nullptr;
  const char* text = nullptr;
  if (cuGetErrorName(rc, &name) != CUDA_SUCCESS || name == nullptr) name = "unknown CUresult";
  if (cuGetErrorString(rc, &text) != CUDA_SUCCESS || text == nullptr) text = "";
  return std::string(name) + " (" + std::to_string(static_cast<int>(rc)) + ": " + text + ")";
}

void Driver::check(CUresult rc, const char* what) const {
  if (rc != CUDA_SUCCESS) throw DriverError(std::string(what) + ": " + describe(rc));
}

DeviceInfo probe_device(int ordinal) {
  const Driver& d = Driver::get();
  const std::string what_to_do = "; run on a machine with an NVIDIA GPU (check nvidia-smi and CUDA_VISIBLE_DEVICES), or "
                                 "use --dry-run to check a workload without one";
  if (CUresult rc = d.cuInit(0); rc != CUDA_SUCCESS) {
    throw NoGpuError("no CUDA device: cuInit failed with " + d.describe(rc) + what_to_do);
  }
  int count = 0;
  if (CUresult rc = d.cuDeviceGetCount(&count); rc != CUDA_SUCCESS || count == 0) {
    throw NoGpuError("no CUDA device: the driver sees " + std::to_string(count) + " devices" + what_to_do);
  }
  if (ordinal < 0 || ordinal >= count) {
    throw NoGpuError("no CUDA device " + std::to_string(ordinal) + ": the driver sees " + std::to_string(count) +
                     " (use --device 0.." + std::to_string(count - 1) + ")");
  }
  CUdevice dev = 0;
  if (CUresult rc = d.cuDeviceGet(&dev, ordinal); rc != CUDA_SUCCESS) {
    throw NoGpuError("no CUDA device: cuDeviceGet(" + std::to_string(ordinal) + ") failed with " + d.describe(rc) +
                     what_to_do);
  }
  DeviceInfo info;
  info.ordinal = ordinal;
  char name[256] = {};
  d.check(d.cuDeviceGetName(name, sizeof name, dev), "cuDeviceGetName");
  info.name = name;
  d.check(d.cuDeviceGetAttribute(&info.sm_count, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, dev), "cuDeviceGetAttribute(SMs)");
  d.check(d.cuDeviceGetAttribute(&info.cc_major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, dev),
          "cuDeviceGetAttribute(compute capability)");
  d.check(d.cuDeviceGetAttribute(&info.cc_minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, dev),
          "cuDeviceGetAttribute(compute capability)");
  d.check(d.cuDeviceGetAttribute(&info.clock_khz, CU_DEVICE_ATTRIBUTE_CLOCK_RATE, dev), "cuDeviceGetAttribute(clock)");
  d.check(d.cuDriverGetVersion(&info.driver_version), "cuDriverGetVersion");
  return info;
}

}  // namespace replay_gpu

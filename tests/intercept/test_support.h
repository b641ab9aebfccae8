// Helpers shared by the shim's test programs: the fake driver's call log, the shim's C API found
// the way programs find it (dlsym), and the mode this run was started in.
#pragma once

#include <dlfcn.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

#include "fake_cuda.h"
#include "orion.h"

namespace icpt_test {

// Kernel names as cuFuncGetName returns them for the libraries a real job loads.
inline constexpr const char* kNcclAllReduceMangled =
    "_Z39ncclDevKernel_AllReduce_Sum_f32_RING_LL24ncclDevKernelArgsStorageILm4096EE";
inline constexpr const char* kNcclSymkName = "ncclSymkDevKernel_AllReduce_AGxLL_R_sum_f32";
inline constexpr const char* kCublasName =
    "_Z20gemmSN_NN_kernel_64x4IfLi256ELi4ELi2ELi8ELi4ELi4ELb0E30cublasGemvTensorStridedBatchedIKfES1_S2_EvNT_17GemmSNParamsEE";
inline constexpr const char* kCudnnName =
    "_ZN5cudnn19engines_precompiled16nchwToNhwcKernelIfffLb0ELb1EL21cudnnKernelDataType_t2EEEvNS0_18nchw2nhwc_params_tIT1_EEPKT_PT0_";
inline constexpr const char* kTritonName = "triton_poi_fused_add_mul_0";

inline std::vector<fake_cuda_call> calls() {
  std::vector<fake_cuda_call> out(fake_cuda_call_count());
  for (size_t i = 0; i < out.size(); ++i) {
    if (fake_cuda_get_call(i, &out[i]) != 0) out.resize(i);
  }
  return out;
}

// Index of the first call after `from` matching `pred`, or -1.
inline long find_call(const std::vector<fake_cuda_call>& log,
                      const std::function<bool(const fake_cuda_call&)>& pred, size_t from = 0) {
  for (size_t i = from; i < log.size(); ++i) {
    if (pred(log[i])) return static_cast<long>(i);
  }
  return -1;
}

// The shared object that defines `fn` ("<none>" if none), and whether it is the shim or the fake
// driver: which one a lookup handed out.
inline std::string library_of(void* fn) {
  Dl_info info{};
  if (fn == nullptr || dladdr(fn, &info) == 0 || info.dli_fname == nullptr) return "<none>";
  return info.dli_fname;
}
inline bool in_shim(void* fn) { return library_of(fn).find("libgpu_scheduler") != std::string::npos; }
inline bool in_fake_driver(void* fn) { return library_of(fn).find("libcuda.so") != std::string::npos; }

inline bool is_launch(const fake_cuda_call& c) { return std::strncmp(c.name, "cuLaunch", 8) == 0; }

inline long find_launch(const std::vector<fake_cuda_call>& log, CUfunction f) {
  return find_call(log, [&](const fake_cuda_call& c) {
    return is_launch(c) && c.function == reinterpret_cast<uint64_t>(f);
  });
}
inline size_t count_launches(const std::vector<fake_cuda_call>& log, CUfunction f) {
  size_t n = 0;
  for (const auto& c : log) n += is_launch(c) && c.function == reinterpret_cast<uint64_t>(f);
  return n;
}
inline long find_named(const std::vector<fake_cuda_call>& log, const char* name, uint64_t stream) {
  return find_call(log, [&](const fake_cuda_call& c) {
    return std::strcmp(c.name, name) == 0 && c.stream == stream;
  });
}
inline uint64_t h(const void* p) { return reinterpret_cast<uint64_t>(p); }

// Which mode ctest started us in: ORION_TEST_MODE=scheduled|passthrough (a run without it is a
// setup error, not a silent pass).
inline bool scheduled_mode() {
  const char* m = std::getenv("ORION_TEST_MODE");
  if (m == nullptr) {
    ADD_FAILURE() << "ORION_TEST_MODE is not set: run through ctest";
    return false;
  }
  return std::string(m) == "scheduled";
}

template <typename Fn>
Fn shim_fn(const char* name) {
  return reinterpret_cast<Fn>(dlsym(RTLD_DEFAULT, name));
}

inline orion_stats stats() {
  orion_stats s{};
  auto get = shim_fn<orion_get_stats_fn>("orion_get_stats");
  if (get != nullptr) get(&s, sizeof s);
  return s;
}

// Waits until the shim has nothing queued or in flight (completions are polled by its thread).
inline bool wait_idle(std::chrono::milliseconds limit = std::chrono::milliseconds(5000)) {
  auto get = shim_fn<orion_get_stats_fn>("orion_get_stats");
  auto deadline = std::chrono::steady_clock::now() + limit;
  while (std::chrono::steady_clock::now() < deadline) {
    orion_stats s{};
    if (get == nullptr || get(&s, sizeof s) != 0) return true;  // pass-through: nothing to wait
    if (s.queued_now == 0 && s.tracked_in_flight == 0) return true;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
  return false;
}

// Makes device `device`'s primary context current on the calling thread (what the CUDA runtime
// does for a thread's first call); every thread that calls the driver needs one.
inline CUcontext use_device(int device) {
  CUcontext ctx = nullptr;
  if (cuDevicePrimaryCtxRetain(&ctx, device) != CUDA_SUCCESS) return nullptr;
  if (cuCtxSetCurrent(ctx) != CUDA_SUCCESS) return nullptr;
  return ctx;
}

// A green context of device `device` with (at least) `sms` SMs of the device's resource.
inline CUresult make_green_context(int device, unsigned sms, CUgreenCtx* out) {
  CUdevResource all{}, part{}, rest{};
  unsigned groups = 1;
  CUdevResourceDesc desc = nullptr;
  CUresult rc = cuDeviceGetDevResource(device, &all, CU_DEV_RESOURCE_TYPE_SM);
  if (rc == CUDA_SUCCESS) rc = cuDevSmResourceSplitByCount(&part, &groups, &all, &rest, 0, sms);
  if (rc == CUDA_SUCCESS) rc = cuDevResourceGenerateDesc(&desc, &part, 1);
  if (rc == CUDA_SUCCESS) rc = cuGreenCtxCreate(out, desc, device, CU_GREEN_CTX_DEFAULT_STREAM);
  return rc;
}

// A graph executable the fake driver made (it launches no other): from an empty graph, or, given
// `kernel`, from a graph of one kernel node of it, whose handle goes to *node (for edits). The
// graph itself is destroyed: the executable keeps what it was made from. Null when a call failed.
inline CUgraphExec make_graph_exec(CUfunction kernel = nullptr, CUgraphNode* node = nullptr) {
  CUgraph graph = nullptr;
  CUgraphExec exec = nullptr;
  if (cuGraphCreate(&graph, 0) != CUDA_SUCCESS) return nullptr;
  CUDA_KERNEL_NODE_PARAMS params{};
  params.func = kernel;
  CUgraphNode added = nullptr;
  bool ok = kernel == nullptr || cuGraphAddKernelNode_v2(&added, graph, nullptr, 0, &params) == CUDA_SUCCESS;
  ok = ok && cuGraphInstantiateWithFlags(&exec, graph, 0) == CUDA_SUCCESS;
  ok = cuGraphDestroy(graph) == CUDA_SUCCESS && ok;
  if (node != nullptr) *node = added;
  return ok ? exec : nullptr;
}

// Releases the retains of `device`'s primary context that earlier tests of the program left
// (use_device retains): the next release of a retain of the caller's own is then the last.
inline void release_primary_retains(int device) {
  while (fake_cuda_primary_retains(device) > 0) {
    if (cuDevicePrimaryCtxRelease(device) != CUDA_SUCCESS) return;
  }
}

// Every test starts from a shim that is loaded and in the mode ctest asked for.
class ShimTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto is_active = shim_fn<orion_is_active_fn>("orion_is_active");
    ASSERT_NE(is_active, nullptr) << "libgpu_scheduler.so is not loaded (LD_PRELOAD)";
    ASSERT_EQ(cuInit(0), CUDA_SUCCESS);
    ASSERT_NE(use_device(0), nullptr);
    scheduled_ = scheduled_mode();
    ASSERT_EQ(is_active() == 1, scheduled_) << "shim mode does not match ORION_TEST_MODE";
    ASSERT_TRUE(wait_idle());
    fake_cuda_reset();
  }
  void TearDown() override {
    fake_cuda_reset();  // releases busy streams
    EXPECT_EQ(cuCtxSynchronize(), CUDA_SUCCESS);
    EXPECT_TRUE(wait_idle());
  }
  bool scheduled_ = false;
};

}  // namespace icpt_test

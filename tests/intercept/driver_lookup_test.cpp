// How programs reach the driver, and that each path lands in the shim: libcudart's sequence
// (dlopen, dlsym(handle, "cuGetProcAddress_v2"), the empty-name probe, versioned lookups with
// flags), Triton's dlsym(handle, "cuLaunchKernelEx"), and NCCL's launches with `extra`.
// Interposition is the same in both modes; run twice by ctest (scheduled and pass-through).
#include <cudaTypedefs.h>

#include <string>
#include <vector>

#include "test_support.h"

namespace {

using namespace icpt_test;

class DriverLookup : public ShimTest {
 protected:
  void SetUp() override {
    ShimTest::SetUp();
    if (HasFatalFailure()) return;
    driver_ = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(driver_, nullptr) << dlerror();
    get_proc_ = reinterpret_cast<PFN_cuGetProcAddress_v12000>(dlsym(driver_, "cuGetProcAddress_v2"));
    ASSERT_NE(get_proc_, nullptr);
    const size_t sizes[] = {sizeof(void*), sizeof(int), sizeof(float)};
    kernel_ = fake_cuda_make_function("triton_kernel", 3, sizes);
  }
  void TearDown() override {
    if (driver_ != nullptr) dlclose(driver_);
    ShimTest::TearDown();
  }

  void* lookup(const char* name, int version, cuuint64_t flags, CUresult expect = CUDA_SUCCESS) {
    void* fn = nullptr;
    CUdriverProcAddressQueryResult status{};
    EXPECT_EQ(get_proc_(name, &fn, version, flags, &status), expect) << name << "@" << version;
    return fn;
  }

  void* driver_ = nullptr;
  PFN_cuGetProcAddress_v12000 get_proc_ = nullptr;
  CUfunction kernel_ = nullptr;
};

TEST_F(DriverLookup, DlsymOnTheDriverHandleFindsTheShim) {
  EXPECT_TRUE(in_shim(reinterpret_cast<void*>(get_proc_))) << library_of((void*)get_proc_);
  EXPECT_TRUE(in_shim(dlsym(driver_, "cuLaunchKernelEx")));
  EXPECT_TRUE(in_shim(dlsym(driver_, "cuLaunchKernel_ptsz")));
  EXPECT_TRUE(in_shim(dlsym(driver_, "cuGetProcAddress")));
  // Every function cuda.h declares is interposed (driver_api_classes.csv): an order-free query
  // and a release-class free get generated wrappers too.
  EXPECT_TRUE(in_shim(dlsym(driver_, "cuFuncGetName")));
  EXPECT_TRUE(in_shim(dlsym(driver_, "cuMemFreeHost")));
  // A symbol cuda.h does not declare is the driver's own.
  EXPECT_TRUE(in_fake_driver(dlsym(driver_, "fake_cuda_set_logging")));
  // Missing symbols stay missing, with the usual dlerror().
  dlerror();
  EXPECT_EQ(dlsym(driver_, "cuNoSuchFunction"), nullptr);
  EXPECT_NE(dlerror(), nullptr);
  // Ordinary lookups still work through the interposed dlsym.
  EXPECT_NE(dlsym(RTLD_DEFAULT, "orion_get_stats"), nullptr);
  EXPECT_NE(dlsym(RTLD_NEXT, "malloc"), nullptr);
}

TEST_F(DriverLookup, CudartSequenceGetsWrappersWithTheRequestedSemantics) {
  // libcudart's probe: a real (non-stub) driver answers "not found", not 34 (stub library).
  void* probe = nullptr;
  CUdriverProcAddressQueryResult status{};
  EXPECT_EQ(get_proc_("", &probe, 13000, 0, &status), CUDA_ERROR_NOT_FOUND);
  EXPECT_EQ(probe, nullptr);

  void* legacy = lookup("cuLaunchKernel", 4000, 0);
  void* per_thread = lookup("cuLaunchKernel", 7000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM);
  ASSERT_TRUE(in_shim(legacy));
  ASSERT_TRUE(in_shim(per_thread));
  EXPECT_NE(legacy, per_thread);
  // A request for the lookup function itself returns ours, in the requested ABI.
  EXPECT_EQ(lookup("cuGetProcAddress", 12000, 0), dlsym(driver_, "cuGetProcAddress_v2"));
  EXPECT_EQ(lookup("cuGetProcAddress", 11030, 0), dlsym(driver_, "cuGetProcAddress"));
  // Versioned ABIs: cuMemcpyHtoDAsync at 3020 is the _v2 ABI, at 2000 the 32-bit v1 ABI (both
  // wrapped, by different wrappers); at 1000 it does not exist and nothing is made up.
  void* htod_v2 = lookup("cuMemcpyHtoDAsync", 3020, 0);
  void* htod_v1 = lookup("cuMemcpyHtoDAsync", 2000, 0);
  EXPECT_TRUE(in_shim(htod_v2));
  EXPECT_TRUE(in_shim(htod_v1));
  EXPECT_NE(htod_v1, htod_v2);
  EXPECT_EQ(lookup("cuMemcpyHtoDAsync", 1000, 0, CUDA_ERROR_NOT_FOUND), nullptr);
  // Functions without a per-thread variant keep their one ABI under the per-thread flag.
  EXPECT_TRUE(in_shim(lookup("cuEventSynchronize", 2000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM)));
  // Generated wrappers answer by the versions cudaTypedefs.h gives each ABI.
  void* get_name = lookup("cuFuncGetName", 12030, 0);
  EXPECT_TRUE(in_shim(get_name));
  EXPECT_EQ(get_name, dlsym(driver_, "cuFuncGetName"));
  const char* name = nullptr;
  EXPECT_EQ(reinterpret_cast<PFN_cuFuncGetName_v12030>(get_name)(&name, kernel_), CUDA_SUCCESS);
  ASSERT_NE(name, nullptr);
  EXPECT_NE(std::string(name).find("kernel"), std::string::npos) << name;

  // Each pointer reaches the driver entry point of the same semantics, exactly once.
  int a = 3;
  float b = 1.5f;
  void* ptr = reinterpret_cast<void*>(0xABCDEF00);
  void* params[] = {&ptr, &a, &b};
  fake_cuda_reset();
  auto launch_legacy = reinterpret_cast<PFN_cuLaunchKernel_v4000>(legacy);
  auto launch_pt = reinterpret_cast<PFN_cuLaunchKernel_v7000_ptsz>(per_thread);
  ASSERT_EQ(launch_legacy(kernel_, 1, 2, 3, 4, 5, 6, 0, nullptr, params, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(launch_pt(kernel_, 1, 2, 3, 4, 5, 6, 0, nullptr, params, nullptr), CUDA_SUCCESS);
  auto log = calls();
  ASSERT_EQ(count_launches(log, kernel_), 2u);
  std::vector<const fake_cuda_call*> launches;
  for (const auto& c : log) {
    if (is_launch(c)) launches.push_back(&c);
  }
  EXPECT_STREQ(launches[0]->name, "cuLaunchKernel");
  EXPECT_STREQ(launches[1]->name, "cuLaunchKernel_ptsz");
  for (const fake_cuda_call* c : launches) {
    EXPECT_EQ(c->grid[2], 3u);
    EXPECT_EQ(c->block[2], 6u);
    void* got_ptr = nullptr;
    int got_a = 0;
    float got_b = 0;
    std::memcpy(&got_ptr, c->params, sizeof got_ptr);
    std::memcpy(&got_a, c->params + 8, sizeof got_a);
    std::memcpy(&got_b, c->params + 12, sizeof got_b);
    EXPECT_EQ(got_ptr, ptr);
    EXPECT_EQ(got_a, 3);
    EXPECT_EQ(got_b, 1.5f);
  }
}

TEST_F(DriverLookup, TritonStyleLaunchKernelExWithAttributes) {
  auto launch_ex = reinterpret_cast<PFN_cuLaunchKernelEx_v11060>(dlsym(driver_, "cuLaunchKernelEx"));
  ASSERT_TRUE(in_shim(reinterpret_cast<void*>(launch_ex)));
  CUstream be = nullptr, hp = nullptr;
  ASSERT_EQ(cuStreamCreateWithPriority(&be, 0, 0), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamCreateWithPriority(&hp, 0, -5), CUDA_SUCCESS);
  // HP in flight so that the best-effort launch is deferred (scheduled mode) and its config,
  // attributes and arguments must survive the caller's frame.
  fake_cuda_set_stream_busy(hp, 1);
  CUfunction hp_kernel = fake_cuda_make_function("hp", 0, nullptr);
  ASSERT_EQ(cuLaunchKernel(hp_kernel, 1, 1, 1, 1, 1, 1, 0, hp, nullptr, nullptr), CUDA_SUCCESS);
  {
    CUlaunchAttribute attr{};
    attr.id = CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION;
    attr.value.clusterDim.x = 2;
    attr.value.clusterDim.y = 1;
    attr.value.clusterDim.z = 1;
    CUlaunchConfig cfg{};
    cfg.gridDimX = 64;
    cfg.gridDimY = cfg.gridDimZ = 1;
    cfg.blockDimX = 256;
    cfg.blockDimY = cfg.blockDimZ = 1;
    cfg.sharedMemBytes = 1024;
    cfg.hStream = be;
    cfg.attrs = &attr;
    cfg.numAttrs = 1;
    void* ptr = reinterpret_cast<void*>(0x1234);
    int n = 77;
    float scale = 0.25f;
    void* params[] = {&ptr, &n, &scale};
    ASSERT_EQ(launch_ex(&cfg, kernel_, params, nullptr), CUDA_SUCCESS);
    n = -1;  // the caller moves on
  }
  ASSERT_EQ(cuStreamSynchronize(be), CUDA_SUCCESS);
  auto log = calls();
  ASSERT_EQ(count_launches(log, kernel_), 1u);
  const fake_cuda_call& c = log.at(find_launch(log, kernel_));
  EXPECT_STREQ(c.name, "cuLaunchKernelEx");
  EXPECT_EQ(c.grid[0], 64u);
  EXPECT_EQ(c.block[0], 256u);
  EXPECT_EQ(c.shared_mem, 1024u);
  EXPECT_EQ(c.stream, h(be));
  int n_got = 0;
  std::memcpy(&n_got, c.params + 8, sizeof n_got);
  EXPECT_EQ(n_got, 77);
  fake_cuda_set_stream_busy(hp, 0);
  EXPECT_EQ(cuStreamDestroy(be), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamDestroy(hp), CUDA_SUCCESS);
}

TEST_F(DriverLookup, NcclStyleLaunchThroughDriverEntryPointIsNotDeferred) {
  // NCCL: cudaGetDriverEntryPointByVersion -> cuGetProcAddress("cuLaunchKernelEx", 12000, ...).
  auto launch_ex = reinterpret_cast<PFN_cuLaunchKernelEx_v11060>(lookup("cuLaunchKernelEx", 12000, 0));
  ASSERT_TRUE(in_shim(reinterpret_cast<void*>(launch_ex)));
  CUstream comm = nullptr, hp = nullptr;
  ASSERT_EQ(cuStreamCreateWithPriority(&comm, 0, 0), CUDA_SUCCESS);  // would be best effort
  ASSERT_EQ(cuStreamCreateWithPriority(&hp, 0, -5), CUDA_SUCCESS);
  fake_cuda_set_stream_busy(hp, 1);
  CUfunction hp_kernel = fake_cuda_make_function("hp", 0, nullptr);
  ASSERT_EQ(cuLaunchKernel(hp_kernel, 1, 1, 1, 1, 1, 1, 0, hp, nullptr, nullptr), CUDA_SUCCESS);
  CUfunction nccl = fake_cuda_make_function("ncclKernel_SendRecv", 0, nullptr);
  unsigned char args[40];
  for (int i = 0; i < 40; ++i) args[i] = static_cast<unsigned char>(i * 3);
  size_t size = sizeof args;
  void* extra[] = {CU_LAUNCH_PARAM_BUFFER_POINTER, args, CU_LAUNCH_PARAM_BUFFER_SIZE, &size,
                   CU_LAUNCH_PARAM_END};
  CUlaunchConfig cfg{};
  cfg.gridDimX = 2;
  cfg.gridDimY = cfg.gridDimZ = 1;
  cfg.blockDimX = 640;
  cfg.blockDimY = cfg.blockDimZ = 1;
  cfg.hStream = comm;
  ASSERT_EQ(launch_ex(&cfg, nccl, nullptr, extra), CUDA_SUCCESS);
  auto log = calls();
  ASSERT_EQ(count_launches(log, nccl), 1u) << "communication kernel deferred";
  const fake_cuda_call& c = log.at(find_launch(log, nccl));
  ASSERT_EQ(c.param_bytes, sizeof args);
  EXPECT_EQ(std::memcmp(c.params, args, sizeof args), 0);
  fake_cuda_set_stream_busy(hp, 0);
  EXPECT_EQ(cuStreamDestroy(comm), CUDA_SUCCESS);
  EXPECT_EQ(cuStreamDestroy(hp), CUDA_SUCCESS);
}

// CUDA 12+ runtimes ask for "cuGraphInstantiate" (answered with cuGraphInstantiateWithFlags) or
// the WithFlags / WithParams names: every one reaches the shim, which reads the graph's event nodes.
TEST_F(DriverLookup, GraphInstantiationResolvesToTheShimUnderEveryName) {
  const cuuint64_t pt = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  void* by_old_name = lookup("cuGraphInstantiate", 12000, 0);
  void* with_flags = lookup("cuGraphInstantiateWithFlags", 12000, 0);
  void* with_params_pt = lookup("cuGraphInstantiateWithParams", 12000, pt);
  for (void* fn : {by_old_name, with_flags, with_params_pt}) ASSERT_TRUE(in_shim(fn)) << library_of(fn);
  EXPECT_EQ(by_old_name, with_flags);
  EXPECT_EQ(with_params_pt, dlsym(driver_, "cuGraphInstantiateWithParams_ptsz"));
}

TEST_F(DriverLookup, MemoryOpsBatchCopiesAndContextSyncResolveToTheRequestedAbi) {
  const cuuint64_t pt = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  auto ctx_sync_old = reinterpret_cast<PFN_cuCtxSynchronize_v2000>(lookup("cuCtxSynchronize", 12000, 0));
  auto ctx_sync_new = reinterpret_cast<PFN_cuCtxSynchronize_v13000>(lookup("cuCtxSynchronize", 13000, 0));
  auto write_v1 = reinterpret_cast<PFN_cuStreamWriteValue32_v8000>(lookup("cuStreamWriteValue32", 8000, 0));
  auto write_v2_pt = reinterpret_cast<PFN_cuStreamWriteValue32_v11070_ptsz>(lookup("cuStreamWriteValue32", 12000, pt));
  auto wait64 = reinterpret_cast<PFN_cuStreamWaitValue64_v11070>(lookup("cuStreamWaitValue64", 13000, 0));
  auto batch_memop = reinterpret_cast<PFN_cuStreamBatchMemOp_v11070_ptsz>(lookup("cuStreamBatchMemOp", 12000, pt));
  auto batch_old = reinterpret_cast<PFN_cuMemcpyBatchAsync_v12080>(lookup("cuMemcpyBatchAsync", 12080, 0));
  auto batch_new_pt = reinterpret_cast<PFN_cuMemcpyBatchAsync_v13000_ptsz>(lookup("cuMemcpyBatchAsync", 13000, pt));
  auto batch3d = reinterpret_cast<PFN_cuMemcpy3DBatchAsync_v13000>(lookup("cuMemcpy3DBatchAsync", 13000, 0));
  auto copy2d_pt = reinterpret_cast<PFN_cuMemcpy2D_v7000_ptds>(lookup("cuMemcpy2D", 12000, pt));
  auto peer = reinterpret_cast<PFN_cuMemcpyPeer_v4000>(lookup("cuMemcpyPeer", 12000, 0));
  for (void* fn : {(void*)ctx_sync_old, (void*)ctx_sync_new, (void*)write_v1, (void*)write_v2_pt,
                   (void*)wait64, (void*)batch_memop, (void*)batch_old, (void*)batch_new_pt,
                   (void*)batch3d, (void*)copy2d_pt, (void*)peer}) {
    ASSERT_TRUE(in_shim(fn)) << library_of(fn);
  }
  EXPECT_NE(reinterpret_cast<void*>(ctx_sync_old), reinterpret_cast<void*>(ctx_sync_new));
  EXPECT_EQ(reinterpret_cast<void*>(write_v2_pt), dlsym(driver_, "cuStreamWriteValue32_v2_ptsz"));

  fake_cuda_reset();
  CUdeviceptr dsts[] = {0x1000}, srcs[] = {0x2000};
  size_t sizes[] = {48};
  CUmemcpyAttributes attr{};
  attr.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
  size_t attr_idx = 0, fail_idx = 0;
  CUstreamBatchMemOpParams op{};
  op.writeValue.operation = CU_STREAM_MEM_OP_WRITE_VALUE_32;
  op.writeValue.value = 3;
  CUDA_MEMCPY2D c2{};
  CUDA_MEMCPY3D_BATCH_OP op3d{};
  ASSERT_EQ(ctx_sync_old(), CUDA_SUCCESS);
  ASSERT_EQ(ctx_sync_new(nullptr), CUDA_SUCCESS);
  ASSERT_EQ(write_v1(nullptr, 0x1000, 1, 0), CUDA_SUCCESS);
  ASSERT_EQ(write_v2_pt(nullptr, 0x1000, 2, 0), CUDA_SUCCESS);
  ASSERT_EQ(wait64(nullptr, 0x1000, 2, CU_STREAM_WAIT_VALUE_GEQ), CUDA_SUCCESS);
  ASSERT_EQ(batch_memop(nullptr, 1, &op, 0), CUDA_SUCCESS);
  ASSERT_EQ(batch_old(dsts, srcs, sizes, 1, &attr, &attr_idx, 1, &fail_idx, CU_STREAM_PER_THREAD), CUDA_SUCCESS);
  ASSERT_EQ(batch_new_pt(dsts, srcs, sizes, 1, &attr, &attr_idx, 1, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(batch3d(1, &op3d, 0, CU_STREAM_PER_THREAD), CUDA_SUCCESS);
  ASSERT_EQ(copy2d_pt(&c2), CUDA_SUCCESS);
  ASSERT_EQ(peer(0x1000, nullptr, 0x2000, nullptr, 8), CUDA_SUCCESS);
  const std::vector<std::string> expected = {
      "cuCtxSynchronize", "cuCtxSynchronize_v2", "cuStreamWriteValue32",
      "cuStreamWriteValue32_v2_ptsz", "cuStreamWaitValue64_v2", "cuStreamBatchMemOp_v2_ptsz",
      "cuMemcpyBatchAsync", "cuMemcpyBatchAsync_v2_ptsz", "cuMemcpy3DBatchAsync_v2",
      "cuMemcpy2D_v2_ptds", "cuMemcpyPeer"};
  std::vector<std::string> seen;
  for (const auto& c : calls()) {
    if (std::strncmp(c.name, "cuEvent", 7) == 0) continue;  // the scheduler's completion tracking
    seen.push_back(c.name);
  }
  EXPECT_EQ(seen, expected);
  // Each call reached the driver once, with its arguments.
  auto log = calls();
  EXPECT_EQ(log.at(find_named(log, "cuStreamBatchMemOp_v2_ptsz", 0)).value, 3u);
  EXPECT_EQ(log.at(find_named(log, "cuMemcpyBatchAsync_v2_ptsz", 0)).value, 48u);
}

TEST_F(DriverLookup, PrefetchCallbacksSemaphoresAndArrayCopiesResolveToTheRequestedAbi) {
  const cuuint64_t pt = CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM;
  auto prefetch_v1 = reinterpret_cast<PFN_cuMemPrefetchAsync_v8000>(lookup("cuMemPrefetchAsync", 12000, 0));
  auto prefetch_v2_pt = reinterpret_cast<PFN_cuMemPrefetchAsync_v12020_ptsz>(lookup("cuMemPrefetchAsync", 13000, pt));
  auto add_cb = reinterpret_cast<PFN_cuStreamAddCallback_v5000>(lookup("cuStreamAddCallback", 12000, 0));
  auto sem_wait = reinterpret_cast<PFN_cuWaitExternalSemaphoresAsync_v10000>(lookup("cuWaitExternalSemaphoresAsync", 12000, 0));
  auto atoh_pt = reinterpret_cast<PFN_cuMemcpyAtoH_v7000_ptds>(lookup("cuMemcpyAtoH", 12000, pt));
  auto memset16 = reinterpret_cast<PFN_cuMemsetD16_v3020>(lookup("cuMemsetD16", 12000, 0));
  for (void* fn : {(void*)prefetch_v1, (void*)prefetch_v2_pt, (void*)add_cb, (void*)sem_wait,
                   (void*)atoh_pt, (void*)memset16}) {
    ASSERT_TRUE(in_shim(fn)) << library_of(fn);
  }
  EXPECT_EQ(reinterpret_cast<void*>(prefetch_v1), dlsym(driver_, "cuMemPrefetchAsync"));
  EXPECT_EQ(reinterpret_cast<void*>(prefetch_v2_pt), dlsym(driver_, "cuMemPrefetchAsync_v2_ptsz"));

  fake_cuda_reset();
  CUmemLocation loc{};
  loc.type = CU_MEM_LOCATION_TYPE_DEVICE;
  CUexternalSemaphore sem = reinterpret_cast<CUexternalSemaphore>(0xc0);
  CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS wait{};
  unsigned char host[32] = {};
  ASSERT_EQ(prefetch_v1(0x1000, 64, 0, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(prefetch_v2_pt(0x1000, 128, loc, 0, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(add_cb(nullptr, nullptr, host, 0), CUDA_SUCCESS);
  ASSERT_EQ(sem_wait(&sem, &wait, 1, nullptr), CUDA_SUCCESS);
  ASSERT_EQ(atoh_pt(host, reinterpret_cast<CUarray>(0x40), 0, sizeof host), CUDA_SUCCESS);
  ASSERT_EQ(memset16(0x1000, 1, 8), CUDA_SUCCESS);
  const std::vector<std::string> expected = {
      "cuMemPrefetchAsync", "cuMemPrefetchAsync_v2_ptsz", "cuStreamAddCallback",
      "cuWaitExternalSemaphoresAsync", "cuMemcpyAtoH_v2_ptds", "cuMemsetD16_v2"};
  std::vector<std::string> seen;
  for (const auto& c : calls()) {
    if (std::strncmp(c.name, "cuEvent", 7) == 0) continue;  // the scheduler's completion tracking
    seen.push_back(c.name);
  }
  // Each call reached the driver once, with its arguments.
  EXPECT_EQ(seen, expected);
  auto log = calls();
  EXPECT_EQ(log.at(find_named(log, "cuMemPrefetchAsync", 0)).value, 64u);
  EXPECT_EQ(log.at(find_named(log, "cuMemPrefetchAsync_v2_ptsz", 0)).value, 128u);
  EXPECT_EQ(log.at(find_named(log, "cuMemcpyAtoH_v2_ptds", 0)).value, 32u);
}

}  // namespace

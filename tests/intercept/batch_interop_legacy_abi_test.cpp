// The last stream-ordered entry points the shim wraps: batch prefetch/discard, batch
// decompression, graph upload, graphics map/unmap (each also as _ptsz) and the pre-3020 copy
// ABIs. Each must reach the driver exactly once, after the best-effort kernel queued before it on
// its stream, with the caller's arguments unchanged, and a driver error must reach the caller.
// Run twice by ctest: scheduled and pass-through.
//
// Compiled like the shim and the fake driver, with cuda.h's internal mode: every ABI is declared
// under its own name (cuGraphUpload_ptsz, the v1 cuMemcpyHtoDAsync with 32-bit pointers,
// CUDA_MEMCPY2D_v1, ...), so each exported symbol can be called with its exact type.
#include "internal_abi_fixture.h"

namespace {

using namespace icpt_test;

struct Case {
  const char* symbol;
  bool caller_waits;  // returns only once its op is in the driver (never deferred past the call)
  uint64_t logged_value;
  std::vector<unsigned char> args;  // what the driver must receive
  std::function<CUresult()> call;
};
// One call of `sym` with the argument list given after `value`.
#define CASE(sym, waits, value, ...) \
  Case { #sym, waits, value, packed(__VA_ARGS__), [=] { return sym(__VA_ARGS__); } }

size_t count_named(const std::vector<fake_cuda_call>& log, const char* name) {
  size_t n = 0;
  for (const auto& c : log) n += std::strcmp(c.name, name) == 0;
  return n;
}

class LateEntryPoints : public Scheduling {
 protected:
  // Queues a best-effort kernel behind in-flight high-priority work, makes the call (releasing
  // high priority after a while when the caller waits, so the queue can be admitted), and
  // returns the call's result.
  CUresult call_behind_queued_kernel(const Case& c) {
    fake_cuda_reset();
    hold_high_priority();
    EXPECT_EQ(launch(k_be_, be_, 1), CUDA_SUCCESS);
    expect_deferred(k_be_);
    Releaser releaser;
    if (c.caller_waits) releaser = release_high_priority_once_a_caller_waits();
    CUresult rc = c.call();
    log_at_return_ = calls();
    releaser.join();
    return rc;
  }

  std::vector<Case> cases() {
    const CUstream s = be_;
    std::vector<Case> out;
    // Batch prefetch / discard (13000): borrowed arrays.
    CUdeviceptr* ptrs = ptrs_;
    size_t* sizes = sizes_;
    CUmemLocation* locs = &loc_;
    size_t* loc_idx = &loc_idx_;
    const size_t n = 2, n_locs = 1;
    const unsigned long long flags = 0;
    out.push_back(CASE(cuMemPrefetchBatchAsync, true, 12288,
                       ptrs, sizes, n, locs, loc_idx, n_locs, flags, s));
    out.push_back(CASE(cuMemPrefetchBatchAsync_ptsz, true, 12288,
                       ptrs, sizes, n, locs, loc_idx, n_locs, flags, s));
    out.push_back(CASE(cuMemDiscardBatchAsync, true, 12288, ptrs, sizes, n, flags, s));
    out.push_back(CASE(cuMemDiscardBatchAsync_ptsz, true, 12288, ptrs, sizes, n, flags, s));
    out.push_back(CASE(cuMemDiscardAndPrefetchBatchAsync, true, 12288,
                       ptrs, sizes, n, locs, loc_idx, n_locs, flags, s));
    out.push_back(CASE(cuMemDiscardAndPrefetchBatchAsync_ptsz, true, 12288,
                       ptrs, sizes, n, locs, loc_idx, n_locs, flags, s));
    // Batch decompression (12060): borrowed parameters, errorIndex written at the call.
    CUmemDecompressParams* dparams = &decompress_;
    size_t* err_idx = &error_index_;
    const size_t one = 1;
    out.push_back(CASE(cuMemBatchDecompressAsync, true, 1, dparams, one, 0u, err_idx, s));
    out.push_back(CASE(cuMemBatchDecompressAsync_ptsz, true, 1, dparams, one, 0u, err_idx, s));
    // Graph upload (11010).
    const CUgraphExec graph = graph_exec_;
    out.push_back(CASE(cuGraphUpload, true, h(graph), graph, s));
    out.push_back(CASE(cuGraphUpload_ptsz, true, h(graph), graph, s));
    // Graphics interop map/unmap (3000, _ptsz 7000): a borrowed resource array.
    CUgraphicsResource* res = resources_;
    out.push_back(CASE(cuGraphicsMapResources, true, 2, 2u, res, s));
    out.push_back(CASE(cuGraphicsMapResources_ptsz, true, 2, 2u, res, s));
    out.push_back(CASE(cuGraphicsUnmapResources, true, 2, 2u, res, s));
    out.push_back(CASE(cuGraphicsUnmapResources_ptsz, true, 2, 2u, res, s));
    // Pre-3020 ABIs, with the rules of their _v2 counterparts: pageable host memory and struct
    // copies make the caller wait; a device-to-device copy is deferred in order.
    void* host = pageable_.data();
    const void* src = host;
    const CUarray arr = reinterpret_cast<CUarray>(0x40);
    const CUDA_MEMCPY2D_v1* c2 = &copy2d_;
    const CUDA_MEMCPY3D_v1* c3 = &copy3d_;
    const CUdeviceptr_v1 dev = 0x1000, dev2 = 0x2000;
    out.push_back(CASE(cuMemcpyHtoDAsync, true, 256, dev, src, 256u, s));
    out.push_back(CASE(cuMemcpyDtoHAsync, true, 128, host, dev, 128u, s));
    out.push_back(CASE(cuMemcpyDtoDAsync, false, 64, dev2, dev, 64u, s));
    out.push_back(CASE(cuMemcpy2DAsync, true, 64, c2, s));
    out.push_back(CASE(cuMemcpy3DAsync, true, 48, c3, s));
    out.push_back(CASE(cuMemcpyHtoAAsync, true, 512, arr, 16u, src, 512u, s));
    out.push_back(CASE(cuMemcpyAtoHAsync, true, 256, host, arr, 32u, 256u, s));
    return out;
  }

  void SetUp() override {
    Scheduling::SetUp();
    loc_.type = CU_MEM_LOCATION_TYPE_DEVICE;
    copy2d_.srcMemoryType = copy2d_.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    copy2d_.WidthInBytes = 16;
    copy2d_.Height = 4;
    copy3d_.srcMemoryType = copy3d_.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    copy3d_.WidthInBytes = 8;
    copy3d_.Height = 2;
    copy3d_.Depth = 3;
    graph_exec_ = make_graph_exec();
    ASSERT_NE(graph_exec_, nullptr);
  }
  void TearDown() override {
    if (graph_exec_ != nullptr) {
      EXPECT_EQ(cuGraphExecDestroy(graph_exec_), CUDA_SUCCESS);
    }
    Scheduling::TearDown();
  }

  std::vector<fake_cuda_call> log_at_return_;
  CUgraphExec graph_exec_ = nullptr;
  CUdeviceptr ptrs_[2] = {0x1000, 0x3000};
  size_t sizes_[2] = {4096, 8192};
  CUmemLocation loc_{};
  size_t loc_idx_ = 0;
  CUmemDecompressParams decompress_{};
  size_t error_index_ = 0;
  CUgraphicsResource resources_[2] = {reinterpret_cast<CUgraphicsResource>(0x70),
                                      reinterpret_cast<CUgraphicsResource>(0x78)};
  std::vector<unsigned char> pageable_ = std::vector<unsigned char>(512, 1);
  CUDA_MEMCPY2D_v1 copy2d_{};
  CUDA_MEMCPY3D_v1 copy3d_{};
};

TEST_F(LateEntryPoints, EachReachesTheDriverOnceAfterTheQueuedKernelWithTheCallersArguments) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.symbol);
    ASSERT_EQ(call_behind_queued_kernel(c), CUDA_SUCCESS);
    const long at_return = find_named(log_at_return_, c.symbol, h(be_));
    if (c.caller_waits) {
      EXPECT_GE(at_return, 0) << "the caller returned before its op reached the driver";
    } else if (scheduled_) {
      EXPECT_EQ(at_return, -1) << "the op overtook the kernel queued before it";
    }
    ASSERT_EQ(cuStreamSynchronize(be_), CUDA_SUCCESS);
    auto log = calls();
    const long k = find_launch(log, k_be_);
    const long op = find_named(log, c.symbol, h(be_));
    ASSERT_GE(k, 0) << "the queued kernel never reached the driver";
    ASSERT_GE(op, 0) << "the call never reached the driver";
    EXPECT_LT(k, op) << "the call overtook the kernel queued before it on its stream";
    EXPECT_EQ(count_named(log, c.symbol), 1u) << "the driver saw the call more than once";
    EXPECT_EQ(log.at(op).value, c.logged_value);
    ASSERT_EQ(log.at(op).param_bytes, c.args.size());
    EXPECT_EQ(std::memcmp(log.at(op).params, c.args.data(), c.args.size()), 0)
        << "the driver received other arguments";
  }
  if (scheduled_) {
    EXPECT_GE(stats().caller_waits, 20u);
  }
}

TEST_F(LateEntryPoints, DriverErrorsReachTheCaller) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.symbol);
    // call_behind_queued_kernel resets the fake first, so the failure is armed by the call.
    Case failing = c;
    const char* symbol = c.symbol;
    failing.call = [call = c.call, symbol] {
      fake_cuda_fail_next(symbol, CUDA_ERROR_INVALID_VALUE);
      return call();
    };
    const CUresult rc = call_behind_queued_kernel(failing);
    if (c.caller_waits || !scheduled_) {
      EXPECT_EQ(rc, CUDA_ERROR_INVALID_VALUE) << "the driver's error was not returned by the call";
    } else {
      // Deferred: the error is reported by the next call that synchronises with the op.
      EXPECT_EQ(rc, CUDA_SUCCESS);
      EXPECT_EQ(cuStreamSynchronize(be_), CUDA_ERROR_INVALID_VALUE);
    }
    EXPECT_EQ(cuStreamSynchronize(be_), CUDA_SUCCESS) << "an error was reported twice";
    auto log = calls();
    const long op = find_named(log, c.symbol, h(be_));
    ASSERT_GE(op, 0);
    EXPECT_EQ(log.at(op).result, CUDA_ERROR_INVALID_VALUE);
    EXPECT_LT(find_launch(log, k_be_), op);
  }
}

// cuGetProcAddress for a version below 3020 returns the v1 ABI; the shim hands out its v1
// wrapper (the exported symbol of that name), never the _v2 one, and a version older than the
// entry point stays unanswered.
TEST_F(LateEntryPoints, OldVersionLookupsGetTheWrapperOfTheSameAbi) {
  auto lookup = [](const char* name, int version, cuuint64_t flags, CUresult expect) {
    void* fn = nullptr;
    CUdriverProcAddressQueryResult status{};
    EXPECT_EQ(cuGetProcAddress_v2(name, &fn, version, flags, &status), expect)
        << name << "@" << version;
    return fn;
  };
  auto shim_symbol = [](const char* symbol) {
    void* fn = dlsym(RTLD_DEFAULT, symbol);
    Dl_info info{};
    EXPECT_TRUE(fn != nullptr && dladdr(fn, &info) != 0 && info.dli_fname != nullptr &&
                std::string(info.dli_fname).find("libgpu_scheduler") != std::string::npos)
        << symbol << " is not the shim's";
    return fn;
  };
  const struct {
    const char* base;
    int version;
    cuuint64_t flags;
    const char* symbol;
  } abis[] = {
      {"cuMemcpyHtoDAsync", 2000, 0, "cuMemcpyHtoDAsync"},
      {"cuMemcpyHtoDAsync", 3020, 0, "cuMemcpyHtoDAsync_v2"},
      {"cuMemcpyDtoHAsync", 3000, 0, "cuMemcpyDtoHAsync"},
      {"cuMemcpyDtoDAsync", 3000, 0, "cuMemcpyDtoDAsync"},
      {"cuMemcpy2DAsync", 2000, 0, "cuMemcpy2DAsync"},
      {"cuMemcpy2DAsync", 12000, 0, "cuMemcpy2DAsync_v2"},
      {"cuMemcpy3DAsync", 2000, 0, "cuMemcpy3DAsync"},
      {"cuMemcpyHtoAAsync", 2000, 0, "cuMemcpyHtoAAsync"},
      {"cuMemcpyAtoHAsync", 2000, 0, "cuMemcpyAtoHAsync"},
      {"cuMemPrefetchBatchAsync", 13000, 0, "cuMemPrefetchBatchAsync"},
      {"cuMemPrefetchBatchAsync", 13000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
       "cuMemPrefetchBatchAsync_ptsz"},
      {"cuMemBatchDecompressAsync", 12060, 0, "cuMemBatchDecompressAsync"},
      {"cuGraphUpload", 12000, CU_GET_PROC_ADDRESS_PER_THREAD_DEFAULT_STREAM,
       "cuGraphUpload_ptsz"},
      {"cuGraphicsUnmapResources", 3000, 0, "cuGraphicsUnmapResources"},
  };
  for (const auto& a : abis) {
    SCOPED_TRACE(std::string(a.base) + "@" + std::to_string(a.version));
    EXPECT_EQ(lookup(a.base, a.version, a.flags, CUDA_SUCCESS), shim_symbol(a.symbol));
  }
  // Older than the entry point: the driver's "not found" passes through, nothing is made up.
  EXPECT_EQ(lookup("cuMemcpyDtoDAsync", 2000, 0, CUDA_ERROR_NOT_FOUND), nullptr);
  EXPECT_EQ(lookup("cuMemcpyHtoDAsync", 1000, 0, CUDA_ERROR_NOT_FOUND), nullptr);
  EXPECT_EQ(lookup("cuMemPrefetchBatchAsync", 12080, 0, CUDA_ERROR_NOT_FOUND), nullptr);

  // The v1 pointer keeps 32-bit semantics end to end: the v1 driver symbol, the same arguments.
  auto htod_v1 = reinterpret_cast<PFN_cuMemcpyHtoDAsync_v2000>(
      lookup("cuMemcpyHtoDAsync", 2000, 0, CUDA_SUCCESS));
  ASSERT_NE(htod_v1, nullptr);
  fake_cuda_reset();
  ASSERT_EQ(htod_v1(0x1000, pageable_.data(), 64, be_), CUDA_SUCCESS);
  ASSERT_EQ(cuStreamSynchronize(be_), CUDA_SUCCESS);
  auto log = calls();
  EXPECT_EQ(count_named(log, "cuMemcpyHtoDAsync"), 1u);
  EXPECT_EQ(count_named(log, "cuMemcpyHtoDAsync_v2"), 0u);
  const long op = find_named(log, "cuMemcpyHtoDAsync", h(be_));
  ASSERT_GE(op, 0);
  const auto expected = packed(CUdeviceptr_v1{0x1000}, static_cast<const void*>(pageable_.data()),
                               64u, be_);
  ASSERT_EQ(log.at(op).param_bytes, expected.size());
  EXPECT_EQ(std::memcmp(log.at(op).params, expected.data(), expected.size()), 0);
}

}  // namespace

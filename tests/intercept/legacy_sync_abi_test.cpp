// The pre-3020 ABIs of the blocking calls: synchronous copies and sets with 32-bit pointers and
// sizes (CUdeviceptr_v1, unsigned int) or the v1 copy structs, and cuMemFree. Like their _v2
// siblings they synchronise with the device, so each must first submit the best-effort work
// queued before it (the drain), then reach the driver exactly once with the caller's arguments,
// and return the driver's result. Each is reached both as the exported symbol (direct linking)
// and through cuGetProcAddress at version 2000. Run twice by ctest: scheduled and pass-through.
//
// Compiled with cuda.h's internal mode, so the unsuffixed names are the v1 symbols.
#include "internal_abi_fixture.h"

namespace {

using namespace icpt_test;

struct Case {
  const char* symbol;  // the v1 symbol, also the cuGetProcAddress base name
  void* exported;      // what direct linking reaches (the shim's symbol under LD_PRELOAD)
  uint64_t logged_value;
  std::vector<unsigned char> args;  // what the driver must receive
  std::function<CUresult(void*)> call_through;  // calls the given pointer with the arguments
};
// One call of the v1 `sym` with the argument list given after `value`.
#define CASE(sym, value, ...)                                                        \
  Case {                                                                             \
    #sym, reinterpret_cast<void*>(&sym), value, packed(__VA_ARGS__), [=](void* fn) { \
      return reinterpret_cast<decltype(&sym)>(fn)(__VA_ARGS__);                      \
    }                                                                                \
  }

size_t count_named(const std::vector<fake_cuda_call>& log, const char* name) {
  size_t n = 0;
  for (const auto& c : log) n += std::strcmp(c.name, name) == 0;
  return n;
}

void* lookup(const char* name, int version, CUresult expect) {
  void* fn = nullptr;
  CUdriverProcAddressQueryResult status{};
  EXPECT_EQ(cuGetProcAddress_v2(name, &fn, version, 0, &status), expect) << name << "@" << version;
  return fn;
}

void* shim_symbol(const char* symbol) {
  void* fn = dlsym(RTLD_DEFAULT, symbol);
  Dl_info info{};
  EXPECT_TRUE(fn != nullptr && dladdr(fn, &info) != 0 && info.dli_fname != nullptr &&
              std::string(info.dli_fname).find("libgpu_scheduler") != std::string::npos)
      << symbol << " is not the shim's";
  return fn;
}

class LegacySyncAbi : public Scheduling {
 protected:
  // Queues a best-effort kernel behind in-flight high-priority work (deferred when scheduling),
  // then makes the blocking call through `fn` and returns its result.
  CUresult call_behind_queued_kernel(const Case& c, void* fn) {
    fake_cuda_reset();
    hold_high_priority();
    EXPECT_EQ(launch(k_be_, be_, 1), CUDA_SUCCESS);
    expect_deferred(k_be_);
    const CUresult rc = c.call_through(fn);
    log_at_return_ = calls();
    return rc;
  }

  std::vector<Case> cases() {
    void* host = host_.data();
    const void* src = host;
    const CUarray arr = reinterpret_cast<CUarray>(0x40), arr2 = reinterpret_cast<CUarray>(0x48);
    const CUDA_MEMCPY2D_v1* c2 = &copy2d_;
    const CUDA_MEMCPY3D_v1* c3 = &copy3d_;
    const CUdeviceptr_v1 dev = 0x1000, dev2 = 0x2000;
    const unsigned char v8 = 0xab;
    const unsigned short v16 = 0xbeef;
    const unsigned int v32 = 0xdeadbeef, pitch = 64;
    std::vector<Case> out;
    out.push_back(CASE(cuMemcpyHtoD, 256, dev, src, 256u));
    out.push_back(CASE(cuMemcpyDtoH, 128, host, dev, 128u));
    out.push_back(CASE(cuMemcpyDtoD, 64, dev2, dev, 64u));
    out.push_back(CASE(cuMemcpyHtoA, 96, arr, 16u, src, 96u));
    out.push_back(CASE(cuMemcpyAtoH, 80, host, arr, 32u, 80u));
    out.push_back(CASE(cuMemcpyAtoD, 72, dev, arr, 8u, 72u));
    out.push_back(CASE(cuMemcpyDtoA, 40, arr, 24u, dev2, 40u));
    out.push_back(CASE(cuMemcpyAtoA, 56, arr2, 4u, arr, 12u, 56u));
    out.push_back(CASE(cuMemcpy2D, 64, c2));
    out.push_back(CASE(cuMemcpy2DUnaligned, 64, c2));
    out.push_back(CASE(cuMemcpy3D, 48, c3));
    out.push_back(CASE(cuMemsetD8, 300, dev, v8, 300u));
    out.push_back(CASE(cuMemsetD16, 150, dev, v16, 150u));
    out.push_back(CASE(cuMemsetD32, 75, dev, v32, 75u));
    out.push_back(CASE(cuMemsetD2D8, 32, dev, pitch, v8, 16u, 2u));
    out.push_back(CASE(cuMemsetD2D16, 24, dev2, pitch, v16, 8u, 3u));
    out.push_back(CASE(cuMemsetD2D32, 20, dev, pitch, v32, 4u, 5u));
    out.push_back(CASE(cuMemFree, 0x3000, CUdeviceptr_v1{0x3000}));
    return out;
  }

  void SetUp() override {
    Scheduling::SetUp();
    copy2d_.srcMemoryType = copy2d_.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    copy2d_.srcDevice = 0x1000;
    copy2d_.dstDevice = 0x2000;
    copy2d_.WidthInBytes = 16;
    copy2d_.Height = 4;
    copy3d_.srcMemoryType = copy3d_.dstMemoryType = CU_MEMORYTYPE_DEVICE;
    copy3d_.WidthInBytes = 8;
    copy3d_.Height = 2;
    copy3d_.Depth = 3;
  }

  // Checks the log at the call's return: the call reached the driver exactly once, after the
  // kernel queued before it, with the caller's arguments, and got `result` there.
  void expect_drained_then_called(const Case& c, CUresult result) {
    const auto& log = log_at_return_;
    const long k = find_launch(log, k_be_);
    const long op = find_named(log, c.symbol, 0);
    ASSERT_GE(op, 0) << "the call returned before it reached the driver";
    ASSERT_GE(k, 0) << "the best-effort kernel queued before the call was not drained";
    EXPECT_LT(k, op) << "the call overtook the kernel queued before it";
    EXPECT_EQ(count_named(log, c.symbol), 1u) << "the driver saw the call more than once";
    EXPECT_EQ(log.at(op).result, result);
    EXPECT_EQ(log.at(op).value, c.logged_value);
    ASSERT_EQ(log.at(op).param_bytes, c.args.size());
    EXPECT_EQ(std::memcmp(log.at(op).params, c.args.data(), c.args.size()), 0)
        << "the driver received other arguments";
  }

  std::vector<fake_cuda_call> log_at_return_;
  std::vector<unsigned char> host_ = std::vector<unsigned char>(512, 1);
  CUDA_MEMCPY2D_v1 copy2d_{};
  CUDA_MEMCPY3D_v1 copy3d_{};
};

TEST_F(LegacySyncAbi, ExportedSymbolsDrainQueuedWorkThenCallTheDriverOnce) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.symbol);
    ASSERT_EQ(call_behind_queued_kernel(c, c.exported), CUDA_SUCCESS);
    expect_drained_then_called(c, CUDA_SUCCESS);
    // High priority is still in flight, yet nothing may stay held back past a blocking call.
    EXPECT_EQ(stats().queued_now, 0u);
  }
}

TEST_F(LegacySyncAbi, Version2000LookupsDrainQueuedWorkThenCallTheDriverOnce) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.symbol);
    void* fn = lookup(c.symbol, 2000, CUDA_SUCCESS);
    ASSERT_NE(fn, nullptr);
    ASSERT_EQ(call_behind_queued_kernel(c, fn), CUDA_SUCCESS);
    expect_drained_then_called(c, CUDA_SUCCESS);
  }
}

TEST_F(LegacySyncAbi, DriverErrorsReachTheCaller) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.symbol);
    Case failing = c;
    failing.call_through = [call = c.call_through, symbol = c.symbol](void* fn) {
      fake_cuda_fail_next(symbol, CUDA_ERROR_INVALID_VALUE);
      return call(fn);
    };
    EXPECT_EQ(call_behind_queued_kernel(failing, c.exported), CUDA_ERROR_INVALID_VALUE)
        << "the driver's error was not returned by the call";
    expect_drained_then_called(c, CUDA_ERROR_INVALID_VALUE);
    EXPECT_EQ(cuCtxSynchronize(), CUDA_SUCCESS) << "the error was reported twice";
  }
}

// Below 3020 a lookup gets the shim's v1 wrapper (the exported symbol of that name), from 3020
// the _v2 one; below the entry point's first version the driver's "not found" passes through.
TEST_F(LegacySyncAbi, LookupsGetTheWrapperOfTheRequestedAbi) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.symbol);
    EXPECT_EQ(lookup(c.symbol, 2000, CUDA_SUCCESS), shim_symbol(c.symbol));
    EXPECT_EQ(lookup(c.symbol, 3010, CUDA_SUCCESS), shim_symbol(c.symbol));
    const std::string v2 = std::string(c.symbol) + "_v2";
    EXPECT_EQ(lookup(c.symbol, 3020, CUDA_SUCCESS), shim_symbol(v2.c_str()));
    EXPECT_NE(shim_symbol(c.symbol), shim_symbol(v2.c_str()));
    EXPECT_EQ(lookup(c.symbol, 1000, CUDA_ERROR_NOT_FOUND), nullptr);
  }
}

}  // namespace

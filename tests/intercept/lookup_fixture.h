// The scheduling fixture plus cuGetProcAddress_v2 as libcudart reaches it (dlopen of the driver,
// dlsym of the symbol: the shim's), for the suites that check what a lookup hands out.
#pragma once

#include <cudaTypedefs.h>

#include "scheduling_fixture.h"

namespace icpt_test {

class ProcLookup : public Scheduling {
 protected:
  void SetUp() override {
    Scheduling::SetUp();
    if (HasFatalFailure()) return;
    driver_ = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(driver_, nullptr) << dlerror();
    get_proc_ = reinterpret_cast<PFN_cuGetProcAddress_v12000>(dlsym(driver_, "cuGetProcAddress_v2"));
    ASSERT_NE(get_proc_, nullptr);
  }
  void TearDown() override {
    if (driver_ != nullptr) dlclose(driver_);
    Scheduling::TearDown();
  }
  void* lookup(const char* name, int version, cuuint64_t flags = 0) {
    void* fn = nullptr;
    CUdriverProcAddressQueryResult status{};
    EXPECT_EQ(get_proc_(name, &fn, version, flags, &status), CUDA_SUCCESS) << name << "@" << version;
    return fn;
  }
  // Whether the shim stopped holding work back for good (orion_stats.holding_stopped).
  static bool holding_stopped() { return stats().holding_stopped != 0; }
  using LaunchFn = CUresult(CUDAAPI*)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned,
                                      unsigned, CUstream, void**, void**);

  void* driver_ = nullptr;
  PFN_cuGetProcAddress_v12000 get_proc_ = nullptr;
};

// A driver newer than the shim's build: from kNewer on, the fake answers some functions with
// entry points of another ABI (fake_cuda_set_newer_launch_abi).
class NewerDriver : public ProcLookup {
 protected:
  static constexpr int kNewer = CUDA_VERSION + 10;
  void SetUp() override {
    ProcLookup::SetUp();
    fake_cuda_set_newer_launch_abi(kNewer);
  }
};

}  // namespace icpt_test

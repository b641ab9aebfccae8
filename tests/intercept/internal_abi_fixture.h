// Shared by the tests that call the driver's old ABIs by their exact names: cuda.h in internal
// mode (every ABI declared under its own name, e.g. the v1 cuMemcpyHtoD with 32-bit sizes) and a
// helper packing call arguments the way the fake driver records them. Include first.
#pragma once

#define __CUDA_API_VERSION_INTERNAL 1
#include <cuda.h>
#include <cudaTypedefs.h>
// In this mode cuStreamDestroy names the pre-4000 symbol; the fixture means the current ABI.
#define cuStreamDestroy cuStreamDestroy_v2

#include <string>
#include <vector>

#include "scheduling_fixture.h"

namespace icpt_test {

template <typename... Args>
std::vector<unsigned char> packed(const Args&... args) {
  std::vector<unsigned char> bytes(FAKE_CUDA_MAX_PARAM_BYTES);
  bytes.resize(fake_cuda_pack_args(bytes.data(), bytes.size(), args...));
  return bytes;
}

}  // namespace icpt_test

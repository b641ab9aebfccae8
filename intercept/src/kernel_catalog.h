// What the shim knows about each kernel function (CUfunction, or a CUkernel passed as one):
// its name, its parameter layout (for deep-copying arguments of deferred launches) and whether it
// is a communication kernel. Looked up once per function through the real driver, then cached
// for the process lifetime (so KernelInfo::name pointers stay valid).
#pragma once

#include <atomic>
#include <cstddef>
#include <string>
#include <vector>

#include "cuda_api.h"

namespace orion {

struct FunctionInfo {
  std::string name;                 // empty when the driver cannot tell
  bool params_known = false;        // cuFuncGetParamInfo / cuKernelGetParamInfo answered
  std::vector<size_t> param_offsets;
  std::vector<size_t> param_sizes;
  size_t param_bytes = 0;           // offset + size of the last parameter
  bool communication = false;       // NCCL: ncclDevKernel_* / ncclSymkDevKernel_* / ncclKernel*
  // The name as registered with the scheduler's profile store (set on first launch).
  mutable std::atomic<const char*> registered_name{nullptr};
};

// Never returns nullptr. Thread-safe; cached per thread after the first lookup.
const FunctionInfo& function_info(CUfunction f);

// True for names of kernels that spin waiting for peers (never deferred), as cuFuncGetName returns
// them (mangled or not).
bool is_communication_kernel(const std::string& name);

}  // namespace orion

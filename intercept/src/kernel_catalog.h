// What the shim knows about each kernel function (CUfunction, or a CUkernel passed as one):
// its name, its parameter layout (for deep-copying arguments of deferred launches) and whether it
// is a communication kernel. Looked up once per function through the real driver, then cached
// until a module or library is unloaded (entries are never freed, so references stay valid).
#pragma once

#include <atomic>
#include <cstddef>
#include <string>
#include <vector>

#include "cuda_api.h"

namespace orion {

struct FunctionInfo {
  std::string name;                 // empty when the driver cannot tell
  // cuFuncGetParamInfo (a CUfunction) or cuKernelGetParamInfo (a CUkernel passed as one) gave
  // the layout. CUDA_ERROR_INVALID_VALUE at index 0 is ambiguous (no parameters, or a handle that
  // API family does not take): unknown, so a launch with arguments makes its caller wait.
  bool params_known = false;
  std::vector<size_t> param_offsets;
  std::vector<size_t> param_sizes;
  size_t param_bytes = 0;           // offset + size of the last parameter
  bool communication = false;       // NCCL: ncclDevKernel_* / ncclSymkDevKernel_* / ncclKernel*
  // The name as registered with the scheduler's profile store (set on first launch).
  mutable std::atomic<const char*> registered_name{nullptr};
};

// Never returns nullptr. Thread-safe; cached per thread after the first lookup. The reference
// stays valid for the process lifetime (entries forgotten are kept, not freed).
const FunctionInfo& function_info(CUfunction f);

// A module or library was unloaded: its function handles may be reused for other kernels, so
// every entry is looked up afresh from now on (per-thread caches included).
void forget_all_functions();

// True for names of kernels that spin waiting for peers (never deferred), as cuFuncGetName returns
// them (mangled or not).
bool is_communication_kernel(const std::string& name);

}  // namespace orion

#include "kernel_catalog.h"

#include <algorithm>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string_view>
#include <unordered_map>

#include "real_driver.h"

namespace orion {
namespace {

std::shared_mutex g_mutex;
// Entries are never erased: their names are handed out as stable pointers.
std::unordered_map<CUfunction, std::unique_ptr<FunctionInfo>>* g_catalog = nullptr;

FunctionInfo* build(CUfunction f) {
  auto info = std::make_unique<FunctionInfo>();
  const char* name = nullptr;
  if (real::cuFuncGetName && real::cuFuncGetName(&name, f) == CUDA_SUCCESS && name) {
    info->name = name;
  } else if (real::cuKernelGetName &&
             real::cuKernelGetName(&name, reinterpret_cast<CUkernel>(f)) == CUDA_SUCCESS && name) {
    info->name = name;
  }
  info->communication = is_communication_kernel(info->name);

  // Parameter layout: ask until the driver says the index is past the end.
  auto query = [&](size_t i, size_t* off, size_t* size) -> CUresult {
    if (real::cuFuncGetParamInfo) {
      CUresult rc = real::cuFuncGetParamInfo(f, i, off, size);
      if (rc == CUDA_SUCCESS || rc == CUDA_ERROR_INVALID_VALUE || !real::cuKernelGetParamInfo) return rc;
    }
    if (real::cuKernelGetParamInfo) {
      return real::cuKernelGetParamInfo(reinterpret_cast<CUkernel>(f), i, off, size);
    }
    return CUDA_ERROR_NOT_SUPPORTED;
  };
  for (size_t i = 0;; ++i) {
    size_t off = 0, size = 0;
    CUresult rc = query(i, &off, &size);
    if (rc == CUDA_SUCCESS) {
      info->param_offsets.push_back(off);
      info->param_sizes.push_back(size);
      info->param_bytes = std::max(info->param_bytes, off + size);
      continue;
    }
    // Index 0 invalid means "no parameters"; anything else means "cannot know".
    info->params_known = (rc == CUDA_ERROR_INVALID_VALUE);
    if (!info->params_known) {
      info->param_offsets.clear();
      info->param_sizes.clear();
      info->param_bytes = 0;
    }
    break;
  }
  std::unique_lock lock(g_mutex);
  if (g_catalog == nullptr) g_catalog = new std::unordered_map<CUfunction, std::unique_ptr<FunctionInfo>>();
  auto [it, inserted] = g_catalog->try_emplace(f, std::move(info));
  return it->second.get();
}

const FunctionInfo* find(CUfunction f) {
  std::shared_lock lock(g_mutex);
  if (g_catalog == nullptr) return nullptr;
  auto it = g_catalog->find(f);
  return it == g_catalog->end() ? nullptr : it->second.get();
}

// Small direct-mapped per-thread cache in front of the shared map: most launches hit it.
struct ThreadCache {
  static constexpr size_t kSlots = 64;
  CUfunction keys[kSlots] = {};
  const FunctionInfo* values[kSlots] = {};
};
thread_local ThreadCache t_cache;

}  // namespace

namespace {

// The unqualified identifier a kernel name starts with: the name itself, or for an Itanium-mangled
// function name (_Z<len><id>..., _ZN<len><id>...E...) its first source name.
std::string_view leading_identifier(std::string_view name) {
  if (!name.starts_with("_Z")) return name;
  size_t i = 2;
  if (i < name.size() && name[i] == 'N') ++i;
  size_t len = 0, digits = 0;
  while (i < name.size() && name[i] >= '0' && name[i] <= '9') {
    len = len * 10 + static_cast<size_t>(name[i] - '0');
    ++i;
    ++digits;
  }
  if (digits == 0 || len > name.size() - i) return {};
  return name.substr(i, len);
}

}  // namespace

bool is_communication_kernel(const std::string& name) {
  // NCCL 2.28 names: ncclDevKernel_* (mangled by cuFuncGetName), ncclSymkDevKernel_* (the
  // symmetric-memory kernels); older releases: ncclKernel*.
  const std::string_view id = leading_identifier(name);
  return id.starts_with("ncclDevKernel_") || id.starts_with("ncclSymkDevKernel_") ||
         id.starts_with("ncclKernel");
}

const FunctionInfo& function_info(CUfunction f) {
  size_t slot = (reinterpret_cast<uintptr_t>(f) >> 4) % ThreadCache::kSlots;
  if (t_cache.keys[slot] == f && t_cache.values[slot] != nullptr) return *t_cache.values[slot];
  const FunctionInfo* info = find(f);
  if (info == nullptr) info = build(f);
  t_cache.keys[slot] = f;
  t_cache.values[slot] = info;
  return *info;
}

}  // namespace orion

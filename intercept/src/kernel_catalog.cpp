#include "kernel_catalog.h"

#include <algorithm>
#include <atomic>
#include <vector>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string_view>
#include <unordered_map>

#include "real_driver.h"

namespace orion {
namespace {

std::shared_mutex g_mutex;
// Entries are never freed: references to them are handed out. Forgotten ones move to g_retired.
std::unordered_map<CUfunction, std::unique_ptr<FunctionInfo>>* g_catalog = nullptr;
std::vector<std::unique_ptr<FunctionInfo>>* g_retired = nullptr;
// Bumped by forget_all_functions(): per-thread caches of an older generation are stale.
std::atomic<uint64_t> g_generation{0};

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

  // Parameter layout. Index 0 decides which API family knows the handle (a CUfunction, or a
  // CUkernel passed as one); then ask that family until it says the index is past the end.
  using Query = CUresult (*)(CUfunction, size_t, size_t*, size_t*);
  Query query = nullptr;
  size_t off = 0, size = 0;
  if (real::cuFuncGetParamInfo && real::cuFuncGetParamInfo(f, 0, &off, &size) == CUDA_SUCCESS) {
    query = [](CUfunction fn, size_t i, size_t* o, size_t* sz) {
      return real::cuFuncGetParamInfo(fn, i, o, sz);
    };
  } else if (real::cuKernelGetParamInfo &&
             real::cuKernelGetParamInfo(reinterpret_cast<CUkernel>(f), 0, &off, &size) ==
                 CUDA_SUCCESS) {
    query = [](CUfunction fn, size_t i, size_t* o, size_t* sz) {
      return real::cuKernelGetParamInfo(reinterpret_cast<CUkernel>(fn), i, o, sz);
    };
  }
  if (query != nullptr) {
    info->param_offsets.push_back(off);
    info->param_sizes.push_back(size);
    info->param_bytes = off + size;
    for (size_t i = 1;; ++i) {
      CUresult rc = query(f, i, &off, &size);
      if (rc == CUDA_SUCCESS) {
        info->param_offsets.push_back(off);
        info->param_sizes.push_back(size);
        info->param_bytes = std::max(info->param_bytes, off + size);
        continue;
      }
      // Past the last parameter; anything else means "cannot know".
      info->params_known = (rc == CUDA_ERROR_INVALID_VALUE);
      break;
    }
  }
  if (!info->params_known) {
    info->param_offsets.clear();
    info->param_sizes.clear();
    info->param_bytes = 0;
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
  uint64_t generation = 0;
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

void forget_all_functions() {
  std::unique_lock lock(g_mutex);
  if (g_catalog != nullptr) {
    if (g_retired == nullptr) g_retired = new std::vector<std::unique_ptr<FunctionInfo>>();
    for (auto& [f, info] : *g_catalog) g_retired->push_back(std::move(info));
    g_catalog->clear();
  }
  g_generation.fetch_add(1, std::memory_order_acq_rel);
}

const FunctionInfo& function_info(CUfunction f) {
  const uint64_t generation = g_generation.load(std::memory_order_acquire);
  if (t_cache.generation != generation) t_cache = ThreadCache{generation};
  size_t slot = (reinterpret_cast<uintptr_t>(f) >> 4) % ThreadCache::kSlots;
  if (t_cache.keys[slot] == f && t_cache.values[slot] != nullptr) return *t_cache.values[slot];
  const FunctionInfo* info = find(f);
  if (info == nullptr) info = build(f);
  t_cache.keys[slot] = f;
  t_cache.values[slot] = info;
  return *info;
}

}  // namespace orion

// Host memory the fake driver knows: page-locked allocations (cuMemAllocHost, cuMemHostAlloc,
// freed by cuMemFreeHost) and registered program memory (cuMemHostRegister, cuMemHostUnregister).
// cuPointerGetAttribute answers CU_MEMORYTYPE_HOST for it (so the shim may hold a copy from it),
// and a copy that reaches the driver after its host memory ended fails, as the real driver's
// would read freed memory: the rule a shim holding such a copy past cuMemFreeHost breaks.
#include <cstdlib>

#include "fake_cuda_state.h"

namespace fake_cuda_impl {

namespace {
// The range containing p (live or not), or end.
std::map<uintptr_t, HostRange>::const_iterator range_of(const State& s, const void* p) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = s.host.upper_bound(a);
  if (it == s.host.begin()) return s.host.end();
  --it;
  return a < it->first + it->second.bytes ? it : s.host.end();
}

CUresult add_range(const char* name, void* p, size_t bytes, bool owned) {
  State& s = st();
  std::lock_guard lock(s.mu);
  fake_cuda_call& c = begin(s, name);
  c.value = bytes;
  if (CUresult rc = unsafe_call(s); rc != CUDA_SUCCESS) return finish(s, c, rc);
  if (current_ctx() == 0) return finish(s, c, CUDA_ERROR_INVALID_CONTEXT);
  auto it = range_of(s, p);
  if (it != s.host.end() && it->second.live) return finish(s, c, CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED);
  s.host[reinterpret_cast<uintptr_t>(p)] = HostRange{bytes, true, owned};
  return finish(s, c);
}

CUresult end_range(const char* name, void* p, bool owned) {
  State& s = st();
  std::lock_guard lock(s.mu);
  fake_cuda_call& c = begin(s, name);
  c.value = reinterpret_cast<uint64_t>(p);
  if (CUresult rc = unsafe_call(s); rc != CUDA_SUCCESS) return finish(s, c, rc);
  auto it = s.host.find(reinterpret_cast<uintptr_t>(p));
  if (it == s.host.end() || !it->second.live || it->second.owned != owned) {
    return finish(s, c, owned ? CUDA_ERROR_INVALID_VALUE : CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED);
  }
  it->second.live = false;
  // Owned memory is kept allocated (never reused by malloc), so a late copy is caught by the
  // range check, not by reading freed memory.
  return finish(s, c);
}
}  // namespace

bool host_pinned(const State& s, const void* p) {
  auto it = range_of(s, p);
  return it != s.host.end() && it->second.live;
}

bool host_freed(const State& s, const void* p, size_t n) {
  for (const void* q : {p, static_cast<const void*>(static_cast<const char*>(p) + (n ? n - 1 : 0))}) {
    auto it = range_of(s, q);
    if (it != s.host.end() && !it->second.live) return true;
  }
  return false;
}

}  // namespace fake_cuda_impl

using namespace fake_cuda_impl;

FAKE_EXPORT CUresult CUDAAPI cuMemAllocHost_v2(void** pp, size_t bytes) {
  if (pp == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  *pp = std::calloc(1, bytes);
  return add_range("cuMemAllocHost_v2", *pp, bytes, true);
}
FAKE_EXPORT CUresult CUDAAPI cuMemHostAlloc(void** pp, size_t bytes, unsigned int) {
  if (pp == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  *pp = std::calloc(1, bytes);
  return add_range("cuMemHostAlloc", *pp, bytes, true);
}
FAKE_EXPORT CUresult CUDAAPI cuMemFreeHost(void* p) { return end_range("cuMemFreeHost", p, true); }
FAKE_EXPORT CUresult CUDAAPI cuMemHostRegister_v2(void* p, size_t bytes, unsigned int) {
  if (p == nullptr || bytes == 0) return CUDA_ERROR_INVALID_VALUE;
  return add_range("cuMemHostRegister_v2", p, bytes, false);
}
FAKE_EXPORT CUresult CUDAAPI cuMemHostUnregister(void* p) {
  return end_range("cuMemHostUnregister", p, false);
}
// Copies with a host side: host memory freed or unregistered before the copy reached the driver
// fails it (counted by fake_cuda_host_use_after_free). `freed` names the sides to look at.
#define FAKE_HOST_COPY(sym, PARAMS, freed)                                                \
  FAKE_EXPORT CUresult CUDAAPI sym PARAMS {                                             \
    {                                                                                   \
      State& st_ = st();                                                                \
      std::lock_guard lock(st_.mu);                                                     \
      if (freed) {                                                                      \
        ++st_.host_use_after_free;                                                      \
        fake_cuda_call& c = begin(st_, #sym);                                           \
        c.stream = reinterpret_cast<uint64_t>(s);                                       \
        c.value = n;                                                                    \
        return finish(st_, c, CUDA_ERROR_INVALID_VALUE);                                \
      }                                                                                 \
    }                                                                                   \
    return simple(#sym, s, n, 100, false);                                              \
  }
#define FAKE_HOST_COPY2(sym, PARAMS, freed) \
  FAKE_HOST_COPY(sym, PARAMS, freed)        \
  FAKE_HOST_COPY(sym##_ptsz, PARAMS, freed)
FAKE_HOST_COPY2(cuMemcpyHtoDAsync_v2, (CUdeviceptr, const void* src, size_t n, CUstream s), host_freed(st_, src, n))
FAKE_HOST_COPY2(cuMemcpyDtoHAsync_v2, (void* dst, CUdeviceptr, size_t n, CUstream s), host_freed(st_, dst, n))
FAKE_HOST_COPY2(cuMemcpyHtoAAsync_v2, (CUarray, size_t, const void* src, size_t n, CUstream s), host_freed(st_, src, n))
FAKE_HOST_COPY2(cuMemcpyAtoHAsync_v2, (void* dst, CUarray, size_t, size_t n, CUstream s), host_freed(st_, dst, n))
// Unified addressing: either side may be host memory.
FAKE_HOST_COPY2(cuMemcpyAsync, (CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s),
                host_freed(st_, reinterpret_cast<const void*>(dst), n) ||
                    host_freed(st_, reinterpret_cast<const void*>(src), n))

FAKE_EXPORT uint64_t fake_cuda_host_use_after_free(void) {
  State& s = st();
  std::lock_guard lock(s.mu);
  return s.host_use_after_free;
}

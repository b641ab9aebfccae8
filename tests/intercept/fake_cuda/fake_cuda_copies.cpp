// The fake driver's copies, sets, stream memory ops, callbacks and stream-ordered allocations:
// each one logged op on its stream's virtual timeline (simple() in fake_cuda.cpp), with the size
// or value a test checks; the ones without a stream are synchronous, so potentially unsafe during
// a capture. Host memory's own rules are in fake_cuda_memory.cpp.
#include "fake_cuda_state.h"  // first: it selects cuda.h's internal (all-variants) mode

#include <cstring>
#include <cstddef>
#include <mutex>
#include <type_traits>

using namespace fake_cuda_impl;

// ---------------- copies, sets, pools ----------------

#define FAKE_UNPAREN(...) __VA_ARGS__
// A call without a stream (nullptr) is synchronous: potentially unsafe during a capture.
#define FAKE_SIMPLE(sym, PARAMS, stream, value)                                         \
  FAKE_EXPORT CUresult CUDAAPI sym PARAMS {                                             \
    return simple(#sym, stream, value, 100,                                             \
                  std::is_same_v<std::remove_cvref_t<decltype(stream)>, std::nullptr_t>); \
  }
#define FAKE_SIMPLE2(sym, sym_pt, PARAMS, stream, value) \
  FAKE_SIMPLE(sym, PARAMS, stream, value)                \
  FAKE_SIMPLE(sym_pt, PARAMS, stream, value)

FAKE_SIMPLE2(cuMemcpyDtoDAsync_v2, cuMemcpyDtoDAsync_v2_ptsz, (CUdeviceptr, CUdeviceptr, size_t n, CUstream s), s, n)
FAKE_SIMPLE2(cuMemcpy2DAsync_v2, cuMemcpy2DAsync_v2_ptsz, (const CUDA_MEMCPY2D*, CUstream s), s, 0)
FAKE_SIMPLE2(cuMemcpy3DAsync_v2, cuMemcpy3DAsync_v2_ptsz, (const CUDA_MEMCPY3D*, CUstream s), s, 0)
FAKE_SIMPLE2(cuMemcpyPeerAsync, cuMemcpyPeerAsync_ptsz, (CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, size_t n, CUstream s), s, n)
FAKE_SIMPLE2(cuMemsetD8Async, cuMemsetD8Async_ptsz, (CUdeviceptr, unsigned char, size_t n, CUstream s), s, n)
FAKE_SIMPLE2(cuMemsetD16Async, cuMemsetD16Async_ptsz, (CUdeviceptr, unsigned short, size_t n, CUstream s), s, n)
FAKE_SIMPLE2(cuMemsetD32Async, cuMemsetD32Async_ptsz, (CUdeviceptr, unsigned int, size_t n, CUstream s), s, n)
FAKE_SIMPLE2(cuMemsetD2D8Async, cuMemsetD2D8Async_ptsz, (CUdeviceptr, size_t, unsigned char, size_t w, size_t h, CUstream s), s, w * h)
FAKE_SIMPLE2(cuMemsetD2D16Async, cuMemsetD2D16Async_ptsz, (CUdeviceptr, size_t, unsigned short, size_t w, size_t h, CUstream s), s, w * h)
FAKE_SIMPLE2(cuMemsetD2D32Async, cuMemsetD2D32Async_ptsz, (CUdeviceptr, size_t, unsigned int, size_t w, size_t h, CUstream s), s, w * h)
FAKE_SIMPLE2(cuMemFreeAsync, cuMemFreeAsync_ptsz, (CUdeviceptr p, CUstream s), s, p)
FAKE_SIMPLE2(cuMemcpy, cuMemcpy_ptds, (CUdeviceptr, CUdeviceptr, size_t n), nullptr, n)
FAKE_SIMPLE2(cuMemcpyHtoD_v2, cuMemcpyHtoD_v2_ptds, (CUdeviceptr, const void*, size_t n), nullptr, n)
FAKE_SIMPLE2(cuMemcpyDtoH_v2, cuMemcpyDtoH_v2_ptds, (void*, CUdeviceptr, size_t n), nullptr, n)
FAKE_SIMPLE2(cuMemcpyDtoD_v2, cuMemcpyDtoD_v2_ptds, (CUdeviceptr, CUdeviceptr, size_t n), nullptr, n)
FAKE_SIMPLE2(cuMemsetD8_v2, cuMemsetD8_v2_ptds, (CUdeviceptr, unsigned char, size_t n), nullptr, n)
FAKE_SIMPLE2(cuMemsetD32_v2, cuMemsetD32_v2_ptds, (CUdeviceptr, unsigned int, size_t n), nullptr, n)
FAKE_SIMPLE(cuMemFree_v2, (CUdeviceptr p), nullptr, p)

#define FAKE_ALLOC_ASYNC(sym)                                                   \
  FAKE_EXPORT CUresult CUDAAPI sym(CUdeviceptr* p, size_t n, CUstream s) {      \
    CUresult rc = simple(#sym, s, n);                                           \
    if (rc == CUDA_SUCCESS) {                                                   \
      std::lock_guard lock(st().mu);                                            \
      *p = st().next_devptr += ((n + 255) / 256 + 1) * 256;                     \
    }                                                                           \
    return rc;                                                                  \
  }
FAKE_ALLOC_ASYNC(cuMemAllocAsync)
FAKE_ALLOC_ASYNC(cuMemAllocAsync_ptsz)


// ---------------- synchronous 2D/3D/peer copies, batch copies, stream memory ops ----------------

FAKE_SIMPLE2(cuMemcpy2D_v2, cuMemcpy2D_v2_ptds, (const CUDA_MEMCPY2D* p), nullptr, p ? p->WidthInBytes * p->Height : 0)
FAKE_SIMPLE2(cuMemcpy2DUnaligned_v2, cuMemcpy2DUnaligned_v2_ptds, (const CUDA_MEMCPY2D* p), nullptr, p ? p->WidthInBytes * p->Height : 0)
FAKE_SIMPLE2(cuMemcpy3D_v2, cuMemcpy3D_v2_ptds, (const CUDA_MEMCPY3D* p), nullptr, p ? p->WidthInBytes * p->Height * p->Depth : 0)
FAKE_SIMPLE2(cuMemcpyPeer, cuMemcpyPeer_ptds, (CUdeviceptr, CUcontext, CUdeviceptr, CUcontext, size_t n), nullptr, n)
FAKE_SIMPLE2(cuMemcpy3DPeer, cuMemcpy3DPeer_ptds, (const CUDA_MEMCPY3D_PEER* p), nullptr, p ? p->WidthInBytes * p->Height * p->Depth : 0)
FAKE_SIMPLE2(cuMemcpy3DPeerAsync, cuMemcpy3DPeerAsync_ptsz, (const CUDA_MEMCPY3D_PEER* p, CUstream s), s, p ? p->WidthInBytes * p->Height * p->Depth : 0)
// Batch copies log the sum of their sizes.
namespace {
uint64_t sum_sizes(const size_t* sizes, size_t count) {
  uint64_t n = 0;
  for (size_t i = 0; sizes != nullptr && i < count; ++i) n += sizes[i];
  return n;
}
}  // namespace
FAKE_SIMPLE2(cuMemcpyBatchAsync, cuMemcpyBatchAsync_ptsz, (CUdeviceptr*, CUdeviceptr*, size_t* sizes, size_t count, CUmemcpyAttributes*, size_t*, size_t, size_t*, CUstream s), s, sum_sizes(sizes, count))
FAKE_SIMPLE2(cuMemcpyBatchAsync_v2, cuMemcpyBatchAsync_v2_ptsz, (CUdeviceptr*, CUdeviceptr*, size_t* sizes, size_t count, CUmemcpyAttributes*, size_t*, size_t, CUstream s), s, sum_sizes(sizes, count))
FAKE_SIMPLE2(cuMemcpy3DBatchAsync, cuMemcpy3DBatchAsync_ptsz, (size_t n, CUDA_MEMCPY3D_BATCH_OP*, size_t*, unsigned long long, CUstream s), s, n)
FAKE_SIMPLE2(cuMemcpy3DBatchAsync_v2, cuMemcpy3DBatchAsync_v2_ptsz, (size_t n, CUDA_MEMCPY3D_BATCH_OP*, unsigned long long, CUstream s), s, n)
// Memory ops log the value written/waited for (batches: the sum of their values, so a test can
// check the array the driver received).
#define FAKE_MEMOP4(name, value_t)                                                          \
  FAKE_SIMPLE2(name, name##_ptsz, (CUstream s, CUdeviceptr, value_t v, unsigned int), s, v) \
  FAKE_SIMPLE2(name##_v2, name##_v2_ptsz, (CUstream s, CUdeviceptr, value_t v, unsigned int), s, v)
FAKE_MEMOP4(cuStreamWriteValue32, cuuint32_t)
FAKE_MEMOP4(cuStreamWriteValue64, cuuint64_t)
FAKE_MEMOP4(cuStreamWaitValue32, cuuint32_t)
FAKE_MEMOP4(cuStreamWaitValue64, cuuint64_t)
namespace {
uint64_t sum_values(const CUstreamBatchMemOpParams* p, unsigned count) {
  uint64_t n = 0;
  for (unsigned i = 0; p != nullptr && i < count; ++i) {
    switch (p[i].operation) {
      case CU_STREAM_MEM_OP_WAIT_VALUE_32: n += p[i].waitValue.value; break;
      case CU_STREAM_MEM_OP_WAIT_VALUE_64: n += p[i].waitValue.value64; break;
      case CU_STREAM_MEM_OP_WRITE_VALUE_32: n += p[i].writeValue.value; break;
      case CU_STREAM_MEM_OP_WRITE_VALUE_64: n += p[i].writeValue.value64; break;
      default: break;
    }
  }
  return n;
}
}  // namespace
FAKE_SIMPLE2(cuStreamBatchMemOp, cuStreamBatchMemOp_ptsz, (CUstream s, unsigned count, CUstreamBatchMemOpParams* p, unsigned int), s, sum_values(p, count))
FAKE_SIMPLE2(cuStreamBatchMemOp_v2, cuStreamBatchMemOp_v2_ptsz, (CUstream s, unsigned count, CUstreamBatchMemOpParams* p, unsigned int), s, sum_values(p, count))

// ---------------- callbacks, prefetch, CUDA-array copies, pools, semaphores, attach ----------------
// Stream callbacks run when submitted (like host functions) and log their user data.
#define FAKE_STREAM_CALLBACK(sym)                                                            \
  FAKE_EXPORT CUresult CUDAAPI sym(CUstream s, CUstreamCallback cb, void* data, unsigned int) { \
    CUresult rc = simple(#sym, s, reinterpret_cast<uint64_t>(data));                         \
    if (rc == CUDA_SUCCESS && cb != nullptr) cb(s, CUDA_SUCCESS, data);                      \
    return rc;                                                                               \
  }
FAKE_STREAM_CALLBACK(cuStreamAddCallback)
FAKE_STREAM_CALLBACK(cuStreamAddCallback_ptsz)
// The range's attributes (synchronous, no stream): logged, their value the first byte zeroed.
FAKE_EXPORT CUresult CUDAAPI cuMemRangeGetAttribute(void* data, size_t size, CUmem_range_attribute, CUdeviceptr p, size_t) {
  if (data == nullptr || size == 0) return CUDA_ERROR_INVALID_VALUE;
  std::memset(data, 0, size);
  return simple("cuMemRangeGetAttribute", nullptr, p, 0, true);
}
FAKE_SIMPLE2(cuMemPrefetchAsync, cuMemPrefetchAsync_ptsz, (CUdeviceptr, size_t n, CUdevice, CUstream s), s, n)
FAKE_SIMPLE2(cuMemPrefetchAsync_v2, cuMemPrefetchAsync_v2_ptsz, (CUdeviceptr, size_t n, CUmemLocation, unsigned int, CUstream s), s, n)
FAKE_SIMPLE2(cuStreamAttachMemAsync, cuStreamAttachMemAsync_ptsz, (CUstream s, CUdeviceptr, size_t n, unsigned int), s, n)
// External semaphores log the number of semaphores.
FAKE_SIMPLE2(cuSignalExternalSemaphoresAsync, cuSignalExternalSemaphoresAsync_ptsz, (const CUexternalSemaphore*, const CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS*, unsigned int n, CUstream s), s, n)
FAKE_SIMPLE2(cuWaitExternalSemaphoresAsync, cuWaitExternalSemaphoresAsync_ptsz, (const CUexternalSemaphore*, const CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS*, unsigned int n, CUstream s), s, n)
#define FAKE_ALLOC_FROM_POOL(sym)                                                         \
  FAKE_EXPORT CUresult CUDAAPI sym(CUdeviceptr* p, size_t n, CUmemoryPool, CUstream s) { \
    CUresult rc = simple(#sym, s, n);                                                     \
    if (rc == CUDA_SUCCESS) {                                                             \
      std::lock_guard lock(st().mu);                                                      \
      *p = st().next_devptr += ((n + 255) / 256 + 1) * 256;                               \
    }                                                                                     \
    return rc;                                                                            \
  }
FAKE_ALLOC_FROM_POOL(cuMemAllocFromPoolAsync)
FAKE_ALLOC_FROM_POOL(cuMemAllocFromPoolAsync_ptsz)
// Synchronous sets and CUDA-array copies (no stream).
FAKE_SIMPLE2(cuMemsetD16_v2, cuMemsetD16_v2_ptds, (CUdeviceptr, unsigned short, size_t n), nullptr, n)
FAKE_SIMPLE2(cuMemsetD2D8_v2, cuMemsetD2D8_v2_ptds, (CUdeviceptr, size_t, unsigned char, size_t w, size_t h), nullptr, w * h)
FAKE_SIMPLE2(cuMemsetD2D16_v2, cuMemsetD2D16_v2_ptds, (CUdeviceptr, size_t, unsigned short, size_t w, size_t h), nullptr, w * h)
FAKE_SIMPLE2(cuMemsetD2D32_v2, cuMemsetD2D32_v2_ptds, (CUdeviceptr, size_t, unsigned int, size_t w, size_t h), nullptr, w * h)
FAKE_SIMPLE2(cuMemcpyHtoA_v2, cuMemcpyHtoA_v2_ptds, (CUarray, size_t, const void*, size_t n), nullptr, n)
FAKE_SIMPLE2(cuMemcpyAtoH_v2, cuMemcpyAtoH_v2_ptds, (void*, CUarray, size_t, size_t n), nullptr, n)
FAKE_SIMPLE2(cuMemcpyAtoD_v2, cuMemcpyAtoD_v2_ptds, (CUdeviceptr, CUarray, size_t, size_t n), nullptr, n)
FAKE_SIMPLE2(cuMemcpyDtoA_v2, cuMemcpyDtoA_v2_ptds, (CUarray, size_t, CUdeviceptr, size_t n), nullptr, n)
FAKE_SIMPLE2(cuMemcpyAtoA_v2, cuMemcpyAtoA_v2_ptds, (CUarray, size_t, CUarray, size_t, size_t n), nullptr, n)

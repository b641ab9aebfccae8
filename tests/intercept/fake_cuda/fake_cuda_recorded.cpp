// Entry points of the fake driver that record their arguments (fake_cuda_pack_args into the log
// entry's `params`): batch prefetch/discard, batch decompression, graph upload, graphics map/unmap
// and the pre-3020 ABIs of copies, sets and cuMemFree. A test compares the bytes with the arguments it passed, so a
// wrapper that changed, reordered or copied an argument (a borrowed array pointer included) is
// caught.
#include "fake_cuda_state.h"  // first: it selects cuda.h's internal (all-variants) mode

#include <cstring>

namespace fake_cuda_impl {
namespace {

// `graph_exec`: an executable the call needs live (0: none).
template <typename... Args>
CUresult recorded_of(const char* name, CUstream hs, uint64_t value, uint64_t graph_exec, const Args&... args) {
  State& s = st();
  std::lock_guard lock(s.mu);
  fake_cuda_call& c = begin(s, name);
  c.stream = reinterpret_cast<uint64_t>(hs);
  c.value = value;
  c.param_bytes = fake_cuda_pack_args(c.params, sizeof c.params, args...);
  if (graph_exec != 0) {
    if (CUresult rc = check_graph_exec(s, graph_exec); rc != CUDA_SUCCESS) return finish(s, c, rc);
  }
  const uint64_t id = sid(hs, std::strstr(name, "_pt") != nullptr);
  if (CUresult rc = check_enqueue(s, id); rc != CUDA_SUCCESS) return finish(s, c, rc);
  advance(s, id, 100, c);
  return finish(s, c);
}
template <typename... Args>
CUresult recorded(const char* name, CUstream hs, uint64_t value, const Args&... args) {
  return recorded_of(name, hs, value, 0, args...);
}

uint64_t total(const size_t* sizes, size_t count) {
  uint64_t n = 0;
  for (size_t i = 0; sizes != nullptr && i < count; ++i) n += sizes[i];
  return n;
}

}  // namespace
}  // namespace fake_cuda_impl

using fake_cuda_impl::recorded;
using fake_cuda_impl::recorded_of;
using fake_cuda_impl::total;

#define FAKE_UNPAREN(...) __VA_ARGS__
// sym PARAMS logs `value` and every argument in ARGS.
#define FAKE_RECORDED(sym, PARAMS, ARGS, stream, value) \
  FAKE_EXPORT CUresult CUDAAPI sym PARAMS { return recorded(#sym, stream, value, FAKE_UNPAREN ARGS); }
#define FAKE_RECORDED2(sym, sym_pt, PARAMS, ARGS, stream, value) \
  FAKE_RECORDED(sym, PARAMS, ARGS, stream, value)                \
  FAKE_RECORDED(sym_pt, PARAMS, ARGS, stream, value)

// Batch prefetch/discard log the sum of their sizes.
FAKE_RECORDED2(cuMemPrefetchBatchAsync, cuMemPrefetchBatchAsync_ptsz,
               (CUdeviceptr* p, size_t* sizes, size_t n, CUmemLocation* locs, size_t* idx, size_t nl,
                unsigned long long flags, CUstream s),
               (p, sizes, n, locs, idx, nl, flags, s), s, total(sizes, n))
FAKE_RECORDED2(cuMemDiscardBatchAsync, cuMemDiscardBatchAsync_ptsz,
               (CUdeviceptr* p, size_t* sizes, size_t n, unsigned long long flags, CUstream s),
               (p, sizes, n, flags, s), s, total(sizes, n))
FAKE_RECORDED2(cuMemDiscardAndPrefetchBatchAsync, cuMemDiscardAndPrefetchBatchAsync_ptsz,
               (CUdeviceptr* p, size_t* sizes, size_t n, CUmemLocation* locs, size_t* idx, size_t nl,
                unsigned long long flags, CUstream s),
               (p, sizes, n, locs, idx, nl, flags, s), s, total(sizes, n))
// Decompression, graphics map/unmap: the count; graph upload: the graph.
FAKE_RECORDED2(cuMemBatchDecompressAsync, cuMemBatchDecompressAsync_ptsz,
               (CUmemDecompressParams* p, size_t n, unsigned int flags, size_t* err, CUstream s),
               (p, n, flags, err, s), s, n)
FAKE_EXPORT CUresult CUDAAPI cuGraphUpload(CUgraphExec g, CUstream s) {
  return recorded_of("cuGraphUpload", s, reinterpret_cast<uint64_t>(g), reinterpret_cast<uint64_t>(g), g, s);
}
FAKE_EXPORT CUresult CUDAAPI cuGraphUpload_ptsz(CUgraphExec g, CUstream s) {
  return recorded_of("cuGraphUpload_ptsz", s, reinterpret_cast<uint64_t>(g), reinterpret_cast<uint64_t>(g), g, s);
}
FAKE_RECORDED2(cuGraphicsMapResources, cuGraphicsMapResources_ptsz,
               (unsigned int n, CUgraphicsResource* r, CUstream s), (n, r, s), s, n)
FAKE_RECORDED2(cuGraphicsUnmapResources, cuGraphicsUnmapResources_ptsz,
               (unsigned int n, CUgraphicsResource* r, CUstream s), (n, r, s), s, n)

// Pre-3020 copy ABIs (32-bit pointers and sizes, v1 structs): the size in bytes.
FAKE_RECORDED(cuMemcpyHtoDAsync, (CUdeviceptr_v1 d, const void* h, unsigned int n, CUstream s),
              (d, h, n, s), s, n)
FAKE_RECORDED(cuMemcpyDtoHAsync, (void* h, CUdeviceptr_v1 d, unsigned int n, CUstream s),
              (h, d, n, s), s, n)
FAKE_RECORDED(cuMemcpyDtoDAsync, (CUdeviceptr_v1 d, CUdeviceptr_v1 src, unsigned int n, CUstream s),
              (d, src, n, s), s, n)
FAKE_RECORDED(cuMemcpy2DAsync, (const CUDA_MEMCPY2D_v1* p, CUstream s), (p, s), s,
              p ? uint64_t{p->WidthInBytes} * p->Height : 0)
FAKE_RECORDED(cuMemcpy3DAsync, (const CUDA_MEMCPY3D_v1* p, CUstream s), (p, s), s,
              p ? uint64_t{p->WidthInBytes} * p->Height * p->Depth : 0)
FAKE_RECORDED(cuMemcpyHtoAAsync,
              (CUarray a, unsigned int off, const void* h, unsigned int n, CUstream s),
              (a, off, h, n, s), s, n)
FAKE_RECORDED(cuMemcpyAtoHAsync,
              (void* h, CUarray a, unsigned int off, unsigned int n, CUstream s),
              (h, a, off, n, s), s, n)

// Pre-3020 synchronous copies, sets and cuMemFree (no stream): the size in bytes (sets: the
// element count, 2D: width * height), cuMemFree the pointer.
FAKE_RECORDED(cuMemcpyHtoD, (CUdeviceptr_v1 d, const void* h, unsigned int n), (d, h, n), nullptr,
              n)
FAKE_RECORDED(cuMemcpyDtoH, (void* h, CUdeviceptr_v1 d, unsigned int n), (h, d, n), nullptr, n)
FAKE_RECORDED(cuMemcpyDtoD, (CUdeviceptr_v1 d, CUdeviceptr_v1 src, unsigned int n), (d, src, n),
              nullptr, n)
FAKE_RECORDED(cuMemcpyHtoA, (CUarray a, unsigned int off, const void* h, unsigned int n),
              (a, off, h, n), nullptr, n)
FAKE_RECORDED(cuMemcpyAtoH, (void* h, CUarray a, unsigned int off, unsigned int n),
              (h, a, off, n), nullptr, n)
FAKE_RECORDED(cuMemcpyAtoD, (CUdeviceptr_v1 d, CUarray a, unsigned int off, unsigned int n),
              (d, a, off, n), nullptr, n)
FAKE_RECORDED(cuMemcpyDtoA, (CUarray a, unsigned int off, CUdeviceptr_v1 d, unsigned int n),
              (a, off, d, n), nullptr, n)
FAKE_RECORDED(cuMemcpyAtoA,
              (CUarray a, unsigned int off, CUarray src, unsigned int src_off, unsigned int n),
              (a, off, src, src_off, n), nullptr, n)
FAKE_RECORDED(cuMemcpy2D, (const CUDA_MEMCPY2D_v1* p), (p), nullptr,
              p ? uint64_t{p->WidthInBytes} * p->Height : 0)
FAKE_RECORDED(cuMemcpy2DUnaligned, (const CUDA_MEMCPY2D_v1* p), (p), nullptr,
              p ? uint64_t{p->WidthInBytes} * p->Height : 0)
FAKE_RECORDED(cuMemcpy3D, (const CUDA_MEMCPY3D_v1* p), (p), nullptr,
              p ? uint64_t{p->WidthInBytes} * p->Height * p->Depth : 0)
FAKE_RECORDED(cuMemsetD8, (CUdeviceptr_v1 d, unsigned char v, unsigned int n), (d, v, n), nullptr,
              n)
FAKE_RECORDED(cuMemsetD16, (CUdeviceptr_v1 d, unsigned short v, unsigned int n), (d, v, n),
              nullptr, n)
FAKE_RECORDED(cuMemsetD32, (CUdeviceptr_v1 d, unsigned int v, unsigned int n), (d, v, n), nullptr,
              n)
FAKE_RECORDED(cuMemsetD2D8,
              (CUdeviceptr_v1 d, unsigned int pitch, unsigned char v, unsigned int w,
               unsigned int h),
              (d, pitch, v, w, h), nullptr, uint64_t{w} * h)
FAKE_RECORDED(cuMemsetD2D16,
              (CUdeviceptr_v1 d, unsigned int pitch, unsigned short v, unsigned int w,
               unsigned int h),
              (d, pitch, v, w, h), nullptr, uint64_t{w} * h)
FAKE_RECORDED(cuMemsetD2D32,
              (CUdeviceptr_v1 d, unsigned int pitch, unsigned int v, unsigned int w,
               unsigned int h),
              (d, pitch, v, w, h), nullptr, uint64_t{w} * h)
FAKE_RECORDED(cuMemFree, (CUdeviceptr_v1 p), (p), nullptr, p)

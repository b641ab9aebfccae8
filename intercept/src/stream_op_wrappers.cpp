// Stream-ordered operations other than launches: copies, sets, event records, waits and
// stream-ordered allocation. They share the per-stream FIFO with kernels so that a deferred
// kernel and the copy after it stay in program order.
//
// Deferred (the op owns a copy of its value arguments): device-to-device and peer copies,
// copies whose host side is pinned memory, memsets, event records, stream waits,
// cuMemFreeAsync, stream callbacks, prefetch, managed-memory attach, CUDA-array copies with a
// pinned host side. The caller waits until its op reached the driver (never deferred past the call)
// for: copies touching pageable host memory (their return means "source staged" / "data
// arrived"), copies described by a struct pointer, batch copies, cuMemAllocAsync and
// cuMemAllocFromPoolAsync (they return the pointer), external-semaphore signals/waits, batch
// prefetch/discard and decompression, graph upload and graphics map/unmap. Stream memory ops
// (cuStreamWriteValue* and co.) are in memop_wrappers.cpp; the pre-3020 copy ABIs in
// legacy_abi_wrappers.cpp.
#include "wrapper_support.h"

using orion::Shim;
namespace real = orion::real;

// --- copies ---
ORION_STREAM_OP2(cuMemcpyAsync, cuMemcpyAsync_ptsz, kCopy,
                 orion::deferrable_copy(shim, id, dst, src), s, 0, n,
                 (CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s), (dst, src, n, s))
ORION_STREAM_OP2(cuMemcpyHtoDAsync_v2, cuMemcpyHtoDAsync_v2_ptsz, kCopy,
                 orion::deferrable_copy(shim, id, dst, src), s, 0, n,
                 (CUdeviceptr dst, const void* src, size_t n, CUstream s), (dst, src, n, s))
ORION_STREAM_OP2(cuMemcpyDtoHAsync_v2, cuMemcpyDtoHAsync_v2_ptsz, kCopy,
                 orion::deferrable_copy(shim, id, dst, src), s, 0, n,
                 (void* dst, CUdeviceptr src, size_t n, CUstream s), (dst, src, n, s))
ORION_STREAM_OP2(cuMemcpyDtoDAsync_v2, cuMemcpyDtoDAsync_v2_ptsz, kCopy,
                 orion::deferrable_copy(shim, id, dst, src), s, 0, n,
                 (CUdeviceptr dst, CUdeviceptr src, size_t n, CUstream s), (dst, src, n, s))
ORION_STREAM_OP2(cuMemcpy2DAsync_v2, cuMemcpy2DAsync_v2_ptsz, kCopy, false, s, 0, 0,
                 (const CUDA_MEMCPY2D* p, CUstream s), (p, s))
ORION_STREAM_OP2(cuMemcpy3DAsync_v2, cuMemcpy3DAsync_v2_ptsz, kCopy, false, s, 0, 0,
                 (const CUDA_MEMCPY3D* p, CUstream s), (p, s))
ORION_STREAM_OP2(cuMemcpyPeerAsync, cuMemcpyPeerAsync_ptsz, kCopy, true, s, 0, n,
                 (CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx, size_t n,
                  CUstream s),
                 (dst, dst_ctx, src, src_ctx, n, s))

// --- memsets ---
ORION_STREAM_OP2(cuMemsetD8Async, cuMemsetD8Async_ptsz, kMemset, true, s, 0, n,
                 (CUdeviceptr dst, unsigned char v, size_t n, CUstream s), (dst, v, n, s))
ORION_STREAM_OP2(cuMemsetD16Async, cuMemsetD16Async_ptsz, kMemset, true, s, 0, n * 2,
                 (CUdeviceptr dst, unsigned short v, size_t n, CUstream s), (dst, v, n, s))
ORION_STREAM_OP2(cuMemsetD32Async, cuMemsetD32Async_ptsz, kMemset, true, s, 0, n * 4,
                 (CUdeviceptr dst, unsigned int v, size_t n, CUstream s), (dst, v, n, s))
ORION_STREAM_OP2(cuMemsetD2D8Async, cuMemsetD2D8Async_ptsz, kMemset, true, s, 0, w * h,
                 (CUdeviceptr dst, size_t pitch, unsigned char v, size_t w, size_t h, CUstream s),
                 (dst, pitch, v, w, h, s))
ORION_STREAM_OP2(cuMemsetD2D16Async, cuMemsetD2D16Async_ptsz, kMemset, true, s, 0, w * h * 2,
                 (CUdeviceptr dst, size_t pitch, unsigned short v, size_t w, size_t h, CUstream s),
                 (dst, pitch, v, w, h, s))
ORION_STREAM_OP2(cuMemsetD2D32Async, cuMemsetD2D32Async_ptsz, kMemset, true, s, 0, w * h * 4,
                 (CUdeviceptr dst, size_t pitch, unsigned int v, size_t w, size_t h, CUstream s),
                 (dst, pitch, v, w, h, s))

// --- events and waits (the dispatcher orders streams through them) ---
// A record of an interprocess event is never held: another process waits on whatever record the
// driver has (the caller returns once it is in the driver, in order on its stream). Nor is a
// wait on one: the wait binds to the record the driver has when it gets the wait ("the most
// recently captured state at the time of the API call"), and another process may record the
// event again meanwhile, where the dispatcher cannot see it.
ORION_STREAM_OP2(cuEventRecord, cuEventRecord_ptsz, kEventRecord, !shim->interprocess_event(e), s,
                 orion::event_id(e), 0, (CUevent e, CUstream s), (e, s))
ORION_STREAM_OP2(cuEventRecordWithFlags, cuEventRecordWithFlags_ptsz, kEventRecord,
                 !shim->interprocess_event(e), s, orion::event_id(e), 0,
                 (CUevent e, CUstream s, unsigned int flags), (e, s, flags))
ORION_STREAM_OP2(cuStreamWaitEvent, cuStreamWaitEvent_ptsz, kStreamWaitEvent, !shim->interprocess_event(e), s,
                 orion::event_id(e), 0, (CUstream s, CUevent e, unsigned int flags), (s, e, flags))

// --- stream-ordered memory pools ---
ORION_STREAM_OP2(cuMemAllocAsync, cuMemAllocAsync_ptsz, kMemPool, false, s, 0, n,
                 (CUdeviceptr * dptr, size_t n, CUstream s), (dptr, n, s))
ORION_STREAM_OP2(cuMemFreeAsync, cuMemFreeAsync_ptsz, kMemPool, true, s, 0, 0,
                 (CUdeviceptr dptr, CUstream s), (dptr, s))

// --- struct-described peer copies and batch copies: the caller waits until its op reached the
// driver (never deferred past the call). Batch copies may name sources with
// CU_MEMCPY_SRC_ACCESS_ORDER_DURING_API_CALL (valid only during the call), and the 12080 form
// writes its failIdx out-parameter at the call, so neither can be queued on borrowed arguments.
ORION_STREAM_OP2(cuMemcpy3DPeerAsync, cuMemcpy3DPeerAsync_ptsz, kCopy, false, s, 0, 0,
                 (const CUDA_MEMCPY3D_PEER* p, CUstream s), (p, s))
ORION_STREAM_OP2(cuMemcpyBatchAsync, cuMemcpyBatchAsync_ptsz, kCopy, false, s, 0, 0,
                 (CUdeviceptr * dsts, CUdeviceptr* srcs, size_t* sizes, size_t count,
                  CUmemcpyAttributes* attrs, size_t* attr_idxs, size_t num_attrs, size_t* fail_idx,
                  CUstream s),
                 (dsts, srcs, sizes, count, attrs, attr_idxs, num_attrs, fail_idx, s))
ORION_STREAM_OP2(cuMemcpyBatchAsync_v2, cuMemcpyBatchAsync_v2_ptsz, kCopy, false, s, 0, 0,
                 (CUdeviceptr * dsts, CUdeviceptr* srcs, size_t* sizes, size_t count,
                  CUmemcpyAttributes* attrs, size_t* attr_idxs, size_t num_attrs, CUstream s),
                 (dsts, srcs, sizes, count, attrs, attr_idxs, num_attrs, s))
ORION_STREAM_OP2(cuMemcpy3DBatchAsync, cuMemcpy3DBatchAsync_ptsz, kCopy, false, s, 0, 0,
                 (size_t n, CUDA_MEMCPY3D_BATCH_OP* ops, size_t* fail_idx,
                  unsigned long long flags, CUstream s),
                 (n, ops, fail_idx, flags, s))
ORION_STREAM_OP2(cuMemcpy3DBatchAsync_v2, cuMemcpy3DBatchAsync_v2_ptsz, kCopy, false, s, 0, 0,
                 (size_t n, CUDA_MEMCPY3D_BATCH_OP* ops, unsigned long long flags, CUstream s),
                 (n, ops, flags, s))

// --- host callbacks (like cuLaunchHostFunc: value arguments, deferred in order) ---
ORION_STREAM_OP2(cuStreamAddCallback, cuStreamAddCallback_ptsz, kHostFunc, true, s, 0, 0,
                 (CUstream s, CUstreamCallback cb, void* user_data, unsigned int flags),
                 (s, cb, user_data, flags))

// --- unified-memory prefetch and attach (value arguments, deferred in order) ---
ORION_STREAM_OP2(cuMemPrefetchAsync, cuMemPrefetchAsync_ptsz, kCopy, true, s, 0, n,
                 (CUdeviceptr p, size_t n, CUdevice dev, CUstream s), (p, n, dev, s))
ORION_STREAM_OP2(cuMemPrefetchAsync_v2, cuMemPrefetchAsync_v2_ptsz, kCopy, true, s, 0, n,
                 (CUdeviceptr p, size_t n, CUmemLocation loc, unsigned int flags, CUstream s),
                 (p, n, loc, flags, s))
ORION_STREAM_OP2(cuStreamAttachMemAsync, cuStreamAttachMemAsync_ptsz, kMemPool, true, s, 0, 0,
                 (CUstream s, CUdeviceptr p, size_t n, unsigned int flags), (s, p, n, flags))

// --- CUDA-array <-> host copies: deferred only with a pinned host side on a best-effort stream,
// else the caller waits until the copy reached the driver ---
ORION_STREAM_OP2(cuMemcpyHtoAAsync_v2, cuMemcpyHtoAAsync_v2_ptsz, kCopy,
                 orion::deferrable_host_copy(shim, id, src), s, 0, n,
                 (CUarray dst, size_t dst_off, const void* src, size_t n, CUstream s),
                 (dst, dst_off, src, n, s))
ORION_STREAM_OP2(cuMemcpyAtoHAsync_v2, cuMemcpyAtoHAsync_v2_ptsz, kCopy,
                 orion::deferrable_host_copy(shim, id, dst), s, 0, n,
                 (void* dst, CUarray src, size_t src_off, size_t n, CUstream s),
                 (dst, src, src_off, n, s))

// --- allocation from a pool: returns the pointer, so the caller waits ---
ORION_STREAM_OP2(cuMemAllocFromPoolAsync, cuMemAllocFromPoolAsync_ptsz, kMemPool, false, s, 0, n,
                 (CUdeviceptr * dptr, size_t n, CUmemoryPool pool, CUstream s),
                 (dptr, n, pool, s))

// --- external semaphores: arrays of handles and parameter structs (borrowed, so the caller
// waits until the op reached the driver; a signal is then never held back past the call). A wait
// blocks its stream on something outside the scheduler's view: like cuStreamWaitValue*, every
// stream is drained first, so a producer issued earlier in program order is in the driver. ---
ORION_STREAM_OP2(cuSignalExternalSemaphoresAsync, cuSignalExternalSemaphoresAsync_ptsz, kHostFunc,
                 false, s, 0, 0,
                 (const CUexternalSemaphore* sems,
                  const CUDA_EXTERNAL_SEMAPHORE_SIGNAL_PARAMS* params, unsigned int n, CUstream s),
                 (sems, params, n, s))

#define ORION_EXT_SEM_WAIT(sym, per_thread)                                                    \
  ORION_EXPORT CUresult CUDAAPI sym(const CUexternalSemaphore* sems,                           \
                                    const CUDA_EXTERNAL_SEMAPHORE_WAIT_PARAMS* params,         \
                                    unsigned int n, CUstream s) {                              \
    ORION_REQUIRE_REAL(sym);                                                                   \
    if (Shim* shim = orion::scheduling_shim()) {                                               \
      shim->dispatcher().release_all(); /* errors stay for their synchronising call */        \
      auto call = orion::value_call(s, real::sym, sems, params, n, s);                         \
      call.capture_context();                                                                  \
      return orion::submit_call(shim, sched::OpKind::kHostFunc,                                \
                                Shim::stream_id(s, per_thread), call, /*clonable=*/false);     \
    }                                                                                          \
    return real::sym(sems, params, n, s);                                                      \
  }
ORION_EXT_SEM_WAIT(cuWaitExternalSemaphoresAsync, false)
ORION_EXT_SEM_WAIT(cuWaitExternalSemaphoresAsync_ptsz, true)

// --- batch prefetch/discard and batch decompression: the arrays are borrowed and
// cuMemBatchDecompressAsync writes errorIndex at the call, so the caller waits until its op
// reached the driver (in order behind the work queued before it on its stream) ---
ORION_STREAM_OP2(cuMemPrefetchBatchAsync, cuMemPrefetchBatchAsync_ptsz, kCopy, false, s, 0, 0,
                 (CUdeviceptr * ptrs, size_t* sizes, size_t count, CUmemLocation* locs,
                  size_t* loc_idxs, size_t num_locs, unsigned long long flags, CUstream s),
                 (ptrs, sizes, count, locs, loc_idxs, num_locs, flags, s))
ORION_STREAM_OP2(cuMemDiscardBatchAsync, cuMemDiscardBatchAsync_ptsz, kCopy, false, s, 0, 0,
                 (CUdeviceptr * ptrs, size_t* sizes, size_t count, unsigned long long flags,
                  CUstream s),
                 (ptrs, sizes, count, flags, s))
ORION_STREAM_OP2(cuMemDiscardAndPrefetchBatchAsync, cuMemDiscardAndPrefetchBatchAsync_ptsz, kCopy,
                 false, s, 0, 0,
                 (CUdeviceptr * ptrs, size_t* sizes, size_t count, CUmemLocation* locs,
                  size_t* loc_idxs, size_t num_locs, unsigned long long flags, CUstream s),
                 (ptrs, sizes, count, locs, loc_idxs, num_locs, flags, s))
ORION_STREAM_OP2(cuMemBatchDecompressAsync, cuMemBatchDecompressAsync_ptsz, kCopy, false, s, 0, 0,
                 (CUmemDecompressParams * params, size_t count, unsigned int flags,
                  size_t* error_index, CUstream s),
                 (params, count, flags, error_index, s))

// --- graph upload: done where the program put it (typically ahead of a latency-critical
// launch), so the caller waits instead of the upload being held back with best-effort work. CUDA
// orders an upload behind the executable's earlier launches and uploads, on any stream (the work
// after it on its stream waits for them): it carries the executable's order id, as a launch does.
ORION_STREAM_OP2(cuGraphUpload, cuGraphUpload_ptsz, kCopy, false, s, Shim::graph_order_id(graph), 0,
                 (CUgraphExec graph, CUstream s), (graph, s))

// --- graphics interop: map hands resources to CUDA, unmap hands them back to the graphics API
// (whose next call must come after every CUDA op issued before the unmap), and the resource
// array is borrowed: the caller waits until its op reached the driver ---
ORION_STREAM_OP2(cuGraphicsMapResources, cuGraphicsMapResources_ptsz, kHostFunc, false, s, 0, 0,
                 (unsigned int count, CUgraphicsResource* resources, CUstream s),
                 (count, resources, s))
ORION_STREAM_OP2(cuGraphicsUnmapResources, cuGraphicsUnmapResources_ptsz, kHostFunc, false, s, 0,
                 0, (unsigned int count, CUgraphicsResource* resources, CUstream s),
                 (count, resources, s))

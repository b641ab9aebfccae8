// Blocking calls and queries: before the driver sees them, everything they depend on must have
// been submitted. An error of a deferred op (returned by the drain) is reported here, at the
// first call that synchronises with it, as CUDA reports asynchronous errors.
#include "wrapper_support.h"

using orion::Shim;
namespace real = orion::real;

using orion::first_error;

namespace {

// Drains what a synchronisation on `s` depends on: the stream itself, or for the legacy stream
// (which waits for every blocking stream) the blocking streams.
int drain_stream(Shim* shim, CUstream s, bool per_thread) {
  sched::StreamId id = Shim::stream_id(s, per_thread);
  if (id == Shim::kLegacyStream) return shim->dispatcher().drain_legacy_sync();
  return shim->dispatcher().drain_stream(id);
}

}  // namespace

#define ORION_STREAM_SYNC(sym, per_thread)                                    \
  ORION_EXPORT CUresult CUDAAPI sym(CUstream s) {                             \
    ORION_REQUIRE_REAL(sym);                                                  \
    if (Shim* shim = orion::scheduling_shim()) {                              \
      int drained = drain_stream(shim, s, per_thread);                        \
      return first_error(drained, real::sym(s));                              \
    }                                                                         \
    return real::sym(s);                                                      \
  }
ORION_STREAM_SYNC(cuStreamSynchronize, false)
ORION_STREAM_SYNC(cuStreamSynchronize_ptsz, true)

// Queries force nothing out (the caching allocator and NCCL's watchdog query all the time): work
// still queued in the shim is not done, CUDA_ERROR_NOT_READY; a deferred error is returned;
// otherwise the driver answers.
namespace {
CUresult query_answer(const sched::QueryState& q) {
  if (q.error != 0) return static_cast<CUresult>(q.error);
  return q.queued ? CUDA_ERROR_NOT_READY : CUDA_SUCCESS;
}
sched::QueryState stream_query_state(Shim* shim, CUstream s, bool per_thread) {
  const sched::StreamId id = Shim::stream_id(s, per_thread);
  if (id == Shim::kLegacyStream) return shim->dispatcher().query_legacy_sync();
  return shim->dispatcher().query_stream(id);
}
}  // namespace

#define ORION_STREAM_QUERY(sym, per_thread)                                               \
  ORION_EXPORT CUresult CUDAAPI sym(CUstream s) {                                         \
    ORION_REQUIRE_REAL(sym);                                                              \
    if (Shim* shim = orion::scheduling_shim()) {                                          \
      if (CUresult rc = query_answer(stream_query_state(shim, s, per_thread)); rc != 0) { \
        return rc;                                                                        \
      }                                                                                   \
    }                                                                                     \
    return real::sym(s);                                                                  \
  }
ORION_STREAM_QUERY(cuStreamQuery, false)
ORION_STREAM_QUERY(cuStreamQuery_ptsz, true)

// Elapsed time: like a query of both events (CUDA answers NOT_READY for an unfinished record).
#define ORION_ELAPSED_TIME(sym)                                                           \
  ORION_EXPORT CUresult CUDAAPI sym(float* ms, CUevent a, CUevent b) {                    \
    ORION_REQUIRE_REAL(sym);                                                              \
    if (Shim* shim = orion::scheduling_shim()) {                                          \
      for (CUevent e : {a, b}) {                                                          \
        if (CUresult rc = query_answer(shim->dispatcher().query_event(orion::event_id(e))); \
            rc != CUDA_SUCCESS) {                                                         \
          return rc;                                                                      \
        }                                                                                 \
      }                                                                                   \
    }                                                                                     \
    return real::sym(ms, a, b);                                                           \
  }
ORION_ELAPSED_TIME(cuEventElapsedTime)
ORION_ELAPSED_TIME(cuEventElapsedTime_v2)

ORION_EXPORT CUresult CUDAAPI cuEventQuery(CUevent e) {
  ORION_REQUIRE_REAL(cuEventQuery);
  if (Shim* shim = orion::scheduling_shim()) {
    if (CUresult rc = query_answer(shim->dispatcher().query_event(orion::event_id(e))); rc != 0) {
      return rc;
    }
  }
  return real::cuEventQuery(e);
}

#define ORION_EVENT_SYNC(sym)                                                            \
  ORION_EXPORT CUresult CUDAAPI sym(CUevent e) {                                         \
    ORION_REQUIRE_REAL(sym);                                                             \
    if (Shim* shim = orion::scheduling_shim()) {                                         \
      int drained = shim->dispatcher().drain_event(orion::event_id(e));                  \
      return first_error(drained, real::sym(e));                                         \
    }                                                                                    \
    return real::sym(e);                                                                 \
  }
ORION_EVENT_SYNC(cuEventSynchronize)

ORION_EXPORT CUresult CUDAAPI cuCtxSynchronize() {
  ORION_REQUIRE_REAL(cuCtxSynchronize);
  if (Shim* shim = orion::scheduling_shim()) {
    int drained = shim->dispatcher().drain_all();
    return first_error(drained, real::cuCtxSynchronize());
  }
  return real::cuCtxSynchronize();
}

// CUDA 13's form names the context; the shim assumes one device context per process (see README),
// so any context synchronise waits for everything queued.
ORION_EXPORT CUresult CUDAAPI cuCtxSynchronize_v2(CUcontext ctx) {
  ORION_REQUIRE_REAL(cuCtxSynchronize_v2);
  if (Shim* shim = orion::scheduling_shim()) {
    int drained = shim->dispatcher().drain_all();
    return first_error(drained, real::cuCtxSynchronize_v2(ctx));
  }
  return real::cuCtxSynchronize_v2(ctx);
}

// Synchronous copies, sets and cuMemFree synchronise with the device (legacy default stream
// semantics; cuMemFree may free memory queued work still uses): drain everything first
// (ORION_DEVICE_SYNC, shared with their pre-3020 ABIs in legacy_abi_wrappers.cpp).

ORION_DEVICE_SYNC2(cuMemcpy, cuMemcpy_ptds, (CUdeviceptr dst, CUdeviceptr src, size_t n),
                   (dst, src, n))
ORION_DEVICE_SYNC2(cuMemcpyHtoD_v2, cuMemcpyHtoD_v2_ptds,
                   (CUdeviceptr dst, const void* src, size_t n), (dst, src, n))
ORION_DEVICE_SYNC2(cuMemcpyDtoH_v2, cuMemcpyDtoH_v2_ptds, (void* dst, CUdeviceptr src, size_t n),
                   (dst, src, n))
ORION_DEVICE_SYNC2(cuMemcpyDtoD_v2, cuMemcpyDtoD_v2_ptds,
                   (CUdeviceptr dst, CUdeviceptr src, size_t n), (dst, src, n))
ORION_DEVICE_SYNC2(cuMemsetD8_v2, cuMemsetD8_v2_ptds, (CUdeviceptr dst, unsigned char v, size_t n),
                   (dst, v, n))
ORION_DEVICE_SYNC2(cuMemsetD32_v2, cuMemsetD32_v2_ptds, (CUdeviceptr dst, unsigned int v, size_t n),
                   (dst, v, n))
ORION_DEVICE_SYNC(cuMemFree_v2, (CUdeviceptr p), (p))
ORION_DEVICE_SYNC2(cuMemcpy2D_v2, cuMemcpy2D_v2_ptds, (const CUDA_MEMCPY2D* p), (p))
ORION_DEVICE_SYNC2(cuMemcpy2DUnaligned_v2, cuMemcpy2DUnaligned_v2_ptds, (const CUDA_MEMCPY2D* p),
                   (p))
ORION_DEVICE_SYNC2(cuMemcpy3D_v2, cuMemcpy3D_v2_ptds, (const CUDA_MEMCPY3D* p), (p))
ORION_DEVICE_SYNC2(cuMemcpyPeer, cuMemcpyPeer_ptds,
                   (CUdeviceptr dst, CUcontext dst_ctx, CUdeviceptr src, CUcontext src_ctx,
                    size_t n),
                   (dst, dst_ctx, src, src_ctx, n))
ORION_DEVICE_SYNC2(cuMemcpy3DPeer, cuMemcpy3DPeer_ptds, (const CUDA_MEMCPY3D_PEER* p), (p))
ORION_DEVICE_SYNC2(cuMemsetD16_v2, cuMemsetD16_v2_ptds, (CUdeviceptr dst, unsigned short v, size_t n),
                   (dst, v, n))
ORION_DEVICE_SYNC2(cuMemsetD2D8_v2, cuMemsetD2D8_v2_ptds,
                   (CUdeviceptr dst, size_t pitch, unsigned char v, size_t w, size_t h),
                   (dst, pitch, v, w, h))
ORION_DEVICE_SYNC2(cuMemsetD2D16_v2, cuMemsetD2D16_v2_ptds,
                   (CUdeviceptr dst, size_t pitch, unsigned short v, size_t w, size_t h),
                   (dst, pitch, v, w, h))
ORION_DEVICE_SYNC2(cuMemsetD2D32_v2, cuMemsetD2D32_v2_ptds,
                   (CUdeviceptr dst, size_t pitch, unsigned int v, size_t w, size_t h),
                   (dst, pitch, v, w, h))
// CUDA-array copies.
ORION_DEVICE_SYNC2(cuMemcpyHtoA_v2, cuMemcpyHtoA_v2_ptds,
                   (CUarray dst, size_t dst_off, const void* src, size_t n), (dst, dst_off, src, n))
ORION_DEVICE_SYNC2(cuMemcpyAtoH_v2, cuMemcpyAtoH_v2_ptds,
                   (void* dst, CUarray src, size_t src_off, size_t n), (dst, src, src_off, n))
ORION_DEVICE_SYNC2(cuMemcpyAtoD_v2, cuMemcpyAtoD_v2_ptds,
                   (CUdeviceptr dst, CUarray src, size_t src_off, size_t n),
                   (dst, src, src_off, n))
ORION_DEVICE_SYNC2(cuMemcpyDtoA_v2, cuMemcpyDtoA_v2_ptds,
                   (CUarray dst, size_t dst_off, CUdeviceptr src, size_t n),
                   (dst, dst_off, src, n))
ORION_DEVICE_SYNC2(cuMemcpyAtoA_v2, cuMemcpyAtoA_v2_ptds,
                   (CUarray dst, size_t dst_off, CUarray src, size_t src_off, size_t n),
                   (dst, dst_off, src, src_off, n))

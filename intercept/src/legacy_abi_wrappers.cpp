// The pre-3020 ABIs of stream-ordered and synchronous copies, sets and cuMemFree: 32-bit device
// pointers and sizes (CUdeviceptr_v1, unsigned int) and the CUDA_MEMCPY2D_v1 / CUDA_MEMCPY3D_v1
// structs. The driver still exports them under the unsuffixed names and cuGetProcAddress returns
// them for versions below 3020, so an old program or a lookup pinned to an old version would
// otherwise reach the driver around the scheduler and overtake deferred work. Each follows the
// rules of its _v2 counterpart (stream_op_wrappers.cpp, sync_wrappers.cpp) and calls the same v1
// driver symbol with the caller's arguments unchanged.
#include "wrapper_support.h"

ORION_STREAM_OP(cuMemcpyHtoDAsync, false, kCopy, orion::deferrable_copy(shim, id, dst, src), s, 0,
                n, (CUdeviceptr_v1 dst, const void* src, unsigned int n, CUstream s),
                (dst, src, n, s))
ORION_STREAM_OP(cuMemcpyDtoHAsync, false, kCopy, orion::deferrable_copy(shim, id, dst, src), s, 0,
                n, (void* dst, CUdeviceptr_v1 src, unsigned int n, CUstream s), (dst, src, n, s))
ORION_STREAM_OP(cuMemcpyDtoDAsync, false, kCopy, orion::deferrable_copy(shim, id, dst, src), s, 0, n,
                (CUdeviceptr_v1 dst, CUdeviceptr_v1 src, unsigned int n, CUstream s),
                (dst, src, n, s))
// Struct-described: the struct is borrowed, so the caller waits.
ORION_STREAM_OP(cuMemcpy2DAsync, false, kCopy, false, s, 0, 0,
                (const CUDA_MEMCPY2D_v1* p, CUstream s), (p, s))
ORION_STREAM_OP(cuMemcpy3DAsync, false, kCopy, false, s, 0, 0,
                (const CUDA_MEMCPY3D_v1* p, CUstream s), (p, s))
ORION_STREAM_OP(cuMemcpyHtoAAsync, false, kCopy, orion::deferrable_host_copy(shim, id, src), s, 0,
                n, (CUarray dst, unsigned int dst_off, const void* src, unsigned int n, CUstream s),
                (dst, dst_off, src, n, s))
ORION_STREAM_OP(cuMemcpyAtoHAsync, false, kCopy, orion::deferrable_host_copy(shim, id, dst), s, 0,
                n, (void* dst, CUarray src, unsigned int src_off, unsigned int n, CUstream s),
                (dst, src, src_off, n, s))

// Synchronous: drain every deferred op first, like the _v2 ABIs (no _ptds variant exists).
ORION_DEVICE_SYNC(cuMemcpyHtoD, (CUdeviceptr_v1 dst, const void* src, unsigned int n),
                  (dst, src, n))
ORION_DEVICE_SYNC(cuMemcpyDtoH, (void* dst, CUdeviceptr_v1 src, unsigned int n), (dst, src, n))
ORION_DEVICE_SYNC(cuMemcpyDtoD, (CUdeviceptr_v1 dst, CUdeviceptr_v1 src, unsigned int n),
                  (dst, src, n))
ORION_DEVICE_SYNC(cuMemcpyHtoA,
                  (CUarray dst, unsigned int dst_off, const void* src, unsigned int n),
                  (dst, dst_off, src, n))
ORION_DEVICE_SYNC(cuMemcpyAtoH, (void* dst, CUarray src, unsigned int src_off, unsigned int n),
                  (dst, src, src_off, n))
ORION_DEVICE_SYNC(cuMemcpyAtoD,
                  (CUdeviceptr_v1 dst, CUarray src, unsigned int src_off, unsigned int n),
                  (dst, src, src_off, n))
ORION_DEVICE_SYNC(cuMemcpyDtoA,
                  (CUarray dst, unsigned int dst_off, CUdeviceptr_v1 src, unsigned int n),
                  (dst, dst_off, src, n))
ORION_DEVICE_SYNC(cuMemcpyAtoA,
                  (CUarray dst, unsigned int dst_off, CUarray src, unsigned int src_off,
                   unsigned int n),
                  (dst, dst_off, src, src_off, n))
ORION_DEVICE_SYNC(cuMemcpy2D, (const CUDA_MEMCPY2D_v1* p), (p))
ORION_DEVICE_SYNC(cuMemcpy2DUnaligned, (const CUDA_MEMCPY2D_v1* p), (p))
ORION_DEVICE_SYNC(cuMemcpy3D, (const CUDA_MEMCPY3D_v1* p), (p))
ORION_DEVICE_SYNC(cuMemsetD8, (CUdeviceptr_v1 dst, unsigned char v, unsigned int n), (dst, v, n))
ORION_DEVICE_SYNC(cuMemsetD16, (CUdeviceptr_v1 dst, unsigned short v, unsigned int n),
                  (dst, v, n))
ORION_DEVICE_SYNC(cuMemsetD32, (CUdeviceptr_v1 dst, unsigned int v, unsigned int n), (dst, v, n))
ORION_DEVICE_SYNC(cuMemsetD2D8,
                  (CUdeviceptr_v1 dst, unsigned int pitch, unsigned char v, unsigned int w,
                   unsigned int h),
                  (dst, pitch, v, w, h))
ORION_DEVICE_SYNC(cuMemsetD2D16,
                  (CUdeviceptr_v1 dst, unsigned int pitch, unsigned short v, unsigned int w,
                   unsigned int h),
                  (dst, pitch, v, w, h))
ORION_DEVICE_SYNC(cuMemsetD2D32,
                  (CUdeviceptr_v1 dst, unsigned int pitch, unsigned int v, unsigned int w,
                   unsigned int h),
                  (dst, pitch, v, w, h))
ORION_DEVICE_SYNC(cuMemFree, (CUdeviceptr_v1 p), (p))

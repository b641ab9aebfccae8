// Stream memory operations: cuStreamWriteValue32/64, cuStreamWaitValue32/64, cuStreamBatchMemOp
// (v1 and _v2 symbols, each with its _ptsz variant).
//
// They go through the stream's FIFO like every stream-ordered op (a write on a best-effort stream
// never overtakes the kernels queued before it), and they are synchronisation signals between
// streams, processes or the host, which the scheduler cannot see. So:
//  - Every memory op reaches the driver before the call returns: it is queued in order, then its
//    stream is drained (queued best-effort work ahead of it is forced out with it). A write is
//    never held back by the policy while a waiter, already submitted on the GPU, blocks its
//    stream (a policy waiting for that stream to go idle would then only be rescued by the
//    starvation bound).
//  - An op that waits (WaitValue, a batch containing a wait) first drains everything queued on
//    every stream: a producer issued earlier in program order (a write, a kernel or copy that
//    sets the flag) is in the driver before the wait can block a stream on it. A producer issued
//    after the wait on a best-effort stream is admitted by the policy or, at the latest, by the
//    starvation bound (ORION_BE_MAX_WAIT_US), so it is never held back forever.
// The caller waits until its op is in the driver (never cloned: the batch's parameter array stays
// the caller's) and gets the driver's own answer: cuda.h documents errors these calls return at
// once (CUDA_ERROR_NOT_SUPPORTED where the device lacks stream memory ops), and programs probe
// support with them.
#include "wrapper_support.h"

using orion::Shim;
namespace real = orion::real;

namespace {

bool has_wait(unsigned count, const CUstreamBatchMemOpParams* params) {
  if (params == nullptr) return false;
  for (unsigned i = 0; i < count; ++i) {
    if (params[i].operation == CU_STREAM_MEM_OP_WAIT_VALUE_32 ||
        params[i].operation == CU_STREAM_MEM_OP_WAIT_VALUE_64) {
      return true;
    }
  }
  return false;
}

// Submits `call` in order on its stream, the caller waiting until it reached the driver (work
// queued ahead of it is forced out first) and returning the driver's answer to it; `waits`:
// release every stream first. Deferred errors of the released work are not this call's: they
// stay for the call that synchronises with their op (finding 7).
template <typename Call>
CUresult submit_memop(Shim* shim, CUstream s, bool per_thread, Call& call, bool waits,
                      sched::OpKind kind, uint64_t bytes) {
  const sched::StreamId id = Shim::stream_id(s, per_thread);
  if (waits) shim->dispatcher().release_all();
  // Another thread may submit it (a drain, the helper thread's dependency walk): under the
  // caller's context, as every call whose caller waits.
  call.capture_context();
  return orion::submit_call(shim, kind, id, call, /*clonable=*/false, 0, bytes);
}

}  // namespace

#define ORION_VALUE_MEMOP(sym, per_thread, value_t, waits, kind, bytes)                      \
  ORION_EXPORT CUresult CUDAAPI sym(CUstream s, CUdeviceptr addr, value_t v, unsigned flags) { \
    ORION_REQUIRE_REAL(sym);                                                                 \
    if (Shim* shim = orion::scheduling_shim()) {                                             \
      auto call = orion::value_call(s, real::sym, s, addr, v, flags);                        \
      return submit_memop(shim, s, per_thread, call, waits, sched::OpKind::kind, bytes);     \
    }                                                                                        \
    return real::sym(s, addr, v, flags);                                                     \
  }
#define ORION_VALUE_MEMOP4(name, value_t, waits, kind, bytes)                \
  ORION_VALUE_MEMOP(name, false, value_t, waits, kind, bytes)                \
  ORION_VALUE_MEMOP(name##_ptsz, true, value_t, waits, kind, bytes)          \
  ORION_VALUE_MEMOP(name##_v2, false, value_t, waits, kind, bytes)           \
  ORION_VALUE_MEMOP(name##_v2_ptsz, true, value_t, waits, kind, bytes)

// A write is a 4/8-byte device write (a memset for the scheduler); a wait blocks its stream on
// something outside it (like a host function).
ORION_VALUE_MEMOP4(cuStreamWriteValue32, cuuint32_t, false, kMemset, 4)
ORION_VALUE_MEMOP4(cuStreamWriteValue64, cuuint64_t, false, kMemset, 8)
ORION_VALUE_MEMOP4(cuStreamWaitValue32, cuuint32_t, true, kHostFunc, 0)
ORION_VALUE_MEMOP4(cuStreamWaitValue64, cuuint64_t, true, kHostFunc, 0)

#define ORION_BATCH_MEMOP(sym, per_thread)                                                    \
  ORION_EXPORT CUresult CUDAAPI sym(CUstream s, unsigned count, CUstreamBatchMemOpParams* p,  \
                                    unsigned flags) {                                         \
    ORION_REQUIRE_REAL(sym);                                                                  \
    if (Shim* shim = orion::scheduling_shim()) {                                              \
      auto call = orion::value_call(s, real::sym, s, count, p, flags);                        \
      return submit_memop(shim, s, per_thread, call, has_wait(count, p),                      \
                          sched::OpKind::kHostFunc, 0);                                       \
    }                                                                                         \
    return real::sym(s, count, p, flags);                                                     \
  }
ORION_BATCH_MEMOP(cuStreamBatchMemOp, false)
ORION_BATCH_MEMOP(cuStreamBatchMemOp_ptsz, true)
ORION_BATCH_MEMOP(cuStreamBatchMemOp_v2, false)
ORION_BATCH_MEMOP(cuStreamBatchMemOp_v2_ptsz, true)

// Shared preamble of every exported wrapper.
#pragma once

#include <optional>

#include "driver_calls.h"
#include "real_driver.h"
#include "shim.h"

// The real entry point must exist before anything else happens; a missing driver or a driver
// too old for this entry point is reported as the driver itself would.
#define ORION_REQUIRE_REAL(sym)                                                   \
  do {                                                                            \
    if (!::orion::load_real_driver()) return CUDA_ERROR_SHARED_OBJECT_INIT_FAILED; \
    if (::orion::real::sym == nullptr) return CUDA_ERROR_NOT_FOUND;               \
  } while (0)

#define ORION_EXPORT extern "C" __attribute__((visibility("default")))

namespace orion {

// The shim when this call should go through the scheduler; nullptr for pass-through. During a
// stream capture calls still go through it (in order behind queued work of their stream), but
// nothing is deferred (Shim::submit).
inline Shim* scheduling_shim() { return active_shim(); }

// Submits a value-argument stream-ordered call (copy, memset, event op, ...).
template <typename Call>
CUresult submit_call(Shim* shim, sched::OpKind kind, sched::StreamId stream, const Call& call,
                     bool clonable, sched::EventId event = 0, uint64_t bytes = 0) {
  sched::Op op;
  op.kind = kind;
  op.stream = stream;
  op.event = event;
  op.bytes = bytes;
  op.borrowed = &call;
  op.clone = clonable ? &Call::clone : nullptr;
  op.requested_class = Shim::thread_class(stream);
  return shim->submit(std::move(op));
}

// The first error wins: a deferred op's failure (from a drain), else the call's own result.
inline CUresult first_error(int drained, CUresult own) {
  return drained != 0 ? static_cast<CUresult>(drained) : own;
}

inline sched::EventId event_id(CUevent e) { return reinterpret_cast<sched::EventId>(e); }

// How the driver knows this address (device memory, or pinned/registered host memory), or
// nullopt for pageable host memory it does not know. A copy from or to pageable host memory is
// synchronous with the host in CUDA (the call returns once the source is staged / the data
// arrived), so it must not be deferred past the call.
inline std::optional<CUmemorytype> driver_memory_type(CUdeviceptr p) {
  CUmemorytype type{};
  if (real::cuPointerGetAttribute == nullptr ||
      real::cuPointerGetAttribute(&type, CU_POINTER_ATTRIBUTE_MEMORY_TYPE, p) != CUDA_SUCCESS) {
    return std::nullopt;
  }
  return type;
}
inline std::optional<CUmemorytype> driver_memory_type(const void* p) {
  return driver_memory_type(reinterpret_cast<CUdeviceptr>(p));
}
inline bool driver_memory(const void* p) { return driver_memory_type(p).has_value(); }

// A copy may be deferred (gets an owned payload) only on a best-effort stream (where it could be
// deferred at all), only when neither side is pageable host memory, and never from host memory
// to host memory: CUDA runs such a copy (pinned or not) before the call returns ("fully
// synchronous with respect to the host"), so the caller may read dst or reuse src at once.
template <typename A, typename B>
bool deferrable_copy(Shim* shim, sched::StreamId stream, A dst, B src) {
  if (shim->dispatcher().stream_class(stream) != sched::StreamClass::kBestEffort) return false;
  const std::optional<CUmemorytype> to = driver_memory_type(dst), from = driver_memory_type(src);
  return to && from && !(*to == CU_MEMORYTYPE_HOST && *from == CU_MEMORYTYPE_HOST);
}

// A copy between a CUDA array and host memory: deferrable only on a best-effort stream and only
// when the host side is pinned/registered (a pageable one is synchronous with the host).
inline bool deferrable_host_copy(Shim* shim, sched::StreamId stream, const void* host) {
  return shim->dispatcher().stream_class(stream) == sched::StreamClass::kBestEffort &&
         driver_memory(host);
}

}  // namespace orion

// A stream-ordered call through the stream's FIFO. `clonable` (an expression that may use `shim`
// and `id`) says whether the op may be deferred with a copy of its value arguments; when false the
// caller waits until its op reached the driver (in order on its stream) and gets its result.
#define ORION_UNPAREN(...) __VA_ARGS__

#define ORION_STREAM_OP(sym, per_thread, kind, clonable, stream, event, bytes, PARAMS, ARGS)       \
  ORION_EXPORT CUresult CUDAAPI sym PARAMS {                                                       \
    ORION_REQUIRE_REAL(sym);                                                                       \
    if (::orion::Shim* shim = orion::scheduling_shim()) {                                          \
      const sched::StreamId id = ::orion::Shim::stream_id(stream, per_thread);                     \
      auto call = orion::value_call(stream, ::orion::real::sym, ORION_UNPAREN ARGS);               \
      const bool can_defer = (clonable);                                                           \
      if (!can_defer) call.capture_context();                                                      \
      return orion::submit_call(shim, sched::OpKind::kind, id, call, can_defer, event, bytes);     \
    }                                                                                              \
    return ::orion::real::sym ARGS;                                                                \
  }

// Each entry point in its legacy and per-thread variant.
#define ORION_STREAM_OP2(sym, sym_pt, kind, clonable, stream, event, bytes, PARAMS, ARGS) \
  ORION_STREAM_OP(sym, false, kind, clonable, stream, event, bytes, PARAMS, ARGS)         \
  ORION_STREAM_OP(sym_pt, true, kind, clonable, stream, event, bytes, PARAMS, ARGS)

// A blocking call that synchronises with the device (synchronous copies and sets, legacy
// default-stream semantics; cuMemFree, which may free memory queued work still uses): every
// deferred op is submitted first, then the driver is called with the caller's arguments. It
// returns the deferred errors of what legacy semantics synchronise with (the blocking streams);
// a non-blocking stream's stay for the call that synchronises with it.
#define ORION_DEVICE_SYNC(sym, PARAMS, ARGS)                                          \
  ORION_EXPORT CUresult CUDAAPI sym PARAMS {                                          \
    ORION_REQUIRE_REAL(sym);                                                          \
    if (::orion::Shim* shim = orion::scheduling_shim()) {                             \
      shim->dispatcher().release_all();                                               \
      const int drained = shim->dispatcher().drain_legacy_sync();                     \
      const CUresult rc = ::orion::real::sym ARGS;                                    \
      shim->work_outside_dispatcher();                                                \
      return ::orion::first_error(drained, rc);                                       \
    }                                                                                 \
    return ::orion::real::sym ARGS;                                                   \
  }
#define ORION_DEVICE_SYNC2(sym, sym_pt, PARAMS, ARGS) \
  ORION_DEVICE_SYNC(sym, PARAMS, ARGS)                \
  ORION_DEVICE_SYNC(sym_pt, PARAMS, ARGS)

// The exported C API (include/orion.h).
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>

#include "orion.h"
#include "driver_functions.h"
#include "wrapper_support.h"

ORION_EXPORT int orion_is_active(void) { return orion::active_shim() != nullptr ? 1 : 0; }

ORION_EXPORT int orion_set_stream_class(void* cu_stream, const char* stream_class) {
  if (stream_class == nullptr) return EINVAL;
  sched::StreamClass cls;
  if (!sched::parse_stream_class(stream_class, &cls)) return EINVAL;
  if (reinterpret_cast<uintptr_t>(cu_stream) <= 2) return EINVAL;  // NULL, legacy, per-thread
  orion::Shim* shim = orion::active_shim();
  if (shim == nullptr) return ENODEV;
  shim->set_stream_class(orion::Shim::stream_id(static_cast<CUstream>(cu_stream), false), cls);
  return 0;
}

ORION_EXPORT int orion_set_thread_class(const char* thread_class) {
  std::optional<sched::StreamClass> cls;
  if (thread_class != nullptr && std::strcmp(thread_class, "stream") != 0) {
    sched::StreamClass parsed;
    if (!sched::parse_stream_class(thread_class, &parsed)) return EINVAL;
    cls = parsed;
  }
  orion::Shim* shim = orion::active_shim();
  if (shim == nullptr) return ENODEV;
  shim->set_thread_class(cls);
  return 0;
}

ORION_EXPORT int orion_get_stats(orion_stats* out, size_t size) {
  if (out == nullptr || size == 0) return EINVAL;
  orion::Shim* shim = orion::active_shim();
  if (shim == nullptr) return ENODEV;
  sched::DispatcherStats d = shim->dispatcher().stats();
  orion_stats s{};
  s.intercepted = d.submitted + d.queued_now;
  s.submitted = d.submitted;
  s.submitted_inline = d.submitted_inline;
  s.deferred = d.deferred;
  s.forced_by_starvation = d.forced_by_starvation;
  s.caller_waits = d.caller_waits;
  s.queued_now = d.queued_now;
  s.backend_errors = d.backend_errors;
  s.tracked_in_flight = shim->device().tracked_in_flight();
  s.communication_streams = shim->communication_streams();
  s.promoted = d.promoted;
  s.thread_classed = d.op_classed;
  if (const orion::GreenPartitions* g = shim->partitions()) {
    const orion::PartitionStats p = g->stats();
    s.partition_moved = p.moved;
    for (uint64_t n : p.in_place) s.partition_in_place += n;
  }
  const orion::ReleaseCallCounts releases = orion::release_call_counts();
  s.release_calls = releases.calls;
  s.release_calls_released = releases.released;
  s.holding_stopped = shim->holds_work() ? 0 : 1;
  s.streams = d.streams;
  // An older caller's smaller struct gets the leading fields it knows.
  std::memcpy(out, &s, std::min(size, sizeof s));
  return 0;
}

ORION_EXPORT int orion_flush(void) {
  orion::Shim* shim = orion::active_shim();
  if (shim == nullptr) return ENODEV;
  return shim->flush();
}

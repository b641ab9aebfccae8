// Stream and event lifetime, and stream capture.
//
// Stream classes: cuStreamCreateWithPriority maps CUDA's priority (lower = more urgent) to a
// class: priority <= ORION_HP_PRIORITY (default -1) is high priority, >= ORION_BE_PRIORITY
// (default 0) best effort, anything between unmanaged. LibTorch creates its low-priority pool
// streams at priority 0 (-> best effort) and high-priority ones at the device's greatest priority
// (-> high priority). cuStreamCreate, the NULL/legacy and per-thread streams are unmanaged. Under
// a policy that gates the whole process (gpud), every stream created is best effort, and so is the
// legacy stream (Shim::stream_created, the Shim's constructor).
#include "wrapper_support.h"

using orion::Shim;
namespace real = orion::real;

ORION_EXPORT CUresult CUDAAPI cuStreamCreate(CUstream* out, unsigned int flags) {
  ORION_REQUIRE_REAL(cuStreamCreate);
  CUresult rc = real::cuStreamCreate(out, flags);
  if (rc == CUDA_SUCCESS && out != nullptr) {
    if (Shim* shim = orion::active_shim()) {
      shim->stream_created(*out, flags, sched::StreamClass::kUnmanaged);
    }
  }
  return rc;
}

ORION_EXPORT CUresult CUDAAPI cuStreamCreateWithPriority(CUstream* out, unsigned int flags,
                                                         int priority) {
  ORION_REQUIRE_REAL(cuStreamCreateWithPriority);
  CUresult rc = real::cuStreamCreateWithPriority(out, flags, priority);
  if (rc == CUDA_SUCCESS && out != nullptr) {
    if (Shim* shim = orion::active_shim()) {
      shim->stream_created(*out, flags, shim->class_for_priority(priority));
    }
  }
  return rc;
}

ORION_EXPORT CUresult CUDAAPI cuEventCreate(CUevent* out, unsigned int flags) {
  ORION_REQUIRE_REAL(cuEventCreate);
  const CUresult rc = real::cuEventCreate(out, flags);
  if (rc == CUDA_SUCCESS && out != nullptr) {
    if (Shim* shim = orion::active_shim()) shim->event_created(*out, flags);
  }
  return rc;
}

// A green context's stream: classed by its priority like cuStreamCreateWithPriority's (the driver
// requires CU_STREAM_NON_BLOCKING). The shim's own partition streams are made through real::.
ORION_EXPORT CUresult CUDAAPI cuGreenCtxStreamCreate(CUstream* out, CUgreenCtx g, unsigned int flags,
                                                     int priority) {
  ORION_REQUIRE_REAL(cuGreenCtxStreamCreate);
  CUresult rc = real::cuGreenCtxStreamCreate(out, g, flags, priority);
  if (rc == CUDA_SUCCESS && out != nullptr) {
    if (Shim* shim = orion::active_shim()) {
      shim->stream_created(*out, flags, shim->class_for_priority(priority));
    }
  }
  return rc;
}

// The handle a device's primary context has: its end (a reset, the last release, the last green
// context's destroy) can then be named (generated::ContextEnd). Both calls below may make a primary
// context active again: not while a call that may end one is between its driver call and the
// shim's look at what ended (Shim::lock_context_lifecycle).
ORION_EXPORT CUresult CUDAAPI cuDevicePrimaryCtxRetain(CUcontext* out, CUdevice dev) {
  ORION_REQUIRE_REAL(cuDevicePrimaryCtxRetain);
  Shim* shim = orion::active_shim();
  if (shim == nullptr) return real::cuDevicePrimaryCtxRetain(out, dev);
  auto lifecycle = shim->lock_context_lifecycle();
  const CUresult rc = real::cuDevicePrimaryCtxRetain(out, dev);
  if (rc == CUDA_SUCCESS && out != nullptr) shim->primary_context_retained(dev, *out);
  return rc;
}
// A green context retains its device's primary context.
ORION_EXPORT CUresult CUDAAPI cuGreenCtxCreate(CUgreenCtx* out, CUdevResourceDesc desc, CUdevice dev,
                                               unsigned int flags) {
  ORION_REQUIRE_REAL(cuGreenCtxCreate);
  Shim* shim = orion::active_shim();
  if (shim == nullptr) return real::cuGreenCtxCreate(out, desc, dev, flags);
  auto lifecycle = shim->lock_context_lifecycle();
  return real::cuGreenCtxCreate(out, desc, dev, flags);
}

// An event opened from another process's handle is interprocess whatever flags were asked for:
// its records must never be held (the other process waits on whatever record the driver has).
ORION_EXPORT CUresult CUDAAPI cuIpcOpenEventHandle(CUevent* out, CUipcEventHandle handle) {
  ORION_REQUIRE_REAL(cuIpcOpenEventHandle);
  const CUresult rc = real::cuIpcOpenEventHandle(out, handle);
  if (rc == CUDA_SUCCESS && out != nullptr) {
    if (Shim* shim = orion::active_shim()) shim->event_created(*out, CU_EVENT_INTERPROCESS);
  }
  return rc;
}

// Both ABIs (the pre-4000 one has the same semantics).
#define ORION_STREAM_DESTROY(sym)                                                              \
  ORION_EXPORT CUresult CUDAAPI sym(CUstream s) {                                              \
    ORION_REQUIRE_REAL(sym);                                                                   \
    if (Shim* shim = orion::active_shim()) {                                                   \
      /* Queued work of a destroyed stream still runs (CUDA semantics): forget_stream drains  \
         first. A destroy the driver refuses leaves the stream as it was: its class comes     \
         back (the legacy stream's, under gpud, was no longer gated). */                      \
      const sched::StreamId id = Shim::stream_id(s, false);                                    \
      const sched::StreamClass cls = shim->dispatcher().stream_class(id);                      \
      shim->stream_ended(id);                                                                  \
      const CUresult rc = real::sym(s);                                                        \
      if (rc != CUDA_SUCCESS) shim->set_stream_class(id, cls);                                 \
      return rc;                                                                               \
    }                                                                                          \
    return real::sym(s);                                                                       \
  }
ORION_STREAM_DESTROY(cuStreamDestroy)
ORION_STREAM_DESTROY(cuStreamDestroy_v2)

#define ORION_EVENT_DESTROY(sym)                                                             \
  ORION_EXPORT CUresult CUDAAPI sym(CUevent e) {                                             \
    ORION_REQUIRE_REAL(sym);                                                                 \
    if (Shim* shim = orion::active_shim()) {                                                 \
      /* A queued record of this event must reach the driver while the event still exists;  \
         destroying does not synchronise, so deferred errors stay for the call that does. */  \
      shim->dispatcher().release_event(orion::event_id(e));                                  \
      shim->dispatcher().forget_event(orion::event_id(e));                                   \
      shim->event_destroyed(e);                                                              \
      return real::sym(e);                                                                   \
    }                                                                                        \
    return real::sym(e);                                                                     \
  }
ORION_EVENT_DESTROY(cuEventDestroy)
ORION_EVENT_DESTROY(cuEventDestroy_v2)

// --- handles that queued work may still use: a graph executable destroyed or updated, a module
// or library unloaded. Its queued launches reach the driver first; after an unload the shim
// forgets what it knew about the functions (their handle values may come back for new ones).
// The released work's deferred errors stay for the call that synchronises with it. ---
ORION_EXPORT CUresult CUDAAPI cuGraphExecDestroy(CUgraphExec g) {
  ORION_REQUIRE_REAL(cuGraphExecDestroy);
  if (Shim* shim = orion::scheduling_shim()) {
    shim->dispatcher().release_all();
    const CUresult rc = real::cuGraphExecDestroy(g);
    if (rc == CUDA_SUCCESS) shim->graph_exec_destroyed(g);
    return rc;
  }
  return real::cuGraphExecDestroy(g);
}
// An update may add or remove event nodes: what the executable does is read again.
#define ORION_GRAPH_EXEC_UPDATE(sym, PARAMS, ARGS)                                 \
  ORION_EXPORT CUresult CUDAAPI sym PARAMS {                                       \
    ORION_REQUIRE_REAL(sym);                                                       \
    if (Shim* shim = orion::scheduling_shim()) {                                   \
      shim->dispatcher().release_all();                                            \
      const CUresult rc = real::sym ARGS;                                          \
      if (rc == CUDA_SUCCESS) shim->graph_instantiated(g, graph);                  \
      return rc;                                                                   \
    }                                                                              \
    return real::sym ARGS;                                                         \
  }
ORION_GRAPH_EXEC_UPDATE(cuGraphExecUpdate_v2,
                        (CUgraphExec g, CUgraph graph, CUgraphExecUpdateResultInfo* info),
                        (g, graph, info))
ORION_GRAPH_EXEC_UPDATE(cuGraphExecUpdate,
                        (CUgraphExec g, CUgraph graph, CUgraphNode* error_node,
                         CUgraphExecUpdateResult* result),
                        (g, graph, error_node, result))

// --- instantiation: whether the executable records or waits on events (Shim::graph_instantiated) ---
namespace orion {
// An instantiate call's result, after the shim has read what the new executable does.
inline CUresult instantiated(CUresult rc, CUgraphExec* exec, CUgraph graph) {
  if (rc == CUDA_SUCCESS && exec != nullptr) {
    if (Shim* shim = scheduling_shim()) shim->graph_instantiated(*exec, graph);
  }
  return rc;
}
}  // namespace orion
#define ORION_GRAPH_INSTANTIATE(sym, last_t)                                        \
  ORION_EXPORT CUresult CUDAAPI sym(CUgraphExec* exec, CUgraph graph, last_t last) { \
    ORION_REQUIRE_REAL(sym);                                                         \
    return orion::instantiated(real::sym(exec, graph, last), exec, graph);           \
  }
ORION_GRAPH_INSTANTIATE(cuGraphInstantiateWithFlags, unsigned long long)
// With CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD the executable is also uploaded into the params'
// hUploadStream, behind that stream's work (as cuGraphUpload, a stream-ordered call): what is held
// reaches the driver first (released: errors stay for the call that synchronises).
#define ORION_GRAPH_INSTANTIATE_WITH_PARAMS(sym)                                                       \
  ORION_EXPORT CUresult CUDAAPI sym(CUgraphExec* exec, CUgraph graph, CUDA_GRAPH_INSTANTIATE_PARAMS* params) { \
    ORION_REQUIRE_REAL(sym);                                                                          \
    if (params != nullptr && (params->flags & CUDA_GRAPH_INSTANTIATE_FLAG_UPLOAD) != 0) {             \
      if (Shim* shim = orion::scheduling_shim()) shim->dispatcher().release_all();                    \
    }                                                                                                 \
    return orion::instantiated(real::sym(exec, graph, params), exec, graph);                          \
  }
ORION_GRAPH_INSTANTIATE_WITH_PARAMS(cuGraphInstantiateWithParams)
ORION_GRAPH_INSTANTIATE_WITH_PARAMS(cuGraphInstantiateWithParams_ptsz)
// The pre-12.0 ABIs: an error node and a log buffer instead of flags.
#define ORION_GRAPH_INSTANTIATE_V1(sym)                                                     \
  ORION_EXPORT CUresult CUDAAPI sym(CUgraphExec* exec, CUgraph graph, CUgraphNode* error_node, \
                                    char* log, size_t log_size) {                           \
    ORION_REQUIRE_REAL(sym);                                                                \
    return orion::instantiated(real::sym(exec, graph, error_node, log, log_size), exec, graph); \
  }
ORION_GRAPH_INSTANTIATE_V1(cuGraphInstantiate)
ORION_GRAPH_INSTANTIATE_V1(cuGraphInstantiate_v2)

#define ORION_UNLOAD(sym, handle_t)                                             \
  ORION_EXPORT CUresult CUDAAPI sym(handle_t h) {                               \
    ORION_REQUIRE_REAL(sym);                                                    \
    if (Shim* shim = orion::active_shim()) {                                    \
      shim->dispatcher().release_all();                                         \
      CUresult rc = real::sym(h);                                               \
      if (rc == CUDA_SUCCESS) shim->forget_functions();                         \
      return rc;                                                                \
    }                                                                           \
    return real::sym(h);                                                        \
  }
ORION_UNLOAD(cuModuleUnload, CUmodule)
ORION_UNLOAD(cuLibraryUnload, CUlibrary)

// --- capture: drain at begin (a deferred error there is returned and no capture begins);
// nothing is deferred while any capture is active ---
#define ORION_BEGIN_CAPTURE(sym, PARAMS, ARGS)                                 \
  ORION_EXPORT CUresult CUDAAPI sym PARAMS {                                   \
    ORION_REQUIRE_REAL(sym);                                                   \
    if (Shim* shim = orion::active_shim()) {                                   \
      return shim->begin_capture([&] { return real::sym ARGS; });              \
    }                                                                          \
    return real::sym ARGS;                                                     \
  }
ORION_BEGIN_CAPTURE(cuStreamBeginCapture, (CUstream s), (s))
ORION_BEGIN_CAPTURE(cuStreamBeginCapture_ptsz, (CUstream s), (s))
ORION_BEGIN_CAPTURE(cuStreamBeginCapture_v2, (CUstream s, CUstreamCaptureMode mode), (s, mode))
ORION_BEGIN_CAPTURE(cuStreamBeginCapture_v2_ptsz, (CUstream s, CUstreamCaptureMode mode), (s, mode))
ORION_BEGIN_CAPTURE(cuStreamBeginCaptureToGraph,
                    (CUstream s, CUgraph g, const CUgraphNode* deps, const CUgraphEdgeData* data,
                     size_t n, CUstreamCaptureMode mode),
                    (s, g, deps, data, n, mode))
ORION_BEGIN_CAPTURE(cuStreamBeginCaptureToGraph_ptsz,
                    (CUstream s, CUgraph g, const CUgraphNode* deps, const CUgraphEdgeData* data,
                     size_t n, CUstreamCaptureMode mode),
                    (s, g, deps, data, n, mode))

#define ORION_END_CAPTURE(sym)                                                 \
  ORION_EXPORT CUresult CUDAAPI sym(CUstream s, CUgraph* graph) {              \
    ORION_REQUIRE_REAL(sym);                                                   \
    CUresult rc = real::sym(s, graph);                                         \
    /* Over with a graph, or over because it was invalidated or left work unjoined. */  \
    bool ended = rc == CUDA_SUCCESS || rc == CUDA_ERROR_STREAM_CAPTURE_INVALIDATED ||  \
                 rc == CUDA_ERROR_STREAM_CAPTURE_UNJOINED;                              \
    if (Shim* shim = orion::active_shim(); shim && ended && shim->capturing()) {       \
      shim->end_capture();                                                              \
    }                                                                                   \
    return rc;                                                                 \
  }
ORION_END_CAPTURE(cuStreamEndCapture)
ORION_END_CAPTURE(cuStreamEndCapture_ptsz)

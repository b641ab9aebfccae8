// Kernel launches, graph launches and host functions: every entry point (and its _ptsz twin)
// goes through the dispatcher when scheduling is on.
#include "driver_functions.h"
#include "wrapper_support.h"

using orion::KernelLaunch;
using orion::Shim;
namespace real = orion::real;

// Each family is written once and stamped out for the base symbol and its _ptsz twin (per_thread:
// the NULL stream means the calling thread's default stream), as the other wrapper files do.
#define ORION_LAUNCH_KERNEL(sym, api, per_thread)                                              \
  ORION_EXPORT CUresult CUDAAPI sym(CUfunction f, unsigned gx, unsigned gy, unsigned gz,      \
                                    unsigned bx, unsigned by, unsigned bz, unsigned smem,      \
                                    CUstream s, void** params, void** extra) {                 \
    ORION_REQUIRE_REAL(sym);                                                                   \
    if (Shim* shim = orion::scheduling_shim()) {                                               \
      KernelLaunch call(KernelLaunch::Api::api, f, gx, gy, gz, bx, by, bz, smem, s, params,    \
                        extra);                                                                \
      return shim->launch(call, per_thread);                                                   \
    }                                                                                          \
    return real::sym(f, gx, gy, gz, bx, by, bz, smem, s, params, extra);                       \
  }
ORION_LAUNCH_KERNEL(cuLaunchKernel, kLaunch, false)
ORION_LAUNCH_KERNEL(cuLaunchKernel_ptsz, kLaunchPtsz, true)

// A NULL config is the driver's to reject: pass it through.
#define ORION_LAUNCH_KERNEL_EX(sym, api, per_thread)                                           \
  ORION_EXPORT CUresult CUDAAPI sym(const CUlaunchConfig* config, CUfunction f, void** params, \
                                    void** extra) {                                            \
    ORION_REQUIRE_REAL(sym);                                                                   \
    Shim* shim = orion::scheduling_shim();                                                     \
    if (shim != nullptr && config != nullptr) {                                                \
      KernelLaunch call(KernelLaunch::Api::api, config, f, params, extra);                     \
      return shim->launch(call, per_thread);                                                   \
    }                                                                                          \
    return real::sym(config, f, params, extra);                                                \
  }
ORION_LAUNCH_KERNEL_EX(cuLaunchKernelEx, kEx, false)
ORION_LAUNCH_KERNEL_EX(cuLaunchKernelEx_ptsz, kExPtsz, true)

#define ORION_LAUNCH_COOPERATIVE(sym, api, per_thread)                                         \
  ORION_EXPORT CUresult CUDAAPI sym(CUfunction f, unsigned gx, unsigned gy, unsigned gz,      \
                                    unsigned bx, unsigned by, unsigned bz, unsigned smem,      \
                                    CUstream s, void** params) {                               \
    ORION_REQUIRE_REAL(sym);                                                                   \
    if (Shim* shim = orion::scheduling_shim()) {                                               \
      KernelLaunch call(KernelLaunch::Api::api, f, gx, gy, gz, bx, by, bz, smem, s, params,    \
                        nullptr);                                                              \
      return shim->launch(call, per_thread);                                                   \
    }                                                                                          \
    return real::sym(f, gx, gy, gz, bx, by, bz, smem, s, params);                              \
  }
ORION_LAUNCH_COOPERATIVE(cuLaunchCooperativeKernel, kCooperative, false)
ORION_LAUNCH_COOPERATIVE(cuLaunchCooperativeKernel_ptsz, kCooperativePtsz, true)

// A graph is one opaque op on its stream: never split, never reordered with its neighbours nor
// with the executable's other launches (on any stream); one with event-record or event-wait
// nodes is never deferred either (Shim::launch_graph).
#define ORION_GRAPH_LAUNCH(sym, per_thread)                                                    \
  ORION_EXPORT CUresult CUDAAPI sym(CUgraphExec graph, CUstream s) {                           \
    ORION_REQUIRE_REAL(sym);                                                                   \
    if (Shim* shim = orion::scheduling_shim()) {                                               \
      auto call = orion::value_call(s, real::sym, graph, s);                                   \
      sched::Op op;                                                                            \
      op.kind = sched::OpKind::kGraphLaunch;                                                   \
      op.stream = Shim::stream_id(s, per_thread);                                              \
      op.event = Shim::graph_order_id(graph); /* behind the executable's earlier launches */   \
      op.borrowed = &call;                                                                     \
      op.clone = &decltype(call)::clone;                                                       \
      op.requested_class = Shim::thread_class(op.stream);                                      \
      return shim->launch_graph(graph, std::move(op));                                         \
    }                                                                                          \
    return real::sym(graph, s);                                                                \
  }
ORION_GRAPH_LAUNCH(cuGraphLaunch, false)
ORION_GRAPH_LAUNCH(cuGraphLaunch_ptsz, true)

#define ORION_HOST_FUNC(sym, per_thread)                                                       \
  ORION_EXPORT CUresult CUDAAPI sym(CUstream s, CUhostFn fn, void* user_data) {                \
    ORION_REQUIRE_REAL(sym);                                                                   \
    if (Shim* shim = orion::scheduling_shim()) {                                               \
      auto call = orion::value_call(s, real::sym, s, fn, user_data);                           \
      return orion::submit_call(shim, sched::OpKind::kHostFunc, Shim::stream_id(s, per_thread), \
                                call, true);                                                   \
    }                                                                                          \
    return real::sym(s, fn, user_data);                                                        \
  }
ORION_HOST_FUNC(cuLaunchHostFunc, false)
ORION_HOST_FUNC(cuLaunchHostFunc_ptsz, true)

// Function attributes apply to launches when they reach the driver: a change after a held launch
// would change (or fail) that launch, so it first releases everything held (the release_all
// class). Setting the value the function already has cannot: PyTorch's flash attention and
// CUTLASS kernels set the dynamic shared memory size before every launch, and releasing there
// would undo the scheduling of every best-effort kernel held at the time.
ORION_EXPORT CUresult CUDAAPI cuFuncSetAttribute(CUfunction f, CUfunction_attribute attrib, int value) {
  ORION_REQUIRE_REAL(cuFuncSetAttribute);
  if (orion::active_shim() != nullptr) {
    int current = 0;
    const bool same = real::cuFuncGetAttribute != nullptr &&
                      real::cuFuncGetAttribute(&current, attrib, f) == CUDA_SUCCESS && current == value;
    if (!same) orion::generated::release_held_work(orion::DriverFunctionId::cuFuncSetAttribute);
  }
  return real::cuFuncSetAttribute(f, attrib, value);
}
ORION_EXPORT CUresult CUDAAPI cuKernelSetAttribute(CUfunction_attribute attrib, int value, CUkernel k,
                                                   CUdevice dev) {
  ORION_REQUIRE_REAL(cuKernelSetAttribute);
  if (orion::active_shim() != nullptr) {
    int current = 0;
    const bool same = real::cuKernelGetAttribute != nullptr &&
                      real::cuKernelGetAttribute(&current, attrib, k, dev) == CUDA_SUCCESS && current == value;
    if (!same) orion::generated::release_held_work(orion::DriverFunctionId::cuKernelSetAttribute);
  }
  return real::cuKernelSetAttribute(attrib, value, k, dev);
}

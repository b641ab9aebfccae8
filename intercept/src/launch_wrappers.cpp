// Kernel launches, graph launches and host functions: every entry point (and its _ptsz twin)
// goes through the dispatcher when scheduling is on.
#include "wrapper_support.h"

using orion::KernelLaunch;
using orion::Shim;
namespace real = orion::real;

ORION_EXPORT CUresult CUDAAPI cuLaunchKernel(CUfunction f, unsigned gx, unsigned gy, unsigned gz,
                                             unsigned bx, unsigned by, unsigned bz, unsigned smem,
                                             CUstream s, void** params, void** extra) {
  ORION_REQUIRE_REAL(cuLaunchKernel);
  if (Shim* shim = orion::scheduling_shim()) {
    KernelLaunch call(KernelLaunch::Api::kLaunch, f, gx, gy, gz, bx, by, bz, smem, s, params, extra);
    return shim->launch(call, false);
  }
  return real::cuLaunchKernel(f, gx, gy, gz, bx, by, bz, smem, s, params, extra);
}

ORION_EXPORT CUresult CUDAAPI cuLaunchKernel_ptsz(CUfunction f, unsigned gx, unsigned gy,
                                                  unsigned gz, unsigned bx, unsigned by,
                                                  unsigned bz, unsigned smem, CUstream s,
                                                  void** params, void** extra) {
  ORION_REQUIRE_REAL(cuLaunchKernel_ptsz);
  if (Shim* shim = orion::scheduling_shim()) {
    KernelLaunch call(KernelLaunch::Api::kLaunchPtsz, f, gx, gy, gz, bx, by, bz, smem, s, params,
                      extra);
    return shim->launch(call, true);
  }
  return real::cuLaunchKernel_ptsz(f, gx, gy, gz, bx, by, bz, smem, s, params, extra);
}

ORION_EXPORT CUresult CUDAAPI cuLaunchKernelEx(const CUlaunchConfig* config, CUfunction f,
                                               void** params, void** extra) {
  ORION_REQUIRE_REAL(cuLaunchKernelEx);
  Shim* shim = orion::scheduling_shim();
  if (shim != nullptr && config != nullptr) {
    KernelLaunch call(KernelLaunch::Api::kEx, config, f, params, extra);
    return shim->launch(call, false);
  }
  return real::cuLaunchKernelEx(config, f, params, extra);
}

ORION_EXPORT CUresult CUDAAPI cuLaunchKernelEx_ptsz(const CUlaunchConfig* config, CUfunction f,
                                                    void** params, void** extra) {
  ORION_REQUIRE_REAL(cuLaunchKernelEx_ptsz);
  Shim* shim = orion::scheduling_shim();
  if (shim != nullptr && config != nullptr) {
    KernelLaunch call(KernelLaunch::Api::kExPtsz, config, f, params, extra);
    return shim->launch(call, true);
  }
  return real::cuLaunchKernelEx_ptsz(config, f, params, extra);
}

ORION_EXPORT CUresult CUDAAPI cuLaunchCooperativeKernel(CUfunction f, unsigned gx, unsigned gy,
                                                        unsigned gz, unsigned bx, unsigned by,
                                                        unsigned bz, unsigned smem, CUstream s,
                                                        void** params) {
  ORION_REQUIRE_REAL(cuLaunchCooperativeKernel);
  if (Shim* shim = orion::scheduling_shim()) {
    KernelLaunch call(KernelLaunch::Api::kCooperative, f, gx, gy, gz, bx, by, bz, smem, s, params,
                      nullptr);
    return shim->launch(call, false);
  }
  return real::cuLaunchCooperativeKernel(f, gx, gy, gz, bx, by, bz, smem, s, params);
}

ORION_EXPORT CUresult CUDAAPI cuLaunchCooperativeKernel_ptsz(CUfunction f, unsigned gx,
                                                             unsigned gy, unsigned gz,
                                                             unsigned bx, unsigned by,
                                                             unsigned bz, unsigned smem,
                                                             CUstream s, void** params) {
  ORION_REQUIRE_REAL(cuLaunchCooperativeKernel_ptsz);
  if (Shim* shim = orion::scheduling_shim()) {
    KernelLaunch call(KernelLaunch::Api::kCooperativePtsz, f, gx, gy, gz, bx, by, bz, smem, s,
                      params, nullptr);
    return shim->launch(call, true);
  }
  return real::cuLaunchCooperativeKernel_ptsz(f, gx, gy, gz, bx, by, bz, smem, s, params);
}

// A graph is one opaque op on its stream: never split, never reordered with its neighbours.
#define ORION_GRAPH_LAUNCH(sym, per_thread)                                                    \
  ORION_EXPORT CUresult CUDAAPI sym(CUgraphExec graph, CUstream s) {                           \
    ORION_REQUIRE_REAL(sym);                                                                   \
    if (Shim* shim = orion::scheduling_shim()) {                                               \
      auto call = orion::value_call(s, real::sym, graph, s);                                   \
      return orion::submit_call(shim, sched::OpKind::kGraphLaunch,                             \
                                Shim::stream_id(s, per_thread), call, true);                   \
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

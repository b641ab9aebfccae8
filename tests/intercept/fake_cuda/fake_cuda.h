/* Control and inspection API of the test-only fake libcuda.so.1 (never installed, never used
 * outside tests/intercept). The fake records every driver call a test program or the shim makes,
 * keeps a virtual timeline per stream, and can be told to fail a call. */
#ifndef FAKE_CUDA_H_
#define FAKE_CUDA_H_

#include <stddef.h>
#include <stdint.h>

#include <cuda.h>

#ifdef __cplusplus
extern "C" {
#endif

enum { FAKE_CUDA_MAX_PARAM_BYTES = 256 };

typedef struct fake_cuda_call {
  char name[64];          /* the exported symbol that was reached, e.g. "cuLaunchKernel_ptsz" */
  uint64_t index;         /* position in the log */
  uint64_t stream;        /* raw CUstream value (0 when the call has none) */
  uint64_t function;      /* CUfunction of launches */
  uint64_t event;         /* CUevent of event calls */
  uint64_t value;         /* copy/set size in bytes, graph handle, pointer, ... (per call) */
  unsigned grid[3], block[3], shared_mem;
  size_t param_bytes;     /* launches: the argument bytes the driver received */
  unsigned char params[FAKE_CUDA_MAX_PARAM_BYTES];
  int result;             /* CUresult returned */
  uint64_t context;       /* the calling thread's current context */
  int captured;           /* stream-ordered work recorded into an active capture (not run) */
  uint64_t thread;        /* the calling thread (fake_cuda_thread_token of that thread) */
  int64_t time_ns;        /* CLOCK_MONOTONIC when the call reached the fake (every process's clock) */
} fake_cuda_call;

/* Clears the log, failure injections and busy streams (streams/events/functions stay valid). */
void fake_cuda_reset(void);
size_t fake_cuda_call_count(void);
/* Copies log entry `index`; returns 0, or -1 when out of range. */
int fake_cuda_get_call(size_t index, fake_cuda_call* out);

/* Primary context of fake device `device` (0 or 1); the handles cuDevicePrimaryCtxRetain returns. */
CUcontext fake_cuda_primary_context(int device);
/* Ends context `ctx` (made with cuCtxCreate) as cuCtxDestroy does, through an entry point the shim
 * does not wrap: a context that ends where the shim cannot tell which one (a primary context's
 * last release through a retain the shim never saw, a driver newer than the shim). The fake's
 * primary contexts end at their last cuDevicePrimaryCtxRelease or a cuDevicePrimaryCtxReset
 * (cuDevicePrimaryCtxGetState answers whether one is active), green contexts at cuGreenCtxDestroy. */
CUresult fake_cuda_end_context(CUcontext ctx);
/* With `enabled`, the stream and event handles a context's end took along are handed out again,
 * newest first, to the next cuStreamCreate* / cuEventCreate (as the driver's freed objects'
 * addresses come back). Off by default, so that tests which key what they saw by handle value
 * (the differential test) stay unambiguous; fake_cuda_reset() turns it off and forgets them. */
void fake_cuda_set_handle_reuse(int enabled);
/* Retains of device `device`'s primary context not released yet (-1: no such device). Retains
 * outlive fake_cuda_reset(), as in a process: a test that needs the last release first releases
 * those earlier tests left (release_primary_retains in test_support.h). */
int fake_cuda_primary_retains(int device);

/* A kernel function (of the calling thread's current context, device 0's primary context when
 * none is current) with `count` parameters of the given sizes (cuFuncGetParamInfo answers
 * them). sizes == NULL: the fake's cuFuncGetParamInfo answers CUDA_ERROR_NOT_SUPPORTED for it. */
CUfunction fake_cuda_make_function(const char* name, size_t count, const size_t* sizes);
void fake_cuda_set_kernel_duration_ns(CUfunction f, int64_t ns);

/* A loaded module (or library: the same handle works as CUmodule and CUlibrary). cuModuleUnload /
 * cuLibraryUnload unload it: its functions become invalid handles, and their handle values are
 * handed out again to functions made later (as a real driver reuses addresses). */
uint64_t fake_cuda_make_module(void);
CUfunction fake_cuda_make_function_in(uint64_t module, const char* name, size_t count,
                                      const size_t* sizes);
/* A CUkernel of a library: context-independent, answered by cuKernelGetName/cuKernelGetParamInfo
 * only (cuFuncGetName/cuFuncGetParamInfo answer CUDA_ERROR_INVALID_VALUE for it); launches accept
 * it cast to CUfunction. */
CUkernel fake_cuda_make_kernel(uint64_t library, const char* name, size_t count,
                               const size_t* sizes);

/* The next call of exported symbol `symbol` returns `result` (it is still logged). */
void fake_cuda_fail_next(const char* symbol, int result);

/* The next launch through exported symbol `symbol` (or the next cuDevicePrimaryCtxGetState) sleeps
 * `us` microseconds before the fake handles it (outside the fake's lock): a slow driver call, to
 * open a race window. */
void fake_cuda_delay_next(const char* symbol, int64_t us);
/* The same for the calling thread's next call of `symbol` only (cuEventQuery too), whatever other
 * threads call meanwhile; whether it is still pending, and how many calls sleep in a delay now. */
void fake_cuda_delay_next_on_this_thread(const char* symbol, int64_t us);
int fake_cuda_delay_pending_on_this_thread(const char* symbol);
int fake_cuda_delays_sleeping(void);

/* A busy stream holds its work: events recorded on it while busy and cuStreamQuery report
 * CUDA_ERROR_NOT_READY until the stream is released (busy = 0) or synchronised. */
void fake_cuda_set_stream_busy(CUstream stream, int busy);

/* cuGetProcAddress lookups answered so far (to check the probe sequence). */
size_t fake_cuda_proc_lookups(void);

/* Logging on (default) or off (benchmarks: the log would grow without bound). */
void fake_cuda_set_logging(int enabled);

/* Driver-call cost model: every logged driver call busy-waits `ns` nanoseconds (0: off), so a
 * benchmark counts what the shim adds in driver calls, not only in its own code. */
void fake_cuda_set_call_cost_ns(int64_t ns);
/* Green contexts (cuGreenCtxCreate & co.): the SMs of context `ctx` (a green context's CUcontext:
 * its partition; a primary context: the device's), -1 for an unknown context. */
int fake_cuda_context_sm_count(CUcontext ctx);
/* Times a green context was made current on a thread while another thread had it current (the
 * driver allows one thread at a time). */
uint64_t fake_cuda_green_ctx_violations(void);
/* A stream's virtual clock: when the work submitted to it so far ends (waits included). */
int64_t fake_cuda_stream_time_ns(CUstream stream);

/* Copies that reached the driver after their host memory was freed (cuMemFreeHost) or
 * unregistered (cuMemHostUnregister): the driver fails them with CUDA_ERROR_INVALID_VALUE (a real
 * GPU would read or write freed memory). */
uint64_t fake_cuda_host_use_after_free(void);

/* The calling thread's token, as logged in fake_cuda_call.thread. Each thread has its own
 * per-thread default stream (CU_STREAM_PER_THREAD, or NULL through a _ptsz entry point). */
uint64_t fake_cuda_thread_token(void);

/* Logged driver calls made so far (counted with logging on or off; never reset). */
uint64_t fake_cuda_calls_made(void);

/* A driver newer than the shim's build: from `version` on (0: never), cuGetProcAddress answers
 * cuLaunchKernel (legacy-stream semantics) with another ABI's entry point, as a real driver answers
 * each ABI range with its own function; its launches are logged as "cuLaunchKernel_newer_abi".
 * fake_cuda_reset() clears it. */
void fake_cuda_set_newer_launch_abi(int version);
CUresult CUDAAPI fake_cuLaunchKernel_newer_abi(CUfunction f, unsigned gx, unsigned gy, unsigned gz, unsigned bx,
                                               unsigned by, unsigned bz, unsigned smem, CUstream s, void** p,
                                               void** e);
/* From the same version on, cuDeviceGetAttribute (an order-free function) is answered with this
 * entry point of its own: the shim hands it out and keeps holding work. */
CUresult CUDAAPI fake_cuDeviceGetAttribute_newer_abi(int* v, CUdevice_attribute a, CUdevice d);
/* And cuEventCreate (order-free, but the shim's hand-written wrapper notes interprocess events):
 * handed out, it makes the shim stop holding work. */
CUresult CUDAAPI fake_cuEventCreate_newer_abi(CUevent* out, unsigned int flags);

/* The real driver's answer is unverified where per-thread default-stream semantics are asked for
 * below the version that brought a name's per-thread variant (cuLaunchKernel at 4000 with the
 * flag; _ptsz came at 7000). 0 (default): not found; 1: the function it answers without the flag;
 * 2: for cuLaunchKernel, an entry point of its own (fake_cuLaunchKernel_newer_abi), one no table
 * lists. fake_cuda_reset() restores 0. */
void fake_cuda_set_early_per_thread_answer(int answer);

/* The fake's own function for an exported symbol name, bypassing dlsym (and so the shim), e.g.
 * to measure the cost of calling the driver directly. NULL if the fake does not export it. */
void* fake_cuda_own_symbol(const char* symbol);

#ifdef __cplusplus
}
#endif

#ifdef __cplusplus
#include <cstring>

/* The bytes of each argument back to back, no padding (stops at `capacity`): what the fake
 * stores in `params` for entry points that record their arguments, and what a test builds from
 * the arguments it passed, to check that the driver received exactly those. */
template <typename... Args>
size_t fake_cuda_pack_args(unsigned char* out, size_t capacity, const Args&... args) {
  size_t off = 0;
  bool full = false;
  auto put = [&](const auto& a) {
    if (full || off + sizeof a > capacity) {
      full = true;
      return;
    }
    std::memcpy(out + off, &a, sizeof a);
    off += sizeof a;
  };
  (put(args), ...);
  return off;
}
#endif

#endif /* FAKE_CUDA_H_ */

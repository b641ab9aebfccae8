/* orion.h: the C API of libgpu_scheduler.so (the LD_PRELOAD CUDA scheduler).
 *
 * Programs should not link against the library: look the functions up at run time, so the same
 * binary runs unchanged with and without the shim:
 *
 *   #include <dlfcn.h>
 *   #include "orion.h"
 *
 *   orion_set_stream_class_fn set_class =
 *       (orion_set_stream_class_fn)dlsym(RTLD_DEFAULT, "orion_set_stream_class");
 *   if (set_class != NULL) set_class((void*)my_cu_stream, "best_effort");
 *
 *   orion_set_thread_class_fn set_thread =
 *       (orion_set_thread_class_fn)dlsym(RTLD_DEFAULT, "orion_set_thread_class");
 *   if (set_thread != NULL) set_thread("high_priority");  // this thread's launches from now on
 *
 *   orion_get_stats_fn get_stats = (orion_get_stats_fn)dlsym(RTLD_DEFAULT, "orion_get_stats");
 *   orion_stats stats;
 *   if (get_stats != NULL && get_stats(&stats, sizeof stats) == 0) printf("%llu deferred\n",
 *       (unsigned long long)stats.deferred);
 *
 * All functions return 0 on success, a positive errno-style code otherwise (EINVAL: bad
 * argument; ENODEV: scheduling is off, i.e. USE_ORION_SCHEDULER is not 1).
 */
#ifndef ORION_H_
#define ORION_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct orion_stats {
  uint64_t intercepted;          /* stream-ordered ops the scheduler took (submitted + queued) */
  uint64_t submitted;            /* ops handed to the driver */
  uint64_t submitted_inline;     /* of those, in the caller's thread at the call */
  uint64_t deferred;             /* ops that were queued */
  uint64_t forced_by_starvation; /* best-effort ops admitted by the starvation bound */
  uint64_t caller_waits;         /* ops whose arguments could not be copied (caller waited) */
  uint64_t queued_now;           /* ops queued at the time of the call */
  uint64_t backend_errors;       /* driver errors of submitted ops */
  uint64_t tracked_in_flight;    /* high-priority/best-effort ops not yet seen complete */
  uint64_t communication_streams;/* streams switched to the communication class (NCCL kernels) */
  uint64_t promoted;             /* queued best-effort ops submitted early: a high-priority (or
                                    unmanaged) op of the same stream arrived behind them */
  uint64_t thread_classed;       /* ops scheduled with their thread's class (orion_set_thread_class) */
  uint64_t partition_moved;      /* ORION_POLICY=partition: best-effort kernels run in a green context */
  uint64_t partition_in_place;   /* ORION_POLICY=partition: best-effort kernels that could not move
                                    (the shim's log at exit says why) */
  uint64_t release_calls;        /* driver calls of the release_all class (driver_api_classes.csv:
                                    frees, resets, attribute changes, anything unclassified) */
  uint64_t release_calls_released; /* of those, calls that found held work and released it */
  uint64_t holding_stopped;      /* 1 once the shim holds no work back for good: a program was handed
                                    a driver entry point the shim could not wrap (a newer ABI than
                                    its build's); the log names it */
  uint64_t streams;              /* streams the scheduler keeps state for: each stream handle it has
                                    seen, the legacy stream, and one per live thread that used its
                                    per-thread default stream (an exited thread's is reused) */
} orion_stats;

/* 1 when scheduling is on (USE_ORION_SCHEDULER=1), 0 in pass-through mode. */
int orion_is_active(void);
typedef int (*orion_is_active_fn)(void);

/* Sets the class of a CUstream: "high_priority"/"hp", "best_effort"/"be",
 * "communication"/"comm" or "unmanaged". Queued work of the stream is drained first. EINVAL for
 * NULL, CU_STREAM_LEGACY and CU_STREAM_PER_THREAD: their work is never held (the legacy stream
 * orders every blocking stream; a per-thread stream can only be named by its own thread). */
int orion_set_stream_class(void* cu_stream, const char* stream_class);
typedef int (*orion_set_stream_class_fn)(void*, const char*);

/* Sets the class of every stream-ordered op the calling thread issues from now on (kernel
 * launches, copies, memsets, event records and waits), whatever its stream: the same names as
 * orion_set_stream_class, or "stream" (or NULL) to go back to each stream's own class, the
 * default. This is how a pipeline runtime marks its phases: forward best effort, backward high
 * priority. Autograd runs a backward kernel on its forward's stream, so classing by stream cannot
 * tell them apart; classing by the thread that issues them can.
 * Stream order always holds: a high-priority op issued on a stream that still holds queued
 * best-effort work submits that work first ("promoted" in orion_stats). Not overridden: streams
 * that carry NCCL kernels (communication), and the legacy NULL stream (every blocking stream
 * orders with it, so none of its work is deferred by thread). Other threads are not affected. */
int orion_set_thread_class(const char* thread_class);
typedef int (*orion_set_thread_class_fn)(const char*);

/* Copies the statistics into *out; `size` is sizeof(orion_stats) as the caller knows it. */
int orion_get_stats(orion_stats* out, size_t size);
typedef int (*orion_get_stats_fn)(orion_stats*, size_t);

/* Submits everything queued (all streams) and writes the trace if ORION_TRACE is set. Returns
 * the first driver error of deferred work as a CUresult value (>0), or 0. */
int orion_flush(void);
typedef int (*orion_flush_fn)(void);

#ifdef __cplusplus
}
#endif

#endif /* ORION_H_ */

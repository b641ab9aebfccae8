// Internal state of the fake driver, shared by its translation units (test-only code).
#pragma once

#define __CUDA_API_VERSION_INTERNAL 1
#include "fake_cuda.h"

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#define FAKE_EXPORT extern "C" __attribute__((visibility("default")))

namespace fake_cuda_impl {

// Contexts: two devices, each with one primary context (the handles below). Every stream, event
// and function belongs to the context current when it was made.
constexpr int kDevices = 2;
constexpr uint64_t kPrimaryContext[kDevices] = {0xC7000000, 0xC7001000};
constexpr int kSmCount[kDevices] = {132, 114};
int device_of(uint64_t ctx);  // -1 for an unknown (or destroyed) context
// True once `ctx` ended: a context made by cuCtxCreate that cuCtxDestroy destroyed, a primary
// context after its last release or a reset (until retained again), a destroyed green context's.
bool context_destroyed(uint64_t ctx);
struct State;
// Under State::mu: the streams, events and functions of context `ctx` go with it. Work on its
// streams answers `streams_answer`; with CUDA_ERROR_INVALID_HANDLE their handles are handed out
// again (fake_cuda_set_handle_reuse), else (a green context's) they leak, as the driver says.
void take_context_along(State& s, uint64_t ctx, CUresult streams_answer);
// Primary contexts' retains: a green context retains its device's primary context, and its
// destroy releases it (which may be the last release: the primary context ends).
void primary_retain(int device);
CUresult primary_release(State& s, int device);
void primary_reset_all();  // fake_cuda_reset: every primary context active again
// Green contexts (fake_cuda_green.cpp): the device of a green context's CUcontext (-1: none), and
// the calling thread's current context changing from `before` to `after` (the one-thread rule).
int green_device(uint64_t ctx);
bool green_ended(uint64_t ctx);  // the CUcontext of a destroyed green context
void green_current_changed(uint64_t before, uint64_t after);

struct Function {
  std::string name;
  uint64_t ctx = 0;
  uint64_t owner = 0;      // module/library (0: none; never unloaded)
  bool is_kernel = false;  // a CUkernel (context-independent; cuKernel* queries only)
  bool params_known = false;
  std::vector<size_t> sizes, offsets;
  int64_t duration_ns = 1000;
  std::map<int, int> attributes;  // cuFuncSetAttribute / cuKernelSetAttribute (unset: 0)
};
struct Stream {
  int64_t time_ns = 0;
  bool busy = false;
  uint64_t busy_epoch = 0;
  int priority = 0;
  uint64_t ctx = 0;        // 0: a handle the fake never created (control API only)
  unsigned flags = 0;      // CU_STREAM_NON_BLOCKING: never synchronises with the legacy stream
};
struct Event {
  int64_t time_ns = 0;
  uint64_t stream = 0;
  bool held = false;  // recorded while its stream was busy
  uint64_t epoch = 0;
  uint64_t ctx = 0;
  uint64_t record_seq = 0;  // which record the event holds now (0: never recorded)
  unsigned flags = 0;       // cuEventCreate's; an event opened from an IPC handle is INTERPROCESS
};
// A node of a graph built with the explicit graph API (fake_cuda_graphs.cpp); the graphs a capture
// makes have none. Event record / wait nodes name their event, child-graph nodes their graph,
// kernel nodes their function (a CUfunction or CUkernel handle).
struct GraphNode {
  CUgraphNodeType type = CU_GRAPH_NODE_TYPE_EMPTY;
  uint64_t event = 0;
  uint64_t child = 0;
  uint64_t function = 0;
};
// A graph executable. The driver copies the graph at instantiation, so the graph's later edits and
// destruction do not reach it: it keeps its graph's nodes and those of their child graphs (depth
// first), by the node handles an edit names, with their parameters as of now (cuGraphExecUpdate and
// the cuGraphExec*SetParams edits change these, never the graph).
struct GraphExec {
  std::vector<uint64_t> nodes;
  std::vector<GraphNode> now;
};
// Host memory the driver knows (fake_cuda_memory.cpp): cuMemAllocHost / cuMemHostAlloc (owned,
// freed by cuMemFreeHost) and cuMemHostRegister (the program's, until cuMemHostUnregister). A
// range stays in the map after it ends (`live` false) so that work using it later is caught.
struct HostRange {
  size_t bytes = 0;
  bool live = true;
  bool owned = false;  // allocated by the fake (freed with std::free)
};
// An active stream capture.
struct Capture {
  uint64_t thread = 0;  // thread_token() of the thread that began it
  CUstreamCaptureMode mode = CU_STREAM_CAPTURE_MODE_GLOBAL;
  bool invalidated = false;
  uint64_t nodes = 0;
  uint64_t ctx = 0;  // the context current when it began (a per-thread stream has no other)
};

struct Module {
  bool loaded = true;
  uint64_t ctx = 0;  // the context it was loaded into, unloaded with it (0: a library, of none)
};

struct State {
  std::mutex mu;
  std::vector<fake_cuda_call> log;
  std::map<std::string, int> fail_next;
  std::map<std::string, int64_t> delay_next_us;
  std::unordered_map<uint64_t, Stream> streams;  // by sid(): created, legacy (per context), per-thread
  std::unordered_map<uint64_t, Event> events;
  std::unordered_map<uint64_t, Function*> functions;
  std::vector<uint64_t> free_function_handles;  // of unloaded functions: reused, like addresses
  std::vector<Function*> unloaded;  // kept (their names may still be referenced), never freed
  std::unordered_map<uint64_t, Module> modules;  // module/library handles
  std::unordered_map<uint64_t, std::vector<uint64_t>> graphs;  // graph -> its nodes
  std::unordered_map<uint64_t, GraphNode> graph_nodes;
  std::unordered_map<uint64_t, GraphExec> graph_execs;  // live executables (destroyed: gone)
  uint64_t next_handle = 0x10000;
  uint64_t next_devptr = 0x7f0000000000;
  uint64_t next_record_seq = 1;
  size_t proc_lookups = 0;
  // A driver newer than the shim's build: from this version on, cuGetProcAddress answers
  // cuLaunchKernel with an entry point of another ABI (fake_cuda_set_newer_launch_abi). 0: none.
  int newer_launch_abi_from = 0;
  // How a per-thread lookup below the version of the name's first per-thread variant is answered
  // (fake_cuda_set_early_per_thread_answer): 0 not found, 1 the legacy function, 2 an entry point
  // of its own (cuLaunchKernel only).
  int early_per_thread_answer = 0;
  std::unordered_map<uint64_t, Capture> captures;  // by stream id
  bool logging = true;
  int64_t call_cost_ns = 0;
  uint64_t calls_made = 0;
  std::map<uintptr_t, HostRange> host;  // by start address
  // Streams a context's end took along: work on them fails with this answer
  // (CUDA_ERROR_INVALID_HANDLE; a destroyed green context's, CUDA_ERROR_CONTEXT_IS_DESTROYED).
  std::unordered_map<uint64_t, CUresult> dead_streams;
  // Handles of the streams and events a cuCtxDestroy took along: with reuse_handles
  // (fake_cuda_set_handle_reuse), handed out again, newest first, to the next streams
  // (cuStreamCreate*) and events (cuEventCreate) made, as the driver's freed objects' addresses
  // come back.
  std::vector<uint64_t> free_stream_handles, free_event_handles;
  bool reuse_handles = false;
  uint64_t host_use_after_free = 0;     // copies that touched freed / unregistered host memory
};

State& st();
// Appends a log entry (under st().mu) and returns it.
fake_cuda_call& begin(State& s, const char* name);
// fake_cuda_delay_next: sleeps the delay set for call `name`, if any (outside the lock), once.
void sleep_if_delayed(State& s, const char* name);
// Applies a pending failure injection for this call, else returns `ok`.
CUresult finish(State& s, fake_cuda_call& c, CUresult ok = CUDA_SUCCESS);
// Stream identity: NULL/legacy -> kLegacyStream | the current context: each context's own legacy
// stream ("an implicit stream which synchronizes with all other streams in the same CUcontext
// except for non-blocking streams", the CUDA runtime's stream synchronization behavior); the
// per-thread default stream (NULL through a _ptsz entry point, or CU_STREAM_PER_THREAD) ->
// kPerThreadStream | the calling thread's token: each thread's own stream, as in the driver (not
// modelled: a thread's per-thread streams of different contexts are one).
constexpr uint64_t kPerThreadStream = uint64_t{1} << 62;
constexpr uint64_t kLegacyStream = uint64_t{1} << 61;
uint64_t sid(CUstream s, bool per_thread);
inline uint64_t legacy_stream_of(uint64_t ctx) { return kLegacyStream | ctx; }
inline bool legacy_stream_id(uint64_t id) { return (id & kLegacyStream) != 0; }
inline uint64_t legacy_stream_ctx(uint64_t id) { return id & ~kLegacyStream; }
inline bool default_stream_id(uint64_t id) { return legacy_stream_id(id) || (id & kPerThreadStream) != 0; }

// The calling thread's current context (0: none), its capture mode, and a token naming it.
uint64_t current_ctx();
CUstreamCaptureMode& thread_capture_mode();
uint64_t thread_token();
// What every call on stream `id` answers once its context ended (CUDA_SUCCESS: it has not).
CUresult dead_stream_answer(const State& s, uint64_t id);
// Whether the calling thread may use stream `id` (under s.mu): CUDA_ERROR_INVALID_CONTEXT with no
// current context, CUDA_ERROR_INVALID_HANDLE for a stream of another context.
CUresult check_stream(State& s, uint64_t id);
// A new function (or, is_kernel, a library's CUkernel) of `owner` (a module, library or 0), in the
// current context (device 0's primary when none is current); `sizes` null: parameters unknown;
// `aligns` null: each parameter aligned to its size, at most 8. Takes State::mu.
uint64_t make_function(uint64_t owner, const char* name, size_t count, const size_t* sizes, bool is_kernel,
                       const size_t* aligns = nullptr);
// check_stream for work enqueued on the stream (launches, asynchronous copies and sets, waits),
// which on the legacy stream may also fail CUDA_ERROR_STREAM_CAPTURE_IMPLICIT (below).
CUresult check_enqueue(State& s, uint64_t id);
// True (and the captures invalidated) when work on context `ctx`'s legacy stream would wait for
// a capturing blocking stream: the call fails CUDA_ERROR_STREAM_CAPTURE_IMPLICIT.
bool legacy_work_waits_for_a_capture(State& s, uint64_t ctx);
// Whether `capture` (of stream `capturing`) is a blocking stream's capture in context `ctx`.
bool blocks_legacy_stream(const State& s, uint64_t capturing, const Capture& capture, uint64_t ctx);
// A potentially unsafe call (query, synchronise, allocation, free) during a capture, under s.mu:
// when the calling thread is prohibited from it (its own non-relaxed capture, or another thread's
// global-mode capture while this thread is not relaxed) the captures in question are
// invalidated and CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED is returned.
CUresult unsafe_call(State& s);
// Stream-ordered work of `duration_ns` on stream `id` (under s.mu): a capturing stream records a
// node instead; the legacy stream waits for every blocking stream, a blocking stream for the
// legacy stream. Returns true when the work was captured (it must not run).
bool advance(State& s, uint64_t id, int64_t duration_ns, fake_cuda_call& c);
// A handle for a new stream or event (under s.mu): a freed one of that kind first (with
// reuse_handles), else a new one.
uint64_t new_handle(State& s, std::vector<uint64_t>& freed);
// Records the event-record nodes of executable `exec`'s graph at stream `id` (under s.mu).
void record_graph_events(State& s, uint64_t exec, uint64_t stream_id);
// CUDA_ERROR_INVALID_HANDLE for an executable the fake never made or one destroyed (under s.mu).
CUresult check_graph_exec(const State& s, uint64_t exec);
// Records event `event_handle` at stream `id`'s current time (under s.mu); the record's number.
uint64_t record_event_now(State& s, uint64_t event_handle, uint64_t id);
// Whether [p, p+n) lies in live pinned/registered host memory, and whether it touches host memory
// that was freed or unregistered (under s.mu).
bool host_pinned(const State& s, const void* p);
bool host_freed(const State& s, const void* p, size_t n);
// A logged call with no effect beyond the log and the stream's timeline. `unsafe`: a synchronous
// call (see unsafe_call); `captured` (optional) says whether the work went into a capture.
CUresult simple(const char* name, CUstream hs, uint64_t value, int64_t duration_ns = 100,
                bool unsafe = false, bool* captured = nullptr);

}  // namespace fake_cuda_impl

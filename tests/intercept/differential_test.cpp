// Differential stress test (issue 11): random multi-threaded programs run through the shim and,
// in the pass-through run, straight on the fake driver; every program is checked against the
// driver's ordering rules from the fake's call log:
//  - every op reaches the driver exactly once, successfully, under its thread's context;
//  - per-stream program order (launches, sets, event records, waits, synchronises);
//  - a wait binds to the program's latest record of its event before the wait;
//  - a legacy-stream launch comes after the earlier work of its thread's blocking streams;
//  - cuMemFree comes after every earlier op of its thread;
//  - a capture (thread-local mode) holds exactly its thread's launches on the capturing stream,
//    in order, and nothing of the shim's;
//  - issue 24: copies from pinned host memory come before the cuMemFreeHost of that memory (the
//    fake fails a copy from freed memory), an edit of a graph executable comes after every
//    earlier op of its thread, launches of one executable reach the driver in program order
//    whatever their streams, a record of an interprocess event is in the driver when
//    cuEventRecord returns, launches on the per-thread default stream (CU_STREAM_PER_THREAD,
//    issued under the best-effort thread class) run on their own thread's stream, in order, and
//    a context made with cuCtxCreate and destroyed with work held on its best-effort stream gets
//    that work into the driver, successfully, before cuCtxDestroy (the fake fails work on a
//    destroyed context's streams, and its events answer as gone: the shim must not wait for them).
// Threads use both devices' contexts, streams of every class (high priority, best effort blocking
// and non-blocking, plain, legacy), events across streams, queries and captures; high-priority
// streams are held busy at random so best-effort work is deferred and admitted. Every program is
// run under the policy ctest chose (priority, orion, partition) and in pass-through. Under
// partition the programs' kernels are CUkernels (context-independent), so best-effort launches
// move to green-context shadow streams: the checks follow each shadow back to its program stream
// (through its join) and require those launches to run in a green context.
// ORION_DIFF_PROGRAMS sets the number of programs (default 300).
#include <atomic>
#include <cstdlib>
#include <map>
#include <random>
#include <set>
#include <sstream>
#include <thread>

#include "test_support.h"

namespace {

using namespace icpt_test;

enum class Kind { kLaunch, kSet, kRecord, kWait, kSync, kCopy, kGraph };

struct Expected {
  Kind kind;
  uint64_t key;  // launch/set: tag; record/wait: event; sync: 0
};

struct ThreadProgram {
  int thread = 0;
  CUcontext ctx = nullptr;
  CUfunction f = nullptr;
  CUstream hp = nullptr, be = nullptr, nb = nullptr, plain = nullptr, cap = nullptr;
  CUevent events[3] = {};  // [2] is an interprocess event
  void* host[2] = {};       // pinned host buffers (cuMemAllocHost), freed and made anew at random
  CUgraphExec exec = nullptr;  // launched on any stream, edited at random
  CUgraphNode exec_node = nullptr;  // its kernel node, which the edits name
  std::vector<uint64_t> edit_tags;  // the barrier key of each edit of `exec`, program order
  CUfunction any_ctx = nullptr;  // a CUkernel: launched in the thread's private contexts too
  std::set<uint64_t> private_contexts;  // made by cuCtxCreate, destroyed by the same op
  std::vector<uint64_t> graph_streams;  // the stream of each launch of `exec`, program order
  std::map<uint64_t, std::vector<Expected>> per_stream;  // stream handle -> program order
  // Program order of everything on the thread's streams, with the stream, to check legacy
  // launches and cuMemFree against what came before them.
  struct Issued {
    uint64_t stream;
    size_t index;  // into per_stream[stream]
    bool blocking;
  };
  std::vector<Issued> issued;
  struct Barrier {
    bool legacy;            // a legacy-stream launch (tag), or a call that releases everything
                            // (cuMemFree, cuMemFreeHost: pointer; a graph edit: its tag)
    uint64_t key;
    size_t issued_before;   // issued.size() at the barrier
  };
  std::vector<Barrier> barriers;
  // Event -> program record count at each wait, in wait order (per event).
  std::map<uint64_t, std::vector<size_t>> wait_binds;
  std::map<uint64_t, size_t> records_so_far;
  std::map<uint64_t, std::vector<uint64_t>> record_streams;  // per event, program order
  std::vector<uint64_t> capture_tags;  // launches made into captures, in order
  std::vector<uint64_t> capture_sizes;
  int failures = 0;
  std::vector<std::string> notes;
};

// Small (1 SM) or large (256 blocks of 1024 threads: 128 of the fake's 132 SMs, so two of them do
// not fit next to each other under the orion policy) kernels.
int launch_tagged(CUfunction f, CUstream s, uint64_t tag, bool large = false) {
  void* params[] = {&tag};
  return cuLaunchKernel(f, large ? 256 : 1, 1, 1, large ? 1024 : 32, 1, 1, 0, s, params, nullptr);
}

// The check's key of a thread's per-thread default stream (the fake logs the handle, 2, and the
// calling thread).
uint64_t per_thread_key(uint64_t thread_token) { return (uint64_t{1} << 62) | thread_token; }

bool partition_run() {
  const char* p = std::getenv("ORION_POLICY");
  return p != nullptr && std::string(p) == "partition" && scheduled_mode();
}

// `blocking_capture`: the capture stream is blocking, and then no thread of the program launches on
// the legacy stream (it would wait for the capture: CUDA_ERROR_STREAM_CAPTURE_IMPLICIT).
void run_thread(ThreadProgram& p, uint64_t seed, int ops, int device, bool blocking_capture) {
  std::mt19937_64 rng(seed);
  auto pick = [&](int n) { return static_cast<int>(rng() % static_cast<uint64_t>(n)); };
  auto fail = [&](const std::string& what, int rc) {
    ++p.failures;
    if (p.notes.size() < 5) p.notes.push_back(what + " returned " + std::to_string(rc));
  };
  p.ctx = use_device(device);
  if (p.ctx == nullptr) return fail("use_device", -1);
  const size_t tag_size[] = {sizeof(uint64_t)};
  static const uint64_t library = fake_cuda_make_module();
  p.f = partition_run() ? reinterpret_cast<CUfunction>(fake_cuda_make_kernel(library, "diff_kernel", 1, tag_size))
                        : fake_cuda_make_function("diff_kernel", 1, tag_size);
  if (cuStreamCreateWithPriority(&p.hp, 0, -5) != CUDA_SUCCESS ||
      cuStreamCreateWithPriority(&p.be, 0, 0) != CUDA_SUCCESS ||
      cuStreamCreateWithPriority(&p.nb, CU_STREAM_NON_BLOCKING, 0) != CUDA_SUCCESS ||
      cuStreamCreate(&p.plain, 0) != CUDA_SUCCESS ||
      cuStreamCreateWithPriority(&p.cap, blocking_capture ? 0 : CU_STREAM_NON_BLOCKING, pick(2) == 0 ? -5 : 0) != CUDA_SUCCESS ||
      cuEventCreate(&p.events[0], 0) != CUDA_SUCCESS || cuEventCreate(&p.events[1], 0) != CUDA_SUCCESS ||
      cuEventCreate(&p.events[2], CU_EVENT_INTERPROCESS | CU_EVENT_DISABLE_TIMING) != CUDA_SUCCESS ||
      cuMemAllocHost(&p.host[0], 4096) != CUDA_SUCCESS || cuMemAllocHost(&p.host[1], 4096) != CUDA_SUCCESS) {
    return fail("setup", -1);
  }
  p.any_ctx = reinterpret_cast<CUfunction>(fake_cuda_make_kernel(library, "diff_kernel_any_ctx", 1, tag_size));
  p.exec = make_graph_exec(p.f, &p.exec_node);
  if (p.exec == nullptr) return fail("make_graph_exec", -1);
  CUstream streams[] = {p.hp, p.be, p.nb, p.plain};
  auto add = [&](CUstream s, Kind k, uint64_t key) {
    // Each thread's per-thread default stream is its own: keyed by the thread, as the check does.
    const uint64_t stream = s == CU_STREAM_PER_THREAD ? per_thread_key(fake_cuda_thread_token()) : h(s);
    auto& seq = p.per_stream[stream];
    seq.push_back({k, key});
    p.issued.push_back({stream, seq.size() - 1, s != p.nb});
  };
  auto set_thread_class = shim_fn<orion_set_thread_class_fn>("orion_set_thread_class");
  uint64_t next_tag = (static_cast<uint64_t>(p.thread) << 32) | 1;
  auto record = [&](CUevent e, CUstream s) {
    if (int rc = cuEventRecord(e, s); rc != CUDA_SUCCESS) fail("record", rc);
    add(s, Kind::kRecord, h(e));
    ++p.records_so_far[h(e)];
    p.record_streams[h(e)].push_back(h(s));
  };
  for (int i = 0; i < ops; ++i) {
    const int r = pick(100);
    CUstream s = streams[pick(4)];
    const uint64_t tag = next_tag++;
    if (pick(100) < 16) {  // issue 24's calls
      const int k = pick(2);
      switch (pick(7)) {
        case 0: {  // a copy from pinned memory (held on a best-effort stream); the size names it
          const size_t n = (tag & 0xfff) + 1;
          if (int rc = cuMemcpyHtoDAsync(0x1000, p.host[k], n, s); rc != CUDA_SUCCESS) fail("pinned copy", rc);
          add(s, Kind::kCopy, n);
          break;
        }
        case 1:  // free the pinned memory held copies may read, and make new
          if (int rc = cuMemFreeHost(p.host[k]); rc != CUDA_SUCCESS) fail("cuMemFreeHost", rc);
          p.barriers.push_back({false, h(p.host[k]), p.issued.size()});
          if (int rc = cuMemAllocHost(&p.host[k], 4096); rc != CUDA_SUCCESS) fail("cuMemAllocHost", rc);
          break;
        case 2:
          if (int rc = cuGraphLaunch(p.exec, s); rc != CUDA_SUCCESS) fail("graph launch", rc);
          add(s, Kind::kGraph, h(p.exec));
          p.graph_streams.push_back(h(s));
          break;
        case 3:  // an edit of the executable: the check tells its edits apart by their order
          if (int rc = cuGraphNodeSetEnabled(p.exec, p.exec_node, 1); rc != CUDA_SUCCESS) fail("graph edit", rc);
          p.edit_tags.push_back(tag);
          p.barriers.push_back({false, tag, p.issued.size()});
          break;
        case 5: {  // a private context with held work, destroyed
          CUcontext c2 = nullptr;
          CUstream s2 = nullptr;
          if (int rc = cuCtxCreate(&c2, nullptr, 0, device); rc != CUDA_SUCCESS) {
            fail("cuCtxCreate", rc);
            break;
          }
          p.private_contexts.insert(h(c2));
          if (int rc = cuStreamCreateWithPriority(&s2, CU_STREAM_NON_BLOCKING, 0); rc != CUDA_SUCCESS) fail("stream in a private context", rc);
          if (int rc = launch_tagged(p.any_ctx, s2, tag); rc != CUDA_SUCCESS) fail("launch in a private context", rc);
          add(s2, Kind::kLaunch, tag);
          CUcontext popped = nullptr;
          if (int rc = cuCtxPopCurrent(&popped); rc != CUDA_SUCCESS || popped != c2) fail("cuCtxPopCurrent", rc);
          if (int rc = cuCtxDestroy(c2); rc != CUDA_SUCCESS) fail("cuCtxDestroy", rc);
          p.barriers.push_back({false, h(c2), p.issued.size()});
          break;
        }
        case 4:  // the per-thread default stream, under the best-effort thread class
          if (set_thread_class != nullptr) set_thread_class("best_effort");
          if (int rc = launch_tagged(p.f, CU_STREAM_PER_THREAD, tag); rc != CUDA_SUCCESS) fail("per-thread launch", rc);
          add(CU_STREAM_PER_THREAD, Kind::kLaunch, tag);
          if (set_thread_class != nullptr) set_thread_class("stream");
          break;
        default: {  // a record another process may wait on: in the driver when the call returns
          record(p.events[2], s);
          size_t in_driver = 0;
          for (const auto& c : calls()) in_driver += std::strcmp(c.name, "cuEventRecord") == 0 && c.event == h(p.events[2]);
          if (in_driver != p.records_so_far[h(p.events[2])]) fail("an interprocess event's record was held", -1);
          break;
        }
      }
      continue;
    }
    if (r < 38) {
      if (int rc = launch_tagged(p.f, s, tag, pick(3) == 0); rc != CUDA_SUCCESS) fail("launch", rc);
      add(s, Kind::kLaunch, tag);
    } else if (r < 44 && !blocking_capture) {
      if (int rc = launch_tagged(p.f, nullptr, tag); rc != CUDA_SUCCESS) fail("legacy launch", rc);
      p.barriers.push_back({true, tag, p.issued.size()});
    } else if (r < 54) {
      // The size names the op (the fake logs it).
      if (int rc = cuMemsetD8Async(0x1000, 0, tag & 0xffffffff, s); rc != CUDA_SUCCESS) fail("memset", rc);
      add(s, Kind::kSet, tag & 0xffffffff);
    } else if (r < 65) {
      record(p.events[pick(2)], s);
    } else if (r < 75) {
      CUevent e = p.events[pick(3)];
      if (p.records_so_far[h(e)] == 0) continue;  // waiting for a never-recorded event is a no-op
      if (int rc = cuStreamWaitEvent(s, e, 0); rc != CUDA_SUCCESS) fail("wait", rc);
      add(s, Kind::kWait, h(e));
      p.wait_binds[h(e)].push_back(p.records_so_far[h(e)]);
    } else if (r < 80) {
      if (int rc = cuStreamSynchronize(s); rc != CUDA_SUCCESS) fail("sync", rc);
      add(s, Kind::kSync, 0);
    } else if (r < 86) {
      int rc = pick(2) == 0 ? cuStreamQuery(s) : cuEventQuery(p.events[pick(2)]);
      if (rc != CUDA_SUCCESS && rc != CUDA_ERROR_NOT_READY) fail("query", rc);
    } else if (r < 91) {
      // Hold or release a stream: held work stays in flight (high priority: best effort waits;
      // best effort: its SMs stay taken).
      fake_cuda_set_stream_busy(pick(2) == 0 ? p.hp : (pick(2) == 0 ? p.be : p.nb), pick(2));
    } else if (r < 93) {
      const uint64_t ptr = 0x100000 + tag;
      if (int rc = cuMemFree(ptr); rc != CUDA_SUCCESS) fail("cuMemFree", rc);
      p.barriers.push_back({false, ptr, p.issued.size()});
    } else if (r < 96) {
      if (int rc = cuStreamBeginCapture(p.cap, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL); rc != CUDA_SUCCESS) {
        fail("begin capture", rc);
        continue;
      }
      const int n = 1 + pick(3);
      for (int k = 0; k < n; ++k) {
        const uint64_t ctag = next_tag++;
        if (int rc = launch_tagged(p.f, p.cap, ctag); rc != CUDA_SUCCESS) fail("captured launch", rc);
        p.capture_tags.push_back(ctag);
      }
      CUgraph g = nullptr;
      if (int rc = cuStreamEndCapture(p.cap, &g); rc != CUDA_SUCCESS) fail("end capture", rc);
      p.capture_sizes.push_back(static_cast<uint64_t>(n));
    } else {
      CUevent e = p.events[pick(2)];
      if (int rc = cuEventSynchronize(e); rc != CUDA_SUCCESS) fail("event sync", rc);
    }
  }
  for (CUstream s : {p.hp, p.be, p.nb}) fake_cuda_set_stream_busy(s, 0);
}

void teardown_thread(ThreadProgram& p) {
  if (use_device(p.thread % 2) == nullptr) return;
  for (CUstream s : {p.hp, p.be, p.nb, p.plain, p.cap}) {
    if (s != nullptr) cuStreamDestroy(s);
  }
  for (CUevent e : p.events) {
    if (e != nullptr) cuEventDestroy(e);
  }
  for (void* m : p.host) {
    if (m != nullptr) cuMemFreeHost(m);
  }
  if (p.exec != nullptr) cuGraphExecDestroy(p.exec);
}

uint64_t tag_of(const fake_cuda_call& c) {
  uint64_t tag = 0;
  std::memcpy(&tag, c.params, sizeof tag);
  return tag;
}

// Checks one program against the log; returns the violations found (described in `why`).
int check(const std::vector<ThreadProgram>& threads, const std::vector<fake_cuda_call>& log,
          std::vector<std::string>* why, size_t* moved) {
  int violations = 0;
  auto bad = [&](const std::string& what) {
    ++violations;
    if (why->size() < 8) why->push_back(what);
  };
  std::map<uint64_t, const ThreadProgram*> by_function;
  std::map<uint64_t, const ThreadProgram*> by_event;
  std::map<uint64_t, std::vector<uint64_t>> graph_streams;  // per executable, driver order
  std::map<uint64_t, const ThreadProgram*> by_exec;
  std::map<uint64_t, size_t> edits_seen;  // per executable
  for (const auto& p : threads) {
    by_function[h(p.f)] = &p;
    by_function[h(p.any_ctx)] = &p;
    for (CUevent e : p.events) by_event[h(e)] = &p;
    graph_streams[h(p.exec)];
    by_exec[h(p.exec)] = &p;
  }
  // Log entries of each program stream, in driver order; legacy launches and frees by key.
  std::map<uint64_t, std::vector<std::pair<Expected, size_t>>> seen;
  std::map<uint64_t, size_t> barrier_at;  // tag/pointer -> log index
  std::map<uint64_t, int> launch_count;
  // Per event, in driver order: the record each wait bound to, each record's number and stream.
  std::map<uint64_t, std::vector<uint64_t>> wait_bound, record_numbers, record_streams;
  std::vector<uint64_t> captured_tags;
  std::vector<uint64_t> capture_ends;
  // The partition policy's shadow streams, their green contexts, and the program stream each
  // joins back to (a wait on an event the shim recorded on the shadow).
  std::map<uint64_t, uint64_t> program_stream_of;
  std::set<uint64_t> shadows, green_contexts;
  std::map<uint64_t, uint64_t> shim_record_stream;
  for (const fake_cuda_call& c : log) {
    if (std::strcmp(c.name, "cuGreenCtxStreamCreate") == 0 && c.result == CUDA_SUCCESS) {
      shadows.insert(c.stream);
      green_contexts.insert(c.context);
    } else if (std::strcmp(c.name, "cuEventRecord") == 0 && by_event.count(c.event) == 0) {
      shim_record_stream[c.event] = c.stream;
    } else if (std::strcmp(c.name, "cuStreamWaitEvent") == 0 && by_event.count(c.event) == 0) {
      auto r = shim_record_stream.find(c.event);
      if (r == shim_record_stream.end() || shadows.count(r->second) == 0) continue;
      auto [it, fresh] = program_stream_of.emplace(r->second, c.stream);
      if (!fresh && it->second != c.stream) bad("a shadow stream joined two program streams");
    }
  }
  for (size_t i = 0; i < log.size(); ++i) {
    const fake_cuda_call& c = log[i];
    const bool launch = is_launch(c) && by_function.count(c.function) != 0;
    const bool program_event = by_event.count(c.event) != 0;
    const ThreadProgram* owner = launch ? by_function[c.function]
                                 : program_event ? by_event[c.event] : nullptr;
    if (c.captured != 0 && !launch) bad(std::string("the shim's ") + c.name + " went into a capture");
    if (launch) {
      if (c.result != CUDA_SUCCESS) bad("a launch failed in the driver: " + std::to_string(c.result));
      uint64_t stream = c.stream == 2 ? per_thread_key(c.thread) : c.stream;
      if (auto sh = program_stream_of.find(c.stream); sh != program_stream_of.end()) {
        stream = sh->second;  // moved: checked as a launch of the program's stream
        ++*moved;
        if (green_contexts.count(c.context) == 0) bad("a moved launch ran outside its green context");
      } else if (shadows.count(c.stream) != 0) {
        bad("a launch ran on a shadow stream that never joined its program stream");
      } else if (c.context != h(owner->ctx) && owner->private_contexts.count(c.context) == 0) {
        bad("a launch ran under another context");
      }
      const uint64_t tag = tag_of(c);
      ++launch_count[tag];
      if (c.captured != 0) {
        captured_tags.push_back(tag);
      } else if (stream == 0) {
        barrier_at[tag] = i;
      } else {
        seen[stream].push_back({{Kind::kLaunch, tag}, i});
      }
    } else if (std::strcmp(c.name, "cuMemsetD8Async") == 0) {
      seen[c.stream].push_back({{Kind::kSet, c.value}, i});
    } else if (std::strcmp(c.name, "cuEventRecord") == 0 && program_event) {
      seen[c.stream].push_back({{Kind::kRecord, c.event}, i});
      record_numbers[c.event].push_back(c.value);
      record_streams[c.event].push_back(c.stream);
    } else if (std::strcmp(c.name, "cuStreamWaitEvent") == 0 && program_event) {
      seen[c.stream].push_back({{Kind::kWait, c.event}, i});
      wait_bound[c.event].push_back(c.value);
    } else if (std::strcmp(c.name, "cuStreamSynchronize") == 0) {
      seen[c.stream].push_back({{Kind::kSync, 0}, i});
    } else if (std::strcmp(c.name, "cuMemFree_v2") == 0 || std::strcmp(c.name, "cuMemFreeHost") == 0 ||
               std::strcmp(c.name, "cuCtxDestroy_v2") == 0) {
      barrier_at[c.value] = i;
    } else if (std::strcmp(c.name, "cuGraphNodeSetEnabled") == 0 && by_exec.count(c.value) != 0) {
      // One thread makes all of an executable's edits, each returning once it is in the driver:
      // the k-th edit in the log is the thread's k-th.
      if (c.result != CUDA_SUCCESS) bad("a graph edit failed in the driver: " + std::to_string(c.result));
      const ThreadProgram& editor = *by_exec[c.value];
      const size_t k = edits_seen[c.value]++;
      if (k < editor.edit_tags.size()) {
        barrier_at[editor.edit_tags[k]] = i;
      } else {
        bad("a graph edit reached the driver more often than it was made");
      }
    } else if (std::strcmp(c.name, "cuMemcpyHtoDAsync_v2") == 0) {
      if (c.result != CUDA_SUCCESS) bad("a pinned copy failed in the driver (its memory was freed?)");
      seen[c.stream].push_back({{Kind::kCopy, c.value}, i});
    } else if (std::strcmp(c.name, "cuGraphLaunch") == 0 && graph_streams.count(c.value) != 0) {
      seen[c.stream].push_back({{Kind::kGraph, c.value}, i});
      graph_streams[c.value].push_back(c.stream);
    } else if (std::strcmp(c.name, "cuStreamEndCapture") == 0) {
      capture_ends.push_back(c.value);
    }
    (void)owner;
  }
  for (const auto& [tag, n] : launch_count) {
    if (n != 1) bad("a launch reached the driver " + std::to_string(n) + " times");
  }
  for (const auto& p : threads) {
    // Per-stream order, and the log index of each program op.
    std::map<uint64_t, std::vector<size_t>> index_of;
    for (const auto& [stream, expected] : p.per_stream) {
      const auto& got = seen[stream];
      if (got.size() != expected.size()) {
        bad("stream of thread " + std::to_string(p.thread) + ": " + std::to_string(got.size()) +
            " ops in the driver, " + std::to_string(expected.size()) + " issued");
        continue;
      }
      for (size_t k = 0; k < expected.size(); ++k) {
        if (got[k].first.kind != expected[k].kind || got[k].first.key != expected[k].key) {
          bad("stream order broken on a stream of thread " + std::to_string(p.thread) + " at op " +
              std::to_string(k));
          break;
        }
        index_of[stream].push_back(got[k].second);
      }
    }
    // Waits bind to the latest record before them (records reach the driver in program order,
    // checked above per stream; across streams by their numbers here).
    for (CUevent e : p.events) {
      const auto& numbers = record_numbers[h(e)];
      const auto& program = p.record_streams.count(h(e)) ? p.record_streams.at(h(e))
                                                         : std::vector<uint64_t>{};
      if (record_streams[h(e)] != program) {
        bad("records of an event reached the driver out of program order");
        continue;
      }
      const auto& expected = p.wait_binds.count(h(e)) ? p.wait_binds.at(h(e)) : std::vector<size_t>{};
      const auto& bound = wait_bound[h(e)];
      if (bound.size() != expected.size()) continue;  // counted by the stream check
      for (size_t k = 0; k < expected.size(); ++k) {
        const size_t want = expected[k];  // the want-th record (1-based) in program order
        if (want == 0 || want > numbers.size() || bound[k] != numbers[want - 1]) {
          bad("a wait bound to another record than the program's latest before it");
        }
      }
    }
    if (graph_streams[h(p.exec)] != p.graph_streams) {
      bad("launches of one graph executable reached the driver out of program order");
    }
    // Barriers: legacy launches wait for blocking streams, the releasing calls for everything.
    for (const auto& b : p.barriers) {
      auto at = barrier_at.find(b.key);
      if (at == barrier_at.end()) {
        bad(b.legacy ? "a legacy-stream launch never reached the driver" : "a releasing call is missing");
        continue;
      }
      for (size_t k = 0; k < b.issued_before; ++k) {
        const auto& op = p.issued[k];
        if (b.legacy && !op.blocking) continue;
        const auto it = index_of.find(op.stream);
        if (it == index_of.end() || op.index >= it->second.size()) continue;
        if (it->second[op.index] > at->second) {
          bad(b.legacy ? "a legacy-stream launch overtook a blocking stream's earlier work"
                       : "a free or graph edit reached the driver before earlier work");
          break;
        }
      }
    }
  }
  // Captures: exactly the captured launches, in each thread's order.
  std::map<uint64_t, std::vector<uint64_t>> captured_by_thread;
  for (uint64_t tag : captured_tags) captured_by_thread[tag >> 32].push_back(tag);
  for (const auto& p : threads) {
    if (captured_by_thread[static_cast<uint64_t>(p.thread)] != p.capture_tags) {
      bad("capture contents differ from the launches made into it");
    }
  }
  size_t expected_captures = 0;
  for (const auto& p : threads) expected_captures += p.capture_sizes.size();
  if (capture_ends.size() != expected_captures) bad("a capture did not end in the driver");
  return violations;
}

class Differential : public ShimTest {};

TEST_F(Differential, RandomProgramsKeepEveryOrderingRule) {
  int programs = 300;
  if (const char* n = std::getenv("ORION_DIFF_PROGRAMS")) programs = std::atoi(n);
  constexpr int kThreads = 3;
  constexpr int kOps = 40;
  int violations = 0, failures = 0;
  size_t moved = 0;
  std::vector<std::string> why;
  for (int prog = 0; prog < programs; ++prog) {
    fake_cuda_reset();
    std::vector<ThreadProgram> threads(kThreads);
    std::vector<std::thread> workers;
    // Most programs capture on non-blocking streams (as PyTorch's pool streams are) and use the
    // legacy stream; every fourth captures on blocking streams and leaves the legacy stream alone.
    const bool blocking_capture = prog % 4 == 3;
    for (int t = 0; t < kThreads; ++t) {
      threads[t].thread = t;
      workers.emplace_back([&, t] {
        run_thread(threads[t], 0x5eed0000ULL * 31 + static_cast<uint64_t>(prog) * kThreads + t, kOps,
                   t % 2, blocking_capture);
      });
    }
    for (auto& w : workers) w.join();
    // Each device's context synchronized once every thread is done: not by a thread itself, when
    // another thread of its device may still be capturing (synchronizing a context that
    // encompasses an active capture is invalid in every capture mode).
    for (int d = 0; d < 2; ++d) {
      ASSERT_NE(use_device(d), nullptr);
      if (int rc = cuCtxSynchronize(); rc != CUDA_SUCCESS) {
        ++failures;
        if (why.size() < 8) why.push_back("program " + std::to_string(prog) + ": cuCtxSynchronize returned " + std::to_string(rc));
      }
    }
    EXPECT_TRUE(wait_idle());
    const auto log = calls();
    for (const auto& p : threads) {
      failures += p.failures;
      for (const auto& n : p.notes) {
        if (why.size() < 8) why.push_back("program " + std::to_string(prog) + ": " + n);
      }
    }
    std::vector<std::string> found;
    violations += check(threads, log, &found, &moved);
    for (const auto& f : found) {
      if (why.size() < 8) why.push_back("program " + std::to_string(prog) + ": " + f);
    }
    for (auto& p : threads) teardown_thread(p);
    ASSERT_NE(use_device(0), nullptr);
  }
  std::ostringstream report;
  report << "differential: " << programs << " programs x " << kThreads << " threads x " << kOps
         << " ops (" << (scheduled_ ? "scheduled" : "pass-through") << "): " << violations
         << " violations, " << failures << " failed calls, " << moved << " launches moved to green contexts";
  std::printf("%s\n", report.str().c_str());
  for (const auto& w : why) std::printf("  %s\n", w.c_str());
  EXPECT_EQ(violations, 0);
  EXPECT_EQ(failures, 0);
  EXPECT_EQ(fake_cuda_host_use_after_free(), 0u) << "a copy reached pinned memory after it was freed";
  if (scheduled_) {
    EXPECT_GT(stats().deferred, 0u) << "the programs never exercised deferral";
  }
  if (partition_run()) {
    EXPECT_GT(moved, 100u) << "the partition policy moved (almost) no best-effort launch";
  } else {
    EXPECT_EQ(moved, 0u);
  }
}

}  // namespace

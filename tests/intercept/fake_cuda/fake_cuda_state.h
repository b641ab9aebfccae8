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

struct Function {
  std::string name;
  bool params_known = false;
  std::vector<size_t> sizes, offsets;
  int64_t duration_ns = 1000;
};
struct Stream {
  int64_t time_ns = 0;
  bool busy = false;
  uint64_t busy_epoch = 0;
  int priority = 0;
};
struct Event {
  int64_t time_ns = 0;
  uint64_t stream = 0;
  bool held = false;  // recorded while its stream was busy
  uint64_t epoch = 0;
};

struct State {
  std::mutex mu;
  std::vector<fake_cuda_call> log;
  std::map<std::string, int> fail_next;
  std::unordered_map<uint64_t, Stream> streams;  // 0 = legacy, 2 = per-thread
  std::unordered_map<uint64_t, Event> events;
  std::unordered_map<uint64_t, Function*> functions;
  uint64_t next_handle = 0x10000;
  uint64_t next_devptr = 0x7f0000000000;
  size_t proc_lookups = 0;
  int capturing = 0;
  bool logging = true;
};

State& st();
// Appends a log entry (under st().mu) and returns it.
fake_cuda_call& begin(State& s, const char* name);
// Applies a pending failure injection for this call, else returns `ok`.
CUresult finish(State& s, fake_cuda_call& c, CUresult ok = CUDA_SUCCESS);
// Stream identity: NULL/legacy -> 0, NULL through a per-thread entry point -> 2.
uint64_t sid(CUstream s, bool per_thread);
// A logged call with no effect beyond the log and the stream's timeline.
CUresult simple(const char* name, CUstream hs, uint64_t value, int64_t duration_ns = 100);

}  // namespace fake_cuda_impl

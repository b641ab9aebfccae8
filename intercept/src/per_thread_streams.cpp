// Per-thread default streams' identities (Shim::per_thread_stream): one number per live thread,
// reused once its thread exits.
#include <mutex>
#include <vector>

#include "shim.h"

namespace orion {

namespace {

// Numbers of per-thread default streams. A thread's stream ends with the thread, so its number
// goes back here and a later thread's stream gets it: what the dispatcher keeps per stream (and
// walks on every pump pass and legacy-stream op) stays bounded by the threads alive at once, not
// by every thread ever started.
struct PerThreadStreamNumbers {
  std::mutex mu;
  std::vector<uint64_t> free;
  uint64_t next = 1;
};
PerThreadStreamNumbers& per_thread_stream_numbers() {
  static auto* numbers = new PerThreadStreamNumbers;  // never destroyed: threads exit after statics go
  return *numbers;
}

thread_local sched::StreamId t_per_thread_stream = 0;
thread_local bool t_per_thread_stream_returned = false;

// Gives the calling thread's number back when the thread exits.
struct PerThreadStreamReturn {
  ~PerThreadStreamReturn() {
    const sched::StreamId id = t_per_thread_stream;
    t_per_thread_stream = 0;
    t_per_thread_stream_returned = true;
    // Not once the shim is off (a child of fork(), whose copy of the mutex another thread of the
    // parent may have held; the process's exit): nothing reuses the number then.
    if (id == 0 || g_shim_state.load(std::memory_order_acquire) <= 1) return;
    PerThreadStreamNumbers& numbers = per_thread_stream_numbers();
    std::lock_guard lock(numbers.mu);
    numbers.free.push_back(id & ~Shim::kPerThreadStream);
  }
};

}  // namespace

sched::StreamId Shim::per_thread_stream() {
  if (t_per_thread_stream != 0) return t_per_thread_stream;
  bool reused = false;
  uint64_t number = 0;
  {
    PerThreadStreamNumbers& numbers = per_thread_stream_numbers();
    std::lock_guard lock(numbers.mu);
    if (!numbers.free.empty()) {
      number = numbers.free.back();
      numbers.free.pop_back();
      reused = true;
    } else {
      number = numbers.next++;
    }
  }
  t_per_thread_stream = kPerThreadStream | number;
  if (!t_per_thread_stream_returned) {
    // Constructed here, on the thread's first use: its destructor runs when the thread exits.
    // Work issued by a thread_local destructor that runs after it gets a number never given back.
    thread_local PerThreadStreamReturn give_back;
    (void)give_back;
  }
  if (reused) {
    if (const uintptr_t v = g_shim_state.load(std::memory_order_acquire); v > 1) {
      reinterpret_cast<Shim*>(v)->stream_ended(t_per_thread_stream);  // the exited thread's
    }
  }
  return t_per_thread_stream;
}

}  // namespace orion

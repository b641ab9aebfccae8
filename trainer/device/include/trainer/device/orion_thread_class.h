// The Orion shim's per-thread class around each pipeline action (orion.h,
// orion_set_thread_class). Autograd runs a micro-batch's backward kernels on the stream its
// forward used, so the shim cannot tell forward from backward by stream; the rank thread that
// issues them knows which action it is running, and says so around each one. Torch-free.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "trainer/schedule/schedule.h"

namespace gpipe {

// The class the launches of `type` get under parallel.priority: backward_first makes F best
// effort and B/I/W high priority, forward_first the reverse; "none" (and sends/receives, whose
// NCCL kernels the shim classes as communication itself) gives nullptr: each stream's own class.
const char* orion_thread_class(ActionType type, const std::string& priority);

using SetThreadClassFn = int (*)(const char*);
// orion_set_thread_class of the preloaded shim, or null without it (looked up once per process,
// so the same binary runs unchanged with and without the shim).
SetThreadClassFn find_orion_set_thread_class();

// Sets the calling thread's class for the scope's lifetime, then gives the thread back to the
// stream rule ("stream"). Does nothing when `cls` or `set` is null. The shim's answer is not an
// error the action can act on (ENODEV: scheduling is off), so it is not checked.
class OrionThreadClassScope {
 public:
  explicit OrionThreadClassScope(const char* cls, SetThreadClassFn set = find_orion_set_thread_class());
  ~OrionThreadClassScope();
  OrionThreadClassScope(const OrionThreadClassScope&) = delete;
  OrionThreadClassScope& operator=(const OrionThreadClassScope&) = delete;

 private:
  SetThreadClassFn set_ = nullptr;
};

// The shim's running totals of what it held back (queued, `deferred` in orion_stats) and what it
// handed to the driver (`submitted`). nullopt without the shim or with scheduling off
// (USE_ORION_SCHEDULER unset): there is nothing to count then.
struct OrionCounts {
  uint64_t held = 0;
  uint64_t admitted = 0;
};
std::optional<OrionCounts> read_orion_counts();

}  // namespace gpipe

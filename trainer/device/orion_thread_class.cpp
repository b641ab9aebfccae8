// OrionThreadClassScope and the action -> class rule (see orion_thread_class.h).
#include "trainer/device/orion_thread_class.h"

#include <dlfcn.h>

#include "orion.h"

namespace gpipe {

const char* orion_thread_class(ActionType type, const std::string& priority) {
  bool backward = false;
  switch (type) {
    case ActionType::kForward:
      break;
    case ActionType::kBackward:
    case ActionType::kBackwardInput:
    case ActionType::kBackwardWeight:
      backward = true;
      break;
    default:
      return nullptr;  // sends and receives: NCCL kernels are communication whatever the thread says
  }
  if (priority == "backward_first") return backward ? "high_priority" : "best_effort";
  if (priority == "forward_first") return backward ? "best_effort" : "high_priority";
  return nullptr;
}

SetThreadClassFn find_orion_set_thread_class() {
  static const auto fn =
      reinterpret_cast<orion_set_thread_class_fn>(dlsym(RTLD_DEFAULT, "orion_set_thread_class"));
  return fn;
}

std::optional<OrionCounts> read_orion_counts() {
  static const auto get_stats = reinterpret_cast<orion_get_stats_fn>(dlsym(RTLD_DEFAULT, "orion_get_stats"));
  if (get_stats == nullptr) return std::nullopt;
  orion_stats stats{};
  if (get_stats(&stats, sizeof stats) != 0) return std::nullopt;  // ENODEV: scheduling is off
  return OrionCounts{stats.deferred, stats.submitted};
}

OrionThreadClassScope::OrionThreadClassScope(const char* cls, SetThreadClassFn set) {
  if (cls == nullptr || set == nullptr) return;
  set_ = set;
  set_(cls);
}

OrionThreadClassScope::~OrionThreadClassScope() {
  if (set_ != nullptr) set_("stream");
}

}  // namespace gpipe

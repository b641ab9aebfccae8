// Names of stream classes and op kinds, and the SM-need formula the policies use.
#include <algorithm>
#include <array>
#include <utility>

#include "scheduler/device.h"
#include "scheduler/op.h"

namespace sched {

namespace {

constexpr std::array<std::pair<const char*, OpKind>, 8> kOpKindNames{{
    {"kernel", OpKind::kKernel},
    {"copy", OpKind::kCopy},
    {"memset", OpKind::kMemset},
    {"event_record", OpKind::kEventRecord},
    {"stream_wait_event", OpKind::kStreamWaitEvent},
    {"host_func", OpKind::kHostFunc},
    {"graph_launch", OpKind::kGraphLaunch},
    {"mem_pool", OpKind::kMemPool},
}};

}  // namespace

const char* to_string(StreamClass c) {
  switch (c) {
    case StreamClass::kHighPriority: return "high_priority";
    case StreamClass::kBestEffort: return "best_effort";
    case StreamClass::kCommunication: return "communication";
    case StreamClass::kUnmanaged: return "unmanaged";
  }
  return "invalid";
}

bool parse_stream_class(const std::string& text, StreamClass* out) {
  static constexpr std::array<std::pair<const char*, StreamClass>, 7> kNames{{
      {"high_priority", StreamClass::kHighPriority},
      {"hp", StreamClass::kHighPriority},
      {"best_effort", StreamClass::kBestEffort},
      {"be", StreamClass::kBestEffort},
      {"communication", StreamClass::kCommunication},
      {"comm", StreamClass::kCommunication},
      {"unmanaged", StreamClass::kUnmanaged},
  }};
  for (const auto& [name, cls] : kNames) {
    if (text == name) {
      *out = cls;
      return true;
    }
  }
  return false;
}

const char* to_string(OpKind k) {
  for (const auto& [name, kind] : kOpKindNames) {
    if (kind == k) return name;
  }
  return "invalid";
}

bool parse_op_kind(const std::string& text, OpKind* out) {
  for (const auto& [name, kind] : kOpKindNames) {
    if (text == name) {
      *out = kind;
      return true;
    }
  }
  return false;
}

int sms_needed(const KernelInfo& kernel, int sm_count, int blocks_per_sm) {
  const uint64_t blocks = kernel.grid.count();
  if (blocks == 0 || sm_count <= 0) return 0;
  // A shape that does not fit on an SM at all (occupancy 0) is charged the whole device: the
  // launch will fail or serialize, and either way nothing should be packed next to it.
  if (blocks_per_sm <= 0) return sm_count;
  const uint64_t per_sm = static_cast<uint64_t>(blocks_per_sm);
  const uint64_t sms = (blocks + per_sm - 1) / per_sm;
  return static_cast<int>(std::min<uint64_t>(sms, static_cast<uint64_t>(sm_count)));
}

}  // namespace sched

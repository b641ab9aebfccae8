// The simulated GPU's state (sim_gpu.cpp): ops in flight with their block groups and progress
// clocks, SMs' resources, streams and events. Private to sim_gpu.cpp.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <set>
#include <utility>
#include <vector>

#include "scheduler/sim_gpu.h"

namespace sched {
namespace sim {

struct BlockGroup {
  double v_finish = 0;                              // kernel progress at which the group ends
  std::vector<std::pair<int, uint32_t>> per_sm;     // (SM index, blocks)
  uint64_t blocks = 0;
};

struct SimOp {
  uint64_t seq = 0;
  StreamId stream = 0;
  OpKind kind = OpKind::kKernel;
  KernelId kernel_id = 0;
  EventId event = 0;
  uint64_t event_generation = 0;  // record: which record this is; wait: which record it waits for
  uint64_t bytes = 0;
  double duration_ns = 0;         // copy / memset / graph launch

  // Kernel state.
  uint64_t blocks_waiting = 0;
  uint64_t blocks_running = 0;
  uint32_t block_threads = 0;     // resources one block holds on its SM
  uint32_t block_smem = 0;
  uint32_t blocks_per_sm = 1;
  double block_ns = 0;
  bool memory_bound = false;
  bool high_priority = false;     // of its stream when it became active
  int context = 0;                // of its stream when it became active
  uint64_t submit_order = 0;
  int64_t activation_ns = 0;      // when it reached the head of its stream
  double v = 0;                   // progress clock (ns of alone time)
  double rate = 1;
  std::deque<BlockGroup> groups;

  bool active = false;
  int64_t start_ns = -1;
  int64_t end_ns = -1;            // timed ops: when they finish
};

struct SmState {
  uint32_t threads = 0;
  uint32_t blocks = 0;
  uint32_t smem = 0;
};

struct StreamState {
  std::deque<std::unique_ptr<SimOp>> queue;
  bool high_priority = false;
  // SMs its blocks may go to, [first_sm, first_sm + sm_count) (a green context's partition);
  // sm_count 0: every SM.
  int first_sm = 0;
  int sm_count = 0;
  int context = 0;  // the process it belongs to (time slicing)
};

// Records of one event on different streams may complete out of order; a wait is met by its own
// record (the latest submitted before it), as in CUDA, not by a later one that finished first.
struct EventState {
  uint64_t submitted = 0;      // records submitted so far
  uint64_t done_through = 0;   // every record generation up to this one completed
  std::set<uint64_t> done_after;  // completed generations above done_through
  void complete(uint64_t generation) {
    if (generation <= done_through) return;
    done_after.insert(generation);
    while (!done_after.empty() && *done_after.begin() == done_through + 1) {
      done_after.erase(done_after.begin());
      ++done_through;
    }
  }
  bool completed(uint64_t generation) const { return generation <= done_through || done_after.count(generation) != 0; }
};

constexpr uint64_t kSpreadGroups = 8;
constexpr uint64_t kMinGroupBlocks = 16;

inline uint32_t round_up_to_warp(uint64_t threads) { return static_cast<uint32_t>((threads + 31) / 32 * 32); }


}  // namespace sim
}  // namespace sched

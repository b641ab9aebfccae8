// What the replayer will launch for a workload, worked out without CUDA: one stream per workload
// stream (its class decides its priority), one spin-kernel copy per kernel name, each kernel op's
// block time (the simulator's: duration_us spread over the waves this GPU needs), and the checks
// that every launch fits an sm_90 SM. `orion-replay-gpu --dry-run` prints it; the GPU run uses it.
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "scheduler/workload.h"

namespace replay_gpu {

// sm_90 (H100) limits.
inline constexpr uint32_t kSharedMemPerSm = 228 * 1024;
inline constexpr uint32_t kReservedSharedMemPerBlock = 1024;  // the driver's per-block reservation
inline constexpr uint32_t kMaxSharedMemPerBlock = kSharedMemPerSm - kReservedSharedMemPerBlock;  // 227 KiB
inline constexpr uint32_t kMaxThreadsPerBlock = 1024;
inline constexpr uint32_t kMaxThreadsPerSm = 2048;
inline constexpr uint32_t kMaxBlocksPerSm = 32;

// A launch shape or op the replayer cannot run; the message names the file, line and limit.
class PlanError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct PlanStream {
  std::string name;
  sched::StreamId id = 0;
  sched::StreamClass cls = sched::StreamClass::kUnmanaged;
  std::vector<std::string> clients;
  size_t ops = 0, kernels = 0, copies = 0, memsets = 0, events = 0, others = 0;
  double busy_ns = 0;  // its ops' expected time alone, summed
};

struct PlanKernel {
  std::string name;
  int slot = 0;                 // spin kernel copy (spin_kernels.h)
  sched::Dim3 grid, block;      // of its first launch
  uint32_t smem = 0;            // the file's dynamic shared memory
  uint32_t launch_smem = 0;     // what is launched (raised to cap blocks per SM at blocks_per_sm)
  int blocks_per_sm = 0;        // resident blocks per SM (the simulator's, which the launch reproduces)
  uint64_t waves = 0;
  double block_ns = 0;
  double alone_ns = 0;          // waves x block time
  size_t launches = 0;
};

// One per workload op (same index).
struct PlanOp {
  int kernel = -1;              // index into Plan::kernels (kernel and graph ops), else -1
  uint32_t launch_smem = 0;
  double block_ns = 0;          // kernels: each block's spin time; graph launches: its one block's
  double expected_ns = 0;       // the op alone
};

struct Plan {
  std::string source;
  int sm_count = 0;
  double copy_bytes_per_ns = 0, memset_bytes_per_ns = 0;  // the simulator's rates (expected times)
  std::vector<PlanStream> streams;  // in order of first appearance (StreamId 1, 2, ...)
  std::vector<PlanKernel> kernels;  // distinct kernel names in order of first appearance
  std::vector<PlanOp> ops;
  std::vector<std::string> clients;
  std::map<std::string, double> client_busy_ns;
  size_t requests = 0, closed_loop_requests = 0, events = 0;
  uint64_t max_copy_bytes = 0, max_memset_bytes = 0;
  double kernel_busy_ns = 0, copy_busy_ns = 0, memset_busy_ns = 0;
  std::vector<std::string> notes;  // things that make the replay differ from the simulation
  double total_busy_ns() const { return kernel_busy_ns + copy_busy_ns + memset_busy_ns; }
  size_t streams_of(sched::StreamClass cls) const;
};

// Throws PlanError for a launch that cannot run on sm_90 (threads per block, block or grid
// dimensions, shared memory past 227 KiB per block).
Plan make_plan(const sched::Workload& workload, int sm_count);
std::string format_plan(const Plan& plan);

}  // namespace replay_gpu

// Workloads for the simulated GPU: a JSONL file of ops, and its replay through a Dispatcher on a
// SimulatedGpu in virtual time.
//
// File format: one JSON object per line; empty lines and lines starting with '#' are ignored.
//   arrival_us   number >= 0   arrival time (open loop; with after_request only when that request
//                              is not replayed, e.g. a client run alone). Default 0.
//   stream       string        stream name (required); each name is one stream
//   class        string        high_priority|best_effort|communication|unmanaged (also hp, be,
//                              comm); required on a stream's first line, must not change after
//   kind         string        kernel|copy|memset|event_record|stream_wait_event|host_func|
//                              graph_launch|mem_pool (default kernel)
//   name         string        kernel name (kernels: required); the kernel id is a hash of it
//   grid, block  int or [x,y,z] launch shape (kernels: required)
//   smem         int           dynamic shared memory per block, bytes (default 0)
//   blocks_per_sm int          resident blocks per SM (default: derived from block and smem)
//   block_us     number > 0    time of one block alone, or
//   duration_us  number > 0    time of the whole kernel alone (block time = duration / waves,
//                              waves = ceil(blocks / (SMs * blocks per SM)) on the replay device)
//   profile      string        compute|memory|unknown (default unknown)
//   bytes        int           copy / memset size
//   event        string or int event name (event_record / stream_wait_event: required)
//   client       string        who issued it (default: the stream name); "alone" runs are per client
//   request      string or int latency unit: ops sharing it form one request (default: the op
//                              alone); ids are global (one request belongs to one client)
//   after_request string or int closed loop: this op arrives after_us after that request (on an
//                              earlier line, any client) finished. All ops of a request name the
//                              same after_request (after_us may differ: launch offsets).
//   after_us     number >= 0   delay after after_request finished (think time, launch offset,
//                              work on other pipeline stages); default 0
// Errors throw WorkloadError naming the file, line number and field.
#pragma once

#include <cstdint>
#include <functional>
#include <iosfwd>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "scheduler/device.h"
#include "scheduler/op.h"
#include "scheduler/policy.h"
#include "scheduler/sim_gpu.h"

namespace sched {

class ProfileStore;

class WorkloadError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct WorkloadOp {
  int line = 0;                 // in the source file
  int64_t arrival_ns = 0;       // see arrival_us above
  std::string stream;
  StreamId stream_id = 0;       // 1, 2, ... in order of first appearance
  StreamClass cls = StreamClass::kUnmanaged;
  OpKind kind = OpKind::kKernel;
  std::string name;
  KernelId kernel_id = 0;       // FNV-1a hash of the name
  Dim3 grid, block;
  uint32_t smem = 0;
  uint32_t blocks_per_sm = 0;
  double block_ns = 0;          // one of block_ns / duration_ns is set for kernels
  double duration_ns = 0;
  KernelProfile profile = KernelProfile::kUnknown;
  uint64_t bytes = 0;
  EventId event = 0;            // 1, 2, ... per event name
  std::string client;
  std::string request;          // never empty: defaults to "#<line>"
  std::string after_request;    // empty: open loop
  int64_t after_ns = 0;
};

struct Workload {
  std::string source;
  std::vector<WorkloadOp> ops;  // file order

  std::vector<std::string> clients() const;  // sorted
  // The ops of one client (same ids), e.g. to measure it alone.
  Workload only_client(const std::string& client) const;
  // Kernel description of a kernel op for `device` (resolves duration_us into a block time).
  // The returned name points into `op` (valid while the workload lives).
  KernelInfo kernel_info(const WorkloadOp& op, Device& device) const;
};

Workload parse_workload(std::istream& in, const std::string& source_name);
Workload load_workload(const std::string& path);  // WorkloadError when unreadable

// ---- Replay ----

struct ReplayOptions {
  std::string policy = "passthrough";
  PolicyParams policy_params;
  SimGpuConfig gpu;
  // Hardware stream priorities: HP streams high when the policy defers best-effort work
  // (priority, orion); all equal for passthrough (no scheduler at all). Forced on/off with these.
  bool force_hw_priority_on = false;
  bool force_hw_priority_off = false;
  std::string trace_path;       // Perfetto/Chrome JSON trace (TraceWriter) of the run; empty: none
  int64_t be_max_wait_ns = 2'000'000;
};

struct RequestResult {
  std::string client;
  std::string request;
  StreamClass cls = StreamClass::kUnmanaged;  // of its first op
  int64_t arrival_ns = 0;       // first op handed to the dispatcher
  int64_t done_ns = 0;          // last op completed
  int64_t first_start_ns = -1;  // earliest device start of its ops
  size_t ops = 0;
  int64_t latency_ns() const { return done_ns - arrival_ns; }
  // Time on the device: from its first op starting to its last completing (latency minus the
  // wait before anything of it ran, e.g. behind earlier requests of its own stream).
  int64_t execution_ns() const { return done_ns - (first_start_ns < 0 ? arrival_ns : first_start_ns); }
};

// A workload's requests (its ops grouped by `request`, in file order) and the closed-loop order
// between them (`after_request`), as every replay needs them (the simulator's, the GPU's). A
// request naming a predecessor the workload does not hold (its client replayed alone) is open loop.
struct WorkloadRequest {
  RequestResult result;            // client, request and class filled in
  std::vector<size_t> ops;         // indices into Workload::ops
  std::vector<size_t> followers;   // requests released when this one completes
  bool closed_loop = false;        // released by the request it follows
};
struct RequestGraph {
  std::vector<WorkloadRequest> requests;
  std::vector<size_t> op_request;  // per op of the workload: its request's index
};
RequestGraph request_graph(const Workload& workload);

struct ReplayResult {
  std::string policy;
  std::vector<RequestResult> requests;  // in order of completion
  int64_t makespan_ns = 0;              // last completion (the clock starts at 0)
  double sm_utilisation = 0;            // busy SM time / (SMs * makespan)
  uint64_t ops_completed = 0;
  uint64_t forced_by_starvation = 0;    // dispatcher stats
  // Best-effort SM partition (policies with one; 0 otherwise), sampled after every dispatcher
  // pump: its size at the start and the end, how often it changed, and its time-weighted mean
  // over the makespan.
  int start_be_sms = 0;
  int final_be_sms = 0;
  uint64_t partition_resizes = 0;
  double mean_be_sms = 0;
};

// Replays `workload` through a Dispatcher (no background thread) on a fresh SimulatedGpu in
// virtual time: arrivals are submitted when the clock reaches them, the dispatcher is pumped after
// every device event. Throws WorkloadError/std::invalid_argument on bad input or policy, and
// std::runtime_error when the backend rejects an op (naming the op's line).
ReplayResult replay_workload(const Workload& workload, const ReplayOptions& options);

// ---- Several processes on one simulated GPU (issue 25) ----
// Each process replays its own workload through its own Dispatcher and Policy (its own shim); its
// streams form one context of the GPU (SimGpuConfig::context_sharing: time slicing without MPS,
// concurrent with it). Stream and event ids stay each process's own.

// Hardware stream priorities of a process's streams.
enum class HwPriority {
  kByPolicy,     // its high-priority streams high when its policy defers or partitions best effort
  kHighPriorityStreams,  // its high-priority streams high, whatever the policy
  kNone,         // every stream normal
  kAllStreams,   // every stream high (MPS client priority: this process above the others)
};

struct ProcessSpec {
  std::string name;
  const Workload* workload = nullptr;  // must outlive the replay
  std::string policy = "passthrough";
  PolicyParams policy_params;
  // Replaces `policy` when set (e.g. a gpud policy over simulated pages and the virtual clock: the
  // device is the process's view of the simulated GPU, whose now_ns() is that clock).
  std::function<std::unique_ptr<Policy>(Device& device)> make_custom_policy;
  HwPriority hw_priority = HwPriority::kByPolicy;
  int64_t be_max_wait_ns = 2'000'000;
  std::string trace_path;  // Perfetto/Chrome JSON trace of this process's dispatcher; empty: none
  // The next virtual time after `now` at which something outside the device changes what this
  // process's policy decides (a published window opens or closes); -1: none. The replay stops the
  // clock there and pumps the dispatcher.
  std::function<int64_t(int64_t now)> next_wakeup_ns;
  // Fills the process's kernel profile store before the replay (an offline profile, as
  // ORION_PROFILE imports one in the shim).
  std::function<void(ProfileStore& profiles)> seed_profiles;
  // Told of each request when it starts (done false) and when it completes (done true).
  std::function<void(const RequestResult&, bool done)> on_request;
};

struct ProcessResult {
  std::string name;
  ReplayResult replay;  // sm_utilisation: the whole GPU's busy SMs over this process's makespan
  std::vector<Completion> completions;  // this process's ops, its own stream ids, completion order
};
struct ColocatedResult {
  std::vector<ProcessResult> processes;  // in ProcessSpec order
  uint64_t context_switches = 0;         // the GPU's (time slicing)
};

// Replays every process together on a fresh SimulatedGpu(gpu) in virtual time, as
// replay_workload does for one. Throws as replay_workload does, naming the process.
ColocatedResult replay_processes(const std::vector<ProcessSpec>& processes, const SimGpuConfig& gpu);

// Nearest-rank percentile (p in [0,100]) of `values`; 0 when empty.
double percentile(std::vector<int64_t> values, double p);
// Latency percentile (nearest rank, p in [0,100]) of the requests of class `cls`; 0 when none.
double latency_percentile_ns(const ReplayResult& result, StreamClass cls, double p);
// The same for RequestResult::execution_ns().
double execution_percentile_ns(const ReplayResult& result, StreamClass cls, double p);
// Requests of class `cls` completed per second over their span (first arrival to last
// completion), summed per client; 0 when none.
double requests_per_second(const ReplayResult& result, StreamClass cls);

}  // namespace sched

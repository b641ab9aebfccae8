// Replays a workload on a real GPU through the CUDA driver API and measures it the way the
// simulator reports it (sched::ReplayResult): one CUstream per workload stream (high priority at the
// greatest stream priority, everything else at the least: how the shim tells classes apart), one
// spin kernel per kernel op with the file's grid, block and shared memory, real copies, memsets
// and events. Open-loop ops are issued at their arrival time; a closed-loop request is issued
// after_us after the request it follows completed. A request's latency runs from its first op's
// issue to its last op's completion (seen by a host thread polling CUDA events; it never
// synchronises, so the shim never has to force queued work out).
#pragma once

#include <memory>
#include <string>

#include "plan.h"
#include "run_json.h"
#include "scheduler/workload.h"

namespace replay_gpu {

struct ReplayerOptions {
  int device = 0;
  bool use_clock64 = false;    // spin on clock64 x the SM clock instead of %globaltimer
  double copy_rate_gbps = 25;  // copies take bytes / this on the GPU (the simulator's rate); 0: file bytes
};

struct ShimState {
  bool loaded = false, active = false;
  uint64_t forced_by_starvation = 0;  // orion_get_stats, so far
};
// Whether libgpu_scheduler.so is in this process (its C API found) and scheduling.
ShimState shim_state();

class GpuReplayer {
 public:
  // Probes the device (NoGpuError without one), plans the workload for its SM count (PlanError),
  // creates the context, loads the spin kernels, creates the streams and buffers, warms up.
  GpuReplayer(const sched::Workload& workload, const ReplayerOptions& options);
  ~GpuReplayer();
  GpuReplayer(const GpuReplayer&) = delete;
  GpuReplayer& operator=(const GpuReplayer&) = delete;

  // `subset` is the workload itself or one of its only_client() views. Named `label`.
  sched::ReplayResult run(const sched::Workload& subset, const std::string& label);
  // Issue time minus due time of the ops of the last run(), in us.
  double last_issue_lag_p99_us() const;
  double last_issue_lag_max_us() const;

  const GpuDescription& gpu() const;
  const Plan& plan() const;
  double h2d_gbps() const;
  double copy_scale() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace replay_gpu

// orion-sim internals shared by its files: the workload generators and the study (one row per
// policy, each relative to the clients run alone).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "scheduler/workload.h"

namespace orion_sim {

// Latency-critical inference client (HP, closed loop) next to a training client (BE).
struct InferenceTrainingSpec {
  uint64_t seed = 1;
  int requests = 300;          // inference requests
  int iterations = 12;         // training iterations (each a request of the BE client)
  double think_us = 200;       // inference: pause between a response and the next request
  double launch_gap_us = 5;    // CPU time between two launches of one request / iteration
};

// One pipeline stage of a GPT 1F1B step: backward micro-batches HP, forward micro-batches BE.
struct PipelineStageSpec {
  int stages = 4;
  int stage = 1;               // 0-based
  int micro_batches = 8;
  int layers = 4;              // transformer blocks on this stage
  int other_layers = 3;        // on every other stage (uneven partition, e.g. [3, 4, 3, 3])
  int batch = 4;               // micro-batch size
  int seq = 1024;
  int hidden = 1024;
  int heads = 16;
  double tflops = 400;         // effective dense bf16 rate for compute-bound kernel durations
  double tbytes_per_s = 2.5;   // effective HBM bandwidth (TB/s) for memory-bound kernels
  double comm_us = 50;         // activation / gradient transfer between stages
  double launch_gap_us = 5;
  // When forward j (j >= p-s) is issued. "async" (the product's async_threaded executor: forward
  // and backward on their own streams, the CPU never waits for the GPU): when backward j-(p-s) is
  // issued, i.e. its gradient arrived, so the forward runs beside that backward. "sync"
  // (Megatron's blocking send_backward_recv_forward): when backward j-(p-s) finished.
  std::string pacing = "async";
};

void write_inference_training(std::ostream& out, const InferenceTrainingSpec& spec, const std::string& command);
void write_pipeline_stage(std::ostream& out, const PipelineStageSpec& spec, const std::string& command);

struct StudyOptions {
  std::vector<std::string> policies;  // empty: all
  sched::PolicyParams params;
  sched::SimGpuConfig gpu;
  std::string trace_dir;              // empty: no traces
  int64_t be_max_wait_ns = 2'000'000;
  std::string hw_priority = "auto";   // auto (per policy) | on | off: HP streams' hardware priority
};

struct StudyRow {
  std::string policy;
  double hp_p50_ns = 0, hp_p99_ns = 0, be_per_s = 0;
  double hp_exec_p99_ns = 0;  // HP requests' time on the device (first start to done)
  int64_t makespan_ns = 0;
  double sm_utilisation = 0;
  uint64_t forced_by_starvation = 0;
};

struct Study {
  StudyRow alone;  // HP latencies / BE throughput of each client run alone (policy passthrough)
  std::vector<StudyRow> rows;
};

Study run_study(const sched::Workload& workload, const StudyOptions& options);
// Each client alone (passthrough on its own GPU): the reference of every ratio.
StudyRow run_alone(const sched::Workload& workload, const StudyOptions& options);
// The whole workload under one policy with these parameters.
StudyRow run_point(const sched::Workload& workload, const StudyOptions& options, const std::string& policy,
                   const sched::PolicyParams& params, const std::string& trace_path = "");
// --param KEY=VALUE: "policy.key" goes to that policy, an unqualified key to orion.
sched::PolicyParams params_for(const std::string& policy, const sched::PolicyParams& params);

// orion-sim sweep: each policy over a grid of its parameters (orion_sim_sweep.cpp).
struct SweepPoint {
  std::string label;  // "partition be_sms=64 hp_rest=0 gate=0"
  std::string policy;
  sched::PolicyParams params;
  double hp_p99_ratio = 0, be_ratio = 0;  // HP p99 / alone, BE throughput / alone
  bool pareto = false;                    // no other point has lower-or-equal p99 and higher-or-equal BE
  bool meets_goal = false;                // hp_p99_ratio <= 1.10 and be_ratio >= 0.60
};
struct Sweep {
  StudyRow alone;
  std::vector<SweepPoint> points;
};
Sweep run_sweep(const sched::Workload& workload, const StudyOptions& options);
// Markdown table (every point, Pareto front marked, goal marked) and CSV of the same.
std::string format_sweep(const Sweep& sweep);
std::string sweep_csv(const Sweep& sweep);
// Markdown table: policy | HP p50 / alone | HP p99 / alone | HP exec p99 / alone |
// BE throughput / alone | makespan | SM util | BE ops forced by the starvation bound.
std::string format_study(const Study& study);

}  // namespace orion_sim

// orion-sim internals shared by its files: the workload generators and the study (one row per
// policy, each relative to the clients run alone).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "scheduler/workload.h"
#include "study.h"

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

// A best-effort training job in a process of its own (issue 25's co-location study): a small GPT's
// forward and backward as one request per iteration on one stream, closed loop.
struct TrainingJobSpec {
  int iterations = 40;
  int layers = 2;
  int batch = 8;      // a job heavy enough to fill the GPU when it runs (not launch-bound)
  int seq = 1024;
  int hidden = 1024;
  int heads = 16;
  double tflops = 400;
  double tbytes_per_s = 2.5;
  double launch_gap_us = 5;
  double think_us = 100;       // CPU time between iterations (optimizer step, data)
};

void write_training_job(std::ostream& out, const TrainingJobSpec& spec, const std::string& command);
void write_inference_training(std::ostream& out, const InferenceTrainingSpec& spec, const std::string& command);
void write_pipeline_stage(std::ostream& out, const PipelineStageSpec& spec, const std::string& command);

// The study (study.h): each client alone, then each of options.policies (empty: all).
Study run_study(const sched::Workload& workload, const StudyOptions& options);

// orion-sim sweep: each policy over a grid of its parameters (orion_sim_sweep.cpp).
struct SweepPoint {
  std::string label;  // "partition be_sms=64 hp_rest=0 gate=0"
  std::string policy;
  sched::PolicyParams params;
  double hp_p99_ratio = 0, be_ratio = 0;  // HP p99 / alone, BE throughput / alone
  bool pareto = false;                    // no other point has lower-or-equal p99 and higher-or-equal BE
  bool meets_goal = false;                // hp_p99_ratio <= 1.10 and be_ratio >= 0.60
  double mean_be_sms = 0;                 // partition: time-weighted mean size (adaptive: moves)
  uint64_t resizes = 0;                   // partition: times the size changed during the run
};
struct Sweep {
  StudyRow alone;
  std::vector<SweepPoint> points;
};
Sweep run_sweep(const sched::Workload& workload, const StudyOptions& options);
// Markdown table (every point, Pareto front marked, goal marked) and CSV of the same.
std::string format_sweep(const Sweep& sweep);
std::string sweep_csv(const Sweep& sweep);

// orion-sim colocate (issue 25): a pipeline stage in one process and a best-effort job in another
// on one simulated GPU, time-sliced (no MPS) or concurrent (MPS), unmanaged or gated by the gpud
// policy into the windows the pipeline publishes (orion_sim_colocate.cpp).
struct ColocateOptions {
  sched::SimGpuConfig gpu;
  int steps = 6;                       // pipeline steps; windows are published from step 1 on
  double step_gap_us = 500;            // between steps (optimizer, data): the GPU idles
  double min_window_us = 200;          // shorter gaps are not published
  double guard_us = 50;                // gpud::AdmissionConfig::guard_ns
  std::vector<double> budgets_us = {250, 500, 1000, 2000, 4000};  // in-flight budgets swept
};
struct ColocateRow {
  std::string sharing;     // "time-slice" (no MPS) | "mps"
  std::string management;  // "unmanaged" | "client priority" | "gpud"
  double budget_us = 0;    // gpud: in-flight budget
  double step_ratio = 0;   // pipeline time over steps 1.. / alone
  double bubble_used = 0;  // job GPU time while no pipeline kernel ran / the pipeline's idle time alone
  double job_ratio = 0;    // job kernels completed per second (over the same span) / alone
  double pipeline_p99_ratio = 0;  // p99 of the pipeline's compute requests' execution time / alone
  uint64_t context_switches = 0;
  uint64_t windows = 0, windows_cut = 0;  // gpud: windows published, of which cut short by demand
  bool meets_goals = false;  // step_ratio <= 1.02 and bubble_used >= 0.50
};
struct ColocateStudy {
  std::string pipeline_source, job_source;
  double pipeline_span_us = 0;  // steps 1.. alone
  double pipeline_idle_us = 0;  // of which the GPU ran no pipeline kernel
  double job_alone_kernels_per_s = 0;
  std::vector<ColocateRow> rows;
};
ColocateStudy run_colocation(const sched::Workload& pipeline, const sched::Workload& job, const ColocateOptions& options);
// Iterations of `spec` whose time alone covers the pipeline's `options.steps` steps alone, so the
// job is still running when the pipeline ends.
int job_iterations_to_outlast(const sched::Workload& pipeline_step, const TrainingJobSpec& spec,
                              const ColocateOptions& options);
std::string format_colocation(const ColocateStudy& study);
std::string colocation_csv(const ColocateStudy& study);
// The workload `steps` times back to back: step k's open-loop ops follow the request that ends
// step k-1 (`last_request`) by step_gap plus their arrival; requests are renamed "<name>@<k>".
sched::Workload repeat_steps(const sched::Workload& workload, int steps, int64_t step_gap_ns,
                             const std::string& last_request);

}  // namespace orion_sim

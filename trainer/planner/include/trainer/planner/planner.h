// The planner behind `gpipe_runner --plan`: from measured layer costs (DeviceProfile) it
// enumerates the pipeline configurations a run could use (schedule, virtual stages,
// micro-batches, time-balanced partition, per-stage recompute, overlapped pairs, data-parallel
// replicas), predicts each one's step time and peak memory with the schedule simulator
// (simulate_step, communication and memory over time included), and ranks them. Torch-free: the
// measurement lives in trainer/training/plan_measure.cpp, which fills DeviceProfile.
//
//   config + world size --> enumerate_candidates --> predict (simulate_step + memory walk)
//        DeviceProfile  ----------------------------^          |
//                                                  rank, render_plan_table, plan_config (YAML)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "trainer/config/config.h"
#include "trainer/schedule/schedule.h"

namespace gpipe {

// One layer of ModelInterface::layer_costs() (embedding, blocks, head), measured on the device
// at one micro-batch size. Times in ms, memory in bytes.
struct LayerMeasurement {
  double forward_ms = 0;
  double input_grad_ms = 0;   // the backward's I part (WeightGradStore deferring the W GEMMs)
  double weight_grad_ms = 0;  // its W part (the deferred GEMMs)
  double activation_bytes = 0;   // allocated by forward and still alive after it (output included)
  double weight_grad_bytes = 0;  // of those, still held between I and W (the deferred GEMMs' inputs)
  double output_bytes = 0;       // the output alone (what a recomputed layer keeps, as the next input)
  double workspace_bytes = 0;    // peak above what is held, during any of its three parts
};

// What the planner knows about the device and the model, all measured (or given for links it
// cannot measure). Layer measurements are taken at up to four micro-batch sizes (ascending,
// distinct); other sizes are interpolated piecewise linearly in the micro-batch size.
struct DeviceProfile {
  std::string device;  // "cpu", "NVIDIA H100 80GB HBM3"
  std::vector<std::string> layer_names;
  std::vector<int64_t> layer_parameters;
  std::vector<int64_t> microbatch_sizes;              // 1 to 4 sizes, ascending, distinct
  std::vector<std::vector<LayerMeasurement>> layers;  // [size index][layer]
  double optimizer_ms_per_parameter = 0;  // gradient norm + AdamW, per parameter (serial per step)
  // Per parameter: weights and AdamW state held all step (fp32: 4 + 8); gradients, made by a
  // stage's first backward each step (the trainer sets them to none after the update); the
  // low-precision copies bf16 autocast makes at a stage's first forward of a step (0 in fp32).
  double state_bytes_per_parameter = 12;
  double grad_bytes_per_parameter = 4;
  double cast_bytes_per_parameter = 0;
  double base_bytes = 0;                  // allocated before any stage exists (data, tokenizer)
  double link_latency_ms = 0;             // one transfer between ranks
  double link_ms_per_byte = 0;
  std::string link_source = "measured";   // "measured, in-process transport" or "given"
  // The in-process transport as measured (what calibration runs use, whatever link is given).
  double inprocess_latency_ms = 0;
  double inprocess_ms_per_byte = 0;
  double pair_serial_share = 1.0;         // SimulateOptions::pair_serial_share, measured
  // Ranks sharing one device (all ranks on CPU, several ranks on one GPU) run at most this many
  // ranks' worth of work at once: rank_concurrency[k-1] for k ranks busy together, measured by
  // running one layer on k threads (k for a CPU's cores, about 1 for a saturated GPU).
  std::vector<double> rank_concurrency;
  // What ranks sharing a device achieve in a real pipeline, as a share of rank_concurrency (the
  // threads of a pipeline contend more than copies of one layer do): calibrated by --plan from
  // one run of the user's own configuration (1: not calibrated).
  double sharing_efficiency = 1.0;
  // Of link_latency_ms, what the calibration added to the transport's measured latency: a rank
  // woken by its input on a busy device waits for its turn (0: not calibrated).
  double handoff_ms = 0;
  // What a step of data-parallel replicas costs beyond their all-reduces (the processes agree on
  // losses and the gradient norm, heartbeats): calibrated by --plan from one run with 2 replicas.
  double replica_step_ms = 0;
  // Between the processes of data-parallel replicas, per message (a ring step): a ring all-reduce
  // over d replicas pays it 2 (d - 1) times.
  double replica_link_latency_ms = 0;
  double replica_link_ms_per_byte = 0;
  std::string replica_link_source = "assumed";
  double action_overhead_ms = 0;          // executor cost per compute action beyond its layers' time (0: none known)
  double memory_per_device_bytes = 0;     // the budget each device's ranks share
  // GPUs visible (1 on CPU). The runner places one process's ranks on GPU r % devices; each
  // process of data-parallel replicas on one GPU (cuda:LOCAL_RANK), all its ranks there.
  int devices = 1;

  // The layer at any micro-batch size, interpolated (or extrapolated) from the measured ones.
  LayerMeasurement layer_at(size_t layer, int64_t microbatch_size) const;
};

// One configuration the planner considers.
struct PlanCandidate {
  std::string schedule = "1f1b";
  int pipeline_ranks = 1;   // parallel.model_parallel_size
  int virtual_stages = 1;   // parallel.virtual_stages
  int microbatches = 1;     // training.num_microbatches (the whole step's, over all replicas)
  int data_parallel = 1;    // parallel.data_parallel_size
  bool overlap = false;     // parallel.overlap_f_b true (false: auto)
  std::vector<int64_t> blocks_per_stage;  // parallel.partition_layers, per virtual stage
  std::vector<double> recompute_ratio;    // per virtual stage; all 0: none
  std::string label() const;  // "zb_h1 p4 v1 m8 dp1", "+ovl", "+rc"
};

struct PlanPrediction {
  double step_ms = 0;       // pipeline (simulated) + optimizer + data-parallel all-reduce
  double pipeline_ms = 0;   // the simulated forward/backward part
  double bubble = 0;
  double tokens_per_s = 0;
  std::vector<double> peak_bytes_per_rank;    // static + activations over time + workspace
  std::vector<double> peak_bytes_per_device;  // the ranks of one device together, base included
  bool fits = true;
  std::string why_not;      // when !fits, or a note ("recompute raised on stage 2 to fit")
};

struct PlanOptions {
  int world_size = 0;             // ranks in all (pipeline ranks x replicas); 0: the config's
  int max_microbatches = 64;
  int max_virtual_stages = 4;
  bool allow_overlap = true;      // also try overlap_f_b: true
  bool allow_recompute = true;    // raise recompute per stage where memory needs it
  std::vector<std::string> schedules;  // empty: every generated kind
};

struct PlannedCandidate {
  PlanCandidate candidate;
  PlanPrediction prediction;
};

struct Plan {
  std::vector<PlannedCandidate> ranked;    // fitting candidates, fastest first
  std::vector<PlannedCandidate> rejected;  // did not fit memory (closest first)
  int considered = 0;                      // legal configurations simulated
  std::vector<std::string> notes;          // why whole families lost ("zbv: needs 2 blocks per rank")
};

// Every legal candidate for the model's `num_blocks` transformer blocks and the config's batch:
// schedules that make_schedule accepts and validate() passes, micro-batch counts that divide the
// batch (and the replicas), virtual stages, replicas dividing the world, overlap on/off. Each gets
// a partition balanced by the profile's measured time (partition: time) at its micro-batch size.
// Throws ConfigError (exit 2) when nothing is legal, naming the constraint.
std::vector<PlanCandidate> enumerate_candidates(const PipelineConfig& config, const DeviceProfile& profile,
                                                const PlanOptions& options, std::vector<std::string>* notes = nullptr);

// Simulates one candidate; with allow_recompute, a rank over its memory budget gets its stages'
// recompute ratio raised (0.25 steps) until it fits or reaches 1.
PlannedCandidate predict_candidate(const PlanCandidate& candidate, const PipelineConfig& config,
                                   const DeviceProfile& profile, bool allow_recompute = true);

// enumerate + predict + rank. Throws ConfigError naming the binding constraint and the nearest
// candidate when none fits.
// What --plan plans against on a GPU when no --memory-budget-gib is given: what this process can
// have, the memory free now plus what its caching allocator already holds (the GPU's total less
// the CUDA contexts and other processes, a best-effort job sharing it among them), with 5% kept
// for the allocator's slack and NCCL's buffers. The GPU's total counted memory the run never gets.
double usable_device_bytes(int64_t total, int64_t free, int64_t reserved_here);

Plan make_plan(const PipelineConfig& config, const DeviceProfile& profile, const PlanOptions& options);

// The configuration that runs `candidate` (the user's config with the plan's parallel fields).
PipelineConfig plan_config(const PipelineConfig& base, const PlanCandidate& candidate);
// The YAML `--plan` writes: a header of comments (what was measured and predicted, and the
// command that trains with it) and the config.
std::string plan_yaml(const PipelineConfig& base, const PlannedCandidate& pick, const DeviceProfile& profile);
// The command that trains with `candidate` written to `config_path`: replicas need a process each
// (`--nproc-per-node`), as --verify launches them.
std::string plan_train_command(const PlanCandidate& candidate, const std::string& config_path);
// The table `--plan` prints: the top `rows` candidates and why the others lost.
std::string render_plan_table(const Plan& plan, const DeviceProfile& profile, int rows);

}  // namespace gpipe

// Training metrics: per-iteration records (output_dir/metrics.jsonl), MFU from the GPU's peak,
// and the end-of-run summary (printed, and output_dir/summary.json, whose keys the benchmark
// script reads).
#pragma once

#include <cstdint>
#include <fstream>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace gpipe {

// Dense bf16/fp16 tensor-core peak FLOP/s of one GPU from its name ("NVIDIA H100 80GB HBM3",
// ...): H100/H200 SXM 989e12, H100 PCIe 756e12, A100 312e12, L40S 362e12, A10 125e12, V100
// 125e12. nullopt for unknown names (MFU is then reported as n/a unless overridden).
std::optional<double> peak_flops_for_device_name(const std::string& device_name);
// The OURGPIPE_PEAK_TFLOPS environment variable (TFLOP/s per GPU), when set and positive; it
// overrides the table. Throws std::invalid_argument naming the variable if it is not a number.
std::optional<double> peak_flops_override_from_env();

// Peak resident set size of this process (getrusage), in bytes.
int64_t max_rss_bytes();

struct IterationMetrics {
  int64_t step = 0;  // 0-based optimizer step
  int epoch = 0;
  double loss = 0;
  double learning_rate = 0;
  double grad_norm = 0;
  double step_time_ms = 0;
  // When the step ended, in seconds since the Unix epoch (system clock): lines a step up with other
  // processes' logs and traces (GPU check j: a best-effort job's throughput during the timed
  // steps). An asp window's steps end at even shares of its time. 0: not recorded.
  double end_unix_s = 0;
  double tokens_per_s = 0;
  double bubble_fraction = 0;
  // The clock busy time and bubble were measured with: "host" (CPU) or "cuda_events" (GPU).
  std::string bubble_clock = "host";
  std::optional<double> mfu;
  int64_t peak_memory_bytes = 0;
  // Most bytes tensors held at once during the step (device.h peak_allocated_bytes: CUDA's
  // allocator, or the CPU allocation counter); -1 when nothing counted. On CPU this is the figure
  // to compare with a prediction: peak_memory_bytes there is the process's max RSS.
  int64_t peak_allocated_bytes = -1;
  // Each pipeline rank's busy share of the step's wall time (index = rank; 1 - share is its
  // bubble). Empty when no rank recorded a span.
  std::vector<double> rank_busy;
  // Under the Orion shim (LD_PRELOAD libgpu_scheduler.so, USE_ORION_SCHEDULER=1): stream-ordered
  // ops it held back, and ops it handed to the driver, during this step. nullopt without it.
  std::optional<int64_t> scheduler_held, scheduler_admitted;
  // The CUDA caching allocator during the step (device.h allocator_activity): cudaMalloc and
  // cudaFree calls, allocations retried after freeing the cache (each one synchronises every
  // stream), and the most bytes it reserved from the driver. nullopt on CPU; an asp window of
  // several steps puts its counts on its first step (the others: nullopt).
  std::optional<int64_t> device_mallocs, device_frees, alloc_retries, reserved_peak_bytes;
  // Run under the PyTorch profiler (training.profile_iteration): its time includes the profiler's
  // overhead, so summary()'s means leave it out, as they leave out the first step.
  bool profiled = false;
};
nlohmann::json to_json(const IterationMetrics& m);

struct RunInfo {
  std::string schedule, executor, device, device_name, dtype, priority;
  std::string attention;  // the SDPA kernel the model's attention ran ("none": the model has none)
  int ranks = 0, stages = 0, microbatches = 0;
  int64_t tokens_per_step = 0, parameters = 0;
  double flops_per_token = 0;
  std::optional<double> peak_flops_per_gpu;  // nullopt: MFU n/a
  int num_gpus = 0;
  bool use_orion_scheduler = false;  // parallel.use_orion_scheduler
  std::string orion_env;             // USE_ORION_SCHEDULER as found in the environment ("" if unset)
};

class TensorBoardEventWriter;

// The TensorBoard scalars of one step: (tag, value), in the order they are written. Tags are
// grouped as TensorBoard's dashboard shows them: train/loss, train/learning_rate,
// train/grad_norm, throughput/tokens_per_s, throughput/step_time_ms, throughput/mfu (when
// known), pipeline/bubble_fraction, pipeline/rank<r>_busy, memory/peak_MiB, scheduler/held and
// scheduler/admitted (under the shim).
std::vector<std::pair<std::string, double>> tensorboard_scalars(const IterationMetrics& m);

// Collects iterations; writes each to metrics.jsonl and to a TensorBoard event file in the
// output folder as it comes; summarises at the end.
class MetricsLog {
 public:
  // Checks that `<output_dir>/metrics.jsonl` can be written (nothing in it is lost yet: see
  // begin_at) and opens a new TensorBoard event file `<output_dir>/events.out.tfevents.*` (when
  // this build has the writer); throws std::runtime_error naming the file.
  MetricsLog(const std::string& output_dir, RunInfo info);
  // Starts metrics.jsonl for a run whose first step is `first_step`: a run that resumed from its
  // own checkpoints (`resumed`) keeps the lines of the steps before it (a resume into the same
  // output folder used to lose them), any other run starts the file empty. Call once, before
  // add(); summary() covers this run's steps only.
  void begin_at(int64_t first_step, bool resumed);
  ~MetricsLog();
  MetricsLog(MetricsLog&&) noexcept;
  // The event file, or nullopt when this build writes none (tensorboard_unavailable_reason()).
  std::optional<std::string> tensorboard_path() const;
  static const char* tensorboard_unavailable_reason();
  // MFU = flops_per_token x tokens/s / (peak per GPU x GPUs), when the peak is known.
  std::optional<double> mfu(double tokens_per_s) const;
  void add(const IterationMetrics& m);
  const std::vector<IterationMetrics>& iterations() const { return iterations_; }
  // Summary keys: tokens_per_s, mfu (null when n/a), bubble_fraction, bubble_clock, peak_memory_bytes,
  // step_time_ms_mean, final_loss, first_loss, steps, schedule, executor, stages, microbatches,
  // plus ranks, device, device_name, dtype, priority, parameters, tokens_per_step,
  // flops_per_token, peak_flops_per_gpu, use_orion_scheduler, orion_env, step_time_ms_first.
  // Means leave out the first step (warm-up: allocator, lazy init) and profiled steps, when that
  // leaves any.
  nlohmann::json summary() const;
  // Writes `<output_dir>/summary.json`; returns its path.
  std::string write_summary() const;
  // The seed-style end-of-run block, for the log.
  std::string summary_text() const;

 private:
  std::string output_dir_;
  RunInfo info_;
  std::string jsonl_path_;  // <output_dir>/metrics.jsonl
  std::ofstream jsonl_;
  std::unique_ptr<TensorBoardEventWriter> tensorboard_;
  std::vector<IterationMetrics> iterations_;
};

}  // namespace gpipe

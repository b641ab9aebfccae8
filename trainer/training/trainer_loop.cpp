// PipelineTrainer's run (train()): the loop over epochs and steps, asp windows of several steps,
// metrics and timelines per step, the profiled step's traces, checkpoints every N steps.
#include "trainer/training/trainer.h"

#include "trainer_internal.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <limits>
#include <optional>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "trainer/device/device.h"
#include "trainer/device/orion_thread_class.h"
#include "trainer/distributed/distributed.h"
#include "trainer/distributed/gradient_reducer.h"
#include "trainer/distributed/transport.h"
#include "trainer/execution/executor.h"
#include "trainer/execution/stage_runtime.h"
#include "trainer/launch/orion_preload.h"
#include "trainer/metrics/kineto_profile.h"
#include "trainer/metrics/metrics.h"
#include "trainer/metrics/timeline.h"
#include "trainer/checkpoint/checkpoint.h"
#include "trainer/colocation/bubble_publisher.h"
#include "trainer/training/lr_schedule.h"

namespace gpipe {
namespace {
// 75 s -> "1:15", 3725 s -> "1:02:05".
std::string format_duration(double seconds) {
  const auto total = static_cast<int64_t>(std::llround(seconds));
  const int64_t h = total / 3600, m = total / 60 % 60, s = total % 60;
  return h > 0 ? fmt::format("{}:{:02}:{:02}", h, m, s) : fmt::format("{}:{:02}", m, s);
}
}  // namespace

nlohmann::json PipelineTrainer::train() {
  if (!components_.dataset) throw std::invalid_argument("train() needs a dataset");
  const auto& t = config_.training;
  const auto& p = config_.parallel;
  const bool main_process = !dist_ || dist_->rank() == 0;
  const char* orion_env = std::getenv("USE_ORION_SCHEDULER");
  RunInfo info;
  info.schedule = p.schedule_file.empty() ? p.schedule : "file " + p.schedule_file;  // what ran, not the unused name
  info.executor = executor_->name();
  info.device = rank_devices_.front().is_cuda() ? "cuda" : "cpu";
  info.device_name = device_display_name(rank_devices_.front());
  info.dtype = bf16_ ? "bf16" : "fp32";
  info.priority = p.priority;
  info.attention = attention_backend_.empty() ? "none" : attention_backend_;
  info.ranks = p.model_parallel_size;
  info.stages = schedule_.num_stages();
  info.microbatches = t.num_microbatches;
  info.tokens_per_step = config_.dataset.batch_size * config_.model.sequence_length;
  info.parameters = num_parameters();
  if (replica_group_) {
    info.parameters = static_cast<int64_t>(replica_group_->all_reduce_sum({static_cast<double>(info.parameters)}).front());
  }
  info.flops_per_token = components_.model->training_flops_per_token();
  info.num_gpus = info.device == "cuda" ? (dist_ ? dist_->world_size() : count_distinct_devices(rank_devices_)) : 0;
  if (info.device == "cuda") {
    info.peak_flops_per_gpu = peak_flops_override_from_env();
    if (!info.peak_flops_per_gpu) info.peak_flops_per_gpu = peak_flops_for_device_name(info.device_name);
  }
  info.use_orion_scheduler = p.use_orion_scheduler;
  info.orion_env = orion_env ? orion_env : "";

  log_info("model: {} parameters, {:.3g} training FLOPs/token; {} virtual stages on {} ranks", info.parameters,
               info.flops_per_token, info.stages, info.ranks);
  for (const auto& s : stages_) {
    if (!s) continue;
    log_info("  stage {} (rank {}): layers [{}, {}), recompute {:.2f}", s->spec().stage,
                 schedule_.rank_of_stage(s->spec().stage), s->spec().first_layer, s->spec().last_layer,
                 s->spec().recompute_ratio);
  }
  log_info("executor {} | schedule {} | device {} ({}) | dtype {} | attention {} (model.attention={}) | intra-op "
           "threads {}",
           info.executor, info.schedule, info.device, info.device_name, info.dtype, info.attention,
           config_.model.attention, at::get_num_threads());
  const auto stream_lines = executor_->describe_streams(rank_devices_);
  for (int r : local_ranks_) log_info("  {}", stream_lines.at(static_cast<size_t>(r)));
  log_info("orion scheduler: parallel.use_orion_scheduler={} USE_ORION_SCHEDULER={} | Orion scheduler library loaded: {}",
           p.use_orion_scheduler ? "true" : "false", orion_env ? orion_env : "(unset)",
           orion_scheduler_loaded() ? "yes" : "no");
  if (p.use_orion_scheduler && (orion_env == nullptr || std::string(orion_env) != "1")) {
    log_warn("parallel.use_orion_scheduler is true but USE_ORION_SCHEDULER=1 is not set: run with "
                 "USE_ORION_SCHEDULER=1 LD_PRELOAD=.../libgpu_scheduler.so for the shim to schedule kernels");
  }

  // Rank 0 writes the metrics and the summary; each process writes the timeline of its ranks.
  std::optional<MetricsLog> metrics;
  if (main_process) {
    metrics.emplace(t.output_dir, info);
    if (const auto events = metrics->tensorboard_path()) {
      log_info("TensorBoard scalars: {} (tensorboard --logdir {})", *events, t.output_dir);
    } else {
      log_warn("no TensorBoard scalars: {}", MetricsLog::tensorboard_unavailable_reason());
    }
  }
  std::filesystem::create_directories(t.output_dir);
  ActionRecorder recorder;
  // orion-gpud: this step's idle windows, as the last step's were, published as the step runs.
  std::optional<BubblePublisher> bubbles;
  std::vector<IdleWindow> next_windows;
  // A process that does not run the publishing rank publishes nothing: its own ranks' idle time is
  // not what was asked for, and with no rank measured its window would cover whole steps.
  const bool runs_publishing_rank =
      p.publish_bubbles_rank < 0 ||
      std::find(local_ranks_.begin(), local_ranks_.end(), p.publish_bubbles_rank) != local_ranks_.end();
  if (!p.publish_bubbles_gpu.empty() && !runs_publishing_rank) {
    log_info("orion-gpud: parallel.publish_bubbles_rank={} runs in another process: this one publishes nothing",
             p.publish_bubbles_rank);
  }
  if (!p.publish_bubbles_gpu.empty() && p.publish_bubbles_gpu != "auto" && p.publish_bubbles_rank < 0 && dist_ &&
      dist_->world_size() > 1) {
    // Every process would attach to that one GPU's daemon as its pipeline; all but the first fail.
    throw ConfigError(fmt::format("parallel.publish_bubbles_gpu names one GPU ({}) but {} processes each publish their "
                                  "own ranks (publish_bubbles_rank=-1); set parallel.publish_bubbles_rank to the "
                                  "pipeline rank whose idle time that GPU offers, or use publish_bubbles_gpu=auto (each "
                                  "process its own rank's GPU)",
                                  p.publish_bubbles_gpu, dist_->world_size()));
  }
  if (!p.publish_bubbles_gpu.empty() && runs_publishing_rank) {
    // auto: the GPU of the publishing rank (or of this process's first rank): a Slurm job with
    // ORION_GPUD=1 runs one orion-gpud per GPU, and each process knows only its own device.
    std::string gpu = p.publish_bubbles_gpu;
    if (gpu == "auto") {
      const int rank = p.publish_bubbles_rank >= 0 ? p.publish_bubbles_rank : local_ranks_.front();
      try {
        gpu = gpu_uuid(rank_devices_.at(static_cast<size_t>(rank)));
      } catch (const std::exception& e) {
        throw ConfigError(fmt::format("parallel.publish_bubbles_gpu=auto: {}; name the GPU's UUID (nvidia-smi -L) "
                                      "or leave it empty",
                                      e.what()));
      }
    }
    bubbles.emplace(gpu, std::filesystem::path());
    // While a compute action runs no window is open (it may have started early, or run long).
    recorder.set_compute_hooks(
        [&bubbles, only = p.publish_bubbles_rank](int rank) {
          if (only < 0 || rank == only) bubbles->demand();
        },
        [&bubbles, only = p.publish_bubbles_rank](int rank, ActionRecorder::ComputeFinished finished) {
          if (only < 0 || rank == only) bubbles->compute_done(std::move(finished));
        });
    log_info("orion-gpud: publishing this pipeline's idle windows for GPU {}", gpu);
  }
  const std::string timeline_name = main_process ? "timeline.json" : fmt::format("timeline.rank{}.json", dist_->rank());
  const std::string timeline_path = (std::filesystem::path(t.output_dir) / timeline_name).string();
  bool profiled = false;
  int64_t step = 0;
  int first_epoch = 0;
  int64_t first_index = 0;
  if (t.checkpoint_interval > 0) check_checkpoint_folder();
  if (resume_) std::tie(step, first_epoch, first_index) = load_checkpoint();
  const int64_t first_step = step;
  // Earlier steps' metrics lines are this run's own only when it resumed from its own checkpoints.
  if (metrics) metrics->begin_at(first_step, resumes_own_checkpoint());
  const int64_t batches = components_.dataset->num_batches();
  // For the log's "step N/total" and the time left.
  const int64_t run_steps = planned_steps();
  const auto run_start = std::chrono::steady_clock::now();
  std::optional<OrionCounts> orion_before = read_orion_counts();
  // asp windows: steps run as one pipeline that does not drain between them (bsp: one step).
  const int64_t window_steps = schedule_.sync_mode == SyncMode::kAsp && p.asp_window_steps != 1
                                   ? (p.asp_window_steps == 0 ? std::numeric_limits<int64_t>::max() : p.asp_window_steps)
                                   : 1;
  struct Pending {
    int epoch;
    int64_t index;
    Batch batch;
  };
  std::vector<Pending> window;
  bool stop = false;
  TrainingPosition reached{step, first_epoch, first_index};  // after the last window run
  int64_t saved_step = step;  // the step of the last checkpoint (or the one resumed from)
  // Runs the steps in `window` (one pipeline run), then logs one metrics line per step and
  // checkpoints when the last of them is due.
  auto run_window = [&] {
    const auto n = static_cast<int64_t>(window.size());
    reset_peak_memory(rank_devices_);
    reset_peak_allocated(rank_devices_);
    const std::optional<AllocatorActivity> allocator_before = allocator_activity(rank_devices_);
    // The profiled step also gets a PyTorch profiler (Kineto) trace, as the Python OurGPipe
    // writes one: CPU ops of every action thread, and GPU kernels with their streams.
    const bool profile_now = t.profile_iteration >= step && t.profile_iteration < step + n;
    std::optional<KinetoStepProfile> kineto;
    if (profile_now) kineto.emplace(rank_devices_.front().is_cuda());
    const auto start = std::chrono::steady_clock::now();
    async_step_ = step;  // asp: the learning rate of this step's updates
    std::vector<Batch> step_batches;
    for (const Pending& w : window) step_batches.push_back(w.batch);
    if (bubbles) bubbles->begin_step(next_windows);
    const std::vector<double> step_losses = forward_backward_steps(step_batches, step, &recorder);
    if (bubbles) {
      bubbles->end_step();  // no window over the optimizer step and what follows
      // When none of this process's ranks computed (they share the device): the next step's windows.
      std::vector<std::pair<double, double>> busy;
      for (int r : local_ranks_) {
        if (p.publish_bubbles_rank >= 0 && r != p.publish_bubbles_rank) continue;
        for (const ActionSpan& s : recorder.spans(r)) {
          if (is_compute(s.action.type)) busy.emplace_back(s.start_us, s.end_us);
        }
      }
      // No span measured (nothing of the publishing rank ran): no window, rather than one step long.
      next_windows = busy.empty() ? std::vector<IdleWindow>{} : idle_windows(std::move(busy), recorder.wall_us(), /*min_us=*/200);
    }
    // Checked before optimizer_step: a non-finite loss means non-finite gradients, and
    // stepping on them would write NaN into the weights.
    for (int64_t k = 0; k < n; ++k) {
      const double loss = step_losses[static_cast<size_t>(k)];
      if (!std::isfinite(loss)) {
        throw std::runtime_error(fmt::format("the loss is {} at step {}: lower training.learning_rate or raise "
                                             "training.warmup_steps", loss, step + k));
      }
    }
    const double grad_norm = optimizer_step(step + n - 1).first;
    synchronize_devices(rank_devices_);
    const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    const double end_unix_s =
        std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
    // Each rank's busy share of the step; a multi-process run sums its processes' own ranks over
    // the replica (every process runs this window, so the collective matches).
    std::vector<double> rank_busy(static_cast<size_t>(recorder.num_ranks()), 0.0);
    if (recorder.wall_us() > 0) {
      for (int r : local_ranks_) rank_busy.at(static_cast<size_t>(r)) = recorder.busy_us(r) / recorder.wall_us();
    }
    // The step's bubble and peak memory over the whole replica, as one process running every rank
    // reports them: the mean of the ranks' busy shares, the largest peak of any of its devices
    // (the recorder and the allocator see this process's ranks only).
    double bubble = recorder.bubble_fraction();
    int64_t peak_memory = peak_memory_bytes(rank_devices_), peak_allocated = peak_allocated_bytes(rank_devices_);
    if (replica_group_) {
      rank_busy = replica_group_->all_reduce_sum(rank_busy);
      if (!rank_busy.empty()) {
        double busy = 0;
        for (double b : rank_busy) busy += b;
        bubble = std::clamp(1.0 - busy / static_cast<double>(rank_busy.size()), 0.0, 1.0);
      }
      // A max through the group's sum: each process fills its own slots.
      const auto me = static_cast<size_t>(replica_group_->rank());
      std::vector<double> peaks(2 * static_cast<size_t>(replica_group_->size()), 0.0);
      peaks[2 * me] = static_cast<double>(peak_memory);
      peaks[2 * me + 1] = static_cast<double>(peak_allocated);
      peaks = replica_group_->all_reduce_sum(peaks);
      for (size_t p = 0; p < peaks.size(); p += 2) {
        peak_memory = std::max(peak_memory, static_cast<int64_t>(peaks[p]));
        peak_allocated = std::max(peak_allocated, static_cast<int64_t>(peaks[p + 1]));
      }
    }
    // What the Orion shim held back and admitted during the window (this process's launches).
    const std::optional<OrionCounts> orion_now = read_orion_counts();
    std::optional<int64_t> held, admitted;
    if (orion_now && orion_before) {
      held = static_cast<int64_t>(orion_now->held - orion_before->held);
      admitted = static_cast<int64_t>(orion_now->admitted - orion_before->admitted);
    }
    orion_before = orion_now;
    std::optional<AllocatorActivity> allocator;
    if (allocator_before) allocator = allocator_activity_since(*allocator_before, *allocator_activity(rank_devices_));
    if (allocator && allocator->alloc_retries > 0 && main_process) {
      log_warn("step {}: the CUDA caching allocator failed {} allocation(s), freed its cache (synchronising every "
               "stream) and retried: the step runs near the GPU's memory limit; a schedule with fewer micro-batches "
               "in flight (1f1b rather than gpipe) or smaller micro-batches (raise training.num_microbatches) "
               "avoids it", step + n - 1, allocator->alloc_retries);
    }
    if (n > 1 && main_process && t.log_interval > 0) {
      log_info("asp window: steps {}..{} in one pipeline run of {:.1f} ms ({} micro-batches, drained once)", step,
               step + n - 1, ms, n * t.num_microbatches);
    }
    for (int64_t k = 0; k < n; ++k, ++step) {
      IterationMetrics it;
      it.step = step;
      it.epoch = window[static_cast<size_t>(k)].epoch;
      it.loss = step_losses[static_cast<size_t>(k)];
      it.learning_rate = learning_rate_at(step, total_steps(), t.learning_rate, t.warmup_steps, t.min_lr_ratio);
      it.grad_norm = grad_norm;
      it.step_time_ms = ms / static_cast<double>(n);  // a window's steps share its time evenly
      it.end_unix_s = end_unix_s - (ms / 1e3) * static_cast<double>(n - 1 - k) / static_cast<double>(n);
      it.profiled = profile_now;
      it.tokens_per_s = static_cast<double>(info.tokens_per_step) / (it.step_time_ms / 1e3);
      it.bubble_fraction = bubble;
      it.bubble_clock = to_string(recorder.clock());
      it.peak_memory_bytes = peak_memory;
      it.peak_allocated_bytes = peak_allocated;
      it.rank_busy = rank_busy;
      // A window's steps share its counts evenly, as they share its time.
      auto share = [n, k](int64_t total) { return total / n + (k < total % n ? 1 : 0); };
      if (held) {
        it.scheduler_held = share(*held);
        it.scheduler_admitted = share(*admitted);
      }
      // The allocator's counts are not spread: an asp window's first step carries them all (its
      // cold start must not look like a warm step's cudaMalloc), the others none.
      if (allocator) {
        if (k == 0) {
          it.device_mallocs = allocator->device_mallocs;
          it.device_frees = allocator->device_frees;
          it.alloc_retries = allocator->alloc_retries;
        }
        it.reserved_peak_bytes = allocator->reserved_peak_bytes;
      }
      if (metrics) {
        it.mfu = metrics->mfu(it.tokens_per_s);
        metrics->add(it);
      }
      // "step N/total": N steps done (metrics.jsonl's 0-based `step` is N-1), logged for the
      // first step, every training.log_interval steps and the last. The time left extrapolates
      // this run's mean step time (a resumed run counts only its own steps).
      const int64_t done = step + 1;
      if (main_process && t.log_interval > 0 &&
          (done % t.log_interval == 0 || done == first_step + 1 || done == run_steps)) {
        const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - run_start).count();
        const double left = elapsed / static_cast<double>(done - first_step) * static_cast<double>(run_steps - done);
        log_info("step {}/{} (epoch {}) | loss {:.4f} | lr {:.3e} | grad norm {:.3f} | {:.1f} ms | {:.0f} tokens/s | "
                 "bubble {:.1f}%{} | elapsed {} | left {}", done, run_steps, it.epoch, it.loss, it.learning_rate,
                 grad_norm, it.step_time_ms, it.tokens_per_s, 100.0 * it.bubble_fraction,
                 it.mfu ? fmt::format(" | MFU {:.2f}%", 100.0 * *it.mfu) : "", format_duration(elapsed),
                 format_duration(std::max(0.0, left)));
      }
    }
    if (profile_now) {
      write_chrome_trace(recorder, static_cast<int>(t.profile_iteration), timeline_path);
      log_info("timeline of step {} written to {}", t.profile_iteration, timeline_path);
      const std::filesystem::path trace_dir = std::filesystem::path(t.output_dir) /
                                              fmt::format("profiler_{}", p.scheduler) /
                                              fmt::format("rank{}", dist_ ? dist_->rank() : 0);
      const std::string trace_path = kineto->finish(trace_dir.string());
      log_info("PyTorch profiler trace of step {} written to {}: {} (TensorBoard's profiler plugin, Perfetto)",
               t.profile_iteration, trace_path, kineto->contents());
      profiled = true;
      if (t.exit_after_profile) {
        log_info("training.exit_after_profile: stopping after the profiled step");
        stop = true;
      }
    }
    {
      const Pending& last = window.back();
      const bool epoch_done = last.index + 1 >= batches;
      reached = {step, epoch_done ? last.epoch + 1 : last.epoch, epoch_done ? 0 : last.index + 1};
    }
    if (t.checkpoint_interval > 0 && step % t.checkpoint_interval == 0) {
      save_checkpoint(reached.step, reached.epoch, reached.batch_index);
      saved_step = step;
    }
    window.clear();
  };
  for (int epoch = first_epoch; epoch < t.epochs && !stop; ++epoch) {
    for (int64_t index = epoch == first_epoch ? first_index : 0; index < batches && !stop; ++index) {
      const int64_t next = step + static_cast<int64_t>(window.size());  // this batch's step
      if (t.max_steps >= 0 && next >= t.max_steps) {
        stop = true;
        break;
      }
      window.push_back(Pending{epoch, index, components_.dataset->process_batch(epoch, index)});
      // A window ends where the run must drain: its length, the last step, a checkpoint, the
      // epoch's end, and around the profiled step (a window of its own: the profiler and the
      // timeline cover that step alone).
      const bool ends = static_cast<int64_t>(window.size()) >= window_steps ||
                        (t.max_steps >= 0 && next + 1 >= t.max_steps) || index + 1 >= batches ||
                        (t.checkpoint_interval > 0 && (next + 1) % t.checkpoint_interval == 0) ||
                        next == t.profile_iteration || next + 1 == t.profile_iteration;
      if (ends) run_window();
    }
  }
  if (!window.empty()) run_window();  // (every path above ends its window; kept for safety)
  // The run's last steps since the last interval's checkpoint (training.max_steps, the epochs'
  // end or exit_after_profile between two intervals): saved too, so a resume that trains longer
  // goes on from where this run stopped instead of repeating them.
  if (t.checkpoint_interval > 0 && step > first_step && saved_step != step) {
    log_info("saving the last step's checkpoint (step {}; training.checkpoint_interval={})", step, t.checkpoint_interval);
    save_checkpoint(reached.step, reached.epoch, reached.batch_index);
  }
  // A resumed run past the profiled step: the earlier run wrote that step's timeline; keep it.
  const bool profiled_before = t.profile_iteration >= 0 && t.profile_iteration < first_step &&
                               std::filesystem::exists(timeline_path);
  if (!profiled && !profiled_before && step > 0 && recorder.wall_us() > 0) {
    write_chrome_trace(recorder, static_cast<int>(step - 1), timeline_path);
    log_info("training.profile_iteration={} was not reached; timeline of the last step ({}) written to {}",
                 t.profile_iteration, step - 1, timeline_path);
  }
  const int64_t steps_run = step - first_step;
  for (size_t s = 0; s < reducers_.size(); ++s) {
    if (!reducers_[s]) continue;
    // The all-reduce's overlap with the backward: what the hooks started before the stage's last
    // gradient action ended (the first step learns the counts, so it starts none early).
    log_info("stage {} replicas' gradient all-reduce: {} of {} buckets started during the last backward of the "
             "last step (parallel.dp_bucket_mb={})", s, reducers_[s]->started_during_backward(),
             reducers_[s]->num_buckets(), p.dp_bucket_mb);
  }
  if (dist_) {
    // What crossed process boundaries, against what the model implies: per micro-batch and
    // boundary one activation and one gradient of (micro-batch, sequence, hidden) values.
    const double sent = dist_->all_reduce_sum({static_cast<double>(transport_->bytes_sent())}).front();
    int boundaries = 0;
    for (int s = 0; s + 1 < schedule_.num_stages(); ++s) {
      if (placement_.process_of(schedule_.rank_of_stage(s)) != placement_.process_of(schedule_.rank_of_stage(s + 1))) ++boundaries;
    }
    const double element = 4.0;  // a block ends in a residual add, so activations cross in fp32 even under autocast
    const double implied = 2.0 * boundaries * static_cast<double>(config_.dataset.batch_size) *
                           static_cast<double>(config_.model.sequence_length * config_.model.hidden_size) * element;
    if (main_process && steps_run > 0) {
      log_info("bytes sent between processes: {:.0f} per step over {} process boundar{} (the model implies {:.0f} "
               "for activations and gradients: ratio {:.4f})", sent / static_cast<double>(steps_run), boundaries,
               boundaries == 1 ? "y" : "ies", implied, implied > 0 ? sent / static_cast<double>(steps_run) / implied : 0.0);
    }
  }
  if (!metrics) return nlohmann::json::object();
  if (steps_run == 0 && first_step > 0) {
    // A resume with nothing left to train: the earlier run's summary stays (this one has none).
    log_info("nothing left to train after step {} (training.max_steps or epochs reached): {} kept as the run that "
             "trained them wrote it; raise --steps to train on", first_step, t.output_dir + "/summary.json");
    return nlohmann::json::object();
  }
  const std::string summary_path = metrics->write_summary();
  std::printf("%s\n", metrics->summary_text().c_str());
  log_info("summary written to {}", summary_path);
  return metrics->summary();
}

}  // namespace gpipe

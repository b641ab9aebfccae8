// PipelineTrainer: building a pipeline from the registries and running optimizer steps.
#include "trainer/training/trainer.h"

#include "trainer_internal.h"
#include "tied_parameters.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/optim/adamw.h>

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <map>
#include <thread>

#include <fmt/format.h>

#include "trainer/device/device.h"
#include "trainer/launch/world.h"
#include "trainer/distributed/distributed.h"
#include "trainer/distributed/gradient_reducer.h"
#include "trainer/distributed/gpu_sharing.h"
#include "trainer/log/engine_log.h"
#include "trainer/execution/executor.h"
#include "trainer/training/fused_adamw.h"
#include "trainer/training/layer_profiler.h"
#include "trainer/training/lr_schedule.h"
#include "trainer/model/attention_backend.h"
#include "trainer/model/registry.h"
#include "trainer/execution/stage_runtime.h"
#include "trainer/distributed/transport.h"

namespace gpipe {

namespace {

// Refuses, before anything is built, a model whose weights, gradients and AdamW state plus one
// micro-batch's activations exceed the memory of every process's devices (this process's devices
// times the world size, torchrun's or SLURM's: the stages spread over the processes).
void check_model_fits(ModelInterface& model, const PipelineConfig& config) {
  model.configure(config.model);
  const MemoryEstimate est = model.estimate_memory();
  const double microbatch_tokens = static_cast<double>(config.dataset.batch_size) /
                                   static_cast<double>(config.training.num_microbatches) *
                                   static_cast<double>(config.model.sequence_length);
  const double state = 16.0 * est.parameters;
  const double activations = est.activation_bytes_per_token * microbatch_tokens;
  const std::vector<c10::Device> devices =
      resolve_rank_devices(config.parallel.device, config.parallel.model_parallel_size);
  // Each pipeline replica holds the whole model: its share of the processes is what counts.
  const double processes_per_replica = static_cast<double>(world_from_environment().world_size) /
                                       static_cast<double>(std::max(1, config.parallel.data_parallel_size));
  const double capacity =
      static_cast<double>(total_memory_bytes(devices)) * std::max(1.0, processes_per_replica);
  if (state + activations <= capacity) return;
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  throw ConfigError(fmt::format(
      "the model cannot fit: model.num_layers={}, model.hidden_size={}, model.sequence_length={} make "
      "{:.3g} parameters, whose weights, gradients and AdamW state (16 bytes each) need {:.1f} GiB, plus "
      "{:.1f} GiB of activations for one micro-batch (dataset.batch_size={} / training.num_microbatches={}), "
      "but the {} memory is {:.1f} GiB: lower model.num_layers / model.hidden_size / model.sequence_length, or "
      "use more memory (parallel.device, more GPUs or processes)",
      config.model.num_layers, config.model.hidden_size, config.model.sequence_length, est.parameters,
      state / kGiB, activations / kGiB, config.dataset.batch_size, config.training.num_microbatches,
      devices.front().is_cuda() ? "GPUs'" : "machine's", capacity / kGiB));
}

}  // namespace

PipelineComponents create_components(PipelineConfig& config) {
  config.load_partition_file();
  config.validate();
  (void)build_schedule(config.parallel, config.training);  // schedule errors before loading data
  PipelineComponents c;
  auto create = [](auto& registry, const std::string& name, const char* field) {
    try {
      return registry.create(name);
    } catch (const std::invalid_argument& e) {
      throw ConfigError(std::string(field) + ": " + e.what());
    }
  };
  c.model = create(model_registry(), config.model.name, "model.name");
  c.stage = create(stage_registry(), config.model.name, "model.name (stage)");
  c.dataset = create(dataset_registry(), config.dataset.name, "dataset.name");
  c.dataset->set_seed(config.training.seed);
  try {
    c.dataset->load_dataset(config.dataset, config.model);
  } catch (const ConfigError&) {
    throw;
  } catch (const std::exception& e) {
    throw ConfigError(std::string("dataset (dataset.path / dataset.tokenizer): ") + e.what());
  }
  const int64_t tokenizer_vocab = c.dataset->get_tokenizer().vocab_size();
  if (config.model.vocab_size == -1) {
    config.model.vocab_size = tokenizer_vocab;
  } else if (config.model.vocab_size < tokenizer_vocab) {
    throw ConfigError(fmt::format("model.vocab_size={} is smaller than the tokenizer's vocabulary ({}): "
                                  "use -1 to take it from the tokenizer",
                                  config.model.vocab_size, tokenizer_vocab));
  }
  check_model_fits(*c.model, config);
  if (c.dataset->num_batches() < 1) {
    throw ConfigError(fmt::format("dataset '{}' has no full batch of {} x {} tokens: give more data or lower "
                                  "dataset.batch_size / model.sequence_length",
                                  config.dataset.name, config.dataset.batch_size, config.model.sequence_length));
  }
  config.validate();
  return c;
}

namespace {
// AdamW with weight decay on matrices (embeddings, linear weights) and none on biases and norms.
std::unique_ptr<torch::optim::AdamW> make_adamw(const std::vector<at::Tensor>& params, const TrainingConfig& t) {
  std::vector<at::Tensor> decay, no_decay;
  for (const auto& p : params) {
    if (!p.requires_grad()) continue;
    (p.dim() >= 2 ? decay : no_decay).push_back(p);
  }
  std::vector<torch::optim::OptimizerParamGroup> groups;
  auto options = [&](double wd) {
    return std::make_unique<torch::optim::AdamWOptions>(
        torch::optim::AdamWOptions(t.learning_rate).weight_decay(wd).betas({0.9, 0.95}).eps(1e-8));
  };
  if (!decay.empty()) groups.emplace_back(decay, options(t.weight_decay));
  if (!no_decay.empty()) groups.emplace_back(no_decay, options(0.0));
  return std::make_unique<torch::optim::AdamW>(groups, torch::optim::AdamWOptions(t.learning_rate));
}
}  // namespace

PipelineTrainer::PipelineTrainer(PipelineConfig config, PipelineComponents components, Distributed* dist)
    : config_(std::move(config)), components_(std::move(components)),
      schedule_(build_schedule(config_.parallel, config_.training)), dist_(dist) {
  if (!components_.model || !components_.stage) throw std::invalid_argument("PipelineTrainer needs a model and a stage");
  if (config_.model.vocab_size <= 0) {
    throw ConfigError("model.vocab_size is unresolved (-1): build the components with create_components()");
  }
  const auto& p = config_.parallel;
  if (p.data_parallel_size > 1 && !dist_) {
    throw ConfigError(fmt::format(
        "parallel.data_parallel_size={} replicates the pipeline over processes, but this is one process: launch "
        "a multiple of {} processes (gpipe_runner --nproc-per-node, torchrun, srun)", p.data_parallel_size,
        p.data_parallel_size));
  }
  placement_ = make_placement(p, dist_ ? dist_->world_size() : 1, dist_ ? dist_->rank() : 0);
  local_ranks_ = placement_.ranks_of(dist_ ? dist_->rank() : 0);
  if (dist_) {
    // This replica's processes: their tied-parameter sums and gradient norm are the pipeline's.
    std::vector<int> members;
    for (int k = 0; k < placement_.processes_per_replica; ++k) {
      members.push_back(placement_.replica * placement_.processes_per_replica + k);
    }
    replica_group_ = dist_->new_group(fmt::format("replica{}", placement_.replica), members, "gloo");
  }
  if (dist_ && dist_->world_size() > 1 && components_.dataset) {
    // Every process reads dataset.path itself; stage 0's gives the inputs and the last stage's the
    // targets, so different data on two nodes would train on mismatched pairs without a word.
    const std::string mine = components_.dataset->content_digest();
    const std::string rank0 = dist_->broadcast_from_rank0("dataset_digest", mine);
    if (mine != rank0) {
      throw ConfigError(fmt::format(
          "this process loaded other data than rank 0: {} here, {} on rank 0 (dataset.path '{}', dataset.name '{}'): "
          "give every node the same files (a shared file system, or identical copies)",
          mine, rank0, config_.dataset.path, config_.dataset.name));
    }
  }
  if (dist_) {
    // One device per process (cuda:LOCAL_RANK, as torchrun runs), shared by its ranks.
    const int local_rank = dist_->world().local_rank;
    const c10::Device device = resolve_rank_devices(p.device, local_rank + 1).at(static_cast<size_t>(local_rank));
    rank_devices_.assign(static_cast<size_t>(p.model_parallel_size), device);
  } else {
    rank_devices_ = resolve_rank_devices(p.device, p.model_parallel_size);
  }
  const bool cuda = rank_devices_.front().is_cuda();
  if (dist_) {
    // Before any NCCL communicator exists: NCCL's own refusal comes only at its first use. Every
    // process takes part (a CPU one says so), so a mix of CPU and CUDA processes is named too.
    const bool nccl_transport = cuda && (p.transport == "auto" || p.transport == "nccl");
    const std::string shared = check_gpu_sharing(
        *dist_, {cuda ? gpu_uuid(rank_devices_.front()) : "", this_host_name(), dist_->world().local_rank},
        cuda ? nccl_communicators(placement_, schedule_, nccl_transport) : std::vector<std::vector<int>>{});
    if (!shared.empty()) log_info("{} (no NCCL communicator between them)", shared);
  }
  const std::string& dtype = config_.training.dtype;
  if (dtype != "auto" && dtype != "fp32" && dtype != "bf16") {
    throw ConfigError("training.dtype='" + dtype + "' is not one of auto, fp32, bf16");
  }
  if (dtype == "bf16" && !cuda) {
    throw ConfigError("training.dtype=bf16 (autocast) needs a CUDA device; use fp32 or auto on CPU");
  }
  bf16_ = cuda && dtype != "fp32";

  at::manual_seed(config_.training.seed);
  // Threads: ranks already run in parallel on CPU, so each gets a share of the cores unless
  // OMP_NUM_THREADS says otherwise. A fixed count keeps a seed's results reproducible.
  if (!cuda && std::getenv("OMP_NUM_THREADS") == nullptr) {
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    const int processes_here = dist_ ? std::max(1, dist_->world().local_world_size) : 1;
    const int ranks_in_parallel = p.scheduler == "async_threaded" ? static_cast<int>(local_ranks_.size()) : 1;
    at::set_num_threads(std::max(1, cores / (ranks_in_parallel * processes_here)));
  }

  components_.model->configure(config_.model);
  // Settled before anything runs the model (the time partition measures it next).
  if (const auto shape = components_.model->attention_shape()) {
    attention_backend_ = select_attention_backend(config_.model.attention, *shape, rank_devices_.front(),
                                                  bf16_ ? at::kBFloat16 : at::kFloat);
  } else if (config_.model.attention != "auto") {
    log_warn("model.attention={} changes nothing: model '{}' does not call scaled_dot_product_attention",
             config_.model.attention, config_.model.name);
  }
  if (config_.dataset.num_workers != 0) {
    // Accepted so that the seed's configs load; said, so that nobody counts on it.
    log_warn("dataset.num_workers={} changes nothing: batches are cut from the tokenized corpus in memory by the "
             "training thread (no loader workers); leave it 0", config_.dataset.num_workers);
  }
  const int num_stages = schedule_.num_stages();
  std::vector<StageSpec> specs;
  if (p.partition == "time") {
    // Each layer alone, forward + backward on a micro-batch, on the first rank's device (the
    // ranks' devices are alike) under the run's dtype and intra-op threads.
    LayerProfileOptions profile;
    profile.bf16_autocast = bf16_;
    log_info("parallel.partition=time: timing each of the model's {} layers alone (forward+backward of one "
             "micro-batch, {} warm-up and {} timed runs) to balance the stages ...",
             components_.model->layer_costs().size(), std::max(1, profile.warmup_runs), profile.timed_runs);
    const auto start = std::chrono::steady_clock::now();
    // How far it is, at most every 5 s (a small model finishes before the first line).
    auto last_said = start;
    profile.on_round = [&](int done, int total) {
      const auto now = std::chrono::steady_clock::now();
      if (done < total && now - last_said >= std::chrono::seconds(5)) {
        log_info("parallel.partition=time: round {}/{} over every layer done ({:.0f} s)", done, total,
                 std::chrono::duration<double>(now - start).count());
        last_said = now;
      }
    };
    measured_layer_ms_ = measure_layer_ms(*components_.model, *components_.stage, config_, rank_devices_.front(), profile);
    if (dist_) {
      // Every process must cut the model at the same layers: rank 0's measurement decides.
      std::string text;
      for (double ms : measured_layer_ms_) text += fmt::format("{:.17g},", ms);
      text = dist_->broadcast_from_rank0("layer_ms", text);
      measured_layer_ms_.clear();
      for (size_t at = 0, next; (next = text.find(',', at)) != std::string::npos; at = next + 1) {
        measured_layer_ms_.push_back(std::stod(text.substr(at, next - at)));
      }
    }
    const double took = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    const auto layers = components_.model->layer_costs();
    std::string listing;
    for (size_t i = 0; i < measured_layer_ms_.size(); ++i) {
      listing += fmt::format("{}{} {:.3f}", i == 0 ? "" : ", ", i < layers.size() ? layers[i].name : std::to_string(i),
                             measured_layer_ms_[i]);
    }
    log_info("parallel.partition=time: measured forward+backward ms per layer on {} ({:.0f} ms): {}",
             device_display_name(rank_devices_.front()), took, listing);
    at::manual_seed(config_.training.seed);  // profiling may draw from the global generator (dropout)
  }
  try {
    specs = components_.model->get_stage_partition(p, num_stages, measured_layer_ms_);
  } catch (const std::invalid_argument& e) {
    throw ConfigError(std::string("parallel.partition: ") + e.what());
  }
  if (static_cast<int>(specs.size()) != num_stages) {
    throw ConfigError(fmt::format("the model's partition gave {} stages for {} virtual stages", specs.size(), num_stages));
  }
  if (p.partition == "time") {
    std::string split;
    for (const auto& spec : specs) {
      double ms = 0;
      for (int64_t l = spec.first_layer; l < spec.last_layer && l < static_cast<int64_t>(measured_layer_ms_.size()); ++l) {
        ms += measured_layer_ms_[static_cast<size_t>(l)];
      }
      split += fmt::format("{}stage {}: layers [{}, {}) {:.3f} ms", spec.stage == 0 ? "" : "; ", spec.stage,
                           spec.first_layer, spec.last_layer, ms);
    }
    log_info("parallel.partition=time split: {}", split);
  }
  optimizers_ = std::make_unique<Optimizers>();
  for (const auto& spec : specs) {
    const int rank = schedule_.rank_of_stage(spec.stage);
    if (!placement_.is_local(rank, dist_ ? dist_->rank() : 0)) {
      stages_.push_back(nullptr);  // another process runs it
      optimizers_->per_stage.push_back(nullptr);
      continue;
    }
    std::shared_ptr<StageModule> module;
    try {
      module = components_.stage->create_sub_model(*components_.model, spec, config_.training.seed);
    } catch (const std::invalid_argument& e) {
      throw ConfigError(fmt::format("stage {}: {}", spec.stage, e.what()));
    }
    const c10::Device device = rank_devices_.at(static_cast<size_t>(schedule_.rank_of_stage(spec.stage)));
    stages_.push_back(std::make_unique<StageRuntime>(spec, std::move(module), *components_.stage, device,
                                                     schedule_.num_microbatches));
    optimizers_->per_stage.push_back(make_adamw(stages_.back()->parameters(), config_.training));
  }
  // Tied parameters: the copies on different stages start equal (in every process, in the same
  // order: a group spanning processes is an all-reduce).
  tied_ = std::make_unique<TiedParameters>(*components_.model, specs, stages_, schedule_, placement_,
                                           replica_group_.get());
  tied_->synchronize_values();
  if (p.data_parallel_size > 1) {
    // One group per stage and its replicas, made in stage order everywhere (each waits for its
    // members): two stages of one process never share a group, so their rank threads' collectives
    // cannot interleave differently in different replicas. The replicas start from equal weights
    // (the layers' seeds do not depend on the placement).
    reducers_.resize(stages_.size());
    const auto bucket_bytes = static_cast<size_t>(p.dp_bucket_mb * 1024.0 * 1024.0);
    std::string groups;
    for (size_t s = 0; s < stages_.size(); ++s) {
      if (!stages_[s]) continue;
      std::vector<int> members;
      const int rank = schedule_.rank_of_stage(static_cast<int>(s));
      for (int r = 0; r < placement_.data_parallel_size; ++r) members.push_back(placement_.process_in_replica(rank, r));
      auto group = dist_->new_group(fmt::format("stage{}", s), members, cuda ? "nccl" : "gloo");
      groups += fmt::format("{}stage {}: ranks", groups.empty() ? "" : "; ", s);
      for (int m : members) groups += " " + std::to_string(m);
      reducers_[s] = std::make_unique<GradientReducer>(fmt::format("stage {}", s), stages_[s]->parameters(),
                                                       replica_collective(std::move(group)), bucket_bytes);
      groups += fmt::format(" ({} buckets)", reducers_[s]->num_buckets());
    }
    log_info("replica {} of {} ({} of the {} micro-batches per step); gradient all-reduce groups ({}): {}",
             placement_.replica, placement_.data_parallel_size, schedule_.num_microbatches,
             config_.training.num_microbatches, cuda ? "nccl" : "gloo", groups);
  }
  if (schedule_.sync_mode == SyncMode::kAsp) {
    if (!tied_->empty()) {
      throw ConfigError("parallel.sync_mode=asp: this model ties parameters across stages, whose copies asynchronous "
                        "per-stage updates cannot keep equal; use parallel.sync_mode: bsp");
    }
    for (auto& s : stages_) {
      if (s) s->enable_async(schedule_.weight_stashing);
    }
  }
  ExecutorOptions options;
  options.priority = p.priority;
  options.streams = p.streams;
  options.bf16_autocast = bf16_;
  options.recv_timeout = std::chrono::milliseconds(static_cast<int64_t>(p.peer_timeout_s * 1000));
  executor_ = make_executor(p.scheduler, options);
  if (dist_) {
    std::string kind = p.transport;
    if (kind == "auto") kind = cuda ? "nccl" : "gloo";
    if (kind == "inprocess") {
      throw ConfigError("parallel.transport is inprocess but WORLD_SIZE=" + std::to_string(dist_->world_size()) +
                        " processes run this pipeline; use auto, gloo (CPU) or nccl (CUDA)");
    }
    if (cuda) bind_thread_to_device(rank_devices_.front());
    transport_ = dist_->make_transport(kind, placement_, schedule_);
    log_info("transport {} between processes ({}), in memory between ranks of one process", kind, placement_.describe());
  } else {
    if (p.transport == "gloo" || p.transport == "nccl") {
      log_info("parallel.transport={} but a single process runs every rank: tensors stay in memory", p.transport);
    }
    transport_ = make_inprocess_transport(p.model_parallel_size, schedule_.stage_to_rank);
  }
}

PipelineTrainer::~PipelineTrainer() {
  if (checkpoint_lock_fd_ >= 0) ::close(checkpoint_lock_fd_);
  if (dist_ && transport_) dist_->unwatch(transport_.get());
}

int64_t PipelineTrainer::num_parameters() const {
  int64_t n = 0;
  for (const auto& s : stages_) {
    if (!s) continue;
    for (const auto& t : s->parameters()) n += tied_->is_duplicate(t) ? 0 : t.numel();
  }
  return n;
}

int64_t PipelineTrainer::planned_steps() const {
  const int64_t per_epoch = components_.dataset ? components_.dataset->num_batches() : 1;
  int64_t steps = per_epoch * config_.training.epochs;
  // The sooner end: a max_steps past the epochs' end left the cosine schedule at its peak to the
  // last step (it spanned steps the run never takes).
  if (config_.training.max_steps >= 0) steps = std::min(steps, config_.training.max_steps);
  return steps;
}

int64_t PipelineTrainer::total_steps() const { return std::max<int64_t>(1, planned_steps()); }

double PipelineTrainer::forward_backward(const Batch& batch, ActionRecorder* recorder) {
  return forward_backward_steps({batch}, async_step_, recorder).front();
}

std::vector<double> PipelineTrainer::forward_backward_steps(const std::vector<Batch>& global_batches,
                                                            int64_t first_step, ActionRecorder* recorder) {
  const int replicas = placement_.data_parallel_size;
  const int steps = static_cast<int>(global_batches.size());
  if (steps < 1) throw std::invalid_argument("forward_backward_steps needs at least one batch");
  if (steps > 1 && schedule_.sync_mode != SyncMode::kAsp) {
    throw std::logic_error("several steps in one pipeline run need parallel.sync_mode asp");
  }
  // One replica's micro-batches per step; an asp window runs `steps` steps' worth as one schedule.
  const int m = schedule_.num_microbatches;
  const Schedule& schedule = steps == 1 ? schedule_ : window_schedule(steps);
  StepContext ctx;
  ctx.schedule = &schedule;
  ctx.rank_devices = rank_devices_;
  ctx.local_ranks = local_ranks_;
  ctx.transport = transport_.get();
  ctx.recorder = recorder;
  // The step's token ids go to the first stage's device and its targets to the last stage's
  // once, from pinned memory without blocking the host, before any stream starts on them (the
  // copies are on this thread's current stream, which every rank stream waits for at its first
  // action of the step). The stages' own .to(device) are then no-ops: no action waits on a host
  // copy. CPU stages and stages of other processes take the batch as it is.
  auto to_stage_device = [&](const at::Tensor& t, int stage) {
    const c10::Device device = stages_.at(static_cast<size_t>(stage)) ? stages_[static_cast<size_t>(stage)]->device()
                                                                        : c10::Device(c10::kCPU);
    return device.is_cuda() ? t.pin_memory().to(device, /*non_blocking=*/true) : t;
  };
  for (const Batch& global_batch : global_batches) {
    const int64_t rows = global_batch.input_ids.size(0);
    if (rows % config_.training.num_microbatches != 0) {
      throw ConfigError(fmt::format("a batch of {} sequences does not split into training.num_microbatches={}", rows,
                                    config_.training.num_microbatches));
    }
    // This replica's share: micro-batches r x m .. (r + 1) x m - 1 of the step's.
    const Batch batch =
        replicas == 1 ? global_batch
                      : Batch{global_batch.input_ids.narrow(0, placement_.replica * (rows / replicas), rows / replicas),
                              global_batch.targets.narrow(0, placement_.replica * (rows / replicas), rows / replicas)};
    const auto inputs = to_stage_device(batch.input_ids, 0).chunk(m, 0);
    const auto targets = to_stage_device(batch.targets, schedule.num_stages() - 1).chunk(m, 0);
    for (int i = 0; i < m; ++i) {
      ctx.microbatches.push_back(Batch{inputs[static_cast<size_t>(i)], targets[static_cast<size_t>(i)]});
    }
  }
  // Dropout masks by place in the run: micro-batch k of this run is micro-batch k % m of step
  // first_step + k / m, which is micro-batch replica x m + k % m of that step's global batch.
  const uint64_t seed = static_cast<uint64_t>(config_.training.seed);
  const int64_t first_of_replica = static_cast<int64_t>(placement_.replica) * m;
  for (auto& s : stages_) {
    if (s) {
      s->begin_step();
      s->set_dropout_origin([seed, first_step, m, first_of_replica](int microbatch) {
        return DropoutOrigin{seed, first_step + microbatch / m, first_of_replica + microbatch % m};
      });
      s->zero_grad();
    }
    ctx.stages.push_back(s.get());
  }
  if (schedule.sync_mode == SyncMode::kAsp) {
    // Each stage's update right after each of its backwards (on that stage's rank thread), at the
    // learning rate of the step the micro-batch belongs to.
    ctx.update_after_backward = [this, first_step, m](int stage, int microbatch) {
      const auto& t = config_.training;
      update_stage_async(stage, learning_rate_at(first_step + microbatch / m, total_steps(), t.learning_rate,
                                                 t.warmup_steps, t.min_lr_ratio));
    };
    std::lock_guard<std::mutex> lock(async_mu_);
    async_norm_sum_ = 0;
    async_updates_ = 0;
  }
  if (!reducers_.empty()) {
    ctx.before_last_gradient = [this](int stage) { reducers_.at(static_cast<size_t>(stage))->begin_last_backward(); };
    ctx.after_last_gradient = [this](int stage) { reducers_.at(static_cast<size_t>(stage))->end_last_backward(); };
  }
  try {
    executor_->run_step(ctx);
    for (auto& r : reducers_) {
      if (r) r->finish();  // each stage's gradients: the replicas' mean
    }
  } catch (...) {
    for (auto& s : stages_) {
      if (s) s->discard_step();  // a later step starts clean
    }
    for (auto& r : reducers_) {
      if (r) r->discard();
    }
    throw;
  }
  // Megatron's embedding all-reduce: every copy of a tied parameter gets the sum of their gradients.
  tied_->reduce_gradients();
  std::vector<double> losses(static_cast<size_t>(steps), 0.0);
  if (const StageRuntime* last = stages_.back().get()) {
    if (last->losses_recorded() != m * steps) {
      throw std::runtime_error(fmt::format("the last stage computed {} losses for {} micro-batches",
                                           last->losses_recorded(), m * steps));
    }
    for (int k = 0; k < steps; ++k) losses[static_cast<size_t>(k)] = last->loss_sum(k * m, m) / m;
  }
  // The last stage's process of each replica has its replica's mean losses; every process needs
  // the steps' (logs, the NaN guard): the mean over the replicas' equal shares.
  if (dist_) {
    losses = dist_->all_reduce_sum(losses);
    for (double& l : losses) l /= replicas;
    // Every process is past the step: what this one sent was received.
    transport_->release_delivered(std::chrono::milliseconds(static_cast<int64_t>(config_.parallel.peer_timeout_s * 1000)));
  }
  return losses;
}

std::pair<double, double> PipelineTrainer::optimizer_step(int64_t step) {
  if (schedule_.sync_mode == SyncMode::kAsp) {
    // asp: the stages already updated after every backward; report their mean update norm.
    const auto& t = config_.training;
    const double lr = learning_rate_at(step, total_steps(), t.learning_rate, t.warmup_steps, t.min_lr_ratio);
    std::lock_guard<std::mutex> lock(async_mu_);
    return {async_updates_ > 0 ? async_norm_sum_ / async_updates_ : 0.0, lr};
  }
  // The global norm spans every stage (each on its own device, later in its own process), so it
  // is summed from per-stage squared norms rather than clip_grad_norm_ over one device's list.
  // Each stage's norms come from one multi-tensor kernel; the squared sums of the stages of one
  // device are added there, so the host reads one number per device (one on a single GPU).
  std::map<std::string, std::vector<at::Tensor>> squared_per_device;
  std::vector<std::vector<at::Tensor>> grads_per_stage;
  for (const auto& s : stages_) {
    if (!s) continue;
    std::vector<at::Tensor> grads, counted;  // counted: without the extra copies of tied parameters
    for (const auto& p : s->parameters()) {
      if (!p.grad().defined()) continue;
      grads.push_back(p.grad());
      if (!tied_->is_duplicate(p)) counted.push_back(p.grad());
    }
    if (grads.empty()) continue;
    if (!counted.empty()) {
      const auto norms = at::_foreach_norm(counted, 2, at::kFloat);
      squared_per_device[s->device().str()].push_back(at::stack(norms).pow(2).sum());
    }
    grads_per_stage.push_back(std::move(grads));
  }
  double squared = 0;
  for (const auto& [device, parts] : squared_per_device) {
    squared += at::stack(parts).to(at::kDouble).sum().item<double>();
  }
  // Over this replica's processes: after the all-reduce every replica holds the same gradients.
  if (replica_group_) squared = replica_group_->all_reduce_sum({squared}).front();
  const double norm = std::sqrt(squared);
  // A NaN/inf norm fails `norm > clip`, so clipping would be skipped and AdamW would write
  // NaN into every weight: stop before the update instead of silently corrupting the model.
  if (!std::isfinite(norm)) {
    throw std::runtime_error(fmt::format("non-finite gradient norm at step {}; lower training.learning_rate or "
                                         "check the data", step));
  }
  const double clip = config_.training.grad_clip;
  if (clip > 0 && norm > clip) {
    const double scale = clip / (norm + 1e-6);
    for (auto& grads : grads_per_stage) at::_foreach_mul_(grads, scale);
  }
  const auto& t = config_.training;
  const double lr = learning_rate_at(step, total_steps(), t.learning_rate, t.warmup_steps, t.min_lr_ratio);
  for (auto& opt : optimizers_->per_stage) {
    if (!opt) continue;
    for (auto& group : opt->param_groups()) static_cast<torch::optim::AdamWOptions&>(group.options()).lr(lr);
    fused_adamw_step(*opt);
  }
  return {norm, lr};
}

}  // namespace gpipe

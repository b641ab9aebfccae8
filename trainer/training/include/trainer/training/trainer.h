// Training: builds a pipeline from a config and the registries (model, stage, dataset), then
// runs optimizer steps: the executor's forward/backward over micro-batches (gradients
// accumulate, the loss is scaled by 1/num_microbatches), global gradient-norm clipping across all
// stages, AdamW per stage (weight decay on matrices only), LR warm-up + cosine decay. Writes
// metrics.jsonl, timeline.json and summary.json to training.output_dir.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include <c10/core/Device.h>
#include <nlohmann/json_fwd.hpp>

#include "trainer/config/config.h"
#include "trainer/model/interfaces.h"
#include "trainer/partition/placement.h"
#include "trainer/schedule/schedule.h"

namespace gpipe {

class Executor;
class StageRuntime;
class ActionRecorder;
class Transport;
class Distributed;
class TiedParameters;
class ProcessGroup;
class GradientReducer;

struct PipelineComponents {
  std::unique_ptr<ModelInterface> model;
  std::unique_ptr<StageInterface> stage;
  std::unique_ptr<DatasetInterface> dataset;  // may be null when model.vocab_size is set (tests)
};

// The runner's config path: validates `config`, creates the model, stage and dataset from the
// registries (model.name, model.name, dataset.name), loads the dataset, resolves
// model.vocab_size from its tokenizer and validates the schedule. Throws ConfigError naming the
// field and what to do (unknown names, impossible shapes, bad data paths, ...).
PipelineComponents create_components(PipelineConfig& config);
// make_schedule + with_communication for the config, validated; throws ConfigError (with the
// step x rank grid when the dry run fails).
Schedule build_schedule(const ParallelConfig& parallel, const TrainingConfig& training);

class PipelineTrainer {
 public:
  // Builds the stages (one thread-free runtime per virtual stage), optimizers, executor and
  // transport. Throws ConfigError for configs that cannot run (e.g. cuda asked and absent).
  // With `dist` (WORLD_SIZE > 1) this process builds only the stages of its pipeline ranks
  // (parallel.placement), and losses, gradient norms and checkpoints are agreed across processes.
  PipelineTrainer(PipelineConfig config, PipelineComponents components, Distributed* dist = nullptr);
  ~PipelineTrainer();

  const PipelineConfig& config() const { return config_; }
  const Schedule& schedule() const { return schedule_; }
  const Executor& executor() const { return *executor_; }
  // Indexed by virtual stage; null for the stages other processes run.
  const std::vector<std::unique_ptr<StageRuntime>>& stages() const { return stages_; }
  const Placement& placement() const { return placement_; }
  // The pipeline ranks this process runs.
  const std::vector<int>& local_ranks() const { return local_ranks_; }
  ModelInterface& model() { return *components_.model; }
  StageInterface& stage_interface() { return *components_.stage; }
  // Distinct parameters of this process's stages (a tied parameter counts once, on the stage of its
  // first member).
  int64_t num_parameters() const;
  // parallel.partition=time: the per-layer forward+backward ms the split was made from
  // (layer_costs() order); empty for the other partitions.
  const std::vector<double>& measured_layer_ms() const { return measured_layer_ms_; }
  // Optimizer steps this run ends at: epochs x batches per epoch, or training.max_steps if sooner.
  // The LR schedule spans total_steps() = max(1, planned_steps()).
  int64_t planned_steps() const;
  int64_t total_steps() const;

  // Splits `batch` into micro-batches (with parallel.data_parallel_size D, this replica's rows
  // [r x B/D, (r + 1) x B/D) into num_microbatches / D of them), clears gradients and runs the
  // executor once (replicas: each stage's gradients then hold the replicas' mean), then sums
  // the gradients of the copies of each tied parameter (ModelInterface::tied_parameters) into
  // every copy. Returns the mean micro-batch loss (= the full-batch loss for equal micro-batches).
  // No optimizer step.
  double forward_backward(const Batch& batch, ActionRecorder* recorder = nullptr);
  // parallel.sync_mode asp: the steps first_step, first_step + 1, ... of `batches` (one each) as
  // one pipeline run that does not drain between them (an asp window); each micro-batch's update
  // takes its own step's learning rate. Returns each step's mean loss. One batch: forward_backward.
  std::vector<double> forward_backward_steps(const std::vector<Batch>& batches, int64_t first_step,
                                             ActionRecorder* recorder = nullptr);
  // Clips the global gradient norm to training.grad_clip (if > 0; a tied parameter counts once),
  // sets the learning rate for `step` and steps every stage's AdamW. Returns {grad norm before
  // clipping, learning rate}.
  // parallel.sync_mode asp: the stages updated after every backward inside forward_backward (each
  // clipped by its own norm, at the learning rate of the step last given to train(), or step 0);
  // this only returns {mean update norm, learning rate}.
  std::pair<double, double> optimizer_step(int64_t step);
  // The whole run (epochs / max_steps / profile_iteration / exit_after_profile). Returns the
  // summary also written to summary.json (on rank 0; other processes return theirs unwritten).
  // Every training.checkpoint_interval steps, each process writes its stages' checkpoint files
  // and rank 0 the manifest, last.
  nlohmann::json train();
  // Before train(): continue from a checkpoint folder, or from the newest complete one under
  // training.checkpoint_dir when `folder` is empty. Throws CheckpointError (missing, truncated,
  // or written by another configuration).
  void resume_from(const std::string& folder);
  // Where checkpoints go: training.checkpoint_dir, or <output_dir>/checkpoints.
  std::string checkpoint_root() const;
  // The hash a checkpoint must carry: of checkpoint_config_yaml(), the config without fields that
  // do not change the training trajectory (output and checkpoint folders, logging and profiling).
  std::string checkpoint_config_hash() const;
  std::string checkpoint_config_yaml() const;

 private:
  // Writes every local stage's checkpoint for `next` (steps done, next batch); rank 0 writes the
  // manifest once all stage files exist, then prunes old checkpoints.
  void save_checkpoint(int64_t step, int epoch, int64_t batch_index);
  // Before the first step of a run that checkpoints: the folder can be made and written, and every
  // process sees the same one (rank 0's probe file); else ConfigError naming
  // training.checkpoint_dir, instead of a failure checkpoint_interval steps into the run.
  void check_checkpoint_folder();
  // Whether resume_ is one of this run's checkpoints (the newest under checkpoint_root(), or a
  // folder there), not another run's given with --resume-from.
  bool resumes_own_checkpoint() const;
  // Refuses (a fresh run) or names (a resume from an older step) this configuration's checkpoints
  // in `root` that the run would not continue from.
  void check_own_checkpoints(const std::string& root);
  // Loads the local stages from resume_ (or the newest checkpoint); returns {step, epoch, batch}.
  std::tuple<int64_t, int, int64_t> load_checkpoint();

  PipelineConfig config_;
  PipelineComponents components_;
  Schedule schedule_;
  std::vector<c10::Device> rank_devices_;
  std::vector<std::unique_ptr<StageRuntime>> stages_;
  struct Optimizers;
  std::unique_ptr<Optimizers> optimizers_;
  std::unique_ptr<TiedParameters> tied_;  // copies of tied parameters across stages
  // With `dist`: this pipeline replica's processes (the tied-parameter sums, the gradient norm).
  std::unique_ptr<ProcessGroup> replica_group_;
  // parallel.data_parallel_size > 1: per virtual stage here, the all-reduce over its replicas.
  std::vector<std::unique_ptr<GradientReducer>> reducers_;
  // asp: one stage's update after a backward (called on the stage's rank thread).
  void update_stage_async(int stage, double lr);
  int64_t async_step_ = 0;
  // The schedule of an asp window of `steps` steps (made once per length; under async_mu_).
  const Schedule& window_schedule(int steps);
  std::map<int, Schedule> window_schedules_;
  std::mutex async_mu_;  // guards the two below (stages update from their rank threads)
  double async_norm_sum_ = 0;
  int async_updates_ = 0;
  std::unique_ptr<Executor> executor_;
  std::unique_ptr<Transport> transport_;
  Distributed* dist_ = nullptr;
  Placement placement_;
  std::vector<int> local_ranks_;
  std::optional<std::string> resume_;  // set by resume_from(); "" = the newest
  // <checkpoint_dir>/.gpipe_lock, held (flock) by the process that writes the manifests for the
  // whole run: a second run into the same folder is refused instead of racing its files. -1: none.
  int checkpoint_lock_fd_ = -1;
  bool bf16_ = false;
  std::string attention_backend_;  // the SDPA kernel the model's attention runs ("" for none)
  std::vector<double> measured_layer_ms_;
};

}  // namespace gpipe

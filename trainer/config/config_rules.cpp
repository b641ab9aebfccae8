// The cross-field rules of PipelineConfig: configs whose fields are each valid but impossible as a
// whole (more stages than layers, micro-batches that do not divide the batch, a schedule and a
// stage count that do not fit, a partition that does not add up, a device and a transport that do
// not go together). Each error names the fields, their values and what to change.
#include "config_rules.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <numeric>
#include <string>

namespace gpipe::detail {

void check_cross_fields(const PipelineConfig& c) {
  const ParallelConfig& par = c.parallel;
  if (par.device == "cpu" && (c.model.attention == "cudnn" || c.model.attention == "efficient"))
    throw ConfigError("model.attention=" + c.model.attention + " is a CUDA kernel and parallel.device is cpu: use auto, "
                      "flash or math");
  const int64_t stages = static_cast<int64_t>(par.model_parallel_size) * par.virtual_stages;
  const std::string stages_text = std::to_string(stages) + " stages (parallel.model_parallel_size " +
                                  std::to_string(par.model_parallel_size) + " x parallel.virtual_stages " +
                                  std::to_string(par.virtual_stages) + ")";
  if (c.model.hidden_size % c.model.num_heads != 0)
    throw ConfigError("model.hidden_size " + std::to_string(c.model.hidden_size) + " is not divisible by model.num_heads " +
                      std::to_string(c.model.num_heads) + "; pick a head count that divides it");
  if (stages > c.model.num_layers)
    throw ConfigError(stages_text + " but model.num_layers is " + std::to_string(c.model.num_layers) +
                      ": every stage needs at least one transformer block; use fewer stages or more layers");
  if (c.training.num_microbatches > c.dataset.batch_size)
    throw ConfigError("training.num_microbatches " + std::to_string(c.training.num_microbatches) +
                      " is larger than dataset.batch_size " + std::to_string(c.dataset.batch_size) +
                      "; a micro-batch needs at least one sample");
  if (c.dataset.batch_size % c.training.num_microbatches != 0)
    throw ConfigError("training.num_microbatches " + std::to_string(c.training.num_microbatches) +
                      " does not divide dataset.batch_size " + std::to_string(c.dataset.batch_size) +
                      "; micro-batches must be equal (pick a divisor of the batch size)");
  if (c.training.num_microbatches % par.data_parallel_size != 0)
    throw ConfigError("training.num_microbatches " + std::to_string(c.training.num_microbatches) +
                      " does not split over parallel.data_parallel_size " + std::to_string(par.data_parallel_size) +
                      " replicas; each replica runs an equal share: use a multiple of data_parallel_size");
  if (par.data_parallel_size > 1 && par.sync_mode == "asp")
    throw ConfigError("parallel.sync_mode is asp with parallel.data_parallel_size " +
                      std::to_string(par.data_parallel_size) + ": asp updates each stage after every backward, "
                      "which replicas averaging once per step cannot follow; use sync_mode: bsp or data_parallel_size: 1");
  if (par.asp_window_steps != 1 && par.sync_mode != "asp")
    throw ConfigError("parallel.asp_window_steps is " + std::to_string(par.asp_window_steps) + " but parallel.sync_mode is " +
                      par.sync_mode + ": only asp runs steps without draining between them (bsp's update needs every "
                      "micro-batch's gradient first); set sync_mode: asp or asp_window_steps: 1");
  if (!par.schedule_file.empty() && par.sync_mode == "asp" && par.asp_window_steps != 1)
    throw ConfigError("parallel.asp_window_steps is " + std::to_string(par.asp_window_steps) + " with parallel.schedule_file: "
                      "a window of several steps runs one schedule of steps x num_microbatches micro-batches, which "
                      "only a generated schedule (parallel.schedule) can give; use asp_window_steps: 1 with the file");
  bool recomputes = false;
  for (double r : par.recompute_ratio) recomputes |= r > 0;
  if (recomputes && c.model.dropout > 0)
    throw ConfigError("parallel.recompute_ratio recomputes blocks and model.dropout is " + YAML::Node(c.model.dropout).as<std::string>() +
                      ": the recomputation would draw new dropout masks (the random state is not replayed), so the "
                      "gradients would not be those of the loss; use model.dropout: 0 with recomputation, or "
                      "recompute_ratio: 0");
  // The schedule's micro-batches: one replica's share.
  const int replica_microbatches = c.training.num_microbatches / par.data_parallel_size;
  const std::string microbatches_field = par.data_parallel_size == 1
                                             ? "training.num_microbatches"
                                             : "training.num_microbatches / parallel.data_parallel_size";
  if (!par.schedule_file.empty()) {
    // The file says the order and placement; its shape is checked against the config when it is
    // read (schedule_from_file), not against the generators' rules below.
  } else if (par.schedule == "interleaved_1f1b" || par.schedule == "interleaved_zb" || par.schedule == "looped_bfs") {
    // Round-robin multi-stage schedules, any parallel.virtual_stages as torch's classes take it
    // (trainer/schedule/schedule.h has the full rules).
    // torch's rule for the interleaved ones: the micro-batches go in max(1, m / p) equal rounds.
    const int m = replica_microbatches;
    const int rounds = std::max(1, m / par.model_parallel_size);
    if (par.schedule != "looped_bfs" && par.sync_mode == "asp" && par.asp_window_steps != 1 &&
        m % par.model_parallel_size != 0)
      // A window of k steps runs k x m micro-batches, and windows close early (checkpoints, epoch
      // ends, the profiled step), so every k x m must split into whole rounds: only a multiple of
      // the ranks guarantees it.
      throw ConfigError("parallel.schedule " + par.schedule + " with sync_mode asp and asp_window_steps " +
                        std::to_string(par.asp_window_steps) + " needs " + microbatches_field + " (" +
                        std::to_string(m) + ") to be a multiple of parallel.model_parallel_size (" +
                        std::to_string(par.model_parallel_size) + "): a window's steps x micro-batches must split "
                        "into equal rounds whatever its length; or use asp_window_steps: 1");
    if (par.schedule != "looped_bfs" && m % rounds != 0)
      throw ConfigError("parallel.schedule " + par.schedule + " needs " + microbatches_field + " (" + std::to_string(m) +
                        ") to split into max(1, num_microbatches / model_parallel_size) = " + std::to_string(rounds) +
                        " equal rounds: use at most " + std::to_string(2 * par.model_parallel_size - 1) +
                        " micro-batches or a multiple of parallel.model_parallel_size (" +
                        std::to_string(par.model_parallel_size) + ")");
  } else if (par.schedule == "zbv" || par.schedule == "dualpipev") {
    if (par.virtual_stages != 2)
      throw ConfigError("parallel.schedule " + par.schedule + " needs parallel.virtual_stages: 2 (got " +
                        std::to_string(par.virtual_stages) + "): its V placement puts stages r and " +
                        "2 x model_parallel_size - 1 - r on rank r");
    if (par.schedule == "dualpipev" && replica_microbatches < 2 * par.model_parallel_size)
      throw ConfigError("parallel.schedule dualpipev needs " + microbatches_field + " (" +
                        std::to_string(replica_microbatches) + ") >= the stage count 2 x " +
                        "parallel.model_parallel_size (" + std::to_string(2 * par.model_parallel_size) + ")");
  } else if (par.virtual_stages != 1) {
    throw ConfigError("parallel.virtual_stages is " + std::to_string(par.virtual_stages) + " but parallel.schedule " +
                      par.schedule + " runs one stage per rank; set virtual_stages: 1 or schedule: interleaved_1f1b, "
                      "interleaved_zb, looped_bfs (>= 2 stages per rank), zbv or dualpipev (2 stages per rank)");
  }
  if (!par.partition_file.empty())
    throw ConfigError("parallel.partition_file '" + par.partition_file +
                      "' was not read: call load_partition_file() before validate()");
  if (par.partition == "explicit") {
    if (par.partition_layers.empty())
      throw ConfigError("parallel.partition is explicit but parallel.partition_layers is empty; give one layer count per stage, e.g. [12, 13, 13, 11]");
    if (static_cast<int64_t>(par.partition_layers.size()) != stages)
      throw ConfigError("parallel.partition_layers has " + std::to_string(par.partition_layers.size()) + " entries but there are " +
                        stages_text + "; give one layer count per stage, or parallel.partition: uniform");
    const int64_t sum = std::accumulate(par.partition_layers.begin(), par.partition_layers.end(), int64_t{0});
    if (sum != c.model.num_layers)
      throw ConfigError("parallel.partition_layers sums to " + std::to_string(sum) + " but model.num_layers is " +
                        std::to_string(c.model.num_layers) + "; the counts must add up to the number of transformer blocks");
  } else if (!par.partition_layers.empty()) {
    throw ConfigError("parallel.partition_layers is set but parallel.partition is " + par.partition +
                      "; set partition: explicit to use it, or remove partition_layers");
  }
  // One ratio for all, one per rank, or one per (virtual) stage: what the model's partition reads.
  const auto ratios = static_cast<int64_t>(par.recompute_ratio.size());
  if (ratios > 1 && ratios != par.model_parallel_size && ratios != stages)
    throw ConfigError("parallel.recompute_ratio has " + std::to_string(ratios) + " entries but there are " + stages_text +
                      "; give 1 ratio, one per rank, one per stage, or leave it empty");
  if (!par.placement.empty() && static_cast<int64_t>(par.placement.size()) != par.model_parallel_size)
    throw ConfigError("parallel.placement has " + std::to_string(par.placement.size()) + " entries but parallel.model_parallel_size is " +
                      std::to_string(par.model_parallel_size) + "; give the process of each pipeline rank, e.g. [0, 0, 1, 1]");
  if (par.transport == "nccl" && par.device == "cpu")
    throw ConfigError("parallel.transport is nccl but parallel.device is cpu; NCCL moves CUDA tensors (use transport gloo or auto on CPU)");
  if (par.transport == "gloo" && par.device == "cuda")
    throw ConfigError("parallel.transport is gloo but parallel.device is cuda; use transport nccl (or auto) for GPU stages");
  if (c.dataset.tokenizer == "sentencepiece" && c.dataset.tokenizer_model.empty())
    throw ConfigError("dataset.tokenizer is sentencepiece but dataset.tokenizer_model is empty; give the .model file");
  if (c.dataset.tokenizer != "sentencepiece" && !c.dataset.tokenizer_model.empty())
    throw ConfigError("dataset.tokenizer_model is '" + c.dataset.tokenizer_model + "' but dataset.tokenizer is " +
                      c.dataset.tokenizer + ", which takes no model: set dataset.tokenizer: sentencepiece, or drop "
                      "the model");
  if (par.publish_bubbles_rank >= par.model_parallel_size) {
    throw ConfigError("parallel.publish_bubbles_rank=" + std::to_string(par.publish_bubbles_rank) +
                      " is not a pipeline rank (0.." + std::to_string(par.model_parallel_size - 1) +
                      "; -1: every rank of this process)");
  }
  if (par.use_orion_scheduler && par.device == "cpu")
    throw ConfigError("parallel.use_orion_scheduler is true but parallel.device is cpu; the Orion scheduler schedules CUDA kernels (use device: cuda or auto)");
}

}  // namespace gpipe::detail

// The run configuration: the seed's YAML schema (model / dataset / training / parallel) with its
// field names, plus the fields this trainer adds. Every field is validated with an error naming
// it and what is allowed (ConfigError).
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace gpipe {

struct ConfigError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// model.name: synthetic (models/synthetic/): layers that take a set time and hold a set activation
// size instead of computing, to study schedules, the simulator and the planner on any machine.
// Read from the `synthetic:` section; other models ignore it.
struct SyntheticLayerConfig {
  double forward_ms = 1.0;      // each layer's forward
  double input_grad_ms = 1.0;   // its input gradient (backward's I part)
  double weight_grad_ms = 1.0;  // its weight gradient (backward's W part)
  double activation_bytes_per_token = 1024;  // held by each layer from its forward to its backward
  bool operator==(const SyntheticLayerConfig&) const = default;
};

struct ModelConfig {
  std::string name = "gpt";
  int64_t hidden_size = 512;
  int64_t num_layers = 16;
  int64_t num_heads = 16;
  int64_t sequence_length = 128;
  int64_t vocab_size = -1;       // -1: take it from the dataset's tokenizer
  int64_t ffn_hidden_size = -1;  // -1: 4 x hidden_size
  double dropout = 0.0;
  // Where a transformer block's LayerNorms sit: "pre" (before attention and MLP, inside the
  // residual branch: GPT-2), "post" (after each residual add: the original BERT), or "default"
  // (the model's own: GPT pre, BERT post). A model refuses a placement it does not implement.
  std::string norm_position = "default";
  // Which of ATen's kernels scaled_dot_product_attention may use: "auto" (PyTorch's own order:
  // on an H100 with cuDNN >= 9.15 that is cuDNN's, whose compiled graphs ATen caches per CPU
  // thread), or one of "flash", "efficient", "cudnn", "math" alone (a model it cannot run is
  // refused at start-up, naming this field). Process-wide: ATen keeps it in its global context.
  std::string attention = "auto";
  SyntheticLayerConfig synthetic;  // model.name: synthetic only
  bool operator==(const ModelConfig&) const = default;
};

struct DatasetConfig {
  std::string name = "code_search_net";  // registry key
  int64_t batch_size = 4;                // global batch (split into micro-batches)
  int num_workers = 0;
  std::string path;                      // file or folder; empty: the embedded corpus
  std::string tokenizer = "byte";        // "byte" or "sentencepiece"
  std::string tokenizer_model;           // .model file for sentencepiece
  bool operator==(const DatasetConfig&) const = default;
};

struct TrainingConfig {
  double learning_rate = 1e-4;
  int epochs = 2;
  int num_microbatches = 4;
  int profile_iteration = 100;   // iteration whose timeline is written
  bool exit_after_profile = true;
  int64_t max_steps = -1;        // -1: run the epochs
  double weight_decay = 0.01;
  double grad_clip = 1.0;        // <= 0: off
  int64_t warmup_steps = 0;
  double min_lr_ratio = 0.1;     // cosine decay floor, as a fraction of learning_rate
  uint64_t seed = 1234;
  std::string dtype = "auto";    // auto (bf16 autocast on GPU, fp32 on CPU) | fp32 | bf16
  int log_interval = 1;
  std::string output_dir = "runs/latest";  // metrics.jsonl, timeline.json, summary
  int64_t checkpoint_interval = 0;  // write a checkpoint every N optimizer steps (0: never)
  std::string checkpoint_dir;       // empty: <output_dir>/checkpoints
  int keep_checkpoints = 2;         // newest complete checkpoints kept (0: all)
  bool operator==(const TrainingConfig&) const = default;
};

struct ParallelConfig {
  int model_parallel_size = 4;              // pipeline ranks
  std::string scheduler = "async_threaded"; // executor: naive | async_threaded
  bool use_orion_scheduler = false;
  // orion-gpud (issue 25): publish each step's idle windows, predicted from the last step, to the
  // daemon of this GPU UUID (runtime folder $ORION_GPUD_DIR...), so best-effort processes on the
  // GPU fill them. Empty: off.
  std::string publish_bubbles_gpu;
  // Whose idle time is the GPU's: -1, every rank of this process (they share one GPU); r, pipeline
  // rank r alone (it has the GPU to itself, as with one GPU per stage).
  int publish_bubbles_rank = -1;
  // gpipe | 1f1b | zb_h1 (1 stage per rank) | interleaved_1f1b | interleaved_zb | looped_bfs
  // (any stages per rank) | zbv | dualpipev (2 stages per rank, V placement)
  std::string schedule = "1f1b";
  // A schedule in torch.distributed.pipelining's CSV format (trainer/schedule/schedule_csv.h) to
  // run instead of generating `schedule`; its ranks, stages per rank and micro-batches must match
  // model_parallel_size, virtual_stages and training.num_microbatches. Empty: generate.
  std::string schedule_file;
  int virtual_stages = 1;                   // model chunks per rank (the multi-stage schedules)
  // Forward / backward pairs of a rank run at the same time (torch's OVERLAP_F_B; schedule.h
  // OverlapMode): auto (the schedule's own pairs: dualpipev's, a file's) | true (also pair each
  // forward with the rank's next backward of another micro-batch) | false (none).
  std::string overlap_f_b = "auto";
  // When a stage's weights change (schedule.h SyncMode): bsp (every micro-batch's gradients, then
  // one update per step) | asp (VPipe / PipeDream 1F1B-async: each stage updates after every
  // backward; needs a schedule of whole backwards, 1f1b or gpipe, and no overlapped pairs).
  std::string sync_mode = "bsp";
  // asp: each backward runs on the weights its forward used (PipeDream's weight stashing); false:
  // on the newest weights.
  bool weight_stashing = true;
  // asp: how many steps one pipeline runs without draining. The next step's first forwards then
  // run during this step's last backwards, as PipeDream's pipeline never flushes; metrics are
  // still one line per step (the window's time split evenly). 0: drain only where the run must
  // (a checkpoint, the profiled step, an epoch's end, the last step); 1: every step (bsp's rhythm).
  int asp_window_steps = 1;
  std::string priority = "backward_first";  // backward_first | forward_first | none
  // async_threaded on CUDA: per_microbatch (each micro-batch's F and B/I on streams of their own,
  // all W on one) or per_rank (every action of a rank on one stream of its own, as
  // torch.distributed.pipelining and Megatron-LM run a stage: one caching-allocator pool per rank)
  std::string streams = "per_microbatch";
  std::string partition = "uniform";        // uniform | explicit | parameters | time
  std::vector<int64_t> partition_layers;    // explicit per-stage layer counts, e.g. [12, 13, 13, 11]
  // VPipe's partition file, JSON {"partition": [12, 13, 13, 11], "recompute_ratio": [0.3, 0, 0, 0]}
  // (recompute_ratio optional): load_partition_file() folds it into partition: explicit,
  // partition_layers and recompute_ratio, and clears this field. YAML may also write the list
  // directly, "partition: [12, 13, 13, 11]" (the seed's form).
  std::string partition_file;
  std::vector<double> recompute_ratio;      // 1 for all, 1 per rank or 1 per stage, in [0, 1]; empty: none
  std::string device = "auto";              // auto | cpu | cuda
  // How stages of different processes exchange activations and gradients: auto (in-process for
  // one process, else gloo on CPU and nccl on CUDA) | inprocess | gloo | nccl.
  std::string transport = "auto";
  // Process of each pipeline rank when several processes run (WORLD_SIZE > 1); empty: contiguous
  // blocks of model_parallel_size / WORLD_SIZE ranks per process. E.g. [0, 0, 1, 1].
  std::vector<int64_t> placement;
  // Replicated stages (VPipe's stage_to_rank_map, Megatron's data parallelism): this many copies
  // of the whole pipeline, each in its own WORLD_SIZE / data_parallel_size processes (replica r
  // holds processes r x that .. (r + 1) x that - 1; parallel.placement applies inside each). Each
  // replica takes training.num_microbatches / data_parallel_size of the step's micro-batches; the
  // replicas of a stage average their gradients (one c10d group per stage: Gloo on CPU, NCCL on
  // CUDA) in buckets, each started as soon as the stage's last backward has produced it (DDP).
  int data_parallel_size = 1;
  // Bucket size of that all-reduce in MiB (DDP's bucket_cap_mb).
  double dp_bucket_mb = 25;
  // How long a rank waits for a peer (rendezvous, a receive, a silent heartbeat) before it gives
  // up with an error naming that peer.
  double peer_timeout_s = 120;
  bool operator==(const ParallelConfig&) const = default;
};

struct PipelineConfig {
  ModelConfig model;
  DatasetConfig dataset;
  TrainingConfig training;
  ParallelConfig parallel;

  // Reads YAML; unknown keys, wrong types and bad values throw ConfigError naming the key path
  // (e.g. "training.num_microbatches"), the file and the line. Cross-field rules are checked by
  // validate() (call it after the overrides).
  static PipelineConfig from_yaml_file(const std::string& path);
  static PipelineConfig from_yaml_string(const std::string& text, const std::string& origin = "<string>");
  // Applies "section.field=value" overrides (the CLI's --set and per-field flags). Lists are
  // written as YAML, "parallel.partition_layers=[12,13,13,11]"; strings are taken verbatim.
  void apply_override(const std::string& assignment);
  // parallel.partition_file, when set: reads it and folds it in (see ParallelConfig). Throws
  // ConfigError naming the file for a missing or malformed file, or a partition also given inline.
  // Call it after the overrides, before validate() (the CLI and create_components() do).
  void load_partition_file();
  // Cross-field checks (stages vs layers, micro-batches dividing the batch, ...). Throws ConfigError.
  // vocab_size may still be -1 here; the runner resolves it from the tokenizer.
  void validate() const;
  std::string to_yaml() const;
  bool operator==(const PipelineConfig&) const = default;
};

// What every process of a multi-process run must agree on: the YAML, plus the contents of the
// files it names that shape training and that each process reads itself (parallel.schedule_file,
// dataset.tokenizer_model): on a cluster without a shared filesystem two nodes can hold different
// files under one path. A file that cannot be read adds its path only (the run's own check names it).
std::string run_fingerprint_text(const PipelineConfig& config);

// One replica's pipeline: with parallel.data_parallel_size D replicas each runs
// training.num_microbatches / D of a step's micro-batches (validate() checked that they divide).
// The run, --print-schedule and --validate-only all schedule this config.
TrainingConfig replica_training(const ParallelConfig& parallel, const TrainingConfig& training);
PipelineConfig replica_config(const PipelineConfig& config);

// The fields whose values differ between `a` and `b`, each as "section.key: <a's> vs <b's>"
// (values as to_yaml() writes them), in to_yaml()'s order.
std::vector<std::string> config_differences(const PipelineConfig& a, const PipelineConfig& b);

}  // namespace gpipe

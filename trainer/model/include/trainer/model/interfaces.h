// The seed's three extension points (core/interfaces.py), in C++: a model says how it is built
// and partitioned, a stage says how its piece runs (input, loss, sub-model), a dataset says how
// text becomes batches. Models find the trainer only through these and the registries
// (registry.h); the trainer never includes a model's headers.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "trainer/config/config.h"

namespace gpipe {

// One batch or micro-batch of token ids: input_ids[b, t] predicts targets[b, t] (the next token
// for GPT; for a masked language model the original token at a masked position and -100, which
// the loss ignores, elsewhere).
struct Batch {
  at::Tensor input_ids;  // int64 [B, T]
  at::Tensor targets;    // int64 [B, T]
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual int64_t vocab_size() const = 0;
  virtual std::vector<int64_t> encode(const std::string& text) const = 0;
  virtual std::string decode(const std::vector<int64_t>& ids) const = 0;
};

class DatasetInterface {
 public:
  virtual ~DatasetInterface() = default;
  // Reads the data named by the config (dataset.path; empty: the embedded corpus). Throws
  // std::runtime_error naming the file and the problem.
  virtual void load_dataset(const DatasetConfig& dataset, const ModelConfig& model) = 0;
  virtual const Tokenizer& get_tokenizer() const = 0;
  // Global batches per epoch.
  virtual int64_t num_batches() const = 0;
  // Global batch `index` of `epoch` ([batch_size, sequence_length]); deterministic for a seed.
  virtual Batch process_batch(int64_t epoch, int64_t index) = 0;
  // Seed of the per-epoch shuffle (the runner passes training.seed; call any time before
  // process_batch). Default: a dataset without randomness ignores it.
  virtual void set_seed(uint64_t /*seed*/) {}
  // A short text that differs when two processes loaded different data (each process reads
  // dataset.path itself, and stage 0's process gives the inputs while the last stage's gives the
  // targets): the trainer compares every rank's with rank 0's. Default: the batch count.
  virtual std::string content_digest() const { return "batches " + std::to_string(num_batches()); }
};

// What one layer of the model costs, for partition balancing. Layer 0 is the embedding, the last
// layer is the final norm + LM head, transformer blocks are in between.
struct LayerCost {
  std::string name;
  int64_t parameters = 0;
  double forward_flops_per_token = 0;
};

// Which layers one (virtual) stage holds: [first_layer, last_layer) over ModelInterface::layer_costs().
struct StageSpec {
  int stage = 0;       // virtual stage index
  int num_stages = 1;  // total virtual stages
  int64_t first_layer = 0;
  int64_t last_layer = 0;
  double recompute_ratio = 0.0;  // share of this stage's blocks recomputed in backward (VPipe)
  bool is_first() const { return stage == 0; }
  bool is_last() const { return stage == num_stages - 1; }
};

// A stage's sub-model: a Module with the stage's layers. forward() takes token ids on the first
// stage and hidden states otherwise; the last stage returns logits.
// Activation recomputation (StageSpec::recompute_ratio) is internal to the module: with grad mode
// on, forward() runs the recomputed blocks inside one autograd node that keeps only their input,
// and the ordinary backward (tensor.backward(grad) or torch::autograd::grad, also split into
// input- and weight-gradient calls for ZB-H1) re-runs them with grad. The engine calls nothing
// extra. Such a module must not be run under autocast states that change between forward and
// backward on the calling thread (the node restores the forward's autocast state itself).
class StageModule : public torch::nn::Module {
 public:
  virtual at::Tensor forward(const at::Tensor& input) = 0;
  // The parameter `name` (as create_layer(layer) names it) of model layer `layer` when this
  // module holds that layer, else an undefined tensor. The trainer finds the copies of tied
  // parameters (ModelInterface::tied_parameters) with it; a model with tied parameters must
  // implement it, and return the one shared tensor for every member that this module holds.
  virtual at::Tensor layer_parameter(int64_t /*layer*/, const std::string& /*name*/) const { return {}; }
};

// One parameter that several layers use (weight tying: BERT's MLM decoder is its token
// embedding). A stage module holding several members shares one tensor among them; members on
// different stages are copies, which start equal (the model initialises them alike, and the
// trainer copies the first member's values into the others when it builds the stages) and stay
// equal: after every step's backward the trainer sums the copies' gradients into each (in
// process directly, across processes by an all-reduce), so every copy takes the same optimizer
// step (Megatron's embedding all-reduce between its first and last stage). Gradient clipping
// counts the parameter once.
struct TiedParameter {
  std::string name;  // for messages, e.g. "word_embeddings"
  struct Member {
    int64_t layer = 0;  // index into layer_costs()
    std::string name;   // as in create_layer(layer)->named_parameters(), e.g. "decoder.weight"
  };
  std::vector<Member> members;  // the first is the owner: its copy counts in the gradient norm
  std::vector<int64_t> shape;   // every copy's shape
};

// What training the whole model needs in memory, from its config alone (nothing built):
// create_components() refuses a model whose parameters, gradients and AdamW state (16 bytes per
// parameter in fp32) plus one micro-batch's activations cannot fit the devices' memory.
struct MemoryEstimate {
  double parameters = 0;
  double activation_bytes_per_token = 0;  // held from forward to backward, all layers, fp32
};

// The attention a model's layers run through at::scaled_dot_product_attention, per micro-batch
// sample: query, key and value are [num_heads, sequence_length, head_dim]. The trainer asks ATen
// which kernel model.attention gives this shape before the first step (trainer/model/attention_backend.h).
struct AttentionShape {
  int64_t num_heads = 1;
  int64_t sequence_length = 1;
  int64_t head_dim = 1;
  bool causal = false;
  double dropout = 0.0;
};

class ModelInterface {
 public:
  virtual ~ModelInterface() = default;
  virtual void configure(const ModelConfig& config) = 0;  // vocab_size already resolved
  virtual const ModelConfig& get_model_config() const = 0;
  // All layers, embedding first and LM head last.
  virtual std::vector<LayerCost> layer_costs() const = 0;
  // Transformer blocks per stage for `num_stages` virtual stages, following parallel.partition
  // (uniform | explicit | parameters | time); `measured_layer_ms` is used by "time".
  virtual std::vector<StageSpec> get_stage_partition(const ParallelConfig& parallel, int num_stages,
                                                     const std::vector<double>& measured_layer_ms = {}) const = 0;
  // Builds layer `index` of layer_costs(). Initialisation depends only on (seed, index), so a
  // pipelined model and the unpipelined one start from identical weights whatever the partition.
  virtual std::shared_ptr<torch::nn::Module> create_layer(int64_t index, uint64_t seed) const = 0;
  // FLOPs per token of one training step (forward + backward), for MFU.
  virtual double training_flops_per_token() const = 0;
  // The shape its layers give scaled_dot_product_attention, or nullopt for a model that does not
  // call it (the default; model.attention then changes nothing).
  virtual std::optional<AttentionShape> attention_shape() const { return std::nullopt; }
  // Parameters shared by several layers (see TiedParameter); none by default.
  virtual std::vector<TiedParameter> tied_parameters() const { return {}; }
  // Called after configure(), before anything is built. The default sums layer_costs()'s
  // parameters and counts no activations; a model whose layer count can be huge (one entry per
  // layer) should give a closed form.
  virtual MemoryEstimate estimate_memory() const {
    MemoryEstimate m;
    for (const LayerCost& layer : layer_costs()) m.parameters += static_cast<double>(layer.parameters);
    return m;
  }
};

class StageInterface {
 public:
  virtual ~StageInterface() = default;
  // The tensor the first stage feeds to its sub-model for this micro-batch (token ids).
  virtual at::Tensor prepare_input(const Batch& microbatch) const = 0;
  // Mean cross-entropy of the last stage's logits against the micro-batch's targets.
  virtual at::Tensor compute_loss(const at::Tensor& logits, const Batch& microbatch) const = 0;
  // The stage's sub-model, built from model.create_layer() for its layers.
  virtual std::shared_ptr<StageModule> create_sub_model(const ModelInterface& model, const StageSpec& spec,
                                                        uint64_t seed) const = 0;
};

}  // namespace gpipe

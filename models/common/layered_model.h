// What the models share: one tensor in and one out per layer (SequentialLayer), so any contiguous
// run of layers is a pipeline stage; the [embedding, block_1 .. block_L, head] partition into
// stages; the per-layer init seed; and activation recomputation of a stage's last blocks as one
// autograd node. Private to models/ (the trainer sees models only through trainer/model/).
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/module.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "trainer/model/interfaces.h"

namespace gpipe::models {

class SequentialLayer : public torch::nn::Module {
 public:
  virtual at::Tensor forward(const at::Tensor& x) = 0;
  // The layer's index in the model (create_layer sets it): its dropout draws are seeded by it
  // (trainer/model/dropout.h), so they do not depend on which stage holds the layer.
  int64_t layer_index() const { return layer_index_; }
  void set_layer_index(int64_t index) { layer_index_ = index; }

 private:
  int64_t layer_index_ = 0;
};

// The init seed of layer `index`: (seed * 1000003 + index) mod 2^63 (as scripts/peers/gpt.py).
uint64_t layer_seed(uint64_t seed, int64_t index);

// Stages of a model whose layers are [embedding, block_1 .. block_L, head] (`layers` is its
// layer_costs(), L = layers.size() - 2): blocks per stage from trainer/partition.h's
// partition_blocks() over the layers' parameter counts, or measured_layer_ms for "time" (one
// entry per layer); stage 0 also holds the embedding, the last stage the head.
// recompute_ratio: parallel.recompute_ratio indexed by virtual stage when it has one entry per
// virtual stage, else by rank (virtual stage % model_parallel_size), a single value applies to
// all, empty means none. Throws ConfigError / std::invalid_argument naming the field.
std::vector<StageSpec> layered_stage_partition(const std::vector<LayerCost>& layers, const ParallelConfig& parallel,
                                               int num_stages, const std::vector<double>& measured_layer_ms);

// Blocks recomputed on a stage holding `blocks` transformer blocks: ceil(ratio * blocks).
// Throws std::invalid_argument when ratio is outside [0, 1].
int64_t recomputed_block_count(double ratio, int64_t blocks);

// Runs `layers` on `input` as one recomputed autograd node: forward runs them without grad and
// keeps only their input, backward re-runs them with grad (also under ZB-H1's split
// autograd::grad() calls). With grad mode off it simply runs them.
at::Tensor run_recomputed(const std::vector<std::shared_ptr<SequentialLayer>>& layers, const at::Tensor& input);

// The checks every transformer model of models/ shares: positive sizes, a resolved vocabulary,
// heads dividing the hidden size, an FFN size or -1, dropout in [0, 1). Throws ConfigError naming
// the field.
void check_transformer_config(const ModelConfig& config);

}  // namespace gpipe::models

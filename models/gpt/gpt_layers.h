// The GPT's layers as torch::nn modules, one tensor in and one out, so any contiguous run of
// them is a pipeline stage. Layer 0 is GptEmbedding, layers 1..L are GptBlock, layer L+1 is
// GptHead (the same architecture, parameter names and init draw order as scripts/peers/gpt.py).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <cstdint>
#include <memory>

#include "common/layered_model.h"
#include "trainer/config/config.h"

namespace gpipe::gpt {

inline constexpr double kLayerNormEps = 1e-5;
inline constexpr double kInitStd = 0.02;

// One tensor in, one out (models/common/layered_model.h).
class GptLayer : public models::SequentialLayer {};

// wte(ids) + wpe(arange(T)); ids int64 [B, T] with T <= sequence_length.
class GptEmbedding final : public GptLayer {
 public:
  explicit GptEmbedding(const ModelConfig& config);
  at::Tensor forward(const at::Tensor& ids) override;
  torch::nn::Embedding wte{nullptr}, wpe{nullptr};

 private:
  int64_t sequence_length_;
  double dropout_;
};

class GptAttention final : public torch::nn::Module {
 public:
  explicit GptAttention(const ModelConfig& config);
  at::Tensor forward(const at::Tensor& x, int64_t layer);  // `layer`: the block's model layer index
  torch::nn::Linear c_attn{nullptr}, c_proj{nullptr};

 private:
  int64_t num_heads_;
  double dropout_;
};

class GptMlp final : public torch::nn::Module {
 public:
  explicit GptMlp(const ModelConfig& config);
  at::Tensor forward(const at::Tensor& x);
  torch::nn::Linear c_fc{nullptr}, c_proj{nullptr};
};

// x + attn(ln_1(x)), then x + mlp(ln_2(x)).
class GptBlock final : public GptLayer {
 public:
  explicit GptBlock(const ModelConfig& config);
  at::Tensor forward(const at::Tensor& x) override;
  torch::nn::LayerNorm ln_1{nullptr}, ln_2{nullptr};
  std::shared_ptr<GptAttention> attn;
  std::shared_ptr<GptMlp> mlp;

 private:
  double dropout_;
};

// lm_head(ln_f(x)): logits [B, T, vocab_size].
class GptHead final : public GptLayer {
 public:
  explicit GptHead(const ModelConfig& config);
  at::Tensor forward(const at::Tensor& x) override;
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear lm_head{nullptr};
};

// The init seed of layer `index`: (seed * 1000003 + index) mod 2^63 (as scripts/peers/gpt.py).
using models::layer_seed;

// GPT-2 init of one layer from its own CPU generator: Linear/Embedding weights ~ N(0, 0.02) drawn
// in construction order, residual projections (*.c_proj) ~ N(0, 0.02 / sqrt(2 L)), biases 0,
// LayerNorm weight 1 and bias 0.
void init_layer(GptLayer& layer, int64_t num_layers, uint64_t generator_seed);

}  // namespace gpipe::gpt

// The transformer pieces GPT and BERT share: sizes from the config, dropout, the split_linear
// path every linear layer takes, multi-head self-attention (causal or not), and the check of a
// stage's layer range.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/nn/modules/linear.h>

#include <cstdint>

#include "trainer/config/config.h"
#include "trainer/model/interfaces.h"

namespace gpipe::models {

// model.ffn_hidden_size, or 4 x hidden_size when it is -1.
int64_t ffn_size(const ModelConfig& config);
// Parameters of one block: two LayerNorms, the qkv and output projections, the two MLP layers.
int64_t transformer_block_parameters(const ModelConfig& config);
// Dropout with probability p while training: draw `site` of model layer `layer`, seeded from its
// place in the run (trainer/model/dropout.h). Sites: 0 is the layer's attention (or embedding)
// dropout, 1 and 2 the residual branches'.
at::Tensor maybe_dropout(const at::Tensor& x, double p, bool training, int64_t layer, int site);
// Every linear layer goes through split_linear: the same math as Linear::forward, and zero-bubble
// schedules can defer its weight GEMMs from I to W (trainer/model/weight_grad_store.h).
at::Tensor linear(const torch::nn::Linear& layer, const at::Tensor& x);
// softmax(QK^T / sqrt(d)) V over `num_heads` heads of x [B, T, H], with the fused qkv projection
// and the output projection; `causal`: each position attends to itself and earlier ones only.
// Attention dropout is draw 0 of model layer `layer`.
at::Tensor self_attention(const torch::nn::Linear& qkv, const torch::nn::Linear& out, const at::Tensor& x,
                          int64_t num_heads, double dropout, bool training, bool causal, int64_t layer);
// What self_attention gives scaled_dot_product_attention for this config (ModelInterface::attention_shape).
AttentionShape self_attention_shape(const ModelConfig& config, bool causal);
// Throws std::invalid_argument unless [first_layer, last_layer) is a non-empty range of the
// model's `total_layers` layers.
void check_stage_layers(const StageSpec& spec, int64_t total_layers);

}  // namespace gpipe::models

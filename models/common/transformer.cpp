#include "common/transformer.h"

#include <ATen/ATen.h>

#include <stdexcept>
#include <string>

#include "trainer/model/dropout.h"
#include "trainer/model/weight_grad_store.h"

namespace gpipe::models {

int64_t ffn_size(const ModelConfig& config) {
  return config.ffn_hidden_size > 0 ? config.ffn_hidden_size : 4 * config.hidden_size;
}

int64_t transformer_block_parameters(const ModelConfig& config) {
  const int64_t h = config.hidden_size, f = ffn_size(config);
  return 2 * 2 * h + (h * 3 * h + 3 * h) + (h * h + h) + (h * f + f) + (f * h + h);
}

at::Tensor maybe_dropout(const at::Tensor& x, double p, bool training, int64_t layer, int site) {
  if (!(p > 0.0 && training)) return x;
  return with_dropout_seed(x.device(), layer, site, [&] { return at::dropout(x, p, true); });
}

at::Tensor linear(const torch::nn::Linear& layer, const at::Tensor& x) {
  return split_linear(x, layer->weight, layer->bias);
}

at::Tensor self_attention(const torch::nn::Linear& qkv, const torch::nn::Linear& out, const at::Tensor& x,
                          int64_t num_heads, double dropout, bool training, bool causal, int64_t layer) {
  const int64_t batch = x.size(0), time = x.size(1), hidden = x.size(2);
  const auto q_k_v = linear(qkv, x).split(hidden, 2);
  auto heads = [&](const at::Tensor& z) { return z.view({batch, time, num_heads, hidden / num_heads}).transpose(1, 2); };
  auto attend = [&](double p) {
    return at::scaled_dot_product_attention(heads(q_k_v[0]), heads(q_k_v[1]), heads(q_k_v[2]), std::nullopt, p, causal);
  };
  const at::Tensor y = (training && dropout > 0.0)
                           ? with_dropout_seed(x.device(), layer, /*site=*/0, [&] { return attend(dropout); })
                           : attend(0.0);
  return linear(out, y.transpose(1, 2).contiguous().view({batch, time, hidden}));
}

AttentionShape self_attention_shape(const ModelConfig& config, bool causal) {
  AttentionShape shape;
  shape.num_heads = config.num_heads;
  shape.sequence_length = config.sequence_length;
  shape.head_dim = config.hidden_size / config.num_heads;
  shape.causal = causal;
  shape.dropout = config.dropout;
  return shape;
}

void check_stage_layers(const StageSpec& spec, int64_t total_layers) {
  if (spec.first_layer < 0 || spec.last_layer > total_layers || spec.first_layer >= spec.last_layer) {
    throw std::invalid_argument("stage " + std::to_string(spec.stage) + " has layers [" +
                                std::to_string(spec.first_layer) + ", " + std::to_string(spec.last_layer) +
                                "), not a non-empty range of the model's " + std::to_string(total_layers) + " layers");
  }
}

}  // namespace gpipe::models

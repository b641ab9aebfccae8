#include "common/transformer.h"

#include <ATen/ATen.h>

#include <cmath>
#include <limits>
#include <optional>
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

namespace {

// x with each element kept with probability 1 - p and scaled by 1 / (1 - p), the mask drawn from
// `generator` (what at::dropout computes on CPU, from a generator of the draw's own).
at::Tensor dropout_from(const at::Tensor& x, double p, at::Generator generator) {
  return x * at::empty_like(x).bernoulli_(1.0 - p, generator).div_(1.0 - p);
}

}  // namespace

at::Tensor maybe_dropout(const at::Tensor& x, double p, bool training, int64_t layer, int site) {
  if (!(p > 0.0 && training)) return x;
  if (x.device().is_cpu()) {
    if (std::optional<at::Generator> generator = cpu_dropout_generator(layer, site)) return dropout_from(x, p, *generator);
  }
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
  const at::Tensor q = heads(q_k_v[0]), k = heads(q_k_v[1]), v = heads(q_k_v[2]);
  auto attend = [&](double p) { return at::scaled_dot_product_attention(q, k, v, std::nullopt, p, causal); };
  at::Tensor y;
  std::optional<at::Generator> cpu_generator;
  if (!(training && dropout > 0.0)) {
    y = attend(0.0);
  } else if (x.device().is_cpu() && (cpu_generator = cpu_dropout_generator(layer, /*site=*/0))) {
    // softmax(QK^T / sqrt(d)) V written out, its dropout from the draw's own generator (SDPA's
    // CPU kernels draw from the process's default one).
    at::Tensor scores = at::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(q.size(-1)));
    if (causal) {
      const at::Tensor future = at::ones({time, time}, q.options().dtype(at::kBool)).triu(1);
      scores = scores.masked_fill(future, -std::numeric_limits<double>::infinity());
    }
    y = at::matmul(dropout_from(at::softmax(scores, -1), dropout, *cpu_generator), v);
  } else {
    y = with_dropout_seed(x.device(), layer, /*site=*/0, [&] { return attend(dropout); });
  }
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

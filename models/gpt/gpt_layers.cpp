// GPT layers: forward passes and the partition-independent GPT-2 initialisation.
#include "gpt_layers.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <stdexcept>
#include <string>

#include "common/transformer.h"
#include "trainer/model/weight_grad_store.h"

namespace gpipe::gpt {
using models::ffn_size;
using models::linear;
using models::maybe_dropout;
using models::self_attention;
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

GptEmbedding::GptEmbedding(const ModelConfig& config)
    : sequence_length_(config.sequence_length), dropout_(config.dropout) {
  wte = register_module("wte", torch::nn::Embedding(config.vocab_size, config.hidden_size));
  wpe = register_module("wpe", torch::nn::Embedding(config.sequence_length, config.hidden_size));
}

at::Tensor GptEmbedding::forward(const at::Tensor& ids) {
  if (ids.dim() != 2) {
    throw std::invalid_argument("GPT embedding expects token ids [batch, time], got " + std::to_string(ids.dim()) +
                                " dimensions");
  }
  const int64_t time = ids.size(1);
  if (time > sequence_length_) {
    throw std::invalid_argument("GPT embedding got " + std::to_string(time) + " tokens per sequence, more than " +
                                "model.sequence_length " + std::to_string(sequence_length_));
  }
  const at::Tensor positions = at::arange(time, ids.options().dtype(at::kLong));
  return maybe_dropout(wte->forward(ids) + wpe->forward(positions), dropout_, is_training(), layer_index(), 0);
}

GptAttention::GptAttention(const ModelConfig& config) : num_heads_(config.num_heads), dropout_(config.dropout) {
  c_attn = register_module("c_attn", torch::nn::Linear(config.hidden_size, 3 * config.hidden_size));
  c_proj = register_module("c_proj", torch::nn::Linear(config.hidden_size, config.hidden_size));
}

at::Tensor GptAttention::forward(const at::Tensor& x, int64_t layer) {
  return self_attention(c_attn, c_proj, x, num_heads_, dropout_, is_training(), /*causal=*/true, layer);
}

GptMlp::GptMlp(const ModelConfig& config) {
  c_fc = register_module("c_fc", torch::nn::Linear(config.hidden_size, ffn_size(config)));
  c_proj = register_module("c_proj", torch::nn::Linear(ffn_size(config), config.hidden_size));
}

at::Tensor GptMlp::forward(const at::Tensor& x) { return linear(c_proj, at::gelu(linear(c_fc, x), "tanh")); }

GptBlock::GptBlock(const ModelConfig& config) : dropout_(config.dropout) {
  const auto norm = torch::nn::LayerNormOptions({config.hidden_size}).eps(kLayerNormEps);
  ln_1 = register_module("ln_1", torch::nn::LayerNorm(norm));
  attn = register_module("attn", std::make_shared<GptAttention>(config));
  ln_2 = register_module("ln_2", torch::nn::LayerNorm(norm));
  mlp = register_module("mlp", std::make_shared<GptMlp>(config));
}

at::Tensor GptBlock::forward(const at::Tensor& input) {
  const int64_t layer = layer_index();
  at::Tensor x = input + maybe_dropout(attn->forward(ln_1->forward(input), layer), dropout_, is_training(), layer, 1);
  return x + maybe_dropout(mlp->forward(ln_2->forward(x)), dropout_, is_training(), layer, 2);
}

GptHead::GptHead(const ModelConfig& config) {
  ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({config.hidden_size}).eps(kLayerNormEps)));
  lm_head = register_module("lm_head", torch::nn::Linear(torch::nn::LinearOptions(config.hidden_size, config.vocab_size).bias(false)));
}

at::Tensor GptHead::forward(const at::Tensor& x) { return linear(lm_head, ln_f->forward(x)); }

void init_layer(GptLayer& layer, int64_t num_layers, uint64_t generator_seed) {
  auto generator = at::make_generator<at::CPUGeneratorImpl>(generator_seed);
  const double residual_std = kInitStd / std::sqrt(2.0 * static_cast<double>(num_layers));
  at::NoGradGuard no_grad;
  // named_modules() is in registration (= construction) order, so the draw sequence is fixed.
  for (const auto& item : layer.named_modules()) {
    const std::string& name = item.key();
    torch::nn::Module* module = item.value().get();
    if (auto* linear = dynamic_cast<torch::nn::LinearImpl*>(module)) {
      linear->weight.normal_(0.0, ends_with(name, "c_proj") ? residual_std : kInitStd, generator);
      if (linear->bias.defined()) linear->bias.zero_();
    } else if (auto* embedding = dynamic_cast<torch::nn::EmbeddingImpl*>(module)) {
      embedding->weight.normal_(0.0, kInitStd, generator);
    } else if (auto* norm = dynamic_cast<torch::nn::LayerNormImpl*>(module)) {
      norm->weight.fill_(1.0);
      norm->bias.zero_();
    }
  }
}

}  // namespace gpipe::gpt

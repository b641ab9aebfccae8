// BERT layers: forward passes and the partition-independent initialisation.
#include "bert_layers.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <stdexcept>
#include <string>

#include "common/transformer.h"
#include "trainer/model/weight_grad_store.h"

namespace gpipe::bert {
using models::ffn_size;
using models::linear;
using models::maybe_dropout;
using models::self_attention;
namespace {

torch::nn::LayerNorm layer_norm(int64_t hidden) {
  return torch::nn::LayerNorm(torch::nn::LayerNormOptions({hidden}).eps(kLayerNormEps));
}

}  // namespace

bool is_pre_norm(const ModelConfig& config) { return config.norm_position == "pre"; }

BertEmbedding::BertEmbedding(const ModelConfig& config)
    : sequence_length_(config.sequence_length), dropout_(config.dropout) {
  // word_embeddings first: init draws it first from the layer's generator (see init_layer).
  word_embeddings = register_module("word_embeddings", torch::nn::Embedding(config.vocab_size, config.hidden_size));
  position_embeddings =
      register_module("position_embeddings", torch::nn::Embedding(config.sequence_length, config.hidden_size));
  layer_norm = register_module("layer_norm", bert::layer_norm(config.hidden_size));
}

at::Tensor BertEmbedding::forward(const at::Tensor& ids) {
  if (ids.dim() != 2) {
    throw std::invalid_argument("BERT embedding expects token ids [batch, time], got " + std::to_string(ids.dim()) +
                                " dimensions");
  }
  const int64_t time = ids.size(1);
  if (time > sequence_length_) {
    throw std::invalid_argument("BERT embedding got " + std::to_string(time) + " tokens per sequence, more than " +
                                "model.sequence_length " + std::to_string(sequence_length_));
  }
  const at::Tensor positions = at::arange(time, ids.options().dtype(at::kLong));
  const at::Tensor x = layer_norm->forward(word_embeddings->forward(ids) + position_embeddings->forward(positions));
  return maybe_dropout(x, dropout_, is_training(), layer_index(), 0);
}

BertAttention::BertAttention(const ModelConfig& config) : num_heads_(config.num_heads), dropout_(config.dropout) {
  qkv = register_module("qkv", torch::nn::Linear(config.hidden_size, 3 * config.hidden_size));
  out = register_module("out", torch::nn::Linear(config.hidden_size, config.hidden_size));
}

at::Tensor BertAttention::forward(const at::Tensor& x, int64_t layer) {
  // Bidirectional: every position attends to every other one.
  return self_attention(qkv, out, x, num_heads_, dropout_, is_training(), /*causal=*/false, layer);
}

BertMlp::BertMlp(const ModelConfig& config) {
  fc_in = register_module("fc_in", torch::nn::Linear(config.hidden_size, ffn_size(config)));
  fc_out = register_module("fc_out", torch::nn::Linear(ffn_size(config), config.hidden_size));
}

at::Tensor BertMlp::forward(const at::Tensor& x) { return linear(fc_out, at::gelu(linear(fc_in, x))); }

BertBlock::BertBlock(const ModelConfig& config) : pre_norm_(is_pre_norm(config)), dropout_(config.dropout) {
  attn = register_module("attn", std::make_shared<BertAttention>(config));
  ln_1 = register_module("ln_1", layer_norm(config.hidden_size));
  mlp = register_module("mlp", std::make_shared<BertMlp>(config));
  ln_2 = register_module("ln_2", layer_norm(config.hidden_size));
}

at::Tensor BertBlock::forward(const at::Tensor& input) {
  const bool training = is_training();
  const int64_t layer = layer_index();
  if (pre_norm_) {
    at::Tensor x = input + maybe_dropout(attn->forward(ln_1->forward(input), layer), dropout_, training, layer, 1);
    return x + maybe_dropout(mlp->forward(ln_2->forward(x)), dropout_, training, layer, 2);
  }
  at::Tensor x = ln_1->forward(input + maybe_dropout(attn->forward(input, layer), dropout_, training, layer, 1));
  return ln_2->forward(x + maybe_dropout(mlp->forward(x), dropout_, training, layer, 2));
}

BertDecoder::BertDecoder(int64_t vocab_size, int64_t hidden_size) {
  weight = register_parameter("weight", at::empty({vocab_size, hidden_size}));
}

BertHead::BertHead(const ModelConfig& config) {
  if (is_pre_norm(config)) ln_f = register_module("ln_f", layer_norm(config.hidden_size));
  transform = register_module("transform", torch::nn::Linear(config.hidden_size, config.hidden_size));
  transform_norm = register_module("transform_norm", layer_norm(config.hidden_size));
  decoder = register_module("decoder", std::make_shared<BertDecoder>(config.vocab_size, config.hidden_size));
  decoder_bias = register_parameter("decoder_bias", at::zeros({config.vocab_size}));
}

at::Tensor BertHead::forward(const at::Tensor& input) {
  at::Tensor x = ln_f ? ln_f->forward(input) : input;
  x = transform_norm->forward(at::gelu(linear(transform, x)));
  return split_linear(x, decoder_weight(), decoder_bias);
}

void BertHead::tie_decoder(const at::Tensor& word_embeddings) {
  if (!word_embeddings.defined() || word_embeddings.sizes() != decoder->weight.sizes()) {
    throw std::invalid_argument("BertHead::tie_decoder: the word embeddings' shape differs from the decoder's");
  }
  if (decoder_is_tied()) throw std::logic_error("BertHead::tie_decoder called twice");
  tied_weight_ = word_embeddings;
  unregister_module("decoder");
  decoder = nullptr;
}

void init_layer(BertLayer& layer, uint64_t seed, int64_t index) {
  at::NoGradGuard no_grad;
  auto generator = at::make_generator<at::CPUGeneratorImpl>(models::layer_seed(seed, index));
  // named_modules() is in registration (= construction) order, so the draw sequence is fixed.
  for (const auto& item : layer.named_modules()) {
    torch::nn::Module* module = item.value().get();
    if (auto* linear = dynamic_cast<torch::nn::LinearImpl*>(module)) {
      linear->weight.normal_(0.0, kInitStd, generator);
      if (linear->bias.defined()) linear->bias.zero_();
    } else if (auto* embedding = dynamic_cast<torch::nn::EmbeddingImpl*>(module)) {
      embedding->weight.normal_(0.0, kInitStd, generator);
    } else if (auto* norm = dynamic_cast<torch::nn::LayerNormImpl*>(module)) {
      norm->weight.fill_(1.0);
      norm->bias.zero_();
    }
  }
  if (auto* head = dynamic_cast<BertHead*>(&layer)) {
    // The embedding layer's generator, first draw: what BertEmbedding's word_embeddings got.
    auto embedding_generator = at::make_generator<at::CPUGeneratorImpl>(models::layer_seed(seed, 0));
    if (head->decoder) head->decoder->weight.normal_(0.0, kInitStd, embedding_generator);
    head->decoder_bias.zero_();
  }
}

}  // namespace gpipe::bert

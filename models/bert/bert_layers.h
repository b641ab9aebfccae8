// BERT's layers as torch::nn modules, one tensor in and one out, so any contiguous run of them is
// a pipeline stage. Layer 0 is BertEmbedding, layers 1..L are BertBlock, layer L+1 is BertHead
// (the masked-language-model head). Attention is bidirectional: no causal mask, no padding mask
// (the samples are fixed-length token windows).
//
// model.norm_position: "post" (the default: the original BERT, LayerNorm after each residual
// add) or "pre" (LayerNorm before attention and MLP, as GPT-2; the head then starts with a final
// LayerNorm ln_f, since the residual stream is never normalised otherwise).
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <cstdint>
#include <memory>

#include "common/layered_model.h"
#include "trainer/config/config.h"

namespace gpipe::bert {

inline constexpr double kLayerNormEps = 1e-12;  // BERT's
inline constexpr double kInitStd = 0.02;

class BertLayer : public models::SequentialLayer {};

// LayerNorm(word_embeddings(ids) + position_embeddings(arange(T))), then dropout.
class BertEmbedding final : public BertLayer {
 public:
  explicit BertEmbedding(const ModelConfig& config);
  at::Tensor forward(const at::Tensor& ids) override;
  torch::nn::Embedding word_embeddings{nullptr}, position_embeddings{nullptr};
  torch::nn::LayerNorm layer_norm{nullptr};

 private:
  int64_t sequence_length_;
  double dropout_;
};

class BertAttention final : public torch::nn::Module {
 public:
  explicit BertAttention(const ModelConfig& config);
  at::Tensor forward(const at::Tensor& x, int64_t layer);  // `layer`: the block's model layer index
  torch::nn::Linear qkv{nullptr}, out{nullptr};

 private:
  int64_t num_heads_;
  double dropout_;
};

class BertMlp final : public torch::nn::Module {
 public:
  explicit BertMlp(const ModelConfig& config);
  at::Tensor forward(const at::Tensor& x);  // fc_out(gelu(fc_in(x))), exact (erf) GELU
  torch::nn::Linear fc_in{nullptr}, fc_out{nullptr};
};

// post: x = ln_1(x + attn(x)); x = ln_2(x + mlp(x)).   pre: x = x + attn(ln_1(x)); x = x + mlp(ln_2(x)).
class BertBlock final : public BertLayer {
 public:
  explicit BertBlock(const ModelConfig& config);
  at::Tensor forward(const at::Tensor& x) override;
  std::shared_ptr<BertAttention> attn;
  torch::nn::LayerNorm ln_1{nullptr};
  std::shared_ptr<BertMlp> mlp;
  torch::nn::LayerNorm ln_2{nullptr};

 private:
  bool pre_norm_;
  double dropout_;
};

// The decoder's weight [vocab_size, hidden_size] in a module of its own ("decoder.weight"), so a
// head that shares the token embedding of its stage can drop it (BertHead::tie_decoder).
class BertDecoder final : public torch::nn::Module {
 public:
  BertDecoder(int64_t vocab_size, int64_t hidden_size);
  at::Tensor weight;
};

// The MLM head: [ln_f (pre only)] -> transform (dense) -> GELU -> transform_norm -> decoder
// (x @ word_embeddings^T + decoder_bias): logits [B, T, vocab_size].
class BertHead final : public BertLayer {
 public:
  explicit BertHead(const ModelConfig& config);
  at::Tensor forward(const at::Tensor& x) override;
  // Uses `word_embeddings` (the same tensor as the embedding's, on one stage) as the decoder
  // weight and unregisters the head's own copy, so the stage has one parameter, not two.
  void tie_decoder(const at::Tensor& word_embeddings);
  bool decoder_is_tied() const { return tied_weight_.defined(); }
  const at::Tensor& decoder_weight() const { return tied_weight_.defined() ? tied_weight_ : decoder->weight; }

  torch::nn::LayerNorm ln_f{nullptr};  // pre-LN only
  torch::nn::Linear transform{nullptr};
  torch::nn::LayerNorm transform_norm{nullptr};
  std::shared_ptr<BertDecoder> decoder;
  at::Tensor decoder_bias;

 private:
  at::Tensor tied_weight_;
};

// Whether model.norm_position means pre-LN for BERT ("default" is post).
bool is_pre_norm(const ModelConfig& config);

// BERT init of one layer from its own CPU generator (seeded layer_seed(seed, index)): Linear and
// Embedding weights ~ N(0, 0.02) in construction order, biases 0, LayerNorm weight 1 and bias 0.
// The head's decoder weight is drawn from a generator seeded layer_seed(seed, 0), first, exactly
// as the embedding draws its word embeddings: the two copies of the tied weight start equal
// whichever stages hold them.
void init_layer(BertLayer& layer, uint64_t seed, int64_t index);

}  // namespace gpipe::bert

// BERT's masked-language-model data: the GPT's text sources and tokenizers (trainer/data/), with
// BERT's masking applied to each sample.
//
// Masking (Devlin et al. 2019): in each sequence of T tokens, max(1, round(0.15 T)) distinct
// positions are chosen uniformly (a fixed count, as the original create_pretraining_data.py: every
// micro-batch then has the same number of predictions, so the mean of the micro-batch losses is
// the batch's loss, and none is empty). Of the chosen positions 80% become [MASK], 10% a random
// token of the tokenizer's vocabulary (never [MASK]) and 10% stay unchanged; targets are the
// original ids at the chosen positions and -100 (ignored by the loss) elsewhere. The draws come
// from a CPU generator seeded by (training.seed, epoch, batch index): a batch is the same whoever
// asks for it, whenever.
//
// [MASK]: the tokenizers have no mask token, so its id is the one after the tokenizer's vocabulary
// (257 for the byte tokenizer; a SentencePiece model's piece count): MaskedTokenizer reports a
// vocabulary one larger, and model.vocab_size = -1 resolves to it.
#pragma once

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "trainer/data/text_data.h"
#include "trainer/data/tokenizer.h"
#include "trainer/model/interfaces.h"

namespace gpipe::bert {

inline constexpr double kMaskFraction = 0.15;   // of the positions of a sequence
inline constexpr double kMaskTokenShare = 0.8;  // of those: [MASK]
inline constexpr double kRandomTokenShare = 0.1;  // a random token; the rest stays unchanged
inline constexpr int64_t kIgnoreTarget = -100;

// Positions masked per sequence of `length` tokens: max(1, round(0.15 * length)).
int64_t masked_positions_per_sequence(int64_t length);

// BERT's masking of `ids` (int64 [B, T]): {inputs with [MASK] / random / unchanged tokens,
// targets = original ids at the chosen positions, -100 elsewhere}. Random tokens are drawn from
// [0, random_vocab_size). Deterministic for a generator seed.
Batch mask_tokens(const at::Tensor& ids, int64_t mask_id, int64_t random_vocab_size, uint64_t generator_seed);

// The generator seed of batch `index` of `epoch` for training.seed `seed` (a SplitMix64 mix).
uint64_t masking_seed(uint64_t seed, int64_t epoch, int64_t index);

// A document tokenizer plus [MASK] at id inner.vocab_size() (see the file comment).
class MaskedTokenizer final : public DocumentTokenizer {
 public:
  static constexpr const char* kMaskText = "[MASK]";
  explicit MaskedTokenizer(std::unique_ptr<DocumentTokenizer> inner);
  int64_t vocab_size() const override { return inner_->vocab_size() + 1; }
  int64_t mask_id() const { return inner_->vocab_size(); }
  std::vector<int64_t> encode(const std::string& text) const override { return inner_->encode(text); }
  // [MASK] decodes to "[MASK]", every other id as the inner tokenizer decodes it.
  std::string decode(const std::vector<int64_t>& ids) const override;
  std::optional<int64_t> eot_id() const override { return inner_->eot_id(); }
  const DocumentTokenizer& inner() const { return *inner_; }

 private:
  std::unique_ptr<DocumentTokenizer> inner_;
};

// The registered BERT datasets: a TextDataset (same readers, embedded corpus, tokenizer and
// shuffle as the GPT's) whose batches are masked. Only input_ids of the text batch are used.
class MaskedLmDataset : public DatasetInterface {
 public:
  explicit MaskedLmDataset(TextDataset::Format format) : text_(format) {}
  void load_dataset(const DatasetConfig& dataset, const ModelConfig& model) override;
  const Tokenizer& get_tokenizer() const override;
  int64_t num_batches() const override { return text_.num_batches(); }
  std::string content_digest() const override { return text_.content_digest(); }
  Batch process_batch(int64_t epoch, int64_t index) override;
  void set_seed(uint64_t seed) override {
    seed_ = seed;
    text_.set_seed(seed);
  }
  const MaskedTokenizer& tokenizer() const;

 private:
  TextDataset text_;
  uint64_t seed_ = 1234;
  std::unique_ptr<MaskedTokenizer> tokenizer_;
};

}  // namespace gpipe::bert

// BERT's masking and the masked-LM datasets (bert_masking.h).
#include "bert_masking.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <cmath>
#include <stdexcept>
#include <string>

namespace gpipe::bert {

int64_t masked_positions_per_sequence(int64_t length) {
  if (length < 1) throw std::invalid_argument("cannot mask a sequence of " + std::to_string(length) + " tokens");
  return std::max<int64_t>(1, std::llround(kMaskFraction * static_cast<double>(length)));
}

uint64_t masking_seed(uint64_t seed, int64_t epoch, int64_t index) {
  auto mix = [](uint64_t z) {  // SplitMix64's finaliser
    z += 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
  };
  return mix(mix(mix(seed) ^ static_cast<uint64_t>(epoch)) ^ static_cast<uint64_t>(index));
}

Batch mask_tokens(const at::Tensor& ids, int64_t mask_id, int64_t random_vocab_size, uint64_t generator_seed) {
  if (ids.dim() != 2 || ids.scalar_type() != at::kLong) {
    throw std::invalid_argument("mask_tokens needs int64 token ids [batch, time]");
  }
  if (random_vocab_size < 1) throw std::invalid_argument("mask_tokens needs a vocabulary of at least one token");
  auto generator = at::make_generator<at::CPUGeneratorImpl>(generator_seed);
  const at::Tensor original = ids.to(at::kCPU).contiguous();
  const int64_t batch = original.size(0), time = original.size(1);
  const int64_t chosen_count = masked_positions_per_sequence(time);
  // The first `chosen_count` positions of a random permutation per row: distinct, uniform.
  const at::Tensor chosen = at::rand({batch, time}, generator).argsort(/*stable=*/true, 1, /*descending=*/false).narrow(1, 0, chosen_count);
  const at::Tensor chosen_ids = original.gather(1, chosen);
  const at::Tensor kind = at::rand({batch, chosen_count}, generator);
  const at::Tensor random_ids = at::randint(random_vocab_size, {batch, chosen_count}, generator, at::kLong);
  const at::Tensor replacement =
      at::where(kind < kMaskTokenShare, at::full_like(chosen_ids, mask_id),
                at::where(kind < kMaskTokenShare + kRandomTokenShare, random_ids, chosen_ids));
  Batch out;
  out.input_ids = original.clone().scatter_(1, chosen, replacement);
  out.targets = at::full_like(original, kIgnoreTarget).scatter_(1, chosen, chosen_ids);
  return out;
}

MaskedTokenizer::MaskedTokenizer(std::unique_ptr<DocumentTokenizer> inner) : inner_(std::move(inner)) {
  if (!inner_) throw std::invalid_argument("MaskedTokenizer needs a tokenizer");
}

std::string MaskedTokenizer::decode(const std::vector<int64_t>& ids) const {
  std::string text;
  std::vector<int64_t> run;
  for (int64_t id : ids) {
    if (id != mask_id()) {
      run.push_back(id);
      continue;
    }
    text += inner_->decode(run) + kMaskText;
    run.clear();
  }
  return text + inner_->decode(run);
}

void MaskedLmDataset::load_dataset(const DatasetConfig& dataset, const ModelConfig& model) {
  auto tokenizer = std::make_unique<MaskedTokenizer>(make_tokenizer(dataset));
  if (model.vocab_size != -1 && model.vocab_size < tokenizer->vocab_size()) {
    throw std::runtime_error("model.vocab_size " + std::to_string(model.vocab_size) + " leaves no room for [MASK]: the " +
                             dataset.tokenizer + " tokenizer has " + std::to_string(tokenizer->vocab_size() - 1) +
                             " ids and [MASK] is id " + std::to_string(tokenizer->mask_id()) +
                             "; set model.vocab_size to -1 to take it from the tokenizer");
  }
  text_.load_dataset(dataset, model);
  tokenizer_ = std::move(tokenizer);
}

const MaskedTokenizer& MaskedLmDataset::tokenizer() const {
  if (!tokenizer_) throw std::logic_error("MaskedLmDataset used before load_dataset()");
  return *tokenizer_;
}

const Tokenizer& MaskedLmDataset::get_tokenizer() const { return tokenizer(); }

Batch MaskedLmDataset::process_batch(int64_t epoch, int64_t index) {
  const MaskedTokenizer& tok = tokenizer();
  const Batch text = text_.process_batch(epoch, index);
  return mask_tokens(text.input_ids, tok.mask_id(), tok.inner().vocab_size(), masking_seed(seed_, epoch, index));
}

}  // namespace gpipe::bert

// Token stream -> shuffled global batches of (input_ids, targets shifted by one).
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include <zlib.h>

#include <algorithm>
#include <array>
#include <limits>
#include <random>
#include <stdexcept>

#include "trainer/data/text_data.h"

namespace gpipe {

void append_document_tokens(TokenStream& out, const std::string& text, const DocumentTokenizer& tokenizer) {
  if (tokenizer.vocab_size() > std::numeric_limits<int32_t>::max()) {
    throw std::runtime_error("tokenizer vocabulary does not fit the int32 token stream");
  }
  tokenizer.encode_into(text, out);
  if (const auto eot = tokenizer.eot_id()) out.push_back(static_cast<int32_t>(*eot));
}

std::vector<int32_t> tokenize_documents(const std::vector<TextDocument>& documents, const DocumentTokenizer& tokenizer) {
  TokenStream tokens;
  for (const auto& document : documents) append_document_tokens(tokens, document.text, tokenizer);
  return tokens.to_vector();
}

TokenBatcher::TokenBatcher(TokenStream tokens, int64_t batch_size, int64_t sequence_length, const std::string& origin)
    : tokens_(std::move(tokens)), batch_size_(batch_size), sequence_length_(sequence_length) {
  if (batch_size_ <= 0) throw std::runtime_error("dataset.batch_size must be positive, got " + std::to_string(batch_size_));
  if (sequence_length_ <= 0) {
    throw std::runtime_error("model.sequence_length must be positive, got " + std::to_string(sequence_length_));
  }
  // The stream's bytes in order, block by block, in chunks of at most 1 GiB (crc32() takes a uInt).
  uLong crc = crc32(0L, Z_NULL, 0);
  tokens_.for_each_block([&crc](const int32_t* tokens, size_t count) {
    const auto* bytes = reinterpret_cast<const Bytef*>(tokens);
    for (size_t left = count * sizeof(int32_t); left > 0;) {
      const size_t n = std::min<size_t>(left, size_t{1} << 30);
      crc = crc32(crc, bytes, static_cast<uInt>(n));
      bytes += n;
      left -= n;
    }
  });
  tokens_crc32_ = static_cast<uint32_t>(crc);
  // Samples overlap by one token: sample i covers tokens [i*T, i*T + T] inclusive.
  num_samples_ = tokens_.size() > 1 ? (tokens_.size() - 1) / sequence_length_ : 0;
  if (num_batches() == 0) {
    throw std::runtime_error(origin + " gives " + std::to_string(tokens_.size()) + " tokens, too few for one batch of " +
                             std::to_string(batch_size_) + " x " + std::to_string(sequence_length_) + " (needs " +
                             std::to_string(batch_size_ * sequence_length_ + 1) +
                             "): use more data or a smaller dataset.batch_size / model.sequence_length");
  }
}

namespace {

// One generator seed per (seed, epoch) pair, mixed by std::seed_seq: a plain seed + epoch made
// run seed 7's second epoch replay run seed 8's first.
uint64_t epoch_order_seed(uint64_t seed, int64_t epoch) {
  const auto e = static_cast<uint64_t>(epoch);
  std::seed_seq mix{static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32), static_cast<uint32_t>(e),
                    static_cast<uint32_t>(e >> 32)};
  std::array<uint32_t, 2> words{};
  mix.generate(words.begin(), words.end());
  return (static_cast<uint64_t>(words[0]) << 32) | words[1];
}

}  // namespace

Batch TokenBatcher::batch(int64_t epoch, int64_t index, uint64_t seed) const {
  if (index < 0 || index >= num_batches()) {
    throw std::out_of_range("batch index " + std::to_string(index) + " is outside [0, " + std::to_string(num_batches()) +
                            ") for this dataset");
  }
  if (epoch < 0) throw std::out_of_range("epoch " + std::to_string(epoch) + " is negative");
  at::Tensor order;
  {
    std::lock_guard<std::mutex> lock(order_mu_);
    if (order_epoch_ != epoch || order_seed_ != seed || !order_.defined()) {
      auto generator = at::make_generator<at::CPUGeneratorImpl>(epoch_order_seed(seed, epoch));
      order_ = at::randperm(num_samples_, generator, at::TensorOptions().dtype(at::kLong));
      order_epoch_ = epoch;
      order_seed_ = seed;
    }
    order = order_;
  }
  const int64_t* sample_ids = order.const_data_ptr<int64_t>() + index * batch_size_;
  at::Tensor inputs = at::empty({batch_size_, sequence_length_}, at::kLong);
  at::Tensor targets = at::empty({batch_size_, sequence_length_}, at::kLong);
  int64_t* in = inputs.mutable_data_ptr<int64_t>();
  int64_t* out = targets.mutable_data_ptr<int64_t>();
  for (int64_t b = 0; b < batch_size_; ++b) {
    const int64_t sample = sample_ids[b] * sequence_length_;
    for (int64_t t = 0; t < sequence_length_; ++t) {
      in[b * sequence_length_ + t] = tokens_[sample + t];
      out[b * sequence_length_ + t] = tokens_[sample + t + 1];
    }
  }
  return {inputs, targets};
}

}  // namespace gpipe

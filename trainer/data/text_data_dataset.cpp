// TextDataset: a reader (CodeSearchNet or plain text, or the embedded corpus) + tokenizer +
// TokenBatcher behind DatasetInterface.
#include <chrono>
#include <cstdio>
#include <stdexcept>
#include <string>

#include "trainer/data/text_data.h"
#include "trainer/log/text_data_log.h"

namespace gpipe {

void TextDataset::load_dataset(const DatasetConfig& dataset, const ModelConfig& model) {
  auto tokenizer = make_tokenizer(dataset);
  if (model.vocab_size != -1 && model.vocab_size < tokenizer->vocab_size()) {
    throw std::runtime_error("model.vocab_size " + std::to_string(model.vocab_size) + " is smaller than the " +
                             dataset.tokenizer + " tokenizer's vocabulary (" + std::to_string(tokenizer->vocab_size()) +
                             "): set model.vocab_size to -1 to take it from the tokenizer");
  }
  // Each document is tokenized as it is read and its text let go: the corpus is never held as
  // text (peak memory is the token stream, 4 bytes a token, plus one document).
  TokenStream tokens;
  int64_t documents = 0;
  const auto add = [&](TextDocument&& document) {
    append_document_tokens(tokens, document.text, *tokenizer);
    ++documents;
  };
  std::string origin;
  // Tokenizing is the long part of a large dataset: say so before, and how long it took after.
  const auto start = std::chrono::steady_clock::now();
  if (dataset.path.empty()) {
    origin = "the embedded corpus";
    std::vector<TextDocument> corpus = embedded_corpus();
    log_data_info("dataset '" + dataset.name + "': dataset.path is empty, using the embedded corpus (" +
                  std::to_string(corpus.size()) + " files of this project's sources), tokenizing with the " +
                  dataset.tokenizer + " tokenizer ...");
    for (auto& document : corpus) add(std::move(document));
  } else {
    origin = "dataset.path '" + dataset.path + "'";
    log_data_info("dataset '" + dataset.name + "': reading and tokenizing " + origin + " with the " + dataset.tokenizer +
                  " tokenizer ...");
    if (format_ == Format::kCodeSearchNet) {
      for_each_codesearchnet_document(dataset.path, add);
    } else {
      for_each_text_document(dataset.path, add);
    }
  }
  const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  char took_text[32];
  std::snprintf(took_text, sizeof took_text, "%.1f s", took);
  batcher_ = std::make_unique<TokenBatcher>(std::move(tokens), dataset.batch_size, model.sequence_length, origin);
  tokenizer_ = std::move(tokenizer);
  log_data_info("dataset '" + dataset.name + "': " + std::to_string(documents) + " documents, " +
                std::to_string(batcher_->num_tokens()) + " tokens, " + std::to_string(batcher_->num_samples()) +
                " samples of " + std::to_string(model.sequence_length) + " tokens, " +
                std::to_string(batcher_->num_batches()) + " global batches of " + std::to_string(dataset.batch_size) +
                " per epoch (read and tokenized in " + took_text + ")");
}

const TokenBatcher& TextDataset::batcher() const {
  if (!batcher_) throw std::logic_error("TextDataset used before load_dataset()");
  return *batcher_;
}

const Tokenizer& TextDataset::get_tokenizer() const {
  if (!tokenizer_) throw std::logic_error("TextDataset::get_tokenizer() called before load_dataset()");
  return *tokenizer_;
}

int64_t TextDataset::num_batches() const { return batcher().num_batches(); }

std::string TextDataset::content_digest() const {
  char crc[16];
  std::snprintf(crc, sizeof crc, "%08x", batcher().tokens_crc32());
  return std::to_string(batcher().num_tokens()) + " tokens, " + std::to_string(num_batches()) +
         " batches per epoch, token CRC-32 " + crc;
}

Batch TextDataset::process_batch(int64_t epoch, int64_t index) { return batcher().batch(epoch, index, seed_); }

}  // namespace gpipe
